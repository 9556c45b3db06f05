"""Engine test helpers: a fake clock, a recording fake supervisor, and the ``h`` harness fixture.

The test plays the children: ``sup.ready(name)`` and ``sup.exit(name)`` post what the real
supervisor would, and ``await engine.until_idle()`` waits until the engine has handled it
(STYLE 9). Time moves only when a test calls ``clock.advance``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from routerpanel.router.catalogue import Event
from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.engine import Engine, EngineEvent, Lease
from routerpanel.router.parts import Prober
from routerpanel.router.preflight import Preflight
from routerpanel.router.preflight import never as preflight_never
from routerpanel.router.supervisor import (
    ChildExited,
    ChildInfo,
    ChildReady,
    ChildStarted,
    LogLine,
    SpawnError,
    Supervisor,
)
from tests.support.waits import settled


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeSupervisor(Supervisor):
    """Record spawn/stop/kill; the test decides when children get ready or exit."""

    def __init__(self, post: Any) -> None:
        super().__init__(post, state_file=None)
        self.post = post
        self.calls: list[tuple[Any, ...]] = []
        self.children: dict[str, int] = {}
        self.next_pid = 100
        self.hold: asyncio.Event | None = None  # set: spawn() waits for it
        self.fail_spawn: set[str] = set()

    async def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        child_protocol: bool,
        load_timeout: float | None,
        host: str = "127.0.0.1",
        keyed: bool = False,
    ) -> int:
        self.calls.append(("spawn", name))
        if self.hold is not None:
            await self.hold.wait()
        if name in self.fail_spawn:
            raise SpawnError("failed to spawn server instance: no such file")
        self.next_pid += 1
        self.children[name] = self.next_pid
        key = f"key-{name}-{self.next_pid}" if keyed else None  # new with every spawn
        self.post(ChildStarted(name, self.next_pid, self.port(name), 1, host, key))
        return self.next_pid

    def stop(self, name: str, stop_timeout: float) -> bool:
        self.calls.append(("stop", name, stop_timeout))
        return name in self.children

    def kill(self, name: str) -> bool:
        self.calls.append(("kill", name))
        return name in self.children

    def live(self) -> dict[str, ChildInfo]:
        return {}

    async def shutdown(self, stop_timeout: float | Mapping[str, float] = 10.0) -> None:
        for name in list(self.children):
            self.exit(name, code=None, signal=9)

    # ---- what the test plays --------------------------------------------------------------

    @staticmethod
    def port(name: str) -> int:
        return 9000 + sum(map(ord, name)) % 500

    def ready(self, name: str) -> None:
        self.post(ChildReady(name, self.port(name), {"id": name}, 0.25))

    def exit(self, name: str, code: int | None = 0, signal: int | None = None) -> None:
        pid = self.children.pop(name)
        expected = any(c[0] in ("stop", "kill") and c[1] == name for c in self.calls)
        line = LogLine(name, "stderr", "bye", 0.0)
        self.post(
            ChildExited(name, pid, self.port(name), code, signal, 1.0, expected, False, True, None,
                        None if expected else "crashed", (line,))
        )  # fmt: skip

    def spawned(self) -> list[str]:
        return [c[1] for c in self.calls if c[0] == "spawn"]

    def stopped(self) -> list[str]:
        """Models asked to stop gracefully (the exit command, then SIGKILL at the deadline)."""
        return [c[1] for c in self.calls if c[0] == "stop"]

    def killed(self) -> list[str]:
        """Models SIGKILLed at once (S4: a loading child; a hung one)."""
        return [c[1] for c in self.calls if c[0] == "kill"]


def preset(name: str, **kw: Any) -> PresetSpec:
    return PresetSpec(name=name, argv=("llama-server", "-m", f"/m/{name}.gguf"), **kw)


class Harness:
    def __init__(self, engine: Engine, sup: FakeSupervisor, clock: FakeClock) -> None:
        self.engine, self.sup, self.clock = engine, sup, clock
        self.events: list[EngineEvent] = []
        self.rid = 0
        self.tasks: list[asyncio.Task[Lease]] = []

    async def idle(self) -> None:
        await self.engine.until_idle()

    def acquire(self, model: str, **kw: Any) -> asyncio.Task[Lease]:
        self.rid += 1
        kw.setdefault("request_id", f"r{self.rid}")
        self.tasks.append(asyncio.create_task(self.engine.acquire(model, **kw)))
        return self.tasks[-1]

    async def warm(self, *names: str) -> None:
        """Bring each model up and leave it idle (a slot must be free)."""
        for name in names:
            await self.engine.load(name)
            self.sup.ready(name)
            await self.idle()

    async def exit(self, name: str, code: int | None = 0) -> None:
        self.sup.exit(name, code)
        await self.idle()

    def of(self, type_: Event) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.type == type_]

    def model(self, name: str) -> dict[str, Any]:
        return next(m for m in self.engine.snapshot()["models"] if m["name"] == name)


async def make(
    *models: str | PresetSpec,
    start: bool = True,
    clock: FakeClock | None = None,
    prober: Prober | None = None,
    preflight: Preflight = preflight_never,
    **config: Any,
) -> tuple[Engine, FakeSupervisor, FakeClock]:
    """An engine over a fake supervisor and clock (``config``: RouterConfig's fields)."""
    clock = clock or FakeClock()
    sups: list[FakeSupervisor] = []

    def factory(post: Any) -> Supervisor:
        sups.append(FakeSupervisor(post))
        return sups[0]

    specs = [m if isinstance(m, PresetSpec) else preset(m) for m in models]
    probing = {"prober": prober} if prober is not None else {}
    engine = Engine(
        RouterConfig(**config), specs, memory_interval=None, clock=clock,
        supervisor_factory=factory, preflight=preflight, **probing,
    )  # fmt: skip
    if start:
        await engine.start()
    return engine, sups[0], clock


async def turns(rounds: int = 50) -> None:
    """Let the event loop go round: on a frozen clock whatever is due runs, and nothing else."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def shut_down(h: Harness) -> None:
    """Shut the engine down, playing its children's exits, without a real-time timeout."""
    shutdown = asyncio.create_task(h.engine.shutdown())
    await h.idle()
    for name in list(h.sup.children):
        h.sup.exit(name)
    await turns()
    assert shutdown.done()
    await settled(shutdown)


@pytest.fixture
async def h(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    args, kw = getattr(request, "param", (("a", "b", "c"), {"models_max": 2}))
    engine, sup, clock = await make(*args, start=False, **kw)
    harness = Harness(engine, sup, clock)
    sub = engine.subscribe(maxsize=100_000)

    async def collect() -> None:
        async for event in sub:
            harness.events.append(event)

    collector = asyncio.create_task(collect())
    await engine.start()
    await harness.idle()
    yield harness
    sup_children = list(sup.children)
    shutdown = asyncio.create_task(engine.shutdown())
    await harness.idle()
    for name in sup_children:
        if name in sup.children:
            sup.exit(name)
    await asyncio.wait_for(shutdown, 5)
    await asyncio.wait_for(collector, 5)
    await asyncio.gather(*harness.tasks, return_exceptions=True)


def engine_config(*models: str | PresetSpec, **config: Any) -> pytest.MarkDecorator:
    """Run the test on an engine with these presets and settings (default a, b, c; max 2)."""
    return pytest.mark.parametrize("h", [(models, config)], indirect=True, ids=["config"])
