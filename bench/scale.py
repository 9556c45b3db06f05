"""Scale: one admission decision with 10,000 queued waiters over 200 presets, and its memory.

    .venv/bin/python bench/scale.py [--waiters 10000] [--presets 200] [--samples 300]

The scheduler (``routerpanel.router.scheduler.Scheduler``) is driven directly with a fake clock:
``models_max = 4``, four models loaded and each busy with one request (so nothing can be evicted),
and the waiters spread round-robin over the other 196 models' queue entries. Timed with
``time.perf_counter_ns``, one call each:

* join — ``request_arrived`` for a queued model: the waiter joins its entry (A2);
* leave — ``waiter_left`` of that waiter (A7);
* grant — ``request_arrived`` for a loaded, busy model: granted at once (A1);
* finish — ``request_finished`` of that request (the model stays busy);
* swap — the three inputs of a swap: the last request on a loaded model finishes (it becomes the
  LRU victim: Stop, A5), its child exits (the head entry spawns, A6), the new child is ready (its
  ~51 waiters are granted). Between swaps the queue is refilled to the same size (not timed).

Memory: ``tracemalloc`` of the scheduler holding all of it, and in a fresh interpreter the RSS
growth of a whole ``Engine`` (stub supervisor, no processes) with the same presets and 10,000
pending ``acquire`` calls — asyncio tasks and futures included — plus one ``acquire``/``release``
round trip through its inbox while they wait.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from bench import common
from bench.common import Table
from routerpanel.router import preflight, supervisor
from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import Grant, Spawn, Stop
from routerpanel.router.engine import Engine
from routerpanel.router.scheduler import Scheduler

MODELS_MAX = 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def tick(self) -> float:
        self.now += 0.001
        return self.now


def specs(n: int) -> list[PresetSpec]:
    return [PresetSpec(name=f"m{i:03d}", argv=("llama-server", "-m", f"m{i:03d}.gguf"))
            for i in range(n)]  # fmt: skip


def queued_name(k: int, presets: int) -> str:
    return f"m{MODELS_MAX + k % (presets - MODELS_MAX):03d}"


# ---- the scheduler alone --------------------------------------------------------------------


def build(presets: int, waiters: int, clock: Clock) -> Scheduler:
    s = Scheduler(specs(presets), RouterConfig(models_max=MODELS_MAX))
    for i in range(MODELS_MAX):
        name = f"m{i:03d}"
        s.request_arrived(f"busy-{name}", name, now=clock.tick())
        s.child_ready(name, now=clock.tick())
    for k in range(waiters):
        s.request_arrived(f"w{k}", queued_name(k, presets), now=clock.tick())
    return s


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter_ns()
    out = call()
    return (time.perf_counter_ns() - started) / 1e9, out


def scheduler_costs(presets: int, waiters: int, samples: int) -> dict[str, list[float]]:
    clock = Clock()
    s = build(presets, waiters, clock)
    assert sum(e.waiters for e in s.queue()) == waiters
    costs: dict[str, list[float]] = {k: [] for k in ("join", "leave", "grant", "finish")}
    gc.collect()
    for i in range(samples):
        model = queued_name(i, presets)
        costs["join"].append(timed(partial(s.request_arrived, f"x{i}", model, now=clock.tick()))[0])
        costs["leave"].append(timed(partial(s.waiter_left, f"x{i}", now=clock.tick()))[0])
        t, out = timed(partial(s.request_arrived, f"g{i}", "m000", now=clock.tick()))
        assert any(isinstance(d, Grant) for d in out)
        costs["grant"].append(t)
        costs["finish"].append(timed(partial(s.request_finished, f"g{i}", now=clock.tick()))[0])
    costs |= swaps(s, clock, presets, waiters, max(10, samples // 10))
    return costs


def swaps(s: Scheduler, clock: Clock, presets: int, waiters: int, n: int) -> dict[str, list[float]]:
    """Time n swaps; keep one busy request per loaded model and the queue at ``waiters``."""
    busy = {m.name: f"busy-{m.name}" for m in s.models() if m.in_flight}
    keys = ("swap", "swap: finish -> stop", "swap: exit -> spawn", "swap: ready -> grants")
    out: dict[str, list[float]] = {key: [] for key in keys}
    fresh = 0
    for _ in range(n):
        victim = min(busy)  # any loaded model; its only request ends, so it is the only idle one
        t1, d1 = timed(partial(s.request_finished, busy.pop(victim), now=clock.tick()))
        assert any(isinstance(d, Stop) and d.model == victim for d in d1), d1
        t2, d2 = timed(partial(s.child_exited, victim, now=clock.tick(), exit_code=0))
        spawned = next(d.model for d in d2 if isinstance(d, Spawn))
        t3, d3 = timed(partial(s.child_ready, spawned, now=clock.tick()))
        granted = [d.request_id for d in d3 if isinstance(d, Grant)]
        for key, t in (("swap: finish -> stop", t1), ("swap: exit -> spawn", t2),
                       ("swap: ready -> grants", t3), ("swap", t1 + t2 + t3)):  # fmt: skip
            out[key].append(t)
        busy[spawned] = granted[0]
        for request_id in granted[1:]:  # untimed: back to one busy request per loaded model
            s.request_finished(request_id, now=clock.tick())
        while sum(e.waiters for e in s.queue()) < waiters:
            fresh += 1
            name = next(n for n in (queued_name(fresh + j, presets) for j in range(presets))
                        if n not in busy)  # fmt: skip
            s.request_arrived(f"r{fresh}", name, now=clock.tick())
    return out


def scheduler_memory(presets: int, waiters: int) -> int:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    s = build(presets, waiters, Clock())
    gc.collect()
    size = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del s
    return size


# ---- the whole engine, in a fresh interpreter -----------------------------------------------


class StubSupervisor:
    """No processes: a spawned child is ready at once, a stopped one exits at once."""

    def __init__(self, post: Callable[[supervisor.SupervisorEvent], None]) -> None:
        self._post = post
        self._pids = iter(range(10_000, 10**9))

    async def spawn(self, name: str, argv: Any, env: Any, **_: Any) -> int:
        pid = next(self._pids)
        self._post(supervisor.ChildStarted(name, pid, 1, 1))
        self._post(supervisor.ChildReady(name, 1, {}, 0.0))
        return pid

    def stop(self, name: str, stop_timeout: float) -> bool:
        exited = supervisor.ChildExited(name, 0, 1, 0, None, 0.0, True, False, True, 0.0, None, ())
        asyncio.get_running_loop().call_soon(self._post, exited)
        return True

    def kill(self, name: str) -> bool:
        return self.stop(name, 0.0)

    def live(self) -> dict[str, Any]:
        return {}

    def logs(self, name: str) -> list[Any]:
        return []

    def forget_logs(self, name: str) -> None:
        pass

    async def shutdown(self, stop_timeout: Any = 0.0) -> None:
        pass


async def engine_figures(presets: int, waiters: int, samples: int) -> dict[str, Any]:
    proc = psutil.Process()
    gc.collect()
    rss_before = proc.memory_info().rss
    engine = Engine(
        RouterConfig(models_max=MODELS_MAX),
        specs(presets),
        memory_interval=None,
        supervisor_factory=StubSupervisor,  # type: ignore[arg-type]
        preflight=preflight.never,  # stub children: no program or file is started or read
    )
    await engine.start()
    busy = [await engine.acquire(f"m{i:03d}", request_id=f"busy-{i}") for i in range(MODELS_MAX)]
    started = time.perf_counter()
    tasks = [
        asyncio.ensure_future(engine.acquire(queued_name(k, presets), request_id=f"w{k}"))
        for k in range(waiters)
    ]
    await engine.until_idle()
    queue_seconds = time.perf_counter() - started
    gc.collect()
    rss_after = proc.memory_info().rss
    queued = sum(e["waiters"] for e in engine.snapshot()["queue"])
    round_trips: list[float] = []
    for i in range(samples):
        t0 = time.perf_counter()
        lease = await engine.acquire("m000", request_id=f"g{i}")
        round_trips.append(time.perf_counter() - t0)
        engine.release(lease.lease_id)
        await engine.until_idle()
    for lease in busy:
        engine.release(lease.lease_id)
    await engine.shutdown()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "rss_growth": rss_after - rss_before,
        "queued": queued,
        "queue_seconds": queue_seconds,
        "round_trips": round_trips,
    }


def engine_in_subprocess(presets: int, waiters: int, samples: int) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--engine-json", "--presets", str(presets)]
    argv += ["--waiters", str(waiters), "--samples", str(samples)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ---- report ---------------------------------------------------------------------------------


def run(waiters: int = 10_000, presets: int = 200, samples: int = 300) -> list[Table]:
    engine = engine_in_subprocess(presets, waiters, samples)
    costs = scheduler_costs(presets, waiters, samples)
    heap = scheduler_memory(presets, waiters)
    table = Table(
        f"Scale: one admission decision with {waiters:,} queued waiters over {presets} presets "
        f"(models_max {MODELS_MAX})",
        ["what", "median ms", "p95 ms", "n"],
    )
    labels = {
        "join": "scheduler: a waiter joins a queued model (A2)",
        "leave": "scheduler: a waiter leaves (A7)",
        "grant": "scheduler: request for a loaded model, granted (A1)",
        "finish": "scheduler: request finished",
        "swap": "scheduler: whole swap (finish + exit + ready)",
        "swap: finish -> stop": "scheduler: swap 1/3, last request ends -> Stop victim (A5)",
        "swap: exit -> spawn": "scheduler: swap 2/3, victim exited -> Spawn head (A6)",
        "swap: ready -> grants": "scheduler: swap 3/3, ready -> grant the head's waiters",
    }
    for key, label in labels.items():
        v = costs[key]
        table.add(label, common.ms(common.median(v)), common.ms(common.p95(v)), len(v))
    trips = engine["round_trips"]
    label = "engine: acquire of a loaded model through the inbox (A1)"
    table.add(label, common.ms(common.median(trips)), common.ms(common.p95(trips)), len(trips))
    table.notes += [
        f"Memory: the scheduler holding {waiters:,} waiters and {presets} presets: "
        f"{heap / 2**20:.1f} MiB (tracemalloc); the whole engine with {engine['queued']:,} "
        f"pending acquire() calls (tasks and futures included): RSS +"
        f"{engine['rss_growth'] / 2**20:.1f} MiB.",
        f"Queueing the {waiters:,} acquire() calls through the engine took "
        f"{engine['queue_seconds']:.1f} s in all ({engine['queue_seconds'] / waiters * 1e3:.2f}"
        " ms each, the queue growing from 0).",
    ]
    return [table]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--waiters", type=int, default=10_000, help="queued waiters (10000)")
    parser.add_argument("--presets", type=int, default=200, help="presets (200)")
    parser.add_argument("--samples", type=int, default=300, help="timed calls per figure (300)")
    parser.add_argument("--engine-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if args.engine_json:  # the fresh interpreter of engine_in_subprocess
        figures = asyncio.run(engine_figures(args.presets, args.waiters, args.samples))
        print(json.dumps(figures))
        return
    common.report(run(args.waiters, args.presets, args.samples), args.out)


if __name__ == "__main__":
    main()
