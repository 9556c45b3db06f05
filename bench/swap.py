"""Measure a forced model swap through the engine, with simserver children and models_max = 2.

    .venv/bin/python bench/swap.py --swaps 50

Three simulated models, two slots: every acquire goes to the model that is not running, so the
engine must stop the least recently used one, wait for its exit (A6) and spawn the requested one.
At the end it prints median and p95 of:

(a) scheduling overhead: the victim's exit observed -> the replacement's spawn started. Both
    stamps come from a thin ``Supervisor`` subclass passed as ``supervisor_factory``: (1) when
    the supervisor posts ``ChildExited`` into the engine's inbox (the process is reaped and its
    pipes drained), (2) when the engine calls ``Supervisor.spawn`` for the replacement. Between
    them lies only engine work: the inbox hop, the scheduler, and applying its decisions.
(b) time to first byte of the swapping request minus the child's own load time: from calling
    ``engine.acquire`` to the first byte of a streamed ``/v1/completions`` answer from the new
    child, minus ``ChildReady.load_seconds`` (the supervisor's process created -> ready, which
    includes the child's interpreter start-up and its --sim-load-ms). What is left: the victim's
    stop, the overhead (a), the fork/exec, the grant and the first HTTP round trip.

Also shown for context: the victim's stop (stop asked -> exit posted) and spawn() -> process
created (fork/exec). Stamps are ``time.monotonic()``, the clock of asyncio's loop. Run it on an
otherwise idle machine for numbers worth comparing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.engine import Engine
from routerpanel.router.supervisor import (
    ChildExited,
    ChildReady,
    ChildStarted,
    Supervisor,
    SupervisorEvent,
)

MODELS = ("alpha", "beta", "gamma")


class StampingSupervisor(Supervisor):
    """The real supervisor, stamping exits posted, spawns called and children ready."""

    def __init__(self, post: Callable[[SupervisorEvent], None]) -> None:
        super().__init__(self._stamp, state_file=None)
        self._forward = post
        self.last_exit: float | None = None
        self.overheads: list[float] = []  # (a)
        self.exec_times: list[float] = []  # spawn() called -> ChildStarted
        self.stop_times: list[float] = []  # stop() -> ChildExited posted
        self.load_seconds: dict[str, float] = {}
        self._spawn_at: dict[str, float] = {}
        self._stop_at: dict[str, float] = {}

    def _stamp(self, event: SupervisorEvent) -> None:
        now = time.monotonic()
        if isinstance(event, ChildExited):
            self.last_exit = now
            if (asked := self._stop_at.pop(event.name, None)) is not None:
                self.stop_times.append(now - asked)
        elif isinstance(event, ChildStarted) and event.name in self._spawn_at:
            self.exec_times.append(now - self._spawn_at.pop(event.name))
        elif isinstance(event, ChildReady):
            self.load_seconds[event.name] = event.load_seconds
        self._forward(event)

    async def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], **options: Any
    ) -> int:
        """Stamp, then the real spawn with whatever options the engine passes."""
        now = time.monotonic()
        if self.last_exit is not None:
            self.overheads.append(now - self.last_exit)
            self.last_exit = None
        self._spawn_at[name] = now
        return int(await super().spawn(name, argv, env, **options))

    def stop(self, name: str, stop_timeout: float) -> bool:
        self._stop_at.setdefault(name, time.monotonic())
        return super().stop(name, stop_timeout)


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p95 = statistics.quantiles(ms, n=20, method="inclusive")[18] if len(ms) > 1 else ms[0]
    return f"{label:<52} median {statistics.median(ms):8.2f} ms   p95 {p95:8.2f} ms   (n={len(ms)})"


async def first_byte(http: httpx.AsyncClient, port: int) -> None:
    body = {"prompt": "hi", "max_tokens": 4, "stream": True}
    url = f"http://127.0.0.1:{port}/v1/completions"
    async with http.stream("POST", url, json=body) as response:
        async for _ in response.aiter_raw():
            return


FIGURES = {
    "overhead": "(a) victim exit observed -> replacement spawn()",
    "ttfb": "(b) swap request first byte - child load time",
    "stop": "    victim stop: stop() -> exit observed",
    "exec": "    spawn() -> process created (fork/exec)",
}


async def measure(swaps: int, load_ms: int, rss_mb: int) -> dict[str, list[float]]:
    """Run ``swaps`` forced swaps; return seconds per figure (keys of FIGURES)."""
    flags = ("--sim-load-ms", str(load_ms), "--sim-rss-mb", str(rss_mb))
    specs = [
        PresetSpec(name=n, argv=(sys.executable, "-m", "routerpanel.router.simserver",
                                 "-m", f"{n}.gguf", *flags))
        for n in MODELS
    ]  # fmt: skip
    holder: list[StampingSupervisor] = []

    def factory(post: Callable[[SupervisorEvent], None]) -> Supervisor:
        holder.append(StampingSupervisor(post))
        return holder[0]

    engine = Engine(RouterConfig(models_max=2), specs, supervisor_factory=factory)  # sampling on
    sup = holder[0]
    await engine.start()
    ttfb: list[float] = []
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            for i in range(swaps + 2):  # the first two only fill the slots
                running = {m["name"] for m in engine.snapshot()["models"] if m["pid"]}
                target = next(n for n in MODELS if n not in running)
                started = time.monotonic()
                lease = await engine.acquire(target, request_id=f"swap-{i}")
                await first_byte(http, lease.port)
                elapsed = time.monotonic() - started
                engine.release(lease.lease_id)
                if i >= 2:
                    ttfb.append(elapsed - sup.load_seconds[target])
    finally:
        await engine.shutdown()
    return {
        "overhead": sup.overheads[-swaps:],
        "ttfb": ttfb,
        "stop": sup.stop_times[-swaps:],
        "exec": sup.exec_times[-swaps:],
    }


async def run(args: argparse.Namespace) -> None:
    results = await measure(args.swaps, args.load_ms, args.rss_mb)
    print(f"{args.swaps} forced swaps, models_max=2, --sim-load-ms {args.load_ms}")
    for key, label in FIGURES.items():
        print(summary(label, results[key]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--swaps", type=int, default=50, help="forced swaps to time (50)")
    parser.add_argument("--load-ms", type=int, default=100, help="simulated load time (100)")
    parser.add_argument("--rss-mb", type=int, default=16, help="memory each child holds (16)")
    args: Any = parser.parse_args(argv)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
