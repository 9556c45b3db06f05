"""Host the router engine in a Channels worker for channel ``router`` (DESIGN §2, §5).

``RouterHost`` owns the engine inside the worker process: ``serve`` (embedded mode, in Daphne's
event loop) or ``runrouter`` (team mode) creates it, starts it at boot — not on the first
message — and stops it on SIGTERM/SIGINT, which stops every child within its stop-timeout.
``RouterConsumer`` is the Channels consumer for channel ``router``; it only forwards each
message type to the host method of the same name (STYLE 13). The messages' types are in
messages.py.

Answers never block the consumer: an acquire may wait minutes in the queue, so each one runs
in a task of its own that answers on the caller's reply channel.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, assert_never

from asgiref.sync import sync_to_async
from channels.consumer import AsyncConsumer
from channels.layers import BaseChannelLayer
from django.conf import settings

from models_app import disk, liveness, nodes, specs, topology
from models_app.audit_writer import AuditWriter, new_router_id
from models_app.config_watch import ConfigWatch, read_version
from models_app.metrics import Family, RouterMetrics
from models_app.routing import transport, wire
from models_app.routing.messages import (
    CALL_TYPES,
    GIVING_BACK,
    AcquireAnswer,
    AcquireMessage,
    AnswerBody,
    Call,
    CallMessage,
    CancelledAnswer,
    CancelMessage,
    CancelQueuedCall,
    EventPayload,
    LeaseAnswer,
    LeaseCall,
    LoadCall,
    LogsAnswer,
    LogsCall,
    MemoryAnswer,
    MetricsAnswer,
    ReadyAnswer,
    RejectedMessage,
    ReleaseMessage,
    ReloadAnswer,
    ReloadCall,
    RenewMessage,
    ResultMessage,
    SettingsCall,
    SnapshotAnswer,
    SuccessAnswer,
    UnloadCall,
    WaitingMessage,
)
from routerpanel.router.catalogue import Event
from routerpanel.router.engine import Engine
from routerpanel.router.errors import Lease, RouterError, unavailable
from routerpanel.router.feed import EngineEvent, Subscription
from routerpanel.router.states import RUNNING

log = logging.getLogger(__name__)
RUNNING_NAMES = frozenset(state.value for state in RUNNING)  # the snapshot's "state" values

QUEUED_AFTER = 0.5  # seconds: an acquire not answered by then is told "queued" first
TRANSPORTS = ("socket", "channel")
# Events in one group message at most: under a flood of long log lines (each cut at 64 KiB,
# supervisor/protocol.py) one message stays within 2 MiB.
EVENT_BATCH = 32
EXPIRED_NOTE_EVERY = 10.0  # seconds: dropped expired messages are published this often at most

_host: RouterHost | None = None


def current_host() -> RouterHost | None:
    return _host


class RouterHost:
    """Run one engine and answer the router protocol for it (docs/architecture.md)."""

    def __init__(
        self,
        layer: BaseChannelLayer,
        *,
        overrides: specs.Overrides | None = None,
        state_file: Path | None = None,
        before_reload: Callable[[], Awaitable[None]] | None = None,
        heartbeat: bool | None = None,
        boot: str | None = None,
    ) -> None:
        self.layer = layer
        self.overrides = overrides or specs.Overrides()
        self.state_file = state_file
        self.before_reload = before_reload
        self.engine: Engine | None = None
        self.boot = boot or new_router_id()  # this boot's id: audit rows, heartbeat, answers
        self.loop: asyncio.AbstractEventLoop | None = None
        # Team mode: tell web processes we live (liveness.py); default: whenever Redis is set.
        self.heartbeat = bool(settings.REDIS_URL) if heartbeat is None else heartbeat
        self._tasks: set[asyncio.Task[Any]] = set()
        self._acquires: dict[str, asyncio.Task[Any]] = {}
        self._readers: list[asyncio.Task[None]] = []
        self._listeners: list[Callable[[EngineEvent], None]] = []
        self._expired: Counter[str] = Counter()
        self.acquires: Counter[str] = Counter()  # by transport: "socket", "channel" (metrics)
        self.link: Any = None  # routerlink.LinkServer of team mode: started before the beat
        self._expired_flush: asyncio.TimerHandle | None = None
        # The handler of each message type; a message comes off the channel layer untyped (Any)
        # and its "type" says which of messages.py's TypedDicts it is.
        self._handlers: dict[str, Callable[[Any], None]] = {
            "router.acquire": self.router_acquire, "router.waiting": self.router_waiting,
            "router.renew": self.router_renew, "router.release": self.router_release,
            "router.cancel": self.router_cancel,
            **{kind: self.router_call for kind in CALL_TYPES},
        }  # fmt: skip

    def add_listener(self, listener: Callable[[EngineEvent], None]) -> None:
        """Call ``listener`` with every engine event, in order (audit writer, metrics). It must
        not block: it runs on the router's event loop."""
        self._listeners.append(listener)

    async def start(self) -> None:
        """Build the engine from the database, start it and publish its events.

        Both readers subscribe before the engine starts, so even ``router.started`` reaches
        them: the listeners (audit writer, metrics) on a deep subscription of their own, the
        channel-layer publisher on another, so a slow layer can never cost an audit row.
        """
        global _host
        self.loop = asyncio.get_running_loop()
        self.started_at = time.time()  # messages sent before this were for an earlier router
        # The counter before the presets are read: a change made while they are read is seen.
        self.config_watch = ConfigWatch(self.reload_from_database)
        self.config_watch.version = await sync_to_async(read_version)()
        config, presets = await sync_to_async(specs.load_specs)(self.overrides)
        self.engine = Engine(config, presets, state_file=self.state_file)
        # Issue 5: the audit log and the metrics are listeners; the writer stores rows from a
        # thread and is closed (rows still waiting are written) when its task ends.
        self.audit = AuditWriter.for_engine(
            self.engine, router_id=self.boot, on_outage_over=self._database_back,
            on_journal_back=self._disk_back, node=self.overrides.node,
        ).start()  # fmt: skip
        self.engine.add_tap(self.audit)  # journaled in the publish path (audit_journal.py)
        self.metrics = RouterMetrics()
        self.add_listener(self.metrics.observe)
        self._writer = self.spawn(self.audit.run_until_cancelled())
        self._readers = [
            asyncio.create_task(self._feed_listeners(self.engine.subscribe(maxsize=100_000))),
            asyncio.create_task(self._publish_events(self.engine.subscribe())),
        ]
        leftovers = await self.engine.start()
        for leftover in leftovers:
            log.warning("killed a leftover child from an earlier router: %s", leftover)
        address = ""
        if self.link is not None:
            address = await self.link.start()  # "" when it cannot listen: channels only
        if self.heartbeat and self.overrides.node:
            await self._join()
        if self.heartbeat:
            self._beat = liveness.Heartbeat(
                self.boot, on_back=self.redis_back, link=address, node=self.overrides.node,
                advertise=self.overrides.advertise, status=self.node_status,
                tcp=self.link.tcp_link if self.link is not None else "",
            )  # fmt: skip
            self.spawn(self._beat.run())
            if self.overrides.node:  # placement reads the beat: tell state changes at once
                self.add_listener(self._poke_beat)
        self.spawn(self.config_watch.run())
        _host = self
        transport.install(self)

    async def reload_from_database(self, actor: str) -> None:
        """Take the presets and settings as the database has them now (config_watch.py): new
        limits at once, presets reconciled as a reload does (A14)."""
        config, presets = await sync_to_async(specs.load_specs)(self.overrides)
        if config != self._engine.config:
            await self._engine.update_settings(config, actor=actor)
        await self._engine.reload(presets, actor=actor)

    @property
    def channel(self) -> str:
        """The channel this router listens on: ``router``, or ``router.NODE`` (nodes.py)."""
        return topology.channel(self.overrides.node)

    async def _join(self) -> None:
        """A named node starts: audit that it joined (or returned, and after how long, from
        its last beat), then watch the other nodes for losses (nodes.PeerWatch)."""
        node = self.overrides.node
        client = liveness.redis_client()
        try:
            last = await nodes.last_seen(client, node)
        except Exception:  # Redis away: the beat will say it when Redis returns
            last = None
        finally:
            await client.aclose()
        known = [m["name"] for m in self._engine.snapshot()["models"]]
        lost_for = None if last is None else round(max(0.0, time.time() - last), 1)
        data = {"node": node, "change": "joined", "host": socket.gethostname(),
                "models": known, "silent_for": None, "lost_for": lost_for}  # fmt: skip
        self._engine.note(Event.NODE_CHANGED, data)
        peers = nodes.PeerWatch(node, lambda lost: self._engine.note(Event.NODE_CHANGED, lost))
        self.spawn(peers.run())

    def _poke_beat(self, event: EngineEvent) -> None:
        if event.type in (Event.MODEL_STATE, Event.QUEUE_CHANGED):
            self._beat.poke()

    def node_status(self) -> dict[str, Any]:
        """What the heartbeat tells web processes about this node, for placement (issue 18):
        its capacity, the memory left and each model's state and use."""
        if self.engine is None:
            return {}
        snap = self.engine.snapshot()
        keep = ("name", "state", "stopping", "last_used", "in_flight", "pinned", "queue_waiters")
        models = [
            {k: m.get(k) for k in keep}
            for m in snap["models"]
            if m["state"] != "unloaded" or m.get("queue_waiters")
        ]
        memory = snap.get("memory") or {}
        return {
            "models_max": snap["config"]["models_max"],
            "running": sum(1 for m in snap["models"] if m["state"] in RUNNING_NAMES),
            "memory_available": memory.get("available"),
            "models": models,
            "known": [m["name"] for m in snap["models"]],  # the presets this node may run
            "aliases": {a: m["name"] for m in snap["models"] for a in m.get("aliases") or ()},
        }

    async def stop(self) -> None:
        """Stop every child within its stop-timeout; let the readers drain; then stop."""
        global _host
        registered = _host is self
        if registered:
            _host = None
        if self.engine is not None:
            await self.engine.shutdown()  # ends the subscriptions after their last events
        if registered:
            # Only now: while the engine shuts down, the proxy still asks it directly why a
            # stream broke off (the shutdown revoked its lease); it refuses new work itself.
            transport.install(None)
        if self.link is not None:
            await self.link.stop()  # after the engine's last answers went out on it
        if self._readers:
            await asyncio.wait(self._readers, timeout=10)
        pending = [*self._readers, *self._tasks]
        for task in pending:
            task.cancel()
        # The audit writer's task writes what is still waiting when cancelled: let it finish.
        await asyncio.gather(*pending, return_exceptions=True)
        if self.heartbeat and hasattr(self, "_beat"):
            await self._beat.clear()

    async def _feed_listeners(self, events: Subscription) -> None:
        async for event in events:
            if events.dropped:
                log.error("listeners missed %d router events", events.dropped)
                events.dropped = 0
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:
                    log.exception("event listener failed on event %s", event.seq)

    async def _publish_events(self, events: Subscription) -> None:
        """Send the engine's events to the events group, in order. An event goes out as soon
        as it comes; those that came while the last message was being sent go together in the
        next one (up to ``EVENT_BATCH``): a child's log lines arrive a dozen per request, and
        on Redis each group message costs the router several commands."""
        async for first in events:
            batch = [first, *events.take(EVENT_BATCH - 1)]
            payloads: list[EventPayload] = []
            for event in batch:
                payload: EventPayload = {
                    "seq": event.seq,
                    "type": event.type,
                    "time": event.time,
                    "data": event.data,
                }
                if self.overrides.node:  # several hosts: each node counts its own seq
                    payload["node"] = self.overrides.node
                payloads.append(payload)
            try:
                await self.layer.group_send(topology.EVENTS_GROUP, wire.events_message(payloads))
            except Exception:  # a slow or absent subscriber must never stop the router
                log.debug("events %s-%s not delivered", first.seq, batch[-1].seq, exc_info=True)

    def _database_back(self, seconds: float) -> None:
        """The audit writer's thread saw the database return: audit the outage (thread-safe)."""
        effect = "audit rows waited in the journal and were written when it returned"
        data = {"service": "the database", "seconds": round(seconds, 3), "effect": effect}
        if self.loop is not None and self.engine is not None:
            self.loop.call_soon_threadsafe(self.engine.note, Event.SERVICE_OUTAGE, data)

    def _disk_back(self, seconds: float, rows: int) -> None:
        """The audit journal is written again (a full disk had space freed): audit it."""
        effect = f"{rows} audit rows waited in memory and were written when it took them again"
        data = {"service": "the data disk", "how": "refused writes", "effect": effect,
                "seconds": round(seconds, 3)}  # fmt: skip
        if self.engine is not None:
            self.engine.note(Event.SERVICE_OUTAGE, data)

    def redis_back(self, seconds: float) -> None:
        """Redis returned after ``seconds``: audit the outage (called on the loop)."""
        effect = "the router kept its children; web processes answered 503 meanwhile"
        if self.engine is not None:
            data = {"service": "Redis", "seconds": seconds, "effect": effect}
            self.engine.note(Event.SERVICE_OUTAGE, data)

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("router task %s failed: %s", task.get_name(), exc, exc_info=exc)

    @property
    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("the router is not started")
        return self.engine

    # ---- calls: the same for a web side in this process and one over the layer -------------

    async def call(self, call: Call) -> AnswerBody:
        """Answer one call (``load``, ``unload``, …); raise RouterError when the answer is no."""
        if call["type"] == "router.load":
            return await self._load(call)
        if call["type"] == "router.unload":
            return await self._unload(call)
        if call["type"] == "router.cancel_queued":
            return await self._cancel_queued(call)
        if call["type"] == "router.reload":
            return await self._reload(call)
        if call["type"] == "router.settings":
            return await self._settings(call)
        if call["type"] == "router.reservations":
            return await self._engine.set_reservations(call["reservations"], actor=call["actor"])
        if call["type"] == "router.snapshot":
            return self._snapshot()
        if call["type"] == "router.ready":  # GET /ready: cheap, no snapshot
            return self._ready()
        if call["type"] == "router.memory":
            return self._memory()
        if call["type"] == "router.metrics":
            return self._metrics()
        if call["type"] == "router.logs":
            return self._logs(call)
        if call["type"] == "router.lease":
            return self._lease(call)
        assert_never(call)  # mypy: every Call is answered (handler() lets no other type in)

    async def _load(self, call: LoadCall) -> SuccessAnswer:
        await self._engine.load(call["model"], actor=call["actor"])
        return {"success": True}

    async def _unload(self, call: UnloadCall) -> SuccessAnswer:
        await self._engine.unload(call["model"], actor=call["actor"])
        return {"success": True}

    async def _cancel_queued(self, call: CancelQueuedCall) -> CancelledAnswer:
        ids = await self._engine.cancel_queued(
            model=call.get("model"), request_id=call.get("queued_request"), actor=call["actor"]
        )
        return {"success": True, "cancelled": ids}

    async def _reload(self, call: ReloadCall) -> ReloadAnswer:
        if self.before_reload is not None and call.get("sources"):
            await self.before_reload()
        _, presets = await sync_to_async(specs.load_specs)(self.overrides)
        return await self._engine.reload(presets, actor=call["actor"])

    async def _settings(self, call: SettingsCall) -> SuccessAnswer:
        config, _ = await sync_to_async(specs.load_specs)(self.overrides)
        await self._engine.update_settings(config, actor=call["actor"])
        return {"success": True}

    def _snapshot(self) -> SnapshotAnswer:
        return self._engine.snapshot() | {"boot": self.boot}

    def _ready(self) -> ReadyAnswer:
        return self._engine.status() | {"boot": self.boot, "problems": self.problems()}

    def problems(self) -> list[str]:
        """What keeps the router from writing its files (a full disk): it goes on serving."""
        found = list(self._engine.problems())
        if self.audit.journal.problem:
            held = self.audit.journal.backlogged
            found.append(f"{self.audit.journal.problem} ({held} rows wait in memory)")
        if low := disk.low_space(settings.DATA_DIR, settings.ROUTERPANEL["DISK_WARN_MB"]):
            found.append(low)
        return found

    def _memory(self) -> MemoryAnswer:
        return {"memory": self._engine.memory_history()}

    def _metrics(self) -> MetricsAnswer:
        families = self.metrics.families(self._engine.snapshot())
        by = [("", {"transport": kind}, float(self.acquires[kind])) for kind in TRANSPORTS]
        text = "Acquires this router answered, by the way they came (socket: routerlink.py)."
        families.append(Family("acquires_total", "counter", text, by).as_json())
        return {"metrics": families}

    def _logs(self, call: LogsCall) -> LogsAnswer:
        return {"logs": self._engine.logs(call["model"])}

    def _lease(self, call: LeaseCall) -> LeaseAnswer:
        """Why did the router end this lease (its child was killed as hung)? None: it did not."""
        error = self._engine.why_ended(call["lease_id"])
        if error is None:
            return {"error": None}
        return {"error": error.error, "retry_after": error.retry_after}

    # ---- message handlers (channel layer), one per type -------------------------------------

    def router_acquire(self, message: AcquireMessage) -> None:
        request_id, reply = message["request_id"], message["reply_channel"]
        self.acquires["channel"] += 1

        async def answer(out: AcquireAnswer) -> None:
            await self.layer.send(reply, out)

        self._acquires[request_id] = self.spawn(self.acquire(message, answer))

    async def acquire(
        self,
        message: AcquireMessage,
        answer_with: Callable[[AcquireAnswer], Awaitable[None]],
        on_grant: Callable[[str, str], None] | None = None,
        started: asyncio.Future[Lease] | None = None,
    ) -> None:
        """Acquire for ``message`` and answer it through ``answer_with`` (a reply channel, or a
        socket: routerlink.py); "queued" first when the grant is not at once. ``on_grant``
        (lease id, request id) is called before the grant is answered. ``started``: the
        future ``begin_acquire`` returned for it, when the caller began it already."""
        request_id = message["request_id"]
        future = started if started is not None else self.begin_acquire(message)
        try:
            if not future.done():
                done, _ = await asyncio.wait({future}, timeout=QUEUED_AFTER)
                if not done:
                    position = self._queue_position(message["model"])
                    await answer_with(wire.queued(request_id, position, self.boot))
                    await asyncio.wait({future})
        except asyncio.CancelledError:
            future.cancel()
            self._engine.cancel(request_id)  # A7: leave the queue, or release the grant
            raise
        finally:
            self._acquires.pop(request_id, None)
        await answer_with(self.answer(request_id, future, on_grant))

    def begin_acquire(self, message: AcquireMessage) -> asyncio.Future[Lease]:
        """Hand ``message``'s acquire to the engine now. The future is done on return when the
        engine decided at once (a grant on a loaded model with nobody queued, or a rejection):
        then the answer can go out without a task (``answer``)."""
        try:
            return self._engine.acquire_soon(
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
            return wire.rejected(request_id, exc, self.boot)
        lease = future.result()
        if on_grant is not None:
            on_grant(lease.lease_id, request_id)
        ttl = self._engine.config.lease_ttl  # not snapshot(): that builds every model's view
        return wire.granted(request_id, lease, ttl, self.boot)

    def _queue_position(self, model: str) -> int:
        return self._engine.queue_position(model)

    def router_waiting(self, message: WaitingMessage) -> None:
        """A queued web request heard nothing for a while: say where it stands (a lost answer
        is sent again; a request this router does not know is answered 503)."""
        request_id, reply = message["request_id"], message["reply_channel"]
        lease = self._engine.lease_for(request_id)
        answer: AcquireAnswer
        if request_id in self._acquires:
            position = self._queue_position(message["model"])
            answer = wire.queued(request_id, position, self.boot)
        elif lease is not None:
            ttl = self._engine.config.lease_ttl
            answer = wire.granted(request_id, lease, ttl, self.boot)
        else:
            text = "the router does not know this request (it restarted, or the request was lost)"
            answer = wire.rejected(request_id, unavailable(text, wire.RETRY_AFTER), self.boot)
        self.spawn(self.layer.send(reply, answer))

    def router_renew(self, message: RenewMessage) -> None:
        idle = message.get("idle")
        idle = float(idle) if isinstance(idle, int | float) else None
        self._engine.renew(message["lease_id"], idle=idle)

    def router_release(self, message: ReleaseMessage) -> None:
        self._engine.release(message["lease_id"])

    def router_cancel(self, message: CancelMessage) -> None:
        task = self._acquires.pop(message["request_id"], None)
        if task is not None:
            task.cancel()
        self._engine.cancel(message["request_id"])

    def router_call(self, message: CallMessage) -> None:
        """``router.load``, ``router.unload``, … (every type that ``call`` knows)."""

        async def answer() -> None:
            request_id, reply = message["request_id"], message["reply_channel"]
            work = asyncio.ensure_future(self.call(message))
            done, _ = await asyncio.wait({work}, timeout=QUEUED_AFTER)
            if not done:
                await self.layer.send(reply, wire.accepted(request_id, self.boot))
            try:
                out = wire.result(request_id, await work, boot=self.boot)
            except RouterError as exc:
                out = wire.failed(request_id, exc, self.boot)
            except Exception as exc:  # a bad preset on reload: 500 with the text (rule 2.25)
                log.exception("router %s failed", message["type"])
                out = wire.failed(request_id, RouterError(500, "server_error", str(exc)), self.boot)
            await self.layer.send(reply, out)

        self.spawn(answer())

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
        if boot and boot != self.boot:
            return True
        if not isinstance(sent, int | float):
            return False
        if sent < getattr(self, "started_at", 0.0):
            return True
        beat = getattr(self, "_beat", None)
        return beat is not None and sent < beat.stale_before()

    def drop_expired(self, message: Mapping[str, Any]) -> None:
        """Drop a message that arrived after its deadline (its sender answered the client
        already): counted, and published at most every EXPIRED_NOTE_EVERY seconds."""
        self._expired[str(message.get("type"))] += 1
        if self._expired_flush is None and self.loop is not None:
            self._expired_flush = self.loop.call_later(EXPIRED_NOTE_EVERY, self._note_expired)
            if sum(self._expired.values()) == 1:  # the first of a burst is told at once
                self._note_expired(rearm=True)

    def _note_expired(self, rearm: bool = False) -> None:
        if not rearm:
            self._expired_flush = None
        if not self._expired or self.engine is None:
            return
        counts, self._expired = dict(self._expired), Counter()
        total = sum(counts.values())
        log.warning("dropped %d expired router messages: %s", total, counts)
        self.engine.note(Event.MESSAGE_EXPIRED, {"counts": counts, "total": total})


class RouterConsumer(AsyncConsumer):  # type: ignore[misc]  # Channels has no types
    """The consumer of channel ``router``: forwards each message to the running host."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        host = current_host()
        if host is not None and host.stale(message):
            host.drop_expired(message)  # its sender has answered its client: never run it
            return
        handler = host.handler(message["type"]) if host else None
        if handler is None:
            await self._refuse(message, host)
            return
        try:
            handler(message)
        except RouterError as exc:
            log.info("router refused %s: %s", message["type"], exc.message)
        except Exception:
            log.exception("router message %s failed", message["type"])

    async def _refuse(self, message: Mapping[str, Any], host: RouterHost | None) -> None:
        reply = message.get("reply_channel")
        if not reply:
            return
        text = "router unavailable" if host is None else f"unknown message {message['type']}"
        error = unavailable(text, wire.RETRY_AFTER)
        out: RejectedMessage | ResultMessage
        if message["type"] == "router.acquire":
            out = wire.rejected(message["request_id"], error)
        else:
            out = wire.failed(message.get("request_id", ""), error)
        await self.channel_layer.send(reply, out)


async def run_worker(layer: BaseChannelLayer, channel: str = topology.UNNAMED_CHANNEL) -> None:
    """Consume ``channel`` (``router``, or a node's ``router.NODE``) until cancelled (DESIGN §2).

    A channel-layer error (Redis restarted, a dropped connection) must not end the router and
    orphan the queue: the listener is started again after a short pause, and the engine with
    its children keeps running meanwhile.
    """
    from channels.routing import ChannelNameRouter
    from channels.worker import Worker

    app = ChannelNameRouter({channel: RouterConsumer.as_asgi()})
    while True:
        try:
            await Worker(app, [channel], layer).arun()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the router's channel listener failed; starting it again in 1 s")
            await asyncio.sleep(1)
