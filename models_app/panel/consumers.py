"""The dashboard's WebSocket: a snapshot on connect, then the router's numbered events (DESIGN §7).

``DashboardConsumer`` refuses anyone without a panel role (the handshake is closed before it is
accepted), then joins the router's events group and sends, in order:

* ``{"type": "snapshot", "snapshot": {...}, "presets": {...}}`` — the engine's whole state with
  its ``seq`` and each preset's id and memory estimate;
* ``{"type": "memory", "history": {...}}`` — the one-hour memory ring as columns;
* ``{"type": "audit", "rows": [...]}`` — the latest audit rows, then new ones as they land;
* ``{"type": "event", "event": {seq, type, time, data}}`` — every router event as it happens.

A user has at most ``ROUTERPANEL_MAX_SOCKETS_PER_USER`` of these open; one more is accepted
and closed at once with ``dashboard_sockets.CLOSE_TOO_MANY`` and a reason the page shows. When a
socket ends, everything it held goes with it: its tasks, its place in the events group and in
the count, and whatever the channel layer still kept for it (layers.py, ``forget``).

The browser checks ``seq``: an event that is not the next one means it missed some (channel
layers drop messages for slow readers, STYLE 14) and it sends ``{"type": "resync"}`` for a new
snapshot. Other messages from the browser: ``{"type": "logs", "model"}`` (that model's log
ring) and ``{"type": "action", "id", "action": load|unload|pin|unpin|cancel, "model",
"request_id"?}`` (cancel: the model's queued requests, or just that one) — operators only,
checked against the database on every message, answered with ``{"type": "action_result"}``.

Audit rows are written by the router's batch writer and by the web side, possibly in another
process, so the consumer reads new rows from the database: soon after each lifecycle event, and
every few seconds otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model
from django.db import DatabaseError
from django.urls import reverse

from models_app.accounts.roles import Role, role_of
from models_app.audit import labels as audit_labels
from models_app.audit import records as audit
from models_app.models import AuditEvent, Preset
from models_app.panel import dashboard_sockets, dashboard_view
from models_app.panel.views import actions, common, memory
from models_app.routing import layers, topology
from models_app.routing.messages import EventMessage, EventPayload, EventsMessage
from routerpanel.router.catalogue import QUIET

log = logging.getLogger(__name__)

AUDIT_POLL = 3.0  # seconds between two reads of new audit rows when nothing happens
AUDIT_FAST = 0.5  # ... and for a few seconds after a lifecycle event
ROLE_RECHECK = 30.0  # seconds between two checks that the user still has a role
FEED_ROWS = 12
SNAPSHOT_RETRY = 1.0  # seconds before asking an unavailable router again (doubling)
SNAPSHOT_RETRY_MAX = 10.0
QUIET_EVENTS = QUIET  # no audit row follows these (catalogue.py)
CLOSE_FORBIDDEN = 4403


def fresh_role(user: Any) -> Role:
    """Read the user's role from the database now (a role may change while a socket is open)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return Role.NONE
    current = get_user_model().objects.filter(pk=user.pk).first()
    return role_of(current)


def audit_row(row: AuditEvent) -> dict[str, Any]:
    return {
        "id": row.pk,
        "time": row.time.timestamp(),
        "kind": row.kind,
        "kind_label": row.get_kind_display(),
        "model": row.model,
        "actor": row.actor,
        "reason": audit_labels.reason(row.kind, row.reason),  # field names in the panel's words
        "from": row.from_state,
        "to": row.to_state,
        "url": reverse("panel:audit_detail", args=[row.pk]),
        "node": row.node,  # several hosts: the node whose router wrote it
    }


def preset_facts(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each shown model's preset id and memory estimate."""
    rows = Preset.objects.filter(name__in=names)
    rows_ = rows.values_list("name", "pk", "memory_estimate", "gguf_estimate")
    return {name: {"id": pk, "estimate": own or gguf} for name, pk, own, gguf in rows_}


class DashboardConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]  # Channels: no types
    """One browser tab's live view; see the module doc for the messages."""

    admitted = False  # holds a place among its user's sockets (dashboard_sockets.py)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # however it ends (a disconnect, the server cancelling it): drop what it holds
            self._let_go()

    async def connect(self) -> None:
        self.user = self.scope.get("user")
        self.role = await database_sync_to_async(fresh_role)(self.user)
        if self.role < Role.VIEWER:
            await self.close(code=CLOSE_FORBIDDEN)  # before accept: the handshake is refused
            return
        self.tasks: set[asyncio.Task[Any]] = set()
        if not await dashboard_sockets.admit(self.channel_layer, self.user.pk, self.channel_name):
            await self._refuse()
            return
        self.admitted = True
        dashboard_sockets.OPEN.add(self.user.pk, self.channel_name, self.tasks)
        self.audit_after = 0
        self.nudge = asyncio.Event()
        self.resyncing: asyncio.Task[None] | None = None
        self.resync_again = False
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.wants_memory = query.get("memory", ["1"])[0] != "0"  # the logs page needs none
        self.view = dashboard_view.View.of({key: values[0] for key, values in query.items()})
        await self.accept()
        try:
            await self.channel_layer.group_add(topology.EVENTS_GROUP, self.channel_name)
        except Exception as exc:  # Redis away: the snapshot loop below waits for the router
            log.warning("dashboard: could not join the events group yet: %s", exc)
            self._spawn(self._join_later())
        self._spawn(self._start())
        self._spawn(dashboard_sockets.renew(self.channel_layer, self.user.pk, self.channel_name))

    async def _refuse(self) -> None:
        """Over the cap: accepted, so that the page can read why, and closed at once."""
        dashboard_sockets.OPEN.refused += 1
        limit = dashboard_sockets.cap()
        await self.accept()
        reason = dashboard_sockets.too_many(self.user.get_username(), limit)
        await self.close(code=dashboard_sockets.CLOSE_TOO_MANY, reason=reason)

    async def disconnect(self, code: int) -> None:
        for task in getattr(self, "tasks", ()):
            task.cancel()
        with contextlib.suppress(Exception):
            await self.channel_layer.group_discard(topology.EVENTS_GROUP, self.channel_name)
        if self.admitted:
            self._let_go()
            await dashboard_sockets.release(self.channel_layer, self.user.pk, self.channel_name)

    def _let_go(self) -> None:
        """Cancel the socket's tasks, give back its place, drop what the layer keeps for it."""
        for task in getattr(self, "tasks", ()):
            task.cancel()
        if self.admitted:
            dashboard_sockets.OPEN.remove(self.user.pk, self.channel_name)
        if getattr(self, "channel_layer", None) is not None:
            layers.forget(self.channel_layer, self.channel_name)

    async def _join_later(self) -> None:
        delay = 0.5
        while True:
            await asyncio.sleep(delay)
            try:
                await self.channel_layer.group_add(topology.EVENTS_GROUP, self.channel_name)
            except Exception:
                delay = min(delay * 2, SNAPSHOT_RETRY_MAX)
                continue
            self._resync()
            return

    async def _start(self) -> None:
        await self._send_snapshot()
        if self.wants_memory:
            await self._send_memory()
        await self._send_audit(FEED_ROWS)
        self._spawn(self._audit_loop())

    # ---- router events (group message type "router.event") ------------------------------------

    async def router_event(self, message: EventMessage) -> None:
        await self._forward([message["event"]])

    async def router_events(self, message: EventsMessage) -> None:
        """Several events in one group message (the router sends what came meanwhile)."""
        await self._forward(message["events"])

    async def _forward(self, events: list[EventPayload]) -> None:
        for event in events:
            await self.send_json({"type": "event", "event": event})
        if any(event.get("type") not in QUIET_EVENTS for event in events):
            self.nudge.set()

    async def layer_reconnected(self, message: dict[str, Any]) -> None:
        """Redis came back (routing/layers.py): events may have been lost, take a snapshot."""
        self._resync()

    # ---- from the browser ---------------------------------------------------------------------

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        if kind == "resync":
            self._resync()
        elif kind == "logs" and isinstance(content.get("model"), str):
            self._spawn(self._send_logs(content["model"]))
        elif kind == "memory":
            self._spawn(self._send_memory())
        elif kind == "action":
            self._spawn(self._action(content))
        else:
            await self.send_json({"type": "error", "message": f"unknown message {kind!r}"})

    async def _action(self, content: dict[str, Any]) -> None:
        request_id = content.get("id")
        action, model = content.get("action"), content.get("model")
        self.role = await database_sync_to_async(fresh_role)(self.user)
        if self.role < Role.OPERATOR:
            text = "forbidden: only operators and admins may load, unload, pin or cancel"
            await self._action_result(request_id, False, text, forbidden=True)
            return
        if action not in actions.ACTIONS or not isinstance(model, str) or not model:
            await self._action_result(request_id, False, "choose a model and an action")
            return
        queued = content.get("request_id")
        actor = audit.actor_of(self.user)
        queued = queued if isinstance(queued, str) else ""
        try:
            outcome = await actions.run(action, model, actor, self.user.pk, queued)
        except DatabaseError as exc:  # SQLite's "database is locked" under write contention
            log.warning("%s %s failed: %s", action, model, exc)
            await self._action_result(request_id, False, f"{model}: {action} failed ({exc})")
            return  # answered: the page's button comes back instead of waiting for ever
        await self._action_result(request_id, outcome.ok, outcome.message, pending=outcome.pending)

    async def _action_result(self, request_id: Any, ok: bool, message: str, **flags: Any) -> None:
        answer = {"type": "action_result", "id": request_id, "ok": ok, "message": message}
        await self.send_json(answer | flags)

    # ---- what we send -------------------------------------------------------------------------

    def _resync(self) -> None:
        """Send a new snapshot; requests while one is on its way coalesce into one more."""
        if self.resyncing is not None and not self.resyncing.done():
            self.resync_again = True
            return
        self.resyncing = self._spawn(self._resync_loop())

    async def _resync_loop(self) -> None:
        while True:
            self.resync_again = False
            await self._send_snapshot()
            if not self.resync_again:
                return

    async def _send_snapshot(self) -> None:
        """Send the router's snapshot; while it does not answer, say so and try again (with
        back-off) until it does — a socket opened during an outage heals by itself."""
        delay = SNAPSHOT_RETRY
        while True:
            answer = await common.call_router({"type": "router.snapshot"})
            shown = None if answer.body is None else dashboard_view.select(answer.body, self.view)
            names = dashboard_view.shown_names(shown or {})
            try:
                presets = await database_sync_to_async(preset_facts)(names)
            except Exception:  # the database away: the page keeps its preset facts
                presets = {}
            if shown is not None:
                snapshot = {"type": "snapshot", "snapshot": shown, "presets": presets}
                await self.send_json(snapshot)
                return
            await self.send_json({"type": "snapshot", "error": answer.error, "presets": presets})
            await asyncio.sleep(delay)
            delay = min(delay * 2, SNAPSHOT_RETRY_MAX)

    async def _send_memory(self) -> None:
        answer = await common.call_router({"type": "router.memory"})
        samples = (answer.body or {}).get("memory")
        if isinstance(samples, list):
            await self.send_json({"type": "memory", "history": memory.columns(samples)})

    async def _send_logs(self, model: str) -> None:
        answer = await common.call_router({"type": "router.logs", "model": model})
        lines = (answer.body or {}).get("logs")
        message = {
            "type": "logs",
            "model": model,
            "lines": lines if isinstance(lines, list) else [],
        }
        await self.send_json(message | ({"error": answer.error} if answer.error else {}))

    async def _send_audit(self, initial: int = 0) -> None:
        rows = await database_sync_to_async(self._new_audit_rows)(initial)
        if rows or initial:
            await self.send_json({"type": "audit", "rows": rows, "initial": bool(initial)})

    def _new_audit_rows(self, initial: int) -> list[dict[str, Any]]:
        if initial:
            rows = list(AuditEvent.objects.order_by("-id")[:initial])[::-1]
        else:
            rows = list(AuditEvent.objects.filter(id__gt=self.audit_after).order_by("id")[:50])
        if rows:
            self.audit_after = max(self.audit_after, rows[-1].pk)
        return [audit_row(r) for r in rows]

    async def _audit_loop(self) -> None:
        """Read new audit rows soon after lifecycle events and every AUDIT_POLL seconds."""
        fast_until = checked_role = time.monotonic()
        while True:
            timeout = AUDIT_FAST if time.monotonic() < fast_until else AUDIT_POLL
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.nudge.wait(), timeout)
            if self.nudge.is_set():
                self.nudge.clear()
                fast_until = time.monotonic() + 3.0
                await asyncio.sleep(0.1)  # let the writer land the row
            try:
                await self._send_audit()
            except Exception:  # a database hiccup must not end the live view
                log.warning("could not read new audit rows", exc_info=True)
            if time.monotonic() - checked_role > ROLE_RECHECK:
                checked_role = time.monotonic()
                if await database_sync_to_async(fresh_role)(self.user) < Role.VIEWER:
                    await self.close(code=CLOSE_FORBIDDEN)
                    return

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("dashboard socket task failed", exc_info=task.exception())
