"""The engine under random load with real simserver children: live children never exceed 2.

Six client coroutines run seeded random operations (acquire, hold, release; cancellations by task
and by request id; loads; unloads; renewals) against five models with models_max = 2. One model
crashes after three completions (``--sim-crash-after``); one ignores SIGTERM and has no child
protocol, so every stop of it must end in a SIGKILL at its stop-timeout. A thread counts this
process's simserver children every 5 ms with psutil; the maximum must never exceed 2, and after
shutdown no simserver of this run may remain anywhere on the machine.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.engine import Engine, EngineEvent, RouterError

PROJECT = Path(__file__).resolve().parents[2]
SEED = 20261130
OPERATIONS = 520
WORKERS = 6
MODELS_MAX = 2
DEAF_STOP_TIMEOUT = 1.0
TOKEN = f"stress{os.getpid()}"  # in every child's argv: finds orphans anywhere
SIMSERVER = "routerpanel.router.simserver"
WEIGHTS = {"m0": 0.3, "m1": 0.25, "m2": 0.2, "crashy": 0.15, "deaf": 0.1}


def sim(name: str, *flags: str) -> tuple[str, ...]:
    return (
        sys.executable, "-m", SIMSERVER, "-m", f"{TOKEN}-{name}.gguf",
        "--sim-load-ms", "20", "--sim-rss-mb", "4", *flags,
    )  # fmt: skip


def presets() -> list[PresetSpec]:
    plain = [PresetSpec(name=n, argv=sim(n), stop_timeout=5.0) for n in ("m0", "m1", "m2")]
    crashy = PresetSpec(name="crashy", argv=sim("crashy", "--sim-crash-after", "3"))
    deaf = PresetSpec(
        name="deaf",
        argv=sim("deaf", "--sim-ignore-sigterm"),
        speaks_child_protocol=False,  # readiness by /health, stop by SIGTERM: ignored (S4)
        stop_timeout=DEAF_STOP_TIMEOUT,
    )
    return [*plain, crashy, deaf]


class LiveCounter(threading.Thread):
    """Count this test's live simserver children every 5 ms; zombies are not live.

    Only children carrying this run's TOKEN count: a process another test left behind in this
    pytest process must not be blamed on the engine (nor hide behind it).
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.max = self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._halt.is_set():
            live = 0
            for child in me.children(recursive=True):
                try:
                    cmdline = child.cmdline()
                    live += SIMSERVER in cmdline and any(TOKEN in part for part in cmdline)
                except psutil.Error:  # gone, or a zombie: its slot is free
                    continue
            self.max = max(self.max, live)
            self.samples += 1
            time.sleep(0.005)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def leftovers() -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(TOKEN in part for part in cmdline):
            found.append(proc.pid)
    return found


class Clients:
    """The random operations; each one counts, whatever its outcome."""

    def __init__(self, engine: Engine, http: httpx.AsyncClient, rng: random.Random) -> None:
        self.engine, self.http, self.rng = engine, http, rng
        self.done = 0
        self.ids = 0
        self.outcomes: collections.Counter[str] = collections.Counter()

    def model(self) -> str:
        return self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]

    def request_id(self) -> str:
        self.ids += 1
        return f"req-{self.ids}"

    async def worker(self) -> None:
        ops = [self.use, self.cancel_task, self.cancel_id, self.unload, self.load, self.renew]
        weights = [50, 15, 10, 10, 10, 5]
        while self.done < OPERATIONS:
            self.done += 1
            op = self.rng.choices(ops, weights=weights)[0]
            try:
                async with asyncio.timeout(30):  # a hang fails the test, it does not stall it
                    await op(self.model())
                self.outcomes[op.__name__] += 1
            except RouterError as exc:
                self.outcomes[f"{op.__name__}:{exc.status}"] += 1

    async def use(self, model: str) -> None:
        lease = await self.engine.acquire(model, request_id=self.request_id(), actor="stress")
        try:
            if model == "crashy" or self.rng.random() < 0.3:
                await self.complete(lease.port)
            await asyncio.sleep(self.rng.uniform(0, 0.03))
        finally:
            self.engine.release(lease.lease_id)

    async def complete(self, port: int) -> None:
        body = {"prompt": "hi", "max_tokens": 4}
        try:
            await self.http.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
        except httpx.HTTPError:  # crashed, or stopped by a concurrent unload
            self.outcomes["http_error"] += 1

    async def cancel_task(self, model: str) -> None:
        rid = self.request_id()
        task = asyncio.create_task(self.engine.acquire(model, request_id=rid))
        await asyncio.sleep(self.rng.uniform(0, 0.05))
        task.cancel()
        await self._settle(task)

    async def cancel_id(self, model: str) -> None:
        rid = self.request_id()
        task = asyncio.create_task(self.engine.acquire(model, request_id=rid))
        await asyncio.sleep(self.rng.uniform(0, 0.05))
        self.engine.cancel(rid)
        await self._settle(task)

    async def _settle(self, task: asyncio.Task[Any]) -> None:
        try:
            lease = await task
        except (asyncio.CancelledError, RouterError):
            return
        self.engine.release(lease.lease_id)  # granted before the cancel landed

    async def unload(self, model: str) -> None:
        await self.engine.unload(model, actor="stress")

    async def load(self, model: str) -> None:
        await self.engine.load(model, actor="stress")

    async def renew(self, model: str) -> None:
        lease = await self.engine.acquire(model, request_id=self.request_id())
        assert self.engine.renew(lease.lease_id)
        self.engine.release(lease.lease_id)


def sigkill_delays(events: list[EngineEvent]) -> list[float]:
    """Seconds from each stop of the deaf model (a Stop, not a Kill) to its SIGKILLed exit."""
    delays, stopped_at = [], None
    for event in events:
        data = event.data
        if data.get("model") != "deaf":
            continue
        if event.type == "model.state" and data["action"] == "stop":
            stopped_at = event.time
        elif event.type == "model.exited":
            if stopped_at is not None:
                assert data["force_killed"], data
                delays.append(event.time - stopped_at)
            stopped_at = None
    return delays


@pytest.fixture
def counter() -> Iterator[LiveCounter]:
    sampler = LiveCounter()
    sampler.start()
    yield sampler
    sampler.stop()


async def test_live_children_never_exceed_models_max_under_random_load(
    tmp_path: Path, counter: LiveCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(PROJECT)  # children import routerpanel from the working directory
    config = RouterConfig(models_max=MODELS_MAX, lease_ttl=30.0)
    engine = Engine(config, presets(), state_file=tmp_path / "children.json", memory_interval=0.5)
    events: list[EngineEvent] = []
    sub = engine.subscribe(maxsize=1_000_000)

    async def collect() -> None:
        async for event in sub:
            events.append(event)

    collector = asyncio.create_task(collect())
    started = time.monotonic()
    await engine.start()
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            clients = Clients(engine, http, random.Random(SEED))
            await asyncio.gather(*(clients.worker() for _ in range(WORKERS)))
            # Certainly one crash while serving, and one stop of the deaf model while loaded.
            lease = await engine.acquire("crashy", request_id="crash-last")
            for _ in range(4):  # --sim-crash-after 3: at most the 4th request finds it gone
                await clients.complete(lease.port)
            engine.release(lease.lease_id)
            lease = await engine.acquire("deaf", request_id="deaf-last")
            engine.release(lease.lease_id)
            await engine.unload("deaf")
    finally:
        await engine.shutdown()
    elapsed = time.monotonic() - started
    await asyncio.wait_for(collector, 10)
    counter.stop()

    delays = sigkill_delays(events)
    print(
        f"\noperations={clients.done} max_live={counter.max} samples={counter.samples} "
        f"elapsed={elapsed:.1f}s events={len(events)}\noutcomes={dict(clients.outcomes)}\n"
        f"deaf SIGKILL after stop: {[round(d, 3) for d in delays]} (stop-timeout "
        f"{DEAF_STOP_TIMEOUT} s)"
    )
    assert clients.done >= 500
    assert counter.samples > 1000
    assert counter.max <= MODELS_MAX
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert leftovers() == [], "simserver processes survived shutdown"
    assert delays, "the deaf model was never stopped while loaded"
    assert all(abs(d - DEAF_STOP_TIMEOUT) <= 0.5 for d in delays), delays
    crashes = [e.data for e in events if e.type == "model.exited" and e.data["exit_code"] == 3]
    unasked = [c for c in crashes if not c["expected"]]  # a crash racing our stop is an unload
    assert unasked and all(not c["clean"] and c["state"] == "failed" for c in unasked), crashes
