"""The web side's one way to the router, and the channel protocol (DESIGN §5, §10, STYLE 13).

This is the ONLY module that knows channel and group names; the messages' shapes are in
messages.py, one TypedDict each. The web side (HTTP views, SSE, WebSocket consumers, tasks) uses
``RouterClient``; the router worker (worker.py) answers the ``router.*`` messages, one handler
per type, named after it.

Two ways to the router, one API:

* **In process** (embedded mode: ``serve`` runs the engine in its own event loop). The client
  calls the engine directly — no channel-layer hop, no message that a full channel could refuse
  (a burst of requests queues in the engine, never in a channel), no lease renewals (a lease
  held by this process cannot outlive it). Progress of a streamed answer is written straight
  into the engine for its hang watchdog.
* **Over the router's socket** (team mode, issue 16.2: routerlink.py). Acquire, renew, release
  and cancel go over one connection per web process to the socket the router advertises in its
  heartbeat; the messages below (without ``reply_channel``), the same answers, the same
  deadlines and dead-router detection, plus: a connection that closes answers its waiters 503
  at once, and the router ends the leases granted over it. Calls and events stay on the layer.
* **Over the channel layer** (team mode: ``runrouter`` elsewhere, Redis between). Whether the
  router lives is the router's heartbeat's to say (liveness.py), not a timeout: a request waits
  for its first answer as long as the router beats (at most ``FIRST_ANSWER_CAP``), so a burst
  that keeps the router busy is served, not refused; a dead, frozen or restarted router answers
  every waiter 503 within seconds. Every message carries ``sent`` and ``expires`` (wall clock)
  and the ``boot`` the sender believes in; the router drops one that its sender has given up on
  — expired, for another boot, sent before this router started, or arriving while its own
  heartbeat has lapsed (the senders then saw it dead) — so a request the web side answered with
  an error never runs later. A web process that gives up also sends ``router.cancel``. While
  queued, a waiter that hears nothing for ``QUEUED_RECHECK`` asks again (``router.waiting``), so
  a lost answer costs seconds, not the request. Anything the layer refuses (Redis away) is a 503
  ``router unavailable`` with Retry-After.

Messages (web → router, channel ``router``); every one has ``sent`` and ``expires``, and every
one that wants an answer ``request_id``, ``reply_channel`` and ``boot``::

    router.acquire  {model, actor, autoload, priority?}     (priority: the key's class)
    router.waiting  {model}         (still queued? answered queued/granted/rejected)
    router.renew    {lease_id, idle}            (idle: seconds since the last byte went out)
    router.release  {lease_id}
    router.cancel   {request_id}
    router.load {model, actor}          router.unload {model, actor}
    router.cancel_queued {actor, model | queued_request}
    router.reload {actor, sources?}     router.settings {actor}     router.lease {lease_id}
    router.reservations {actor, reservations: {model: [owner, ...]}}
    router.snapshot   router.ready   router.memory   router.metrics   router.logs {model}

Answers (router → reply channel); each carries the router's ``boot`` id::

    router.queued   {request_id, position}
    router.granted  {request_id, lease_id, model, port, lease_ttl,
                     queue_ms, load_ms, evicted, caused_load,   (the receipt, issue 17.3)
                     host, key?}                                (the child's address, issue 18)
    router.rejected {request_id, status, error: {code, message, type}, retry_after}
    router.accepted {request_id}                      (a call is under way; result follows)
    router.result   {request_id, ok, status, body}    (body: the call's answer, messages.py)

Events (router → group ``router.events``)::

    router.event    {event: {seq, type, time, data}}
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings

from models_app import liveness, nodes, routerlink, topology
from models_app.messages import (
    AcceptedMessage,
    AcquireAnswer,
    AcquireMessage,
    Addressed,
    AnswerBody,
    Call,
    CallAnswer,
    CancelledAnswer,
    CancelMessage,
    ErrorBody,
    EventMessage,
    EventPayload,
    EventsMessage,
    GrantedMessage,
    LeaseAnswer,
    MemoryAnswer,
    MetricsAnswer,
    QueuedMessage,
    ReadyAnswer,
    RejectedMessage,
    ReleaseMessage,
    ReloadAnswer,
    RenewMessage,
    ReservationsAnswer,
    ResultMessage,
    SnapshotAnswer,
    Stamped,
    SuccessAnswer,
    WaitingMessage,
)
from routerpanel.router.address import LOOPBACK, ChildAddress
from routerpanel.router.errors import Lease, RouterError
from routerpanel.router.receipts import NO_RECEIPT, Receipt

if TYPE_CHECKING:
    from models_app.liveness import RouterWatch
    from models_app.routerlink import Connection
    from routerpanel.router.engine import Engine

log = logging.getLogger(__name__)
T = TypeVar("T")

ROUTER_CHANNEL = "router"
EVENTS_GROUP = "router.events"
ROUTER_TIMEOUT = 5.0  # seconds for the router's first answer before "router unavailable"
FIRST_ANSWER_CAP = 30.0  # team mode: longest first-answer wait while the router beats
QUEUED_RECHECK = 10.0  # team mode: seconds of silence in the queue before asking again
CALL_TIMEOUT = 900.0  # seconds a call may run once accepted (a reload waits for stops)
EXPIRY_MARGIN = 1.0  # a message expires this long before its sender stops waiting
QUIET_EXPIRY = 60.0  # renew / release / cancel: no answer awaited; stale after this
RETRY_AFTER = 5


# An answer on a reply channel: to an acquire (or waiting), or to a call.
Reply = AcquireAnswer | CallAnswer


def error_body(status: int, message: str, error_type: str) -> ErrorBody:
    return {"code": status, "message": message, "type": error_type}


class RouterRejected(Exception):
    """The router answered no: ``status`` and ``body`` are the HTTP answer to give."""

    def __init__(self, status: int, error: ErrorBody, retry_after: float | None = None) -> None:
        super().__init__(error["message"])
        self.status = status
        self.error = error
        self.retry_after = retry_after

    @property
    def body(self) -> dict[str, Any]:
        return {"error": dict(self.error)}

    @classmethod
    def from_error(cls, exc: RouterError) -> RouterRejected:
        return cls(exc.status, error_body(exc.status, exc.message, exc.error_type), exc.retry_after)


def router_unavailable(why: str = "") -> RouterRejected:
    text = f"router unavailable: {why}" if why else "router unavailable"
    return RouterRejected(503, error_body(503, text, "unavailable_error"), RETRY_AFTER)


@dataclass(frozen=True)
class Grant:
    """A granted request: send it to ``address``; release the lease when the answer ends.

    ``lease_ttl`` is ``inf`` for an in-process grant: nothing to renew. ``key`` is the child's
    per-spawn API key (issue 18), None for an unprotected child; repr leaves it out.
    """

    request_id: str
    lease_id: str
    model: str
    port: int
    lease_ttl: float
    boot: str = ""
    receipt: Receipt = NO_RECEIPT  # what the request waited through (issue 17.3)
    host: str = LOOPBACK
    key: str | None = field(default=None, repr=False)
    node: str = ""  # the node that granted it (issue 18): renew and release go there
    # The router connection it was granted over (team mode, routerlink.py): renew and release
    # go on it; when it closes the router has ended the lease already.
    via: Connection | None = field(default=None, compare=False, repr=False)

    @property
    def local(self) -> bool:
        return math.isinf(self.lease_ttl)

    @property
    def address(self) -> ChildAddress:
        return ChildAddress(self.host, self.port, self.key)


class LocalRouter(Protocol):
    """What the router host offers to a web side in the same process (worker.RouterHost)."""

    engine: Engine | None
    boot: str
    loop: asyncio.AbstractEventLoop | None

    async def call(self, call: Call) -> AnswerBody: ...


_local: LocalRouter | None = None


def register_local(host: LocalRouter | None) -> None:
    """The router host of this process (or None when it stops): clients call it directly."""
    global _local
    _local = host


def local_router() -> LocalRouter | None:
    host = _local
    return host if host is not None and host.engine is not None else None


class RouterClient:
    """Talk to the router (see module doc). Cheap to make; one per process is fine.

    ``RouterClient()`` calls the router of this process when there is one (embedded mode) and
    goes over the default channel layer otherwise; ``RouterClient(layer)`` always uses ``layer``.
    """

    def __init__(
        self,
        layer: BaseChannelLayer | None = None,
        timeout: float = ROUTER_TIMEOUT,
        node: str | None = None,
    ):
        self._layer = layer
        self._explicit_layer = layer is not None
        self.timeout = timeout
        # Several hosts (issue 18): None places each request (nodes.py) — on the unnamed
        # router when no node beats; a name talks to that node's router only.
        self.node = node

    def with_timeout(self, timeout: float) -> RouterClient:
        """The same client with another first-answer deadline."""
        layer = self._layer if self._explicit_layer else None
        return RouterClient(layer, timeout=timeout, node=self.node)

    def on_node(self, node: str) -> RouterClient:
        """The same client bound to ``node`` ("" the unnamed router)."""
        if node == self.node:
            return self
        twin = RouterClient(self._layer if self._explicit_layer else None, self.timeout, node)
        return twin

    @property
    def channel(self) -> str:
        return topology.channel(self.node or "")

    async def _placed(self, model: str | None) -> RouterClient:
        """The client of the node ``model``'s request goes to (nodes.place); self when bound or
        when no node beats (one router)."""
        if self.node is not None:
            return self
        directory = await nodes.known()
        if not directory:
            return self  # one router: the unnamed one (None and "" go to the same channel)
        try:
            return self.on_node(await nodes.place_claimed(model, directory))
        except nodes.NoPlace as exc:
            raise RouterRejected(503, error_body(503, str(exc), "unavailable_error"), 5) from None

    @property
    def layer(self) -> BaseChannelLayer:
        if self._layer is None:
            self._layer = get_channel_layer()
            if self._layer is None:
                raise RuntimeError("no channel layer configured (CHANNEL_LAYERS)")
        return self._layer

    def _in_process(self) -> LocalRouter | None:
        return None if self._explicit_layer else local_router()

    # ---- requests -----------------------------------------------------------------------

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
        """Wait for a lease on ``model``; raise ``RouterRejected``. Cancelling leaves the queue.

        ``priority``: the key's class (low, normal, high), for the ``fair`` queue policy.
        ``patient``: wait even when every slot is held by pinned models (else 503 at once).
        """
        request_id = request_id or uuid.uuid4().hex
        host = self._in_process()
        if host is not None:
            return await self._acquire_local(
                host, model, actor, autoload, request_id, priority, patient
            )
        client = await self._placed(model)
        try:
            return await client._acquire_remote(
                model, actor, autoload, request_id, priority, patient
            )
        except RouterRejected as exc:
            # Placed on a node that was lost before it answered: place it once more, on a node
            # that lives (the model's preset may run elsewhere), instead of failing it.
            if self.node is not None or not client.node or exc.status != 503:
                raise
            if not await nodes.lost(client.node):
                raise
            again = await self._placed(model)
            if again.node == client.node:
                raise
            log.warning("node %s was lost; request %s placed again on %s",
                        client.node, request_id, again.node)  # fmt: skip
            return await again._acquire_remote(
                model, actor, autoload, request_id, priority, patient
            )

    async def _acquire_local(
        self,
        host: LocalRouter,
        model: str,
        actor: str,
        autoload: bool,
        request_id: str,
        priority: str = "normal",
        patient: bool = False,
    ) -> Grant:
        engine = host.engine
        if engine is None:
            raise router_unavailable()
        loop = host.loop
        if loop is None or loop is asyncio.get_running_loop():  # the engine's own loop
            now = engine.grant_now(model, request_id=request_id, actor=actor, priority=priority)
            if now is not None:  # a loaded model, nothing queued: the hot path (issue 16.5)
                return _local_grant(request_id, now, host)
        try:
            lease = await _on_loop(
                host,
                engine.acquire(
                    model,
                    request_id=request_id,
                    actor=actor,
                    autoload=autoload,
                    renewable=False,
                    priority=priority,
                    patient=patient,
                ),
            )
        except RouterError as exc:
            raise RouterRejected.from_error(exc) from None
        return _local_grant(request_id, lease, host)

    async def _acquire_remote(
        self,
        model: str,
        actor: str,
        autoload: bool,
        request_id: str,
        priority: str = "normal",
        patient: bool = False,
    ) -> Grant:
        watch = _watch(self.node or "")
        if watch is not None and (why := watch.lost(None)) is not None:
            raise router_unavailable(why)  # known dead: do not even queue a message
        if watch is not None and (conn := await _connection(watch)) is not None:
            return await self._acquire_linked(
                conn, model, actor, autoload, request_id, priority, patient
            )
        wait = self._first_wait(watch)
        reply = await self._new_channel()
        envelope = _addressed(request_id, reply, watch, wait)
        message: AcquireMessage = {
            "type": "router.acquire",
            "model": model,
            "actor": actor,
            "autoload": autoload,
            "priority": priority,
            "patient": patient,
            **envelope,
        }
        await self._send(message)
        try:
            answer = await self._first_answer(reply, wait, envelope["boot"])
            while answer["type"] == "router.queued":  # no deadline but the router's life
                answer = await self._while_queued(reply, request_id, model, answer["boot"], watch)
        except (asyncio.CancelledError, RouterRejected):
            cancel: CancelMessage = {"type": "router.cancel", "request_id": request_id, **_quiet()}
            await self._send_quietly(cancel)
            raise
        return self._grant_or_raise(answer)

    async def _acquire_linked(
        self,
        conn: Connection,
        model: str,
        actor: str,
        autoload: bool,
        request_id: str,
        priority: str,
        patient: bool = False,
    ) -> Grant:
        """``_acquire_remote`` over the router connection (routerlink.py): the same messages
        and deadlines; a connection that closes answers 503 at once."""
        wait = max(self.timeout, FIRST_ANSWER_CAP)  # the heartbeat tells life (the watch)
        sent = time.time()
        message = {
            "type": "router.acquire", "model": model, "actor": actor, "autoload": autoload,
            "priority": priority, "patient": patient, "request_id": request_id, "sent": sent,
            "expires": sent + wait - EXPIRY_MARGIN, "boot": conn.boot,
        }  # fmt: skip
        answers = conn.expect(request_id)
        try:
            conn.send(message)
            try:
                async with asyncio.timeout(wait):
                    answer = _linked_answer(await answers.get())
            except TimeoutError:
                raise router_unavailable() from None
            while answer["type"] == "router.queued":  # no deadline but the router's life
                answer = _linked_answer(await answers.get())
        except (asyncio.CancelledError, RouterRejected):
            conn.send({"type": "router.cancel", "request_id": request_id, **_quiet()})
            raise
        finally:
            conn.forget(request_id)
        return self._grant_or_raise(answer, via=conn)

    def _first_wait(self, watch: RouterWatch | None) -> float:
        """The first answer's deadline: the heartbeat tells life in team mode, not a timeout."""
        return self.timeout if watch is None else max(self.timeout, FIRST_ANSWER_CAP)

    async def _while_queued(
        self, reply: str, request_id: str, model: str, boot: str | None, watch: RouterWatch | None
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
                    "model": model,
                    **_addressed(request_id, reply, watch, QUEUED_RECHECK),
                }
                await self._send(recheck)

    async def renew(self, lease: Grant | str, idle: float | None = None) -> None:
        """Keep a remote lease alive; ``idle``: seconds since the last byte went out."""
        lease_id = lease if isinstance(lease, str) else lease.lease_id
        message: RenewMessage = {
            "type": "router.renew",
            "lease_id": lease_id,
            "idle": idle,
            **_quiet(),
        }
        if isinstance(lease, Grant) and lease.via is not None:
            lease.via.send(message)  # closed: the router ended the lease already
            return
        client = self.on_node(lease.node) if isinstance(lease, Grant) else self
        await client._send_quietly(message)

    def progress_of(self, grant: Grant) -> Callable[[], None] | None:
        """What to call each time a byte of ``grant``'s answer goes out, when its router runs
        in this process: the engine's hang watchdog, bound to the lease once per request
        instead of looked up per chunk. None for a lease from another process (its renewals
        carry the progress)."""
        host = self._in_process()
        if host is None or host.engine is None or not grant.local:
            return None
        return functools.partial(host.engine.progress, grant.lease_id)

    async def release(self, grant: Grant | str) -> None:
        lease_id = grant if isinstance(grant, str) else grant.lease_id
        host = self._in_process()
        if host is not None and host.engine is not None:
            host.engine.release(lease_id)
            return
        message: ReleaseMessage = {"type": "router.release", "lease_id": lease_id, **_quiet()}
        if isinstance(grant, Grant) and grant.via is not None:
            grant.via.send(message)  # closed: the router ended the lease already
            return
        client = self.on_node(grant.node) if isinstance(grant, Grant) else self
        await client._send_quietly(message)

    async def why_ended(self, grant: Grant) -> RouterRejected | None:
        """Ask why the router ended this lease (its child was killed as hung), or None.

        Called when the child's answer breaks off: the rare path, so a round trip is fine.
        """
        host = self._in_process()
        if host is not None and host.engine is not None:
            ended = host.engine.why_ended(grant.lease_id)
            return None if ended is None else RouterRejected.from_error(ended)
        try:
            body: LeaseAnswer = await self.on_node(grant.node)._call(
                {"type": "router.lease", "lease_id": grant.lease_id}
            )
        except RouterRejected:
            return None
        error = body.get("error")
        if not isinstance(error, dict):
            return None
        status = int(error.get("code") or 503)
        rejected = error_body(status, str(error.get("message")), str(error.get("type")))
        return RouterRejected(status, rejected, body.get("retry_after"))

    # ---- calls ----------------------------------------------------------------------------

    async def call(self, call: Call) -> Mapping[str, Any]:
        """Ask the router something (a ``messages.Call``); return the answer's body.

        Raises ``RouterRejected`` when it says no and ``router unavailable`` when it does not
        answer in time. The methods below are the same calls, typed with their answers.
        """
        body: Mapping[str, Any] = await self._call(call)
        return body

    async def load(self, model: str, *, actor: str) -> SuccessAnswer:
        call: Call = {"type": "router.load", "model": model, "actor": actor}
        body: SuccessAnswer = await self._call(call)
        return body

    async def unload(self, model: str, *, actor: str) -> SuccessAnswer:
        call: Call = {"type": "router.unload", "model": model, "actor": actor}
        body: SuccessAnswer = await self._call(call)
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
        body: CancelledAnswer = await self._call(call)
        return body

    async def reload(self, *, actor: str, sources: bool = False) -> ReloadAnswer:
        call: Call = {"type": "router.reload", "actor": actor, "sources": sources}
        body: ReloadAnswer = await self._call(call)
        return body

    async def set_reservations(
        self, reservations: dict[str, list[str]], *, actor: str
    ) -> ReservationsAnswer:
        """Hand the router the whole current set of reservations (issue 17.6). Several hosts:
        each reserved model goes to the one node placement picks (loaded there in advance, not on
        every node that may run it), and every live node gets its whole set, maybe empty."""
        if self.node is None and self._in_process() is None and (found := await nodes.known()):
            return await self._reserve_on_nodes(reservations, found, actor)
        call: Call = {"type": "router.reservations", "actor": actor, "reservations": reservations}
        body: ReservationsAnswer = await self._call(call)
        return body

    async def _reserve_on_nodes(
        self, reservations: dict[str, list[str]], found: list[nodes.Node], actor: str
    ) -> ReservationsAnswer:
        shares: dict[str, dict[str, list[str]]] = {n.name: {} for n in found if n.live}
        unknown = []
        for model, owners in sorted(reservations.items()):
            try:
                shares[await nodes.place_claimed(model, found)][model] = owners
            except nodes.NoPlace:
                unknown.append(model)  # no live node may run it now: the next tick tries again
        answers = await asyncio.gather(
            *(self.on_node(node).set_reservations(share, actor=actor)
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

    async def snapshot(self) -> SnapshotAnswer:
        body: SnapshotAnswer = await self._call({"type": "router.snapshot"})
        return body

    async def ready(self) -> ReadyAnswer:
        body: ReadyAnswer = await self._call({"type": "router.ready"})
        return body

    async def memory(self) -> MemoryAnswer:
        body: MemoryAnswer = await self._call({"type": "router.memory"})
        return body

    async def metrics(self) -> MetricsAnswer:
        body: MetricsAnswer = await self._call({"type": "router.metrics"})
        return body

    async def _call(self, call: Call) -> Any:
        """The body of ``call``'s answer, of the type messages.py gives for that call (Any here:
        it crossed the channel layer, which Channels leaves untyped)."""
        host = self._in_process()
        if host is not None:
            return await self._call_local(host, call)
        model = call.get("model")
        if self.node is None and not model and (live := await nodes.live_names()):
            return await self._call_every(call, live)
        client = await self._placed(str(model) if model else None)
        return await client._call_remote(call)

    async def _call_every(self, call: Call, live: list[str]) -> Any:
        """A call without a model when several nodes beat goes to every live node: snapshots
        merge (each model and queue entry names its node), metrics gain a ``node`` label; any
        other call (reload, reservations, ready, memory) answers with the first node's answer."""
        answers = await asyncio.gather(
            *(self.on_node(node)._call_remote(call) for node in live), return_exceptions=True
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

    async def _call_local(self, host: LocalRouter, call: Call) -> AnswerBody:
        try:
            return await _on_loop(host, host.call(call))
        except RouterError as exc:
            raise RouterRejected.from_error(exc) from None

    async def _call_remote(self, call: Call) -> Mapping[str, Any]:
        watch = _watch(self.node or "")
        if watch is not None and (why := watch.lost(None)) is not None:
            raise router_unavailable(why)
        wait = self.timeout  # calls are short and pages wait for them: no burst allowance
        reply = await self._new_channel()
        envelope = _addressed(uuid.uuid4().hex, reply, watch, wait)
        message: dict[str, Any] = {**call, **envelope}  # a Call, Addressed (messages.py)
        await self._send(message)
        answer = await self._first_answer(reply, wait, envelope["boot"])
        if answer["type"] == "router.accepted":
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    answer = await self._until_router_gone(self._receive(reply), answer["boot"])
            except TimeoutError:
                raise router_unavailable() from None
        if answer["type"] != "router.result":  # an acquire's answer to a call: never sent
            raise router_unavailable()
        body = answer["body"]
        if not answer["ok"]:
            raise RouterRejected(answer["status"], body["error"], body.get("retry_after"))
        return body

    async def events(self) -> AsyncIterator[EventPayload]:
        """Yield router events (``{seq, type, time, data}``) until the caller stops iterating."""
        host = self._in_process()
        if host is not None and host.engine is not None:
            async with host.engine.subscribe(maxsize=10_000) as events:
                async for event in events:
                    yield {"seq": event.seq, "type": event.type, "time": event.time,
                           "data": event.data}  # fmt: skip
            return
        channel = await self.layer.new_channel()
        await self.layer.group_add(EVENTS_GROUP, channel)
        try:
            while True:
                message = await self.layer.receive(channel)
                for payload in unpack_events(message):
                    yield payload
        finally:
            try:
                await self.layer.group_discard(EVENTS_GROUP, channel)
            except Exception:
                log.debug("could not leave the events group", exc_info=True)

    # ---- the channel layer ----------------------------------------------------------------

    async def _first_answer(
        self, reply: str, wait: float | None = None, boot: str | None = None
    ) -> Reply:
        try:  # not wait_for: on Python 3.11 that makes a task per call (every acquire)
            async with asyncio.timeout(wait or self.timeout):
                return await self._until_router_gone(self._receive(reply), boot)
        except TimeoutError:
            raise router_unavailable() from None

    async def _receive(self, reply: str) -> Reply:
        """The next answer on ``reply``; a layer's reconnect notice (layers.py) is no answer."""
        while True:
            message = await self.layer.receive(reply)
            if message.get("type") != "layer.reconnected":
                answer: Reply = message  # the router sends nothing else to a reply channel
                return answer

    async def _until_router_gone(self, wait: Awaitable[T], boot: str | None) -> T:
        """Await ``wait``; raise 503 as soon as the router that answered is dead or replaced."""
        watch = _watch(self.node or "")
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
        raise router_unavailable(gone.result() if gone.done() and not gone.cancelled() else "")

    async def _new_channel(self) -> str:
        try:
            channel: str = await self.layer.new_channel()
            return channel
        except Exception as exc:
            raise router_unavailable() from exc

    async def _send(self, message: Mapping[str, Any]) -> None:
        """Send to the router; a layer that refuses (Redis away, full) is a 503, never a 500."""
        try:
            await self.layer.send(self.channel, message)
        except Exception as exc:
            log.warning("could not send %s to the router: %s", message["type"], exc)
            raise router_unavailable() from exc

    async def _send_quietly(self, message: RenewMessage | ReleaseMessage | CancelMessage) -> None:
        try:
            await self.layer.send(self.channel, message)
        except Exception:  # a full or unreachable layer must not turn a release into a 500
            log.warning("could not send %s", message["type"], exc_info=True)

    def _grant_or_raise(self, answer: Reply, via: Connection | None = None) -> Grant:
        """The grant ``answer`` carries (``via``: the router connection it came over), or raise
        its refusal."""
        if answer["type"] == "router.granted":
            return Grant(
                answer["request_id"],
                answer["lease_id"],
                answer["model"],
                int(answer["port"]),
                float(answer["lease_ttl"]),
                answer.get("boot", ""),
                receipt_from(answer),
                str(answer.get("host") or LOOPBACK),
                answer.get("key") or None,
                self.node or "",
                via,
            )
        if answer["type"] == "router.rejected":
            raise RouterRejected(answer["status"], answer["error"], answer.get("retry_after"))
        raise router_unavailable()  # a call's answer to an acquire: it was refused unread


def _addressed(request_id: str, reply: str, watch: RouterWatch | None, wait: float) -> Addressed:
    """A message's return address and deadline fields: when it was sent, when its sender stops
    waiting, and the router boot the sender believes alive (the router drops it when any says
    "stale")."""
    sent = time.time()
    boot = watch.boot if watch is not None else None
    return {
        "request_id": request_id,
        "reply_channel": reply,
        "sent": sent,
        "expires": sent + wait - EXPIRY_MARGIN,
        "boot": boot,
    }


def _quiet() -> Stamped:
    """The deadline fields of a message that gives something back: none waits for an answer."""
    sent = time.time()
    return {"sent": sent, "expires": sent + QUIET_EXPIRY}


def _linked_answer(item: Mapping[str, Any] | str) -> Reply:
    """An answer that came over the router connection; a str says why the link failed."""
    if isinstance(item, str):
        raise router_unavailable(item)
    answer: Reply = item  # type: ignore[assignment]  # the router sends nothing else
    return answer


async def _connection(watch: RouterWatch) -> Connection | None:
    """The router connection of this process (team mode), or None: the channel layer."""
    return await routerlink.connection(watch)


def _watch(node: str = "") -> RouterWatch | None:
    """The heartbeat watch of ``node``'s router ("" the unnamed one) on this loop in team mode;
    None without Redis."""
    if not settings.REDIS_URL:
        return None
    return liveness.watch(node)


def _local_grant(request_id: str, lease: Lease, host: LocalRouter) -> Grant:
    """The grant of a lease from this process's engine: it never expires (no renewing)."""
    return Grant(
        request_id, lease.lease_id, lease.model, lease.port, math.inf, host.boot, lease.receipt,
        lease.host, lease.key,
    )  # fmt: skip


async def _on_loop(host: LocalRouter, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on the router's loop: the engine must only be touched from there."""
    loop = host.loop
    if loop is None or loop is asyncio.get_running_loop():
        return await work
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))


def expired(message: Mapping[str, Any], now: float | None = None) -> bool:
    """Whether a message's sender has stopped waiting for it (its ``expires`` has passed)."""
    expires = message.get("expires")
    return isinstance(expires, int | float) and expires < (now or time.time())


# ---- router side: building answers (worker.py only) ---------------------------------------


def queued(request_id: str, position: int, boot: str = "") -> QueuedMessage:
    return {"type": "router.queued", "request_id": request_id, "position": position, "boot": boot}


def granted(
    request_id: str,
    lease_id: str,
    model: str,
    port: int,
    ttl: float,
    boot: str = "",
    receipt: Receipt = NO_RECEIPT,
    *,
    host: str = LOOPBACK,
    key: str | None = None,
) -> GrantedMessage:
    """A lease's answer; the child's key goes along only when it has one (issue 18)."""
    message: GrantedMessage = {
        "type": "router.granted",
        "request_id": request_id,
        "lease_id": lease_id,
        "model": model,
        "port": port,
        "lease_ttl": ttl,
        "boot": boot,
        "queue_ms": receipt.queued * 1000,
        "load_ms": receipt.load * 1000,
        "evicted": list(receipt.evicted),
        "caused_load": receipt.caused_load,
        "host": host,
    }
    if key is not None:
        message["key"] = key
    return message


def receipt_from(answer: GrantedMessage) -> Receipt:
    """The receipt a granted message carries (none from a router that sends none)."""
    try:
        return Receipt(
            float(answer.get("queue_ms", 0.0)) / 1000,
            float(answer.get("load_ms", 0.0)) / 1000,
            tuple(str(m) for m in answer.get("evicted", ())),
            bool(answer.get("caused_load", False)),
        )
    except (TypeError, ValueError):
        return NO_RECEIPT


def rejected(
    request_id: str,
    status: int,
    error: ErrorBody,
    retry_after: float | None = None,
    boot: str = "",
) -> RejectedMessage:
    return {
        "type": "router.rejected",
        "request_id": request_id,
        "status": status,
        "error": error,
        "retry_after": retry_after,
        "boot": boot,
    }


def accepted(request_id: str, boot: str = "") -> AcceptedMessage:
    return {"type": "router.accepted", "request_id": request_id, "boot": boot}


def result(
    request_id: str, body: Mapping[str, Any], status: int = 200, boot: str = ""
) -> ResultMessage:
    return {
        "type": "router.result",
        "request_id": request_id,
        "ok": status < 400,
        "status": status,
        "body": body,
        "boot": boot,
    }


def event(payload: EventPayload) -> EventMessage:
    return {"type": "router.event", "event": payload}


def events_message(payloads: list[EventPayload]) -> EventMessage | EventsMessage:
    """One group message for ``payloads`` (in order): ``router.event`` for one."""
    if len(payloads) == 1:
        return event(payloads[0])
    return {"type": "router.events", "events": payloads}


def unpack_events(message: Mapping[str, Any]) -> list[EventPayload]:
    """The events a group message carries, in order ([] for any other message)."""
    kind = message.get("type")
    if kind == "router.event":
        return [message["event"]]
    if kind == "router.events":
        return list(message["events"])
    return []
