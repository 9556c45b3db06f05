"""``RouterClient``: what the web side (views, the API, consumers, tasks) calls to reach the router.

It asks one ``RouterTransport`` (transport.py) and knows no other: the in-process one when this
process hosts the router (installed at its start), else the team's (``Placed`` over the nodes'
routers). The typed calls below are ``messages.Call``s with their answers' types.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from channels.layers import BaseChannelLayer

from models_app.routing import transport as transports
from models_app.routing.layer import ROUTER_TIMEOUT
from models_app.routing.messages import (
    Call,
    CancelledAnswer,
    EventPayload,
    MemoryAnswer,
    MetricsAnswer,
    ReadyAnswer,
    ReloadAnswer,
    ReservationsAnswer,
    SnapshotAnswer,
    SuccessAnswer,
)
from models_app.routing.placed import Placed
from models_app.routing.transport import Ask, RouterTransport
from models_app.routing.wire import Grant


class RouterClient:
    """Talk to the router. Cheap to make; one per process is fine.

    ``RouterClient()`` uses the router of this process when there is one (embedded mode) and the
    team's transports over the default channel layer otherwise; ``RouterClient(layer)`` always
    goes over ``layer``; ``node`` binds it to one node's router ("" the unnamed one).
    """

    def __init__(
        self,
        layer: BaseChannelLayer | None = None,
        timeout: float = ROUTER_TIMEOUT,
        node: str | None = None,
        *,
        transport: RouterTransport | None = None,
    ) -> None:
        self._explicit_layer = layer
        self.timeout = timeout
        self.node = node
        team: RouterTransport = Placed(layer, timeout)
        self._team = transport or (team if node is None else team.on_node(node))
        self._own = transport is not None or layer is not None

    @property
    def transport(self) -> RouterTransport:
        """This process's router when it hosts one, else the team's (see class doc)."""
        if not self._own and (local := transports.installed()) is not None:
            return local
        return self._team

    def with_timeout(self, timeout: float) -> RouterClient:
        """The same client with another first-answer deadline."""
        return RouterClient(self._explicit_layer, timeout, self.node)

    def on_node(self, node: str) -> RouterClient:
        """The same client bound to ``node`` ("" the unnamed router)."""
        if node == self.node:
            return self
        return RouterClient(self._explicit_layer, self.timeout, node)

    async def acquire(
        self,
        model: str,
        *,
        actor: str = "",
        autoload: bool = True,
        request_id: str | None = None,
        priority: str = "normal",
        patient: bool = False,
    ) -> Grant:
        """Wait for a lease on ``model``; raise ``RouterError``. Cancelling leaves the queue.

        ``priority``: the key's class (low, normal, high), for the ``fair`` queue policy.
        ``patient``: wait even when every slot is held by pinned models (else 503 at once).
        """
        ask = Ask(model, request_id or uuid.uuid4().hex, actor, autoload, priority, patient)
        return await self.transport.acquire(ask)

    async def call(self, call: Call) -> Mapping[str, Any]:
        """Ask the router something (a ``messages.Call``); return the answer's body.

        Raises ``RouterError`` when it says no and ``router unavailable`` when it does not
        answer in time. The methods below are the same calls, typed with their answers.
        """
        body: Mapping[str, Any] = await self.transport.call(call)
        return body

    async def load(self, model: str, *, actor: str) -> SuccessAnswer:
        body: SuccessAnswer = await self.transport.call(
            {"type": "router.load", "model": model, "actor": actor}
        )
        return body

    async def unload(self, model: str, *, actor: str) -> SuccessAnswer:
        body: SuccessAnswer = await self.transport.call(
            {"type": "router.unload", "model": model, "actor": actor}
        )
        return body

    async def cancel_queued(
        self, *, actor: str, model: str | None = None, queued_request: str | None = None
    ) -> CancelledAnswer:
        """Reject the requests queued for ``model``, or the one queued as ``queued_request``."""
        if model:
            call: Call = {"type": "router.cancel_queued", "actor": actor, "model": model}
        else:
            request = queued_request or ""
            call = {"type": "router.cancel_queued", "actor": actor, "queued_request": request}
        body: CancelledAnswer = await self.transport.call(call)
        return body

    async def reload(self, *, actor: str, sources: bool = False) -> ReloadAnswer:
        call: Call = {"type": "router.reload", "actor": actor, "sources": sources}
        body: ReloadAnswer = await self.transport.call(call)
        return body

    async def set_reservations(
        self, reservations: dict[str, list[str]], *, actor: str
    ) -> ReservationsAnswer:
        """Hand the router the whole current set of reservations (issue 17.6; several hosts:
        placed.py splits it over the nodes)."""
        call: Call = {"type": "router.reservations", "actor": actor, "reservations": reservations}
        body: ReservationsAnswer = await self.transport.call(call)
        return body

    async def snapshot(self) -> SnapshotAnswer:
        body: SnapshotAnswer = await self.transport.call({"type": "router.snapshot"})
        return body

    async def ready(self) -> ReadyAnswer:
        body: ReadyAnswer = await self.transport.call({"type": "router.ready"})
        return body

    async def memory(self) -> MemoryAnswer:
        body: MemoryAnswer = await self.transport.call({"type": "router.memory"})
        return body

    async def metrics(self) -> MetricsAnswer:
        body: MetricsAnswer = await self.transport.call({"type": "router.metrics"})
        return body

    def events(self) -> AsyncIterator[EventPayload]:
        """Router events (``{seq, type, time, data}``) until the caller stops iterating."""
        return self.transport.events()
