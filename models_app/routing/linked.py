"""Team mode over the router's socket (link_client.py): acquire, renew, release and cancel go
over one connection per web process; calls and events stay on the channel layer.

The same messages and deadlines as the layer (layer.py), plus: a connection that closes answers
its waiters 503 at once, and the router ends the leases granted over it. While no connection
can be made (the router advertises none, or it is out of reach), the layer serves the leases too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from models_app.routing import link_client, wire
from models_app.routing.layer import Layer, Reply, router_gone
from models_app.routing.messages import Call, EventPayload, ReleaseMessage, RenewMessage
from routerpanel.router.errors import RouterError

if TYPE_CHECKING:
    from models_app.routing.link_client import Connection
    from models_app.routing.transport import Ask, RouterTransport


class Linked:
    """One node's router: leases over its socket when connected, everything else on ``layer``."""

    def __init__(self, layer: Layer) -> None:
        self.layer = layer
        self.node = layer.node

    def on_node(self, node: str) -> RouterTransport:
        return self if node == self.node else Linked(Layer(self.layer._layer, node, self.timeout))

    @property
    def timeout(self) -> float:
        return self.layer.timeout

    async def acquire(self, ask: Ask) -> wire.Grant:
        watch = self.layer.watch()
        if watch is None:
            return await self.layer.acquire(ask)
        if (why := watch.lost(None)) is not None:
            raise router_gone(why)  # known dead: do not even queue a message
        conn = await link_client.connection(watch)
        if conn is None:
            return await self.layer.acquire(ask)
        return await self.over(conn, ask)

    async def over(self, conn: Connection, ask: Ask) -> wire.Grant:
        """Acquire over the router connection ``conn``."""
        wait = self.layer.first_wait(True)  # the heartbeat tells life (the watch)
        sent = time.time()
        message = {
            "type": "router.acquire", "model": ask.model, "actor": ask.actor,
            "autoload": ask.autoload, "priority": ask.priority, "patient": ask.patient,
            "request_id": ask.request_id, "sent": sent,
            "expires": sent + wait - wire.EXPIRY_MARGIN, "boot": conn.boot,
        }  # fmt: skip
        answers = conn.expect(ask.request_id)
        try:
            conn.send(message)
            try:
                async with asyncio.timeout(wait):
                    answer = _answer(await answers.get())
            except TimeoutError:
                raise router_gone() from None
            while answer["type"] == "router.queued":  # no deadline but the router's life
                answer = _answer(await answers.get())
        except (asyncio.CancelledError, RouterError):
            conn.send({"type": "router.cancel", "request_id": ask.request_id, **wire.quiet()})
            raise
        finally:
            conn.forget(ask.request_id)
        return Layer.grant_of(answer, OnConnection(conn, self.layer))

    async def call(self, call: Call) -> Any:
        return await self.layer.call(call)

    def events(self) -> AsyncIterator[EventPayload]:
        return self.layer.events()


class OnConnection:
    """The owner of a lease granted over ``conn``: renew and release go on it (closed, the
    router has ended the lease already); asking why it ended goes on the layer."""

    def __init__(self, conn: Connection, layer: Layer) -> None:
        self.conn = conn
        self.layer = layer

    async def renew(self, grant: wire.Grant, idle: float | None) -> None:
        message: RenewMessage = {
            "type": "router.renew", "lease_id": grant.lease_id, "idle": idle, **wire.quiet()
        }  # fmt: skip
        self.conn.send(message)

    async def release(self, grant: wire.Grant) -> None:
        message: ReleaseMessage = {
            "type": "router.release", "lease_id": grant.lease_id, **wire.quiet()
        }  # fmt: skip
        self.conn.send(message)

    def progress_of(self, grant: wire.Grant) -> Callable[[], None] | None:
        return None  # the renewals carry the progress

    async def why_ended(self, grant: wire.Grant) -> RouterError | None:
        return await self.layer.why_ended(grant)


def _answer(item: Mapping[str, Any] | str) -> Reply:
    """An answer that came over the router connection; a str says why the link failed."""
    if isinstance(item, str):
        raise router_gone(item)
    answer: Reply = item  # type: ignore[assignment]  # the router sends nothing else
    return answer
