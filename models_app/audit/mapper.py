"""Map the router's lifecycle events to audit rows: correlated, in the order they happened.

``AuditMapper`` turns engine events (``EngineEvent``: seq, type, time, data) into audit rows
(plain dicts of ``AuditEvent`` fields, rows.py). It reads each event once, in order, and hands
it to its handler (the explicit table below). It is composed of three parts:

- instant.py builds the rows of the events that make their row at once (a lease expired, a
  queue entry, an outage, a node lost...): one event, one row, nothing remembered;
- stops.py holds the stop rows that wait (eviction, unload, TTL, reload, shutdown, a hung
  child's kill): for the victim's exit, then memory after and the settle gate; each is pending
  (``on_pending``, so the journal holds it before the stop is carried out, journal.py) until it
  is complete or its time is up;
- attribution.py remembers who a stop or a failed load is put down to: the limit lowered before
  a shrink, the models evicted for a load that then failed.

The mapper itself keeps the last memory sample and builds the rows of the model.state,
model.evicted, model.hung and model.exited events, which join those parts. A row keeps the seq
of the event that started it, so (router boot id, seq) identifies it.

Owned by the router's loop: not thread-safe, never blocks, no I/O.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Callable
from typing import Any

from models_app.audit import instant
from models_app.audit.attribution import Attribution
from models_app.audit.rows import AUDIT_TAIL_LINES, Row, exit_details, requests_text, row
from models_app.audit.stops import AFTER_EXIT, EVICTIONS, STOP_GRACE, Stops
from models_app.models import AuditKind
from routerpanel.router.catalogue import Event
from routerpanel.router.decisions import StopReason
from routerpanel.router.feed import EngineEvent

log = logging.getLogger(__name__)

STOP_KINDS = {
    StopReason.EVICTION: AuditKind.EVICTION,
    StopReason.SHRINK: AuditKind.EVICTION,
    StopReason.TTL: AuditKind.TTL,
    StopReason.UNLOAD: AuditKind.UNLOAD,
    StopReason.RELOAD: AuditKind.RELOAD,
    StopReason.REMOVED: AuditKind.RELOAD,
    StopReason.SHUTDOWN: AuditKind.SHUTDOWN,
    StopReason.HUNG: AuditKind.HUNG,
}
OWN_ROW = (*EVICTIONS, StopReason.HUNG)  # the stop's own event (evicted, hung) makes the row
# Events that make no row and feed no row: the rest of the catalogue has a handler below.
IGNORED = frozenset(
    {Event.MODEL_PROGRESS, Event.MODEL_LOG, Event.ROUTER_STOPPING, Event.PRESETS_RELOADED}
)  # fmt: skip

Handler = Callable[[int, float, Any], None]


def new_router_id() -> str:
    """A boot id: this host and a random part, unique per router start (DESIGN §10: host-ready)."""
    return f"{socket.gethostname()[:40]}:{uuid.uuid4().hex[:12]}"


def stop_reason(value: str | None) -> StopReason | None:
    """The ``model.state`` event's ``stop_reason`` (a StopReason value), if it names one."""
    try:
        return StopReason(value) if value else None
    except ValueError:
        return None


class AuditMapper:
    """Map engine events to audit rows, in the order the engine published them (see module doc).

    Call ``feed`` from the router's loop for every event; ``emit`` gets each finished row. Owned
    by that loop: not thread-safe, never blocks.
    """

    def __init__(
        self,
        emit: Callable[[Row], None],
        *,
        on_pending: Callable[[Row, list[str]], None] = lambda row, waiting: None,
        settle_expected: Callable[[], bool] = lambda: False,
        stop_grace: float = STOP_GRACE,
        after_exit: float = AFTER_EXIT,
    ) -> None:
        self._emit = emit
        # The stops emit through self._emit, looked up at each row: whoever replaces it (a test
        # counting the rows) hears the stop rows too.
        self._stops = Stops(
            lambda finished: self._emit(finished),
            on_pending=on_pending,
            settle_expected=settle_expected,
            stop_grace=stop_grace,
            after_exit=after_exit,
        )
        self._attribution = Attribution()
        self._system: dict[str, Any] | None = None  # the last memory sample's system part
        self.last_seq = 0
        self.missed = 0  # events never seen (a seq gap: the host's subscription fell behind)

    @property
    def stop_grace(self) -> float:
        """Seconds past a stop-timeout before a stop row is written without its exit."""
        return self._stops.stop_grace

    @stop_grace.setter
    def stop_grace(self, seconds: float) -> None:
        self._stops.stop_grace = seconds

    @property
    def after_exit(self) -> float:
        """Seconds after the exit to wait for memory after and the settle gate."""
        return self._stops.after_exit

    @after_exit.setter
    def after_exit(self, seconds: float) -> None:
        self._stops.after_exit = seconds

    # ---- input ------------------------------------------------------------------------------

    def feed(self, event: EngineEvent) -> None:
        if self.last_seq and event.seq > self.last_seq + 1:
            self.missed += event.seq - self.last_seq - 1
            log.warning("audit: events %d-%d were never seen", self.last_seq + 1, event.seq - 1)
        self.last_seq = max(self.last_seq, event.seq)
        handler = self._handlers.get(event.type)
        if handler is not None:
            handler(event.seq, event.time, event.data)
        elif event.type not in IGNORED:
            log.error("audit: no handler for event type %r", event.type)
        self.expire(event.time)

    def expire(self, now: float) -> None:
        """Write the stop rows whose deadline has passed, incomplete."""
        self._stops.expire(now)

    def finish_all(self) -> None:
        """Write every waiting row now, incomplete (the router is stopping)."""
        self._stops.finish_all()

    def pending(self) -> list[tuple[Row, list[str]]]:
        """The rows still waiting (for the exit, memory after, the settle gate), oldest first."""
        return self._stops.pending()

    @property
    def _handlers(self) -> dict[Event, Handler]:
        """The explicit table of what this reader handles (catalogue.py); IGNORED the rest."""
        return {
            Event.MODEL_STATE: self.model_state, Event.MODEL_EVICTED: self.model_evicted,
            Event.MODEL_HUNG: self.model_hung, Event.MODEL_EXITED: self.model_exited,
            Event.MODEL_STUCK: self.model_stuck,
            Event.MODEL_BACKOFF: self._instant(instant.model_backoff),
            Event.LEASE_EXPIRED: self._instant(instant.lease_expired),
            Event.QUEUE_CANCELLED: self._instant(instant.queue_cancelled),
            Event.QUEUE_CHANGED: self.queue_changed,
            Event.ROUTER_STARTED: self._instant(instant.router_started),
            Event.MEMORY_SAMPLE: self.memory_sample, Event.MEMORY_SETTLED: self.memory_settled,
            Event.MESSAGE_EXPIRED: self._instant(instant.message_expired),
            Event.SERVICE_OUTAGE: self._instant(instant.service_outage),
            Event.NODE_CHANGED: self._instant(instant.node_changed),
            Event.MODEL_REFUSED: self._instant(instant.model_refused),
            Event.SETTINGS_CHANGED: self.settings_changed,
        }  # fmt: skip

    def _instant(self, build: Callable[[int, float, dict[str, Any]], Row | None]) -> Handler:
        """The handler of an event that makes its row at once (or none)."""

        def handle(seq: int, t: float, d: dict[str, Any]) -> None:
            made = build(seq, t, d)
            if made is not None:
                self._emit(made)

        return handle

    # ---- handlers, named after the event types (STYLE 13) ------------------------------------

    def settings_changed(self, seq: int, t: float, d: dict[str, Any]) -> None:
        self._attribution.limits_changed(d)

    def model_state(self, seq: int, t: float, d: dict[str, Any]) -> None:
        frm, to = d["from"], d["to"]
        self._attribution.state(d["model"], to)
        trigger = d.get("trigger") or {}
        action = d.get("action")
        if d.get("stopping") and action in ("stop", "kill") and frm == to:
            self._stopping_started(seq, t, d, action, trigger)
        elif to == "loading" and action == "spawn":
            self._state_row(seq, t, AuditKind.LOADING, d, trigger, memory_before=self._used())
        elif to == "loaded" and frm == "loading" and "loaded_for" in d:  # a spawn's first ready
            self._attribution.ready(d["model"])
            ready = self._state_row(seq, t, AuditKind.READY, d, {}, emit=False)
            ready.update(actor=d["loaded_for"], load_seconds=d.get("load_seconds"))
            self._emit(ready)
        elif to == "quarantined":
            details = {"last_lines": list(d.get("log_tail") or [])[-AUDIT_TAIL_LINES:]}
            self._state_row(seq, t, AuditKind.QUARANTINE, d, {}, details=details)

    def _stopping_started(
        self, seq: int, t: float, d: dict[str, Any], action: str, trigger: dict[str, Any]
    ) -> None:
        model = d["model"]
        reason = stop_reason(d.get("stop_reason")) or StopReason.UNLOAD
        if reason in OWN_ROW:
            return  # model.evicted or model.hung follows at once, with the details
        stopping = self._state_row(seq, t, STOP_KINDS[reason], d, trigger, emit=False)
        stopping.update(memory_before=self._used(), to_state="", idle_seconds=d.get("idle_for"))
        stopping["details"] |= {"action": action, "stop_timeout": d.get("stop_timeout")}
        stopping["details"]["memory_before"] = self._system
        self._stops.wait_for_exit(model, stopping, action, reason, d.get("stop_timeout"), t)

    def model_evicted(self, seq: int, t: float, d: dict[str, Any]) -> None:
        victim = d["victim"]
        frm, action, timeout = d.get("from_state", ""), d.get("action", "stop"), d["stop_timeout"]
        reason = StopReason(d["reason"])
        memory = d.get("memory_before") or {}
        why, trigger = self._attribution.eviction(victim, reason, d.get("trigger") or {})
        evicted = row(
            seq, t, AuditKind.EVICTION, model=victim, from_state=frm, reason=why,
            actor=trigger.get("actor") or "", trigger_model=trigger.get("model") or "",
            trigger_request=trigger.get("request_id") or "", queue_depth=d.get("queue_depth"),
            idle_seconds=d.get("idle_for"), memory_before=memory.get("used"),
            details={
                "stop_reason": reason.value, "action": action, "stop_timeout": timeout,
                "in_flight": d.get("in_flight"), "victim_rss": memory.get("victim_rss"),
                "memory_before": {k: v for k, v in memory.items() if k != "victim_rss"} or None,
            },
        )  # fmt: skip
        self._stops.wait_for_exit(victim, evicted, action, reason, timeout, t)

    def model_hung(self, seq: int, t: float, d: dict[str, Any]) -> None:
        """The watchdog's kill: one row, completed by the exit (how long the kill took)."""
        model = d["model"]
        frm, action = d.get("from_state", "loaded"), d.get("action", "kill")
        holders = d.get("holders") or {}
        who = ", ".join(f"{a} ×{n}" for a, n in sorted(holders.items())) or "nobody"
        hung = row(
            seq, t, AuditKind.HUNG, model=model, from_state=frm, actor="watchdog",
            reason=f"no progress for {d.get('idle_seconds', 0):.0f} s ({d.get('probe')}); "
            f"killed with {requests_text(d.get('in_flight') or 0)} in flight ({who})",
            idle_seconds=d.get("idle_seconds"), memory_before=self._used(),
            details={
                "pid": d.get("pid"), "in_flight": d.get("in_flight"), "holders": holders,
                "probe": d.get("probe"), "action": action, "stop_reason": "hung",
            },
        )  # fmt: skip
        self._stops.wait_for_exit(model, hung, action, StopReason.HUNG, None, t)

    def model_exited(self, seq: int, t: float, d: dict[str, Any]) -> None:
        model = d["model"]
        stop = self._stops.get(model)
        if stop is not None and d.get("expected"):
            self._stops.exited(model, stop, seq, t, d, sampling=self._system is not None)
            return
        frm = d.get("state_before") or ""
        details = exit_details(d)
        if not d.get("was_ready"):
            kind, why = AuditKind.LOAD_FAILED, d.get("error") or "the child exited while loading"
            if victims := self._attribution.load_failed(model):  # what the failed load cost
                why += f"; {', '.join(victims)} had been evicted for it"
                details["evicted_for_it"] = victims
        elif d.get("clean"):
            kind, why = AuditKind.EXITED, d.get("error") or "exited with code 0"
        else:
            kind, why = AuditKind.CRASH, d.get("error") or f"exit code {d.get('exit_code')}"
        exited = row(
            seq, t, kind, model=model, from_state=frm, to_state=d.get("state") or "",
            reason=why, exit_code=d.get("exit_code"), force_killed=d.get("force_killed"),
            load_seconds=None if d.get("was_ready") else d.get("duration"),
            details=details,
        )  # fmt: skip
        self._emit(exited)

    def model_stuck(self, seq: int, t: float, d: dict[str, Any]) -> None:
        stop = self._stops.get(d["model"])
        self._emit(instant.model_stuck(seq, t, d, actor=stop.row["actor"] if stop else ""))

    def queue_changed(self, seq: int, t: float, d: dict[str, Any]) -> None:
        requested = instant.queue_changed(seq, t, d, memory_before=self._used())
        if requested is not None:
            self._emit(requested)

    def memory_sample(self, seq: int, t: float, d: dict[str, Any]) -> None:
        self._system = d.get("system")
        self._stops.sampled(self._system, d.get("time", t))

    def memory_settled(self, seq: int, t: float, d: dict[str, Any]) -> None:
        self._stops.settled(d)

    # ---- helpers ----------------------------------------------------------------------------

    def _state_row(
        self,
        seq: int,
        t: float,
        kind: str,
        d: dict[str, Any],
        trigger: dict[str, Any],
        *,
        emit: bool = True,
        details: dict[str, Any] | None = None,
        **extra: Any,
    ) -> Row:
        """The row of a ``model.state`` event, naming its trigger."""
        made = row(
            seq, t, kind, model=d["model"], from_state=d["from"], to_state=d["to"],
            reason=d.get("reason") or "", actor=trigger.get("actor") or "",
            trigger_model=trigger.get("model") or "",
            trigger_request=trigger.get("request_id") or "",
            queue_depth=trigger.get("queue_depth") if trigger else None,
            details=details or {}, **extra,
        )  # fmt: skip
        if emit:
            self._emit(made)
        return made

    def _used(self) -> int | None:
        return None if self._system is None else self._system.get("used")
