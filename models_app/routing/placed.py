"""Several hosts (issue 18): spread a team's requests over the nodes' routers.

``Placed`` is a transport over one ``Linked`` transport per node. A request goes to the node
``nodes.place_claimed`` picks (the unnamed router when no node beats) and is placed once more if
that node was lost before it answered. A call without a model goes to every live node: snapshots
merge, metrics gain a ``node`` label; reservations are split, each reserved model to the one node
placement picks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from models_app.routing import nodes, wire
from models_app.routing.layer import Layer
from models_app.routing.linked import Linked
from models_app.routing.messages import Call, EventPayload, ReservationsAnswer
from routerpanel.router.errors import RouterError, unavailable

if TYPE_CHECKING:
    from channels.layers import BaseChannelLayer

    from models_app.routing.transport import Ask, RouterTransport

log = logging.getLogger(__name__)


class Placed:
    """The team's routers, one ``Linked`` per node, created on first use."""

    def __init__(self, layer: BaseChannelLayer | None, timeout: float) -> None:
        self._layer = layer
        self.timeout = timeout
        self._nodes: dict[str, Linked] = {}

    def on_node(self, node: str) -> RouterTransport:
        transport = self._nodes.get(node)
        if transport is None:
            transport = self._nodes[node] = Linked(Layer(self._layer, node, self.timeout))
        return transport

    async def _place(self, model: str | None, found: list[nodes.Node]) -> RouterTransport:
        try:
            return self.on_node(await nodes.place_claimed(model, found))
        except nodes.NoPlace as exc:
            raise unavailable(str(exc), wire.RETRY_AFTER) from None

    async def acquire(self, ask: Ask) -> wire.Grant:
        found = await nodes.known()
        if not found:  # one router: the unnamed one
            return await self.on_node("").acquire(ask)
        placed = await self._place(ask.model, found)
        try:
            return await placed.acquire(ask)
        except RouterError as exc:
            # Placed on a node that was lost before it answered: place it once more, on a node
            # that lives (the model's preset may run elsewhere), instead of failing it.
            node = getattr(placed, "node", "")
            if exc.status != 503 or not node or not await nodes.lost(node):
                raise
            again = await self._place(ask.model, await nodes.known())
            if again is placed:
                raise
            log.warning("node %s was lost; request %s placed again on %s",
                        node, ask.request_id, getattr(again, "node", ""))  # fmt: skip
            return await again.acquire(ask)

    async def call(self, call: Call) -> Any:
        model = call.get("model")
        if call["type"] == "router.reservations" and (found := await nodes.known()):
            return await self._reserve_on_nodes(call["reservations"], found, call["actor"])
        if not model and (live := await nodes.live_names()):
            return await self._call_every(call, live)
        found = await nodes.known()
        placed = (
            self.on_node("") if not found else await self._place(str(model or "") or None, found)
        )
        return await placed.call(call)

    async def _call_every(self, call: Call, live: list[str]) -> Any:
        """A call without a model when several nodes beat: snapshots merge (each model and
        queue entry names its node), metrics gain a ``node`` label; any other call (reload,
        ready, memory) answers with the first node's answer."""
        answers = await asyncio.gather(
            *(self.on_node(node).call(call) for node in live), return_exceptions=True
        )
        got = {node: a for node, a in zip(live, answers, strict=True) if isinstance(a, Mapping)}
        if not got:
            failed = next(a for a in answers if isinstance(a, BaseException))
            raise failed
        if call["type"] == "router.snapshot":
            return nodes.merge_snapshots(got, await nodes.known())
        if call["type"] == "router.metrics":
            return nodes.merge_metrics(got)
        if call["type"] == "router.cancel_queued":  # by request id: only its node has it
            cancelled = sorted({r for a in got.values() for r in a.get("cancelled", ())})
            return {"success": True, "cancelled": cancelled}
        return next(iter(got.values()))

    async def _reserve_on_nodes(
        self, reservations: dict[str, list[str]], found: list[nodes.Node], actor: str
    ) -> ReservationsAnswer:
        """Each reserved model goes to the one node placement picks (loaded there in advance,
        not on every node that may run it), and every live node gets its whole set, maybe
        empty."""
        shares: dict[str, dict[str, list[str]]] = {n.name: {} for n in found if n.live}
        unknown = []
        for model, owners in sorted(reservations.items()):
            try:
                shares[await nodes.place_claimed(model, found)][model] = owners
            except nodes.NoPlace:
                unknown.append(model)  # no live node may run it now: the next tick tries again
        answers = await asyncio.gather(
            *(self.on_node(node).call(
                {"type": "router.reservations", "actor": actor, "reservations": share})
              for node, share in shares.items()),
            return_exceptions=True,
        )  # fmt: skip
        out: ReservationsAnswer = {"reserved": [], "loading": [], "unknown": unknown}
        for answer in answers:
            if isinstance(answer, BaseException):
                log.warning("a node did not take its reservations: %s", answer)
                continue
            for key in ("reserved", "loading", "unknown"):
                out[key] = sorted({*out[key], *answer.get(key, [])})
        return out

    def events(self) -> AsyncIterator[EventPayload]:
        return self.on_node("").events()  # the events group: every node publishes to it
