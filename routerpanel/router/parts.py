"""What the engine's parts need of each other: the callables and protocols they are built with.

The engine (engine.py) owns its parts and hands each, in its constructor, only what it uses:
the effects (effects.py) carry out decisions, the hang watch (hangs.py) probes busy children,
the inbox (inbox.py) takes one command at a time. They see each other through the protocols
here, never through a class or a private attribute: the hang watch and the inbox see the
effects as an ``Actuator``, the inbox sees the hang watch as a ``Watch``, the reservations
(reservations.py) see the inbox as ``Calls``. This module imports no part, so no part imports
another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from routerpanel.router import commands, supervisor, watchdog
from routerpanel.router.address import ChildAddress
from routerpanel.router.catalogue import Event, ModelStateData
from routerpanel.router.decisions import Decision

Post = Callable[[commands.Command], None]  # into the inbox; never blocks
Prober = Callable[[ChildAddress, float], Awaitable[watchdog.Reading | None]]
Emit = Callable[[Event, Mapping[str, Any]], object]  # publish one event (feed.Feed.publish)
Clock = Callable[[], float]  # monotonic seconds
T = TypeVar("T")


class Actuator(Protocol):
    """The effects, as the hang watch and the inbox use them."""

    @property
    def spawning(self) -> bool:
        """A spawn is in flight (its ``ChildStarted`` or its exit has not come yet)."""
        ...

    def apply(self, out: list[Decision], note: tuple[str, ModelStateData] | None = None) -> None:
        """Carry out decisions in order."""
        ...

    def hung(self, name: str, facts: dict[str, Any]) -> None:
        """Keep what the hang watch found, for the ``model.hung`` event of the kill."""
        ...

    def forget_gone(self) -> None:
        """Drop what is kept of removed presets the scheduler has forgotten (A14)."""
        ...

    def on_log(self, line: supervisor.LogLine) -> None: ...
    def on_started(self, ev: supervisor.ChildStarted) -> None: ...
    def on_state(self, ev: supervisor.ChildState) -> None: ...
    def on_ready(self, ev: supervisor.ChildReady) -> None: ...
    def on_stuck(self, ev: supervisor.ChildStuck) -> None: ...
    def on_exited(self, ev: supervisor.ChildExited) -> None: ...


class Calls(Protocol):
    """The inbox, as the reservations use it: post a command and await its answer."""

    def future(self) -> asyncio.Future[Any]:
        """A future for a command's answer; raises 503 while the engine closes."""
        ...

    async def call(self, command: commands.Command, future: asyncio.Future[T]) -> T:
        """Post ``command`` and await its answer."""
        ...


class Load(Protocol):
    """``Engine.load``, as the lifecycle uses it for load-on-startup (A13)."""

    def __call__(self, model: str, *, actor: str = "") -> Awaitable[None]: ...


class Watch(Protocol):
    """The hang watch, as the inbox uses it."""

    def next_deadline(self) -> float | None:
        """When the next busy child is due a probe; None while nothing is watched."""
        ...

    def probe_due(self, now: float) -> None:
        """Start a probe of every busy child that is due one."""
        ...

    def on_probe(self, done: commands.ProbeDone) -> None:
        """Judge a probe's reading; kill the child if it is hung."""
        ...


def wall_clock(clock: Clock) -> Callable[[float], float]:
    """Return a function that turns a ``clock`` reading into wall-clock seconds."""

    def wall(t: float) -> float:
        return time.time() - (clock() - t)

    return wall
