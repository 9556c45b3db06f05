"""The web side's one interface to the router, and its in-process implementation.

``RouterTransport`` is what a web process asks; three implementations answer it
(docs/architecture.md): ``InProcess`` here (embedded mode: the engine runs in this process),
``linked.Linked`` (team mode: leases over the router's socket) and ``layer.Layer`` (team mode:
the channel layer), with ``placed.Placed`` spreading requests over several nodes' transports.
The process's router host installs its ``InProcess`` when it starts (``install``); otherwise a
client uses the team transports. Nothing else knows which one answers.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from models_app.routing import wire
from models_app.routing.messages import AnswerBody, Call, EventPayload
from routerpanel.router.errors import RouterError, unavailable

if TYPE_CHECKING:
    from routerpanel.router.engine import Engine

T = TypeVar("T")


@dataclass(frozen=True)
class Ask:
    """A request for a lease on ``model`` (``priority``: the key's class, for the ``fair``
    policy; ``patient``: wait even when every slot is held by pinned models)."""

    model: str
    request_id: str
    actor: str = ""
    autoload: bool = True
    priority: str = "normal"
    patient: bool = False


class RouterTransport(Protocol):
    """How this process reaches the router: a lease, a call, the events."""

    async def acquire(self, ask: Ask) -> wire.Grant:
        """Wait for a lease; raise ``RouterError``. Cancelling leaves the queue."""
        ...

    async def call(self, call: Call) -> Any:
        """The body of ``call``'s answer (its type per messages.py); raise ``RouterError``."""
        ...

    def events(self) -> AsyncIterator[EventPayload]: ...

    def on_node(self, node: str) -> RouterTransport:
        """The same transport bound to one node's router ("" the unnamed one)."""
        ...


class LocalRouter(Protocol):
    """What the router host offers to a web side in the same process (worker.RouterHost)."""

    engine: Engine | None
    boot: str
    loop: asyncio.AbstractEventLoop | None

    async def call(self, call: Call) -> AnswerBody: ...


class InProcess:
    """Embedded mode: call the engine directly — no channel-layer hop, no message a full
    channel could refuse (a burst queues in the engine), no lease renewals (a lease held by
    this process cannot outlive it); progress goes straight to the engine's hang watchdog."""

    def __init__(self, host: LocalRouter) -> None:
        self.host = host

    def _engine(self) -> Engine:
        engine = self.host.engine
        if engine is None:
            raise unavailable("router unavailable", wire.RETRY_AFTER)
        return engine

    async def acquire(self, ask: Ask) -> wire.Grant:
        engine = self._engine()
        loop = self.host.loop
        if loop is None or loop is asyncio.get_running_loop():  # the engine's own loop
            now = engine.grant_now(
                ask.model, request_id=ask.request_id, actor=ask.actor, priority=ask.priority
            )
            if now is not None:  # a loaded model, nothing queued: the hot path (issue 16.5)
                return wire.Grant(now, math.inf, self.host.boot, self)
        lease = await self._on_loop(
            engine.acquire(
                ask.model,
                request_id=ask.request_id,
                actor=ask.actor,
                autoload=ask.autoload,
                renewable=False,
                priority=ask.priority,
                patient=ask.patient,
            )
        )
        return wire.Grant(lease, math.inf, self.host.boot, self)

    async def renew(self, grant: wire.Grant, idle: float | None) -> None:
        """Nothing to renew: an in-process lease never expires."""

    async def release(self, grant: wire.Grant) -> None:
        if (engine := self.host.engine) is not None:
            engine.release(grant.lease_id)

    def progress_of(self, grant: wire.Grant) -> Callable[[], None] | None:
        engine = self.host.engine
        return None if engine is None else functools.partial(engine.progress, grant.lease_id)

    async def why_ended(self, grant: wire.Grant) -> RouterError | None:
        engine = self.host.engine
        return None if engine is None else engine.why_ended(grant.lease_id)

    async def call(self, call: Call) -> Any:
        return await self._on_loop(self.host.call(call))

    async def events(self) -> AsyncIterator[EventPayload]:
        async with self._engine().subscribe(maxsize=10_000) as events:
            async for event in events:
                yield {"seq": event.seq, "type": event.type, "time": event.time,
                       "data": event.data}  # fmt: skip

    def on_node(self, node: str) -> RouterTransport:
        return self  # one router: this process's

    async def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the router's loop: the engine must only be touched from there."""
        loop = self.host.loop
        if loop is None or loop is asyncio.get_running_loop():
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))


_installed: InProcess | None = None


def install(host: LocalRouter | None) -> None:
    """This process's router host (None when it stops): clients use it directly."""
    global _installed
    _installed = None if host is None else InProcess(host)


def installed() -> InProcess | None:
    """The in-process transport, while its engine runs."""
    local = _installed
    return local if local is not None and local.host.engine is not None else None
