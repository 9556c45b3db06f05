"""The engine's state and the helpers every layer of it uses (the engine is built in layers).

``EngineBase`` holds everything the engine owns — the scheduler, the supervisor, the callers'
book, the feed, the facts, the timer, the watchdog — created once; the layers above add one
concept each: ``effects.Effects`` carries out decisions and mirrors the supervisor's reports,
``hangs.HangWatch`` runs the hang watchdog, ``inbox.Inbox`` is the owner loop that takes one
command at a time, and ``engine.Engine`` is the public API. One asyncio loop owns all of it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from routerpanel.router import commands, payloads, probe, supervisor, watchdog
from routerpanel.router.address import ChildAddress
from routerpanel.router.callers import Callers
from routerpanel.router.catalogue import Event
from routerpanel.router.config import PresetSpec, RouterConfig, preset_map
from routerpanel.router.facts import Facts
from routerpanel.router.feed import Feed
from routerpanel.router.preflight import Checks, Preflight
from routerpanel.router.preflight import check as preflight_check
from routerpanel.router.scheduler import Scheduler
from routerpanel.router.states import RUNNING
from routerpanel.router.timer import Timer

log = logging.getLogger(__name__)
Post = Callable[[supervisor.SupervisorEvent], None]
Prober = Callable[[ChildAddress, float], Awaitable[watchdog.Reading | None]]


class EngineBase:
    """What the engine owns (see module doc). Not used alone: ``engine.Engine`` is the router."""

    def __init__(
        self,
        config: RouterConfig,
        presets: Iterable[PresetSpec],
        *,
        state_file: Path | None = None,
        memory_interval: float | None = 1.0,
        clock: Callable[[], float] = time.monotonic,
        supervisor_factory: Callable[[Post], supervisor.Supervisor] | None = None,
        router_port: int = 0,
        prober: Prober = probe.read_slots,
        preflight: Preflight = preflight_check,
    ) -> None:
        self._config = config
        self._specs = preset_map(presets)
        self._retired: dict[str, PresetSpec] = {}  # removed presets whose child still runs
        self._aliases = alias_map(self._specs)
        self._scheduler = Scheduler(self._specs.values(), config)
        self._clock = clock
        self._state_file = state_file
        self._memory_interval = memory_interval
        self._supervisor = (
            supervisor_factory(self._post)
            if supervisor_factory is not None
            else supervisor.Supervisor(self._post, state_file=state_file, router_port=router_port)
        )
        self._inbox: asyncio.Queue[commands.Command] = asyncio.Queue()
        self._feed = Feed()
        self._request_rows = payloads.RequestRows()  # queued requests' rows, made once each
        self._facts = Facts(math.ceil(3600 / memory_interval) if memory_interval else 3600)
        self._callers = Callers()
        self._spawning: dict[str, asyncio.Task[None]] = {}  # until ChildStarted or the exit
        self._kill_on_start: set[str] = set()  # Kill decided while the spawn was in flight
        self._timer = Timer(clock, self._post)
        self._watchdog = watchdog.Watchdog()
        self._prober = prober
        self._checks = Checks(preflight)  # which models cannot start (preflight.py)
        self._hangs: dict[str, dict[str, Any]] = {}  # model -> the verdict's facts, until killed
        self._tickets: set[int] = set()  # queue entries already published (queue.changed)
        self._probes: set[asyncio.Task[None]] = set()
        self._preloads: set[asyncio.Task[None]] = set()  # reservations' loads in advance
        self._sample_soon = asyncio.Event()
        self._drained = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop_task: asyncio.Task[None] | None = None
        self._handling = False  # a command is being handled now (Inbox._submit)
        self._shutdown_task: asyncio.Future[None] | None = None
        self._closing = False

    def _post(self, command: commands.Command) -> None:
        """Enqueue; never blocks (the supervisor calls it from inside stop() and kill())."""
        self._inbox.put_nowait(command)

    def _emit(self, type_: Event, data: Mapping[str, Any]) -> None:
        self._feed.publish(type_, data)

    def _wall(self, t: float) -> float:
        return time.time() - (self._clock() - t)

    def _spec(self, name: str) -> PresetSpec | None:
        return self._specs.get(name) or self._retired.get(name)

    def _running(self) -> bool:
        return any(view.state in RUNNING for view in self._scheduler.models())

    def _servable(self, name: str) -> bool:
        return self._scheduler.servable(name)  # one answer: the scheduler's (draining included)

    def _forget_gone(self) -> None:
        """Drop what we keep of removed presets once the scheduler has forgotten them (A14)."""
        known = {view.name for view in self._scheduler.models()}
        for name in [n for n in self._retired if n not in known]:
            del self._retired[name]
            self._facts.forget(name)
            self._supervisor.forget_logs(name)


def alias_map(specs: dict[str, PresetSpec]) -> dict[str, str]:
    return {alias: spec.name for spec in specs.values() for alias in spec.aliases}
