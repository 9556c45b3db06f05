"""Host the router engine in this process (DESIGN §2, §5; docs/architecture.md).

``RouterHost`` owns the engine: ``serve`` (embedded mode, in Daphne's event loop) or
``runrouter`` (team mode) creates it, starts it at boot — not on the first message — and stops
it on SIGTERM/SIGINT, which stops every child within its stop-timeout. Around the engine it runs
the audit writer and the metrics (listeners of its events), the events' publisher, the
heartbeat and the router link. Its ``desk`` (desk.py) answers the protocol's messages; the
listener (listener.py) hands it those of channel ``router``, the link server those of its socket.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer
from django.conf import settings

from models_app.audit.writer import AuditWriter, new_router_id
from models_app.presets import specs
from models_app.routing import calls, listener, liveness, nodes, topology, transport, wire
from models_app.routing.config_watch import ConfigWatch, read_version
from models_app.routing.desk import Desk
from models_app.routing.messages import (
    AnswerBody,
    Call,
    EventPayload,
)
from models_app.routing.metrics import RouterMetrics
from routerpanel.router.catalogue import Event
from routerpanel.router.engine import Engine
from routerpanel.router.feed import EngineEvent, Subscription
from routerpanel.router.states import RUNNING

log = logging.getLogger(__name__)
RUNNING_NAMES = frozenset(state.value for state in RUNNING)  # the snapshot's "state" values

# Events in one group message at most: under a flood of long log lines (each cut at 64 KiB,
# supervisor/protocol.py) one message stays within 2 MiB.
EVENT_BATCH = 32


class RouterHost:
    """Run one engine, and the services around it (see module doc)."""

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
        self.started_at = 0.0  # wall clock of the start: earlier messages were for another
        self.beat: liveness.Heartbeat | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._readers: list[asyncio.Task[None]] = []
        self._listeners: list[Callable[[EngineEvent], None]] = []
        self.acquires: Counter[str] = Counter()  # by transport: "socket", "channel" (metrics)
        self.link: Any = None  # link_server.LinkServer of team mode: started before the beat
        self.desk = Desk(self)

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
            self.beat = liveness.Heartbeat(
                self.boot, on_back=self.redis_back, link=address, node=self.overrides.node,
                advertise=self.overrides.advertise, status=self.node_status,
                tcp=self.link.tcp_link if self.link is not None else "",
            )  # fmt: skip
            self.spawn(self.beat.run())
            if self.overrides.node:  # placement reads the beat: tell state changes at once
                self.add_listener(self._poke_beat)
        self.spawn(self.config_watch.run())
        listener.attach(self)
        transport.install(self)

    async def reload_from_database(self, actor: str) -> None:
        """Take the presets and settings as the database has them now (config_watch.py): new
        limits at once, presets reconciled as a reload does (A14)."""
        config, presets = await sync_to_async(specs.load_specs)(self.overrides)
        if config != self.running_engine.config:
            await self.running_engine.update_settings(config, actor=actor)
        await self.running_engine.reload(presets, actor=actor)

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
        known = [m["name"] for m in self.running_engine.snapshot()["models"]]
        lost_for = None if last is None else round(max(0.0, time.time() - last), 1)
        data = {"node": node, "change": "joined", "host": socket.gethostname(),
                "models": known, "silent_for": None, "lost_for": lost_for}  # fmt: skip
        self.running_engine.note(Event.NODE_CHANGED, data)
        peers = nodes.PeerWatch(
            node, lambda lost: self.running_engine.note(Event.NODE_CHANGED, lost)
        )
        self.spawn(peers.run())

    def _poke_beat(self, event: EngineEvent) -> None:
        if event.type in (Event.MODEL_STATE, Event.QUEUE_CHANGED) and self.beat is not None:
            self.beat.poke()

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
        registered = listener.detach(self)
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
        if self.beat is not None:
            await self.beat.clear()

    async def _feed_listeners(self, events: Subscription) -> None:
        async for event in events:
            if events.dropped:
                log.error("listeners missed %d router events", events.dropped)
                events.dropped = 0
            for each in self._listeners:
                try:
                    each(event)
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
    def running_engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("the router is not started")
        return self.engine

    async def call(self, call: Call) -> AnswerBody:
        """Answer one call (calls.py); raise RouterError when the answer is no."""
        return await calls.answer(self, call)
