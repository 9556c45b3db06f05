"""Time to first byte of a request that forces a model swap: RouterPanel vs llama.cpp's router.

    .venv/bin/python bench/swap_routers.py [--swaps 24] [--sched-swaps 50] [--out FILE]

Both routers get the same preset file (the three tiny real models, 3/50/200 MB, llama.cpp keys
only) and ``--models-max 2``. After two requests fill the slots, every request asks for the model
that is not running (tiny → small → medium → tiny …, least recently used first), so each one
waits for a graceful stop of the LRU model (exit command, exit awaited) and a fresh load. The two
routers take turns, in a shuffled order per round. Figure: seconds from sending a streamed chat
completion (4 tokens) on a new connection to the first byte of its body, median and p95. It
includes the child's own load (0.1–1.5 s here, the same binary and file for both routers).

The second table is the scheduling part alone (``bench/swap.py``: the engine with simulated
children; see bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, swap
from bench.common import Proc, Processes, Table

CYCLE = ("medium", "tiny", "small")  # after tiny and small were loaded, in that order
BODY = json.dumps(
    {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
)


def one_swap(router: Proc, model: str) -> float:
    status = common.model_status(router, model)
    if status != "unloaded":
        raise RuntimeError(f"{router.name}: {model} is {status}, the request would not swap")
    body = json.dumps({**json.loads(BODY), "model": model}).encode()
    return common.first_byte(router.port or 0, "/v1/chat/completions", body)


def routers(swaps: int, rng: random.Random) -> Table:
    server_bin = common.llama_server_bin()
    table = Table(
        f"Time to first byte of a request that forces a swap ({swaps} swaps per router, "
        "models_max 2, three tiny real models)",
        ["router", "median ms", "p95 ms", "min ms", "× llama.cpp (median)"],
    )
    with common.workdir("swap") as work, Processes(work) as procs:
        ini = work / "same.ini"
        ini.write_text(common.preset_ini(common.tiny_models()))
        pair = [
            common.start_routerpanel(procs, ini, 2, server_bin=server_bin),
            common.start_llama_router(procs, server_bin, ini, 2),
        ]
        for router in pair:
            for model in ("tiny", "small"):
                common.load_by_request(router, model)
        samples: dict[str, list[float]] = {r.name: [] for r in pair}
        for i in range(swaps):
            order = list(pair)
            rng.shuffle(order)
            for router in order:
                samples[router.name].append(one_swap(router, CYCLE[i % len(CYCLE)]))
    llama = common.median(samples["llama-router"])
    for label, name in (("RouterPanel", "routerpanel"), ("llama.cpp router", "llama-router")):
        values = samples[name]
        ratio = common.median(values) / llama
        table.add(label, common.ms(common.median(values)), common.ms(common.p95(values)),
                  common.ms(min(values)), f"{ratio:.2f}")  # fmt: skip
    table.notes.append(
        "Includes the child's own load; llama.cpp's waiters re-check every 200 ms and its "
        "monitor polls exits every 50 ms (ROUTER_SPEC 7.14, 5.5), RouterPanel awaits both."
    )
    return table


def scheduling(swaps: int) -> Table:
    results = asyncio.run(swap.measure(swaps, load_ms=100, rss_mb=16))
    table = Table(
        f"The swap's scheduling part alone (bench/swap.py: engine + simserver, {swaps} swaps)",
        ["figure", "median ms", "p95 ms"],
    )
    for key, label in swap.FIGURES.items():
        values = results[key]
        table.add(label.strip(), common.ms(common.median(values)), common.ms(common.p95(values)))
    return table


def run(swaps: int = 24, sched_swaps: int = 50, seed: int = 11434) -> list[Table]:
    return [routers(swaps, random.Random(seed)), scheduling(sched_swaps)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--swaps", type=int, default=24, help="swaps per router (24)")
    parser.add_argument("--sched-swaps", type=int, default=50, help="swaps of swap.py (50)")
    parser.add_argument("--out", type=Path, help="also write the Markdown tables here")
    args = parser.parse_args(argv)
    common.report(run(args.swaps, args.sched_swaps), args.out)


if __name__ == "__main__":
    main()
