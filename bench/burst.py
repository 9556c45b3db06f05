"""A burst: 1,000 concurrent chat requests over three simulated models with ``models_max 2``.

    .venv/bin/python bench/burst.py [--requests 1000]

Default settings (no queue limits): every request must be answered, with no 5xx — before issue
11 the in-memory channel's capacity of 100 turned some into 500s. The router swaps while
hundreds wait (a third model needs a slot; only an idle model may be evicted). Embedded mode
(``serve``) always; team mode (``runrouter`` + ``serve --no-router``) when PostgreSQL and Redis
answer on 127.0.0.1 (a throw-away database and Redis prefix).

The client is a bare asyncio HTTP/1.1 client (one connection per request, ``Connection: close``)
so that 1,000 concurrent requests do not cost the 2-core machine more than the router does.
Figures: wall time, requests/s, the client-side latency (which is mostly queue wait) at p50 and
p99, and the answers by status. A child sampler reports the peak of live children (must be 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from bench.common import Proc, Processes, Table

MODELS = ("burst-a", "burst-b", "burst-c")


async def post(port: int, body: bytes, timeout: float) -> int:
    """One POST /v1/chat/completions on its own connection; the status, or 0 for no answer."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(common.HOST, port)
            writer.write(head + body)
            status_line = await reader.readline()
            await reader.read()  # to the end: Connection: close
            writer.close()
    except (OSError, TimeoutError):
        return 0
    parts = status_line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


async def fire(port: int, requests: int, timeout: float) -> tuple[Counter[int], list[float], float]:
    async def one(i: int) -> tuple[int, float]:
        body = json.dumps({"model": MODELS[i % len(MODELS)], "max_tokens": 8,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
        started = time.monotonic()
        status = await post(port, body, timeout)
        return status, time.monotonic() - started

    started = time.monotonic()
    results = await asyncio.gather(*(one(i) for i in range(requests)))
    wall = time.monotonic() - started
    return Counter(s for s, _ in results), sorted(t for _, t in results), wall


class PeakChildren:
    """Sample the router's live simulated children every 5 ms in a thread; keep the maximum."""

    def __init__(self, router: Proc) -> None:
        self.router, self.peak, self.samples = router, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakChildren:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(self.router.children((), "burst-marker")))
            self.samples += 1
            self._stop.wait(0.005)


def ini_text() -> str:
    text = common.sim_ini(MODELS, parallel=4, load_ms=200)
    return text.replace("sim-tokens = 256", "sim-tokens = 8\nsim-tag = burst-marker")


def row(table: Table, mode: str, requests: int, result: tuple[Counter[int], list[float], float],
        peak: int) -> None:  # fmt: skip
    statuses, latencies, wall = result
    errors = sum(n for s, n in statuses.items() if s >= 500 or s == 0)
    p50, p99 = latencies[len(latencies) // 2], latencies[max(0, int(len(latencies) * 0.99) - 1)]
    answers = ", ".join(f"{s or 'none'}: {n}" for s, n in sorted(statuses.items()))
    table.add(mode, f"{requests:,}", f"{wall:.2f}", f"{requests / wall:.0f}", common.ms(p50),
              common.ms(p99), answers, errors, peak)  # fmt: skip


def run(requests: int = 1000, timeout: float = 300.0) -> list[Table]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # 1,000 sockets need room
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    table = Table(
        f"A burst of {requests:,} concurrent chat requests over 3 simulated models, models_max 2",
        ["mode", "requests", "wall s", "requests/s", "p50 ms", "p99 ms", "answers", "5xx or none",
         "peak children"],
    )  # fmt: skip
    with common.workdir("burst") as work, Processes(work) as procs:
        ini = work / "burst.ini"
        ini.write_text(ini_text())
        router = common.start_routerpanel(procs, ini, 2)
        with PeakChildren(router) as peak:
            result = asyncio.run(fire(router.port or 0, requests, timeout))
        row(table, "embedded (serve)", requests, result, peak.peak)
        procs.stop(router)
        with common.team_services("rp_burst") as services:
            if services is None:
                table.notes.append("team mode: PostgreSQL or Redis not reachable, skipped")
            else:
                database, redis_url = services
                runrouter, web = common.start_team(procs, ini, 2, database, redis_url)
                with PeakChildren(runrouter) as peak:
                    result = asyncio.run(fire(web.port or 0, requests, timeout))
                row(table, "team (runrouter + serve --no-router)", requests, result, peak.peak)
    table.notes += [
        "Default settings: no max waiters, no max wait; each simulated child has 4 slots, "
        "loads in 0.2 s and answers 8 tokens.",
        "Latency is the client's (connect to last byte): nearly all of it is time queued "
        "behind swaps. 5xx or none: answers of 500 or above, or no answer within "
        f"{timeout:g} s.",
    ]
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    common.print_tables(run(requests=parser.parse_args().requests))


if __name__ == "__main__":
    main()
