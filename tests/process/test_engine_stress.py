"""The engine under random load with real simserver children: live children never exceed 2.

Six client coroutines run seeded random operations (acquire, hold, release; cancellations by task
and by request id; loads; unloads; renewals) against five models with models_max = 2. One model
crashes after three completions (``--sim-crash-after``); one ignores SIGTERM and has no child
protocol, so every stop of it must end in a SIGKILL at its stop-timeout. A thread counts this
process's simserver children every 5 ms with psutil; the maximum must reach 2 and never exceed
it, every model must have run, and after shutdown no simserver of this run may remain anywhere on
the machine. Every request gets exactly one answer, and the answers must be a sane mix: each
operation may get only the answers listed in ANSWERS (rejections with their exact messages), and
mostly the one it is for (INTENDED).
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import re
import sys
import threading
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.catalogue import Event
from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.engine import Engine, EngineEvent, Lease, RouterError
from tests.support.waits import settled

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
        self.seen: set[str] = set()  # the models of the children counted
        self._halt = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._halt.is_set():
            live = 0
            for child in me.children(recursive=True):
                try:
                    cmdline = child.cmdline()
                except psutil.Error:  # gone, or a zombie: its slot is free
                    continue
                ours = [part for part in cmdline if TOKEN in part] if SIMSERVER in cmdline else []
                if ours:  # "-m <TOKEN>-<model>.gguf"
                    live += 1
                    self.seen.add(ours[0].removeprefix(f"{TOKEN}-").removesuffix(".gguf"))
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
    """The random operations. Every request id gets exactly one answer, recorded with the
    operation that sent it: granted, rejected with its status, or cancelled."""

    def __init__(self, engine: Engine, http: httpx.AsyncClient, rng: random.Random) -> None:
        self.engine, self.http, self.rng = engine, http, rng
        self.done = 0
        self.issued: list[str] = []
        self.answers: dict[str, tuple[str, str]] = {}  # request id -> (operation, outcome)
        self.outcomes: collections.Counter[str] = collections.Counter()  # "operation:outcome"
        self.messages: dict[str, set[str]] = collections.defaultdict(set)  # per outcome

    def model(self) -> str:
        return self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]

    def request_id(self) -> str:
        self.issued.append(f"req-{len(self.issued) + 1}")
        return self.issued[-1]

    def answer(self, op: str, rid: str, outcome: str) -> None:
        assert rid not in self.answers, f"{rid} answered twice: {self.answers[rid]}, {outcome}"
        self.answers[rid] = (op, outcome)

    def count(self, op: str, outcome: str, error: RouterError | None = None) -> None:
        self.outcomes[f"{op}:{outcome}"] += 1
        if error is not None:
            self.messages[f"{op}:{outcome}"].add(error.message)

    async def worker(self) -> None:
        ops = [self.use, self.cancel_task, self.cancel_id, self.unload, self.load, self.renew]
        weights = [50, 15, 10, 10, 10, 5]
        while self.done < OPERATIONS:
            self.done += 1
            op = self.rng.choices(ops, weights=weights)[0]
            async with asyncio.timeout(30):  # a hang fails the test, it does not stall it
                await op(self.model())

    async def ask(self, op: str, model: str) -> Lease | None:
        """Acquire under a fresh request id; record its one answer; None when rejected."""
        rid = self.request_id()
        try:
            lease = await self.engine.acquire(model, request_id=rid, actor="stress")
        except RouterError as exc:
            self.answer(op, rid, f"rejected:{exc.status}")
            self.count(op, f"rejected:{exc.status}", exc)
            return None
        self.answer(op, rid, "granted")
        self.count(op, "granted")
        return lease

    async def ask_until_granted(self, model: str) -> Lease:
        """Acquire as a client that honours Retry-After (crashy may be in its crash back-off)."""
        for _ in range(5):
            if (lease := await self.ask("last", model)) is not None:
                return lease
            await asyncio.sleep(2)  # the back-off: 1, 2, 4 s after successive crashes
        raise AssertionError(f"{model} was never granted: {dict(self.messages)}")

    async def use(self, model: str) -> None:
        lease = await self.ask("use", model)
        if lease is None:
            return
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
        await self._settle("cancel_task", rid, task)

    async def cancel_id(self, model: str) -> None:
        rid = self.request_id()
        task = asyncio.create_task(self.engine.acquire(model, request_id=rid))
        await asyncio.sleep(self.rng.uniform(0, 0.05))
        self.engine.cancel(rid)
        await self._settle("cancel_id", rid, task)

    async def _settle(self, op: str, rid: str, task: asyncio.Task[Lease]) -> None:
        await asyncio.wait([task])  # never raises: the task's own end is read below
        error = None if task.cancelled() else task.exception()
        if task.cancelled():
            outcome = "cancelled"
        elif isinstance(error, RouterError):
            outcome = f"rejected:{error.status}"
        elif error is not None:
            raise error
        else:
            outcome = "granted"
            self.engine.release(task.result().lease_id)  # granted before the cancel landed
        self.answer(op, rid, outcome)
        self.count(op, outcome, error if isinstance(error, RouterError) else None)

    async def unload(self, model: str) -> None:
        await self._command("unload", self.engine.unload(model, actor="stress"))

    async def load(self, model: str) -> None:
        await self._command("load", self.engine.load(model, actor="stress"))

    async def _command(self, op: str, call: Awaitable[None]) -> None:
        try:
            await settled(call, 120)  # a load may queue behind every other model
        except RouterError as exc:
            self.count(op, f"rejected:{exc.status}", exc)
        else:
            self.count(op, "done")

    async def renew(self, model: str) -> None:
        lease = await self.ask("renew", model)
        if lease is not None:
            assert self.engine.renew(lease.lease_id)
            self.engine.release(lease.lease_id)


def sigkill_delays(events: list[EngineEvent]) -> list[float]:
    """Seconds from each stop of the deaf model (a Stop, not a Kill) to its SIGKILLed exit."""
    delays, stopped_at = [], None
    for event in events:
        data = event.data
        if data.get("model") != "deaf":
            continue
        if event.type == Event.MODEL_STATE and data["action"] == "stop":
            stopped_at = event.time
        elif event.type == Event.MODEL_EXITED:
            if stopped_at is not None:
                assert data["force_killed"], data
                delays.append(event.time - stopped_at)
            stopped_at = None
    return delays


# What each operation may be answered (anything else is a bug), and the message of each rejection.
ANSWERS = {
    "use": {"granted", "rejected:400", "rejected:503"},
    "renew": {"granted", "rejected:400", "rejected:503"},
    "cancel_task": {"granted", "cancelled", "rejected:400", "rejected:503"},
    "cancel_id": {"granted", "rejected:499", "rejected:400", "rejected:503"},
    "load": {"done", "rejected:400"},
    "unload": {"done", "rejected:400"},
    "last": {"granted", "rejected:503"},
}
REJECTIONS = {
    "rejected:400": r"model name=(m0|m1|m2|crashy|deaf) is not running",  # an unload came first
    "rejected:499": r"the request was cancelled",  # by its id, while it waited
    "rejected:503": r"model name=crashy died soon after it started, .*",  # its crash back-off
    # already up; or queued behind its stopping instance when an unload rejected its waiters
    "load:rejected:400": r"model is already running|model name=(m0|m1|m2|crashy|deaf) is not "
    r"running",
    "unload:rejected:400": r"model is not running",
}
# The least share of each operation's answers that must be the intended one: a router that
# rejects or ignores most of what it is asked fails here, whatever its peak of children.
# A renew is an acquire like a use (then a renew and a release): the two are counted together.
# Renews alone are 5% of the mix, about 20 answers a run, too few for a share of their own (a CI
# run saw 11 of 16 granted, 69%, while 88% of that run's uses were).
INTENDED = {
    ("use", "renew"): ("granted", 0.85),
    ("cancel_task",): ("cancelled", 0.5),
    ("cancel_id",): ("rejected:499", 0.5),
    ("load",): ("done", 0.5),
    ("unload",): ("done", 0.15),  # most unloads find their model not running: 400
}


def check_the_mix(outcomes: collections.Counter[str], messages: dict[str, set[str]]) -> None:
    """Assert that every answer is one its operation may get, with the right message, and that
    each operation mostly did what it was for."""
    for key in outcomes.keys() - {"http_error"}:
        op, outcome = key.split(":", 1)
        assert outcome in ANSWERS[op], f"{key}: {sorted(messages.get(key, ()))}"
    for key, texts in messages.items():
        pattern = REJECTIONS.get(key) or REJECTIONS[key.split(":", 1)[1]]
        assert all(re.fullmatch(pattern, text) for text in texts), (key, texts)
    for ops, (intended, least) in INTENDED.items():
        total = sum(n for key, n in outcomes.items() if key.split(":", 1)[0] in ops)
        share = sum(outcomes[f"{op}:{intended}"] for op in ops) / total if total else 0.0
        what = " and ".join(ops)
        assert share >= least, f"only {share:.0%} of {total} {what} answers were {intended}"


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
            lease = await clients.ask_until_granted("crashy")
            for _ in range(4):  # --sim-crash-after 3: at most the 4th request finds it gone
                await clients.complete(lease.port)
            engine.release(lease.lease_id)
            lease = await clients.ask_until_granted("deaf")
            engine.release(lease.lease_id)
            await engine.unload("deaf")
            await engine.until_idle()
            left = engine.snapshot()
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
        f"{DEAF_STOP_TIMEOUT} s)\nrejections={dict(clients.messages)}"
    )
    assert clients.done >= 500
    assert sorted(clients.answers) == sorted(clients.issued)  # each exactly once (answer())
    assert left["queue"] == []  # nobody is left waiting, and no lease in flight:
    assert {m["name"]: m["in_flight"] for m in left["models"]} == dict.fromkeys(WEIGHTS, 0)
    check_the_mix(clients.outcomes, clients.messages)
    assert counter.samples > 1000
    assert (counter.max, counter.seen) == (MODELS_MAX, set(WEIGHTS))  # reached, never passed
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert leftovers() == [], "simserver processes survived shutdown"
    assert delays, "the deaf model was never stopped while loaded"
    assert all(abs(d - DEAF_STOP_TIMEOUT) <= 0.5 for d in delays), delays
    crashes = [e.data for e in events if e.type == Event.MODEL_EXITED and e.data["exit_code"] == 3]
    unasked = [c for c in crashes if not c["expected"]]  # a crash racing our stop is an unload
    # After it the model is failed; or loading again, when requests were queued for it and no
    # crash-loop back-off applied (A6 spawns the queue's head in the same step); or unloaded,
    # when the child died and was reaped just before the engine decided to stop it (the exit is
    # then the end of that stop, though the supervisor had not asked for it).
    after = ("failed", "loading", "unloaded")
    assert unasked and all(
        not c["clean"] and c["state_before"] == "loaded" and c["state"] in after for c in unasked
    ), [(c["state_before"], c["state"], c["clean"]) for c in crashes]
