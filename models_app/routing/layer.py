"""Team mode over the channel layer: one node's router, reached through Redis (or, in tests, the
in-memory layer). docs/architecture.md tells the protocol; in short:

Whether the router lives is its heartbeat's to say (liveness.py), not a timeout: a request waits
for its first answer as long as the router beats (at most ``FIRST_ANSWER_CAP``), so a burst that
keeps the router busy is served, not refused; a dead, frozen or restarted router answers every
waiter 503 within seconds. Every message carries ``sent`` and ``expires`` and the ``boot`` the
sender believes in, and the router drops one its sender has given up on; a sender that gives up
also sends ``router.cancel``. While queued, a waiter that hears nothing for ``QUEUED_RECHECK``
asks again (``router.waiting``), so a lost answer costs seconds, not the request. Anything the
layer refuses (Redis away) is a 503 ``router unavailable`` with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from models_app.routing import liveness, topology, wire
from models_app.routing.messages import (
    AcquireAnswer,
    AcquireMessage,
    Call,
    CallAnswer,
    CancelMessage,
    EventPayload,
    LeaseAnswer,
    ReleaseMessage,
    RenewMessage,
    WaitingMessage,
)
from routerpanel.router.errors import RouterError, unavailable

if TYPE_CHECKING:
    from models_app.routing.liveness import RouterWatch
    from models_app.routing.transport import Ask, RouterTransport

log = logging.getLogger(__name__)
T = TypeVar("T")

ROUTER_TIMEOUT = 5.0  # seconds for the router's first answer before "router unavailable"
FIRST_ANSWER_CAP = 30.0  # team mode: longest first-answer wait while the router beats
QUEUED_RECHECK = 10.0  # team mode: seconds of silence in the queue before asking again
CALL_TIMEOUT = 900.0  # seconds a call may run once accepted (a reload waits for stops)

# An answer on a reply channel: to an acquire (or waiting), or to a call.
Reply = AcquireAnswer | CallAnswer


def router_gone(why: str = "") -> RouterError:
    """The 503 of a router out of reach (dead, frozen, replaced, or the layer refused)."""
    return unavailable(f"router unavailable: {why}" if why else "router unavailable", 5)


class Layer:
    """One node's router over the channel layer (``node`` "": the unnamed router)."""

    def __init__(
        self, layer: BaseChannelLayer | None = None, node: str = "", timeout: float = ROUTER_TIMEOUT
    ) -> None:
        self._layer = layer
        self.node = node
        self.timeout = timeout
        self.channel = topology.channel(node)

    @property
    def layer(self) -> BaseChannelLayer:
        if self._layer is None:
            self._layer = get_channel_layer()
            if self._layer is None:
                raise RuntimeError("no channel layer configured (CHANNEL_LAYERS)")
        return self._layer

    def on_node(self, node: str) -> RouterTransport:
        return self if node == self.node else Layer(self._layer, node, self.timeout)

    def watch(self) -> RouterWatch | None:
        """The heartbeat watch of this node's router on this loop; None without Redis."""
        return liveness.watch(self.node) if settings.REDIS_URL else None

    # ---- a lease ----------------------------------------------------------------------------

    async def acquire(self, ask: Ask) -> wire.Grant:
        watch = self.watch()
        if watch is not None and (why := watch.lost(None)) is not None:
            raise router_gone(why)  # known dead: do not even queue a message
        wait = self.first_wait(watch is not None)
        reply = await self._new_channel()
        envelope = wire.addressed(ask.request_id, reply, _boot(watch), wait)
        message: AcquireMessage = {
            "type": "router.acquire",
            "model": ask.model,
            "actor": ask.actor,
            "autoload": ask.autoload,
            "priority": ask.priority,
            "patient": ask.patient,
            **envelope,
        }
        await self._send(message)
        try:
            answer = await self._first_answer(reply, wait, envelope["boot"])
            while answer["type"] == "router.queued":  # no deadline but the router's life
                answer = await self._while_queued(reply, ask, answer["boot"], watch)
        except (asyncio.CancelledError, RouterError):
            cancel: CancelMessage = {
                "type": "router.cancel", "request_id": ask.request_id, **wire.quiet()
            }  # fmt: skip
            await self.send_quietly(cancel)
            raise
        return self.grant_of(answer, self)

    def first_wait(self, beating: bool) -> float:
        """The first answer's deadline: the heartbeat tells life in team mode, not a timeout."""
        return max(self.timeout, FIRST_ANSWER_CAP) if beating else self.timeout

    @staticmethod
    def grant_of(answer: Reply, owner: wire.LeaseOwner) -> wire.Grant:
        """The grant ``answer`` carries, kept by ``owner``; or raise its refusal."""
        if answer["type"] == "router.granted":
            return wire.Grant(
                wire.lease_from(answer), float(answer["lease_ttl"]), answer.get("boot", ""), owner
            )
        if answer["type"] == "router.rejected":
            raise wire.refusal(answer)
        raise router_gone()  # a call's answer to an acquire: it was refused unread

    async def _while_queued(
        self, reply: str, ask: Ask, boot: str | None, watch: RouterWatch | None
    ) -> Reply:
        """The next answer for a queued request; ask again after QUEUED_RECHECK of silence."""
        if watch is None:
            return await self._receive(reply)
        while True:
            try:
                async with asyncio.timeout(QUEUED_RECHECK):
                    return await self._until_router_gone(self._receive(reply), boot)
            except TimeoutError:
                recheck: WaitingMessage = {
                    "type": "router.waiting",
                    "model": ask.model,
                    **wire.addressed(ask.request_id, reply, _boot(watch), QUEUED_RECHECK),
                }
                await self._send(recheck)

    async def renew(self, grant: wire.Grant, idle: float | None) -> None:
        message: RenewMessage = {
            "type": "router.renew", "lease_id": grant.lease_id, "idle": idle, **wire.quiet()
        }  # fmt: skip
        await self.send_quietly(message)

    async def release(self, grant: wire.Grant) -> None:
        message: ReleaseMessage = {
            "type": "router.release", "lease_id": grant.lease_id, **wire.quiet()
        }  # fmt: skip
        await self.send_quietly(message)

    def progress_of(self, grant: wire.Grant) -> Callable[[], None] | None:
        return None  # the renewals carry the progress

    async def why_ended(self, grant: wire.Grant) -> RouterError | None:
        """Ask the router why it ended this lease: the rare path, so a round trip is fine."""
        try:
            body: LeaseAnswer = await self.call(
                {"type": "router.lease", "lease_id": grant.lease_id}
            )
        except RouterError:
            return None
        error = body.get("error")
        if not isinstance(error, dict):
            return None
        return RouterError.from_wire(503, error, body.get("retry_after"))

    # ---- calls and events ---------------------------------------------------------------------

    async def call(self, call: Call) -> Any:
        watch = self.watch()
        if watch is not None and (why := watch.lost(None)) is not None:
            raise router_gone(why)
        wait = self.timeout  # calls are short and pages wait for them: no burst allowance
        reply = await self._new_channel()
        envelope = wire.addressed(uuid.uuid4().hex, reply, _boot(watch), wait)
        message: dict[str, Any] = {**call, **envelope}  # a Call, Addressed (messages.py)
        await self._send(message)
        answer = await self._first_answer(reply, wait, envelope["boot"])
        if answer["type"] == "router.accepted":
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    answer = await self._until_router_gone(self._receive(reply), answer["boot"])
            except TimeoutError:
                raise router_gone() from None
        if answer["type"] != "router.result":  # an acquire's answer to a call: never sent
            raise router_gone()
        body = answer["body"]
        if not answer["ok"]:
            raise RouterError.from_wire(answer["status"], body["error"], body.get("retry_after"))
        return body

    async def events(self) -> AsyncIterator[EventPayload]:
        channel = await self.layer.new_channel()
        await self.layer.group_add(topology.EVENTS_GROUP, channel)
        try:
            while True:
                message = await self.layer.receive(channel)
                for payload in wire.unpack_events(message):
                    yield payload
        finally:
            try:
                await self.layer.group_discard(topology.EVENTS_GROUP, channel)
            except Exception:
                log.debug("could not leave the events group", exc_info=True)

    # ---- the channel layer ----------------------------------------------------------------

    async def _first_answer(self, reply: str, wait: float, boot: str | None) -> Reply:
        try:  # not wait_for: on Python 3.11 that makes a task per call (every acquire)
            async with asyncio.timeout(wait):
                return await self._until_router_gone(self._receive(reply), boot)
        except TimeoutError:
            raise router_gone() from None

    async def _receive(self, reply: str) -> Reply:
        """The next answer on ``reply``; a layer's reconnect notice (layers.py) is no answer."""
        while True:
            message = await self.layer.receive(reply)
            if message.get("type") != "layer.reconnected":
                answer: Reply = message  # the router sends nothing else to a reply channel
                return answer

    async def _until_router_gone(self, wait: Awaitable[T], boot: str | None) -> T:
        """Await ``wait``; raise 503 as soon as the router that answered is dead or replaced."""
        watch = self.watch()
        if watch is None:
            return await wait
        waiting = asyncio.ensure_future(wait)
        gone = asyncio.ensure_future(watch.gone(boot))
        try:
            await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not waiting.done():
                waiting.cancel()
        if waiting.done() and not waiting.cancelled():
            return waiting.result()
        raise router_gone(gone.result() if gone.done() and not gone.cancelled() else "")

    async def _new_channel(self) -> str:
        try:
            channel: str = await self.layer.new_channel()
            return channel
        except Exception as exc:
            raise router_gone() from exc

    async def _send(self, message: Mapping[str, Any]) -> None:
        """Send to the router; a layer that refuses (Redis away, full) is a 503, never a 500."""
        try:
            await self.layer.send(self.channel, message)
        except Exception as exc:
            log.warning("could not send %s to the router: %s", message["type"], exc)
            raise router_gone() from exc

    async def send_quietly(self, message: RenewMessage | ReleaseMessage | CancelMessage) -> None:
        try:
            await self.layer.send(self.channel, message)
        except Exception:  # a full or unreachable layer must not turn a release into a 500
            log.warning("could not send %s", message["type"], exc_info=True)


def _boot(watch: RouterWatch | None) -> str | None:
    return watch.boot if watch is not None else None
