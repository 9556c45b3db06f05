"""The router's desk: it answers the protocol's messages for one engine, one handler per type,
named after it (STYLE 13; the types are in messages.py, the protocol in docs/architecture.md).

Messages come off the channel layer (listener.py) or the router's socket (link_server.py). An
acquire may wait minutes in the queue, so each runs in a task of its own that answers on the
caller's reply channel (or socket); answers never block the listener. A message whose sender
has given up (``stale``) is dropped unheard, counted, and noted at most every
``EXPIRED_NOTE_EVERY`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from models_app.routing import calls, wire
from models_app.routing.messages import (
    CALL_TYPES,
    GIVING_BACK,
    AcquireAnswer,
    AcquireMessage,
    CallMessage,
    CancelMessage,
    ReleaseMessage,
    RenewMessage,
    WaitingMessage,
)
from routerpanel.router.catalogue import Event
from routerpanel.router.errors import Lease, RouterError, unavailable

if TYPE_CHECKING:
    from channels.layers import BaseChannelLayer

    from models_app.routing.liveness import Heartbeat
    from routerpanel.router.engine import Engine

log = logging.getLogger(__name__)

QUEUED_AFTER = 0.5  # seconds: an acquire not answered by then is told "queued" first
EXPIRED_NOTE_EVERY = 10.0  # seconds: dropped expired messages are published this often at most


class DeskHost(calls.CallHost, Protocol):
    """What the desk needs of the router host (routing/host.py)."""

    engine: Engine | None
    layer: BaseChannelLayer
    loop: asyncio.AbstractEventLoop | None
    started_at: float
    beat: Heartbeat | None

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]: ...


class Desk:
    """Answer the protocol's messages for ``host``'s engine (see module doc)."""

    def __init__(self, host: DeskHost) -> None:
        self.host = host
        self._acquires: dict[str, asyncio.Task[Any]] = {}  # waiting acquires, by request id
        self._expired: Counter[str] = Counter()
        self._expired_flush: asyncio.TimerHandle | None = None
        # The handler of each message type; a message comes off the channel layer untyped (Any)
        # and its "type" says which of messages.py's TypedDicts it is.
        self._handlers: dict[str, Callable[[Any], None]] = {
            "router.acquire": self.router_acquire, "router.waiting": self.router_waiting,
            "router.renew": self.router_renew, "router.release": self.router_release,
            "router.cancel": self.router_cancel,
            **{kind: self.router_call for kind in CALL_TYPES},
        }  # fmt: skip

    @property
    def engine(self) -> Engine | None:
        return self.host.engine

    @property
    def boot(self) -> str:
        return self.host.boot

    @property
    def acquires(self) -> Counter[str]:
        return self.host.acquires

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        return self.host.spawn(coro)

    def router_acquire(self, message: AcquireMessage) -> None:
        request_id, reply = message["request_id"], message["reply_channel"]
        self.host.acquires["channel"] += 1

        async def answer(out: AcquireAnswer) -> None:
            await self.host.layer.send(reply, out)

        self._acquires[request_id] = self.host.spawn(self.acquire(message, answer))

    async def acquire(
        self,
        message: AcquireMessage,
        answer_with: Callable[[AcquireAnswer], Awaitable[None]],
        on_grant: Callable[[str, str], None] | None = None,
        started: asyncio.Future[Lease] | None = None,
    ) -> None:
        """Acquire for ``message`` and answer it through ``answer_with`` (a reply channel, or a
        socket: link_server.py); "queued" first when the grant is not at once. ``on_grant``
        (lease id, request id) is called before the grant is answered. ``started``: the
        future ``begin_acquire`` returned for it, when the caller began it already."""
        request_id = message["request_id"]
        future = started if started is not None else self.begin_acquire(message)
        try:
            if not future.done():
                done, _ = await asyncio.wait({future}, timeout=QUEUED_AFTER)
                if not done:
                    position = self._queue_position(message["model"])
                    await answer_with(wire.queued(request_id, position, self.host.boot))
                    await asyncio.wait({future})
        except asyncio.CancelledError:
            future.cancel()
            self.host.running_engine.cancel(request_id)  # A7: leave the queue, or release the grant
            raise
        finally:
            self._acquires.pop(request_id, None)
        await answer_with(self.answer(request_id, future, on_grant))

    def begin_acquire(self, message: AcquireMessage) -> asyncio.Future[Lease]:
        """Hand ``message``'s acquire to the engine now. The future is done on return when the
        engine decided at once (a grant on a loaded model with nobody queued, or a rejection):
        then the answer can go out without a task (``answer``)."""
        try:
            return self.host.running_engine.acquire_soon(
                message["model"],
                request_id=message["request_id"],
                actor=message["actor"],
                autoload=message["autoload"],
                priority=message.get("priority", "normal"),
                patient=bool(message.get("patient", False)),
            )
        except (RouterError, ValueError) as exc:  # an unknown model or priority class
            failed: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    def answer(
        self,
        request_id: str,
        future: asyncio.Future[Lease],
        on_grant: Callable[[str, str], None] | None = None,
    ) -> AcquireAnswer:
        """The answer to a decided acquire: granted, or rejected with the router's error."""
        exc = future.exception()
        if exc is not None:
            if isinstance(exc, ValueError):  # an unknown priority class, a request id in use
                exc = RouterError(400, "invalid_request_error", str(exc))
            elif not isinstance(exc, RouterError):
                log.error("acquire %s failed", request_id, exc_info=exc)
                exc = RouterError(500, "server_error", f"router error: {exc}")
            return wire.rejected(request_id, exc, self.host.boot)
        lease = future.result()
        if on_grant is not None:
            on_grant(lease.lease_id, request_id)
        ttl = (
            self.host.running_engine.config.lease_ttl
        )  # not snapshot(): that builds every model's view
        return wire.granted(request_id, lease, ttl, self.host.boot)

    def _queue_position(self, model: str) -> int:
        return self.host.running_engine.queue_position(model)

    def router_waiting(self, message: WaitingMessage) -> None:
        """A queued web request heard nothing for a while: say where it stands (a lost answer
        is sent again; a request this router does not know is answered 503)."""
        request_id, reply = message["request_id"], message["reply_channel"]
        lease = self.host.running_engine.lease_for(request_id)
        answer: AcquireAnswer
        if request_id in self._acquires:
            position = self._queue_position(message["model"])
            answer = wire.queued(request_id, position, self.host.boot)
        elif lease is not None:
            ttl = self.host.running_engine.config.lease_ttl
            answer = wire.granted(request_id, lease, ttl, self.host.boot)
        else:
            text = "the router does not know this request (it restarted, or the request was lost)"
            answer = wire.rejected(request_id, unavailable(text, wire.RETRY_AFTER), self.host.boot)
        self.host.spawn(self.host.layer.send(reply, answer))

    def router_renew(self, message: RenewMessage) -> None:
        idle = message.get("idle")
        idle = float(idle) if isinstance(idle, int | float) else None
        self.host.running_engine.renew(message["lease_id"], idle=idle)

    def router_release(self, message: ReleaseMessage) -> None:
        self.host.running_engine.release(message["lease_id"])

    def router_cancel(self, message: CancelMessage) -> None:
        task = self._acquires.pop(message["request_id"], None)
        if task is not None:
            task.cancel()
        self.host.running_engine.cancel(message["request_id"])

    def router_call(self, message: CallMessage) -> None:
        """``router.load``, ``router.unload``, … (every type that ``call`` knows)."""

        async def answer() -> None:
            request_id, reply = message["request_id"], message["reply_channel"]
            work = asyncio.ensure_future(calls.answer(self.host, message))
            done, _ = await asyncio.wait({work}, timeout=QUEUED_AFTER)
            if not done:
                await self.host.layer.send(reply, wire.accepted(request_id, self.host.boot))
            try:
                out = wire.result(request_id, await work, boot=self.host.boot)
            except RouterError as exc:
                out = wire.failed(request_id, exc, self.host.boot)
            except Exception as exc:  # a bad preset on reload: 500 with the text (rule 2.25)
                log.exception("router %s failed", message["type"])
                out = wire.failed(
                    request_id, RouterError(500, "server_error", str(exc)), self.host.boot
                )
            await self.host.layer.send(reply, out)

        self.host.spawn(answer())

    def handler(self, message_type: str) -> Callable[[Any], None] | None:
        """The handler of a message type, or None for a type this router does not know."""
        return self._handlers.get(message_type)

    # ---- messages whose sender gave up ------------------------------------------------------

    def stale(self, message: Mapping[str, Any]) -> bool:
        """Whether the message's sender has given up on it, so it must not run.

        Expired; addressed to another boot; sent before this router started; or arriving while
        this router's heartbeat has lapsed (it was frozen, or Redis was away), when every web
        process saw it dead and answered its waiters. Messages that give something back
        (release, renew, cancel) are never stale.
        """
        if message.get("type") in GIVING_BACK:
            return False
        if wire.expired(message):
            return True
        boot, sent = message.get("boot"), message.get("sent")
        if boot and boot != self.host.boot:
            return True
        if not isinstance(sent, int | float):
            return False
        if sent < self.host.started_at:
            return True
        beat = self.host.beat
        return beat is not None and sent < beat.stale_before()

    def drop_expired(self, message: Mapping[str, Any]) -> None:
        """Drop a message that arrived after its deadline (its sender answered the client
        already): counted, and published at most every EXPIRED_NOTE_EVERY seconds."""
        self._expired[str(message.get("type"))] += 1
        if self._expired_flush is None and self.host.loop is not None:
            self._expired_flush = self.host.loop.call_later(EXPIRED_NOTE_EVERY, self._note_expired)
            if sum(self._expired.values()) == 1:  # the first of a burst is told at once
                self._note_expired(rearm=True)

    def _note_expired(self, rearm: bool = False) -> None:
        if not rearm:
            self._expired_flush = None
        if not self._expired or self.host.engine is None:
            return
        counts, self._expired = dict(self._expired), Counter()
        total = sum(counts.values())
        log.warning("dropped %d expired router messages: %s", total, counts)
        self.host.engine.note(Event.MESSAGE_EXPIRED, {"counts": counts, "total": total})
