"""Map the router's lifecycle events to audit rows: correlated, in the order they happened.

``AuditMapper`` turns engine events (``EngineEvent``: seq, type, time, data) into audit rows
(plain dicts of ``AuditEvent`` fields). Most events give one row at once. A stop (eviction,
unload, TTL, reload, shutdown, a hung child's kill) gives one row that waits for the victim's
later ``model.exited`` (stop duration, force-kill, exit code), then for the next memory sample
(memory after) and, in memory mode, for the settle gate (``memory.settled``); it is written
incomplete, with the missing parts named in ``details["incomplete"]``, when they do not come in
time. While it waits it is *pending*: ``on_pending`` hears of it at once, so the journal holds
it before the stop is carried out (audit_journal.py). A row keeps the seq of the event that
started it, so (router boot id, seq) identifies it.

Owned by the router's loop: not thread-safe, never blocks, no I/O.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models_app.models import AuditKind
from models_app.panel.views.common import human_bytes
from routerpanel.router import states
from routerpanel.router.catalogue import Event
from routerpanel.router.decisions import StopReason
from routerpanel.router.feed import EngineEvent

log = logging.getLogger(__name__)

Row = dict[str, Any]

STOP_GRACE = 60.0  # seconds past a stop-timeout before a stop row is written without its exit
AFTER_EXIT = 30.0  # seconds after the exit to wait for memory after and the settle gate
AUDIT_TAIL_LINES = 20  # of the supervisor's last lines (30), the ones an audit row keeps

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
# Why a lease ended without its release (the engine's ``why``), in the audit row's words.
_LEASE_GONE = {
    "not renewed": "lease not renewed in time: the web process serving it is gone",
    "disconnected": "the web process holding it closed its connection to the router "
    "(it exited or was killed): the lease ended at once",
}
EVICTIONS = (StopReason.EVICTION, StopReason.SHRINK)
OWN_ROW = (*EVICTIONS, StopReason.HUNG)  # the stop's own event (evicted, hung) makes the row
# Events that make no row and feed no row: the rest of the catalogue has a handler below.
IGNORED = frozenset(
    {Event.MODEL_PROGRESS, Event.MODEL_LOG, Event.ROUTER_STOPPING, Event.PRESETS_RELOADED}
)  # fmt: skip


def new_router_id() -> str:
    """A boot id: this host and a random part, unique per router start (DESIGN §10: host-ready)."""
    return f"{socket.gethostname()[:40]}:{uuid.uuid4().hex[:12]}"


def stop_reason(value: str | None) -> StopReason | None:
    """The ``model.state`` event's ``stop_reason`` (a StopReason value), if it names one."""
    try:
        return StopReason(value) if value else None
    except ValueError:
        return None


@dataclass
class _Stop:
    """A stop row waiting for the victim's exit (and then memory after, settle)."""

    row: Row
    action: str  # "stop": asked, SIGKILL at the deadline (S4); "kill": SIGKILL at once
    reason: StopReason
    deadline: float  # wall clock: write it incomplete after this
    waiting: set[str] = field(default_factory=lambda: {"exit"})
    exit_time: float | None = None
    timer: asyncio.TimerHandle | None = None


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
        self._on_pending = on_pending
        self._settle_expected = settle_expected
        self.stop_grace = stop_grace
        self.after_exit = after_exit
        self._stops: dict[str, _Stop] = {}  # stop rows waiting for their victim's exit
        # model -> the models evicted to make room for its load, until it is ready or fails: a
        # load that fails after evicting names what it cost.
        self._evicted_for: dict[str, list[str]] = {}
        self._system: dict[str, Any] | None = None  # the last memory sample's system part
        self._running: set[str] = set()  # models whose child runs (model.state events)
        # who lowered which limit, for the evictions that follow (issue 49.6)
        self._lowered: tuple[str, str] = ("scheduler", "models_max or the memory budget")
        self.last_seq = 0
        self.missed = 0  # events never seen (a seq gap: the host's subscription fell behind)

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
        for name, stop in list(self._stops.items()):
            if stop.deadline <= now:
                self._finish(name, stop, incomplete=True)

    def finish_all(self) -> None:
        """Write every waiting row now, incomplete (the router is stopping)."""
        for name, stop in list(self._stops.items()):
            self._finish(name, stop, incomplete=True)

    def pending(self) -> list[tuple[Row, list[str]]]:
        """The rows still waiting (for the exit, memory after, the settle gate), oldest first."""
        stops = sorted(self._stops.values(), key=lambda s: s.row["seq"])
        return [(stop.row, sorted(stop.waiting)) for stop in stops]

    @property
    def _handlers(self) -> dict[Event, Callable[[int, float, Any], None]]:
        """The explicit table of what this reader handles (catalogue.py); IGNORED the rest."""
        return {
            Event.MODEL_STATE: self.model_state, Event.MODEL_EVICTED: self.model_evicted,
            Event.MODEL_HUNG: self.model_hung, Event.MODEL_EXITED: self.model_exited,
            Event.MODEL_STUCK: self.model_stuck, Event.MODEL_BACKOFF: self.model_backoff,
            Event.LEASE_EXPIRED: self.lease_expired, Event.QUEUE_CANCELLED: self.queue_cancelled,
            Event.QUEUE_CHANGED: self.queue_changed, Event.ROUTER_STARTED: self.router_started,
            Event.MEMORY_SAMPLE: self.memory_sample, Event.MEMORY_SETTLED: self.memory_settled,
            Event.MESSAGE_EXPIRED: self.message_expired,
            Event.SERVICE_OUTAGE: self.service_outage, Event.NODE_CHANGED: self.node_changed,
            Event.MODEL_REFUSED: self.model_refused, Event.SETTINGS_CHANGED: self.settings_changed,
        }  # fmt: skip

    # ---- handlers, named after the event types (STYLE 13) ------------------------------------

    def settings_changed(self, seq: int, t: float, d: dict[str, Any]) -> None:
        """Remember who changed the limits and which one now holds fewer models than run: the
        evictions that follow (``shrink``) name both."""
        config = d.get("config") or {}
        models_max, budget = config.get("models_max") or 0, config.get("memory_budget")
        if 0 < models_max < len(self._running):
            what = f"Max running models to {models_max}"
        elif budget is not None:
            what = f"the memory budget to {human_bytes(budget)}"
        else:
            what = "models_max or the memory budget"
        self._lowered = (d.get("actor") or "scheduler", what)

    def model_state(self, seq: int, t: float, d: dict[str, Any]) -> None:
        frm, to = d["from"], d["to"]
        (self._running.add if to in states.RUNNING else self._running.discard)(d["model"])
        trigger = d.get("trigger") or {}
        action = d.get("action")
        if d.get("stopping") and action in ("stop", "kill") and frm == to:
            self._stopping_started(seq, t, d, action, trigger)
        elif to == "loading" and action == "spawn":
            self._row(seq, t, AuditKind.LOADING, d, trigger, memory_before=self._used())
        elif to == "loaded" and frm == "loading" and "loaded_for" in d:  # a spawn's first ready
            self._evicted_for.pop(d["model"], None)
            row = self._row(seq, t, AuditKind.READY, d, {}, emit=False)
            row.update(actor=d["loaded_for"], load_seconds=d.get("load_seconds"))
            self._emit(row)
        elif to == "quarantined":
            details = {"last_lines": list(d.get("log_tail") or [])[-AUDIT_TAIL_LINES:]}
            self._row(seq, t, AuditKind.QUARANTINE, d, {}, details=details)

    def _stopping_started(
        self, seq: int, t: float, d: dict[str, Any], action: str, trigger: dict[str, Any]
    ) -> None:
        model = d["model"]
        reason = stop_reason(d.get("stop_reason")) or StopReason.UNLOAD
        if reason in OWN_ROW:
            return  # model.evicted or model.hung follows at once, with the details
        row = self._row(seq, t, STOP_KINDS[reason], d, trigger, emit=False)
        row.update(memory_before=self._used(), to_state="", idle_seconds=d.get("idle_for"))
        row["details"] |= {"action": action, "stop_timeout": d.get("stop_timeout")}
        row["details"]["memory_before"] = self._system
        self._wait_for_exit(model, row, action, reason, d.get("stop_timeout"), t)

    def model_evicted(self, seq: int, t: float, d: dict[str, Any]) -> None:
        victim, trigger = d["victim"], d.get("trigger") or {}
        frm, action, timeout = d.get("from_state", ""), d.get("action", "stop"), d["stop_timeout"]
        reason = StopReason(d["reason"])
        memory = d.get("memory_before") or {}
        if reason is StopReason.SHRINK:
            actor, what = self._lowered
            why = f"over the limit after {actor} lowered {what}"
            trigger = {**trigger, "actor": actor}
        else:
            why = f"least recently used idle model, stopped for {trigger.get('model')}"
            if trigger.get("model"):
                self._evicted_for.setdefault(trigger["model"], []).append(victim)
        row = _row(
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
        self._wait_for_exit(victim, row, action, reason, timeout, t)

    def model_hung(self, seq: int, t: float, d: dict[str, Any]) -> None:
        """The watchdog's kill: one row, completed by the exit (how long the kill took)."""
        model = d["model"]
        frm, action = d.get("from_state", "loaded"), d.get("action", "kill")
        holders = d.get("holders") or {}
        who = ", ".join(f"{a} ×{n}" for a, n in sorted(holders.items())) or "nobody"
        row = _row(
            seq, t, AuditKind.HUNG, model=model, from_state=frm, actor="watchdog",
            reason=f"no progress for {d.get('idle_seconds', 0):.0f} s ({d.get('probe')}); "
            f"killed with {_requests(d.get('in_flight') or 0)} in flight ({who})",
            idle_seconds=d.get("idle_seconds"), memory_before=self._used(),
            details={
                "pid": d.get("pid"), "in_flight": d.get("in_flight"), "holders": holders,
                "probe": d.get("probe"), "action": action, "stop_reason": "hung",
            },
        )  # fmt: skip
        self._wait_for_exit(model, row, action, StopReason.HUNG, None, t)

    def model_backoff(self, seq: int, t: float, d: dict[str, Any]) -> None:
        n = d.get("strikes") or 1
        times = "once" if n == 1 else f"{n} times in a row"
        self._emit(
            _row(
                seq, t, AuditKind.CRASH_BACKOFF, model=d.get("model") or "", actor="router",
                reason=f"died soon after it started, {times} (last: {d.get('reason')}); "
                f"no new start for {d.get('seconds', 0):g} s",
                details={k: d.get(k) for k in ("seconds", "strikes", "reason", "until")},
            )
        )  # fmt: skip

    def message_expired(self, seq: int, t: float, d: dict[str, Any]) -> None:
        counts = d.get("counts") or {}
        what = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        self._emit(
            _row(
                seq, t, AuditKind.MESSAGE_EXPIRED, actor="router",
                reason=f"dropped {d.get('total', 0)} messages whose senders had stopped waiting "
                f"({what}): nothing they asked for was done",
                details={"counts": counts},
            )
        )  # fmt: skip

    def service_outage(self, seq: int, t: float, d: dict[str, Any]) -> None:
        self._emit(
            _row(
                seq, t, AuditKind.OUTAGE, actor="router",
                reason=f"{d.get('service')} {d.get('how') or 'was unreachable'} for "
                f"{d.get('seconds', 0):.1f} s; "
                f"{d.get('effect') or 'the router kept serving'}",
                details=dict(d),
            )
        )  # fmt: skip

    def node_changed(self, seq: int, t: float, d: dict[str, Any]) -> None:
        node, models = d.get("node") or "", ", ".join(d.get("models") or ()) or "none"
        if d.get("change") == "lost":
            kind = AuditKind.NODE_LOST
            reason = (
                f"node {node} on {d.get('host') or '?'} stopped beating "
                f"{d.get('silent_for') or 0:.0f} s ago; its models are shown as lost and "
                f"requests go to other eligible nodes; it was running: {models}"
            )
        else:
            kind = AuditKind.NODE_JOINED
            back = d.get("lost_for")
            reason = (
                f"node {node} on {d.get('host') or '?'} "
                + (f"returned after {back:.0f} s" if back is not None else "joined")
                + f"; it may run: {models}"
            )
        self._emit(_row(seq, t, kind, actor="router", reason=reason, node=node,
                        details=dict(d)))  # fmt: skip

    def model_exited(self, seq: int, t: float, d: dict[str, Any]) -> None:
        model = d["model"]
        stop = self._stops.get(model)
        if stop is not None and d.get("expected"):
            self._stop_exited(model, stop, seq, t, d)
            return
        frm = d.get("state_before") or ""
        details = _exit_details(d)
        if not d.get("was_ready"):
            kind, why = AuditKind.LOAD_FAILED, d.get("error") or "the child exited while loading"
            if victims := self._evicted_for.pop(model, []):  # what the failed load cost
                why += f"; {', '.join(victims)} had been evicted for it"
                details["evicted_for_it"] = victims
        elif d.get("clean"):
            kind, why = AuditKind.EXITED, d.get("error") or "exited with code 0"
        else:
            kind, why = AuditKind.CRASH, d.get("error") or f"exit code {d.get('exit_code')}"
        row = _row(
            seq, t, kind, model=model, from_state=frm, to_state=d.get("state") or "",
            reason=why, exit_code=d.get("exit_code"), force_killed=d.get("force_killed"),
            load_seconds=None if d.get("was_ready") else d.get("duration"),
            details=details,
        )  # fmt: skip
        self._emit(row)

    def model_refused(self, seq: int, t: float, d: dict[str, Any]) -> None:
        """A load that could not start, refused before anyone was evicted for it."""
        self._emit(
            _row(
                seq, t, AuditKind.LOAD_REFUSED, model=d["model"], actor=d.get("actor") or "",
                reason=f"cannot start, nobody evicted: {d['reason']}",
                trigger_model=d["model"], trigger_request=d.get("request_id") or "",
                details={"kind": d.get("kind")},
            )
        )  # fmt: skip

    def _stop_exited(self, model: str, stop: _Stop, seq: int, t: float, d: dict[str, Any]) -> None:
        row = stop.row
        row.update(
            to_state=d.get("state") or "unloaded",
            stop_seconds=d.get("stop_seconds"),
            force_killed=bool(d.get("force_killed")),
            exit_code=d.get("exit_code"),
        )
        row["details"] |= {"signal": d.get("signal"), "pid": d.get("pid"), "exit_seq": seq}
        if d.get("force_killed") and stop.action == "stop" and d.get("was_ready"):
            timeout = row["details"].get("stop_timeout")
            self._emit(
                _row(
                    seq,
                    t,
                    AuditKind.FORCE_KILL,
                    model=model,
                    actor=row["actor"],
                    from_state=row["from_state"],
                    to_state=row["to_state"],
                    reason=f"still running at its stop-timeout ({timeout} s): "
                    "SIGKILL to its process group",
                    stop_seconds=d.get("stop_seconds"),
                    force_killed=True,
                    exit_code=d.get("exit_code"),
                    details={
                        "stop_seq": row["seq"],
                        "stop_timeout": timeout,
                        "signal": d.get("signal"),
                        "pid": d.get("pid"),
                    },
                )
            )
        stop.waiting.discard("exit")
        stop.exit_time = t
        settle = stop.reason in EVICTIONS and self._settle_expected()
        if settle:
            stop.waiting.add("settle")
        if settle or (self._system is not None and stop.reason is not StopReason.SHUTDOWN):
            stop.waiting.add("memory")  # the sampler runs: the next sample is memory after
        self._arm(model, stop, t + self.after_exit)
        self._maybe_finish(model, stop)

    def model_stuck(self, seq: int, t: float, d: dict[str, Any]) -> None:
        model = d["model"]
        stop = self._stops.get(model)
        secs = d.get("seconds_since_kill") or 0.0
        self._emit(
            _row(
                seq,
                t,
                AuditKind.STUCK,
                model=model,
                actor=stop.row["actor"] if stop else "",
                from_state=d.get("from_state") or "",
                to_state="stuck",
                reason=f"process group still alive {secs:.1f} s after SIGKILL",
                details={"pid": d.get("pid"), "seconds_since_kill": secs},
            )
        )

    def lease_expired(self, seq: int, t: float, d: dict[str, Any]) -> None:
        self._emit(
            _row(
                seq,
                t,
                AuditKind.LEASE_EXPIRED,
                model=d.get("model") or "",
                actor=d.get("actor") or "",
                trigger_request=d.get("request_id") or "",
                reason=_LEASE_GONE.get(d.get("why") or "", _LEASE_GONE["not renewed"]),
                details={"lease_id": d.get("lease_id"), "why": d.get("why") or "not renewed"},
            )
        )

    def queue_cancelled(self, seq: int, t: float, d: dict[str, Any]) -> None:
        ids = d.get("request_ids") or []
        what = "every queued request" if d.get("by_model") else "a queued request"
        self._emit(
            _row(
                seq,
                t,
                AuditKind.QUEUE_CANCELLED,
                model=d.get("model") or "",
                actor=d.get("actor") or "",
                trigger_request=ids[0] if len(ids) == 1 else "",
                queue_depth=len(ids),
                reason=f"{what} cancelled by an operator ({len(ids)} answered 499)",
                details={"request_ids": ids, "by_model": bool(d.get("by_model"))},
            )
        )

    def router_started(self, seq: int, t: float, d: dict[str, Any]) -> None:
        leftovers = d.get("leftovers") or []
        if not leftovers:
            return
        names = ", ".join(sorted({x.get("name", "?") for x in leftovers}))
        outcomes = ", ".join(f"{x.get('name')}: {x.get('outcome')}" for x in leftovers)
        self._emit(
            _row(
                seq,
                t,
                AuditKind.LEFTOVER_KILLED,
                model=names,
                actor="router",
                reason=f"children of an earlier router ({outcomes})",
                details={"leftovers": leftovers},
            )
        )

    def queue_changed(self, seq: int, t: float, d: dict[str, Any]) -> None:
        entries = d.get("entries") or []
        added = set(d.get("added") or ())
        new = [e for e in entries if e["ticket"] in added]
        if not new:
            return
        first = new[0]
        waiter = (first.get("requests") or [{}])[0]  # who made the entry: its oldest waiter
        self._emit(
            _row(
                seq,
                t,
                AuditKind.LOAD_REQUESTED,
                model=first["model"],
                actor=waiter.get("actor") or "",
                trigger_request=waiter.get("request_id") or "",
                queue_depth=d.get("depth"),
                memory_before=self._used(),
                reason=(
                    "loading at once: a slot was free"
                    if first.get("starting")
                    else f"queued at position {first['position']} until a slot is free"
                ),
                details={
                    "ticket": first["ticket"],
                    "position": first["position"],
                    "waiters": first["waiters"],
                    "also": [e["model"] for e in new[1:]],
                },
            )
        )

    def memory_sample(self, seq: int, t: float, d: dict[str, Any]) -> None:
        self._system = d.get("system")
        taken = d.get("time", t)
        for name, stop in list(self._stops.items()):
            if "memory" in stop.waiting and stop.exit_time is not None and taken >= stop.exit_time:
                stop.row["memory_after"] = (self._system or {}).get("used")
                stop.row["details"]["memory_after"] = self._system
                stop.waiting.discard("memory")
                self._maybe_finish(name, stop)

    def memory_settled(self, seq: int, t: float, d: dict[str, Any]) -> None:
        for name, stop in list(self._stops.items()):
            if "settle" in stop.waiting:
                stop.row["settle_seconds"] = d.get("waited")
                stop.row["details"] |= {"settle_by": d.get("by"), "settle_for": d.get("model")}
                stop.waiting.discard("settle")
                self._maybe_finish(name, stop)

    # ---- helpers ----------------------------------------------------------------------------

    def _row(
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
        row = _row(
            seq, t, kind, model=d["model"], from_state=d["from"], to_state=d["to"],
            reason=d.get("reason") or "", actor=trigger.get("actor") or "",
            trigger_model=trigger.get("model") or "",
            trigger_request=trigger.get("request_id") or "",
            queue_depth=trigger.get("queue_depth") if trigger else None,
            details=details or {}, **extra,
        )  # fmt: skip
        if emit:
            self._emit(row)
        return row

    def _used(self) -> int | None:
        return None if self._system is None else self._system.get("used")

    def _wait_for_exit(
        self,
        model: str,
        row: Row,
        action: str,
        reason: StopReason,
        stop_timeout: float | None,
        t: float,
    ) -> None:
        old = self._stops.pop(model, None)
        if old is not None:  # a new stop before the old one's exit: never lose the old row
            self._finish(model, old, incomplete=True)
        stop = _Stop(row, action, reason, deadline=0.0)
        self._stops[model] = stop
        self._on_pending(row, sorted(stop.waiting))  # journaled before the stop is carried out
        self._arm(model, stop, t + (stop_timeout or 0.0) + self.stop_grace)

    def _arm(self, model: str, stop: _Stop, deadline: float) -> None:
        stop.deadline = deadline
        if stop.timer is not None:
            stop.timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a test feeding by hand): the next event's expire() checks
        delay = max(0.0, deadline - time.time()) + 0.01
        stop.timer = loop.call_later(delay, lambda: self.expire(time.time()))

    def _maybe_finish(self, model: str, stop: _Stop) -> None:
        if not stop.waiting:
            self._finish(model, stop, incomplete=False)

    def _finish(self, model: str, stop: _Stop, *, incomplete: bool) -> None:
        if self._stops.get(model) is stop:
            del self._stops[model]
        if stop.timer is not None:
            stop.timer.cancel()
        if incomplete and stop.waiting:
            stop.row["details"]["incomplete"] = sorted(stop.waiting)
        self._emit(stop.row)


def _row(seq: int, t: float, kind: str, **fields: Any) -> Row:
    row: Row = {"seq": seq, "time": t, "kind": str(kind)}
    row.update(fields)
    row.setdefault("details", {})
    return row


def _requests(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


def _exit_details(d: dict[str, Any]) -> dict[str, Any]:
    keys = ("pid", "signal", "duration", "expected", "was_ready", "stop_seconds")
    return {k: d.get(k) for k in keys} | {
        "last_lines": (d.get("last_lines") or [])[-AUDIT_TAIL_LINES:]
    }
