"""The scheduler's book: the model table, the queue and what one input decides (STYLE 2).

``Book`` holds the state every scheduler input changes — one ``ModelRecord`` per model, the
FIFO ``WaitQueue`` (waitqueue.py), the granted requests and their owners, each owner's recent
use (fairshare.py), the reservations, the settle gate — and the decisions gathered during one
input. Its helpers are the one choke point for state changes (``set_state``) and the only way
decisions are emitted. Pure: no I/O, no clock. ``scheduler.Scheduler`` owns a book and the
parts that work on it: ``admission.Admission`` runs the admission rules over it,
``arrivals.Arrivals`` takes requests in and out, ``children.Children`` mirrors what a child
reports, ``reconcile.reconcile`` applies a reload. They read and write the book through these
names, and the book knows none of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from routerpanel.router.backoff import CrashLoop
from routerpanel.router.blocked import Holder, blocked_reason
from routerpanel.router.config import PresetSpec, RouterConfig, preset_map
from routerpanel.router.decisions import (
    BackedOff,
    Decision,
    Grant,
    Kill,
    ModelView,
    QueueEntryView,
    Reject,
    RequestKind,
    StateChanged,
    Stop,
    StopReason,
    Trigger,
    WaiterView,
)
from routerpanel.router.fairshare import RecentUse, owner_of
from routerpanel.router.states import (
    EVICTABLE,
    FAILED,
    LOADING,
    QUARANTINED,
    RUNNING,
    SERVABLE,
    STUCK,
    UNLOADED,
    ModelState,
    check_transition,
)
from routerpanel.router.waitqueue import Entry, WaitQueue

RETRY_AFTER = 5  # seconds suggested to clients turned away by a queue limit (A8)
WATCHDOG_ACTOR = "watchdog"
QUEUE_VIEW_REQUESTS = 5  # waiters listed per entry in queue() and its events: O(entries)


class UnknownModelError(LookupError):
    """The scheduler has no model by that name (the adapter resolves names and aliases)."""


class NotRunningError(ValueError):
    """An unload of a model with no child (llama.cpp: 400 ``model is not running``)."""


@dataclass(slots=True)
class ModelRecord:
    spec: PresetSpec
    state: ModelState = UNLOADED
    stopping: bool = False
    stop_reason: StopReason | None = None  # set by _stop: the exit is then expected
    drain_then: StopReason | None = None  # stop as soon as in_flight reaches 0 (A14)
    removed: bool = False  # its preset is gone; forgotten at exit
    in_flight: int = 0
    last_used: float = 0.0
    failures: int = 0  # consecutive failed loads (A10)
    log_tail: tuple[str, ...] = ()
    ready_at: float | None = None  # when this child first became ready
    crashes: CrashLoop = field(default_factory=CrashLoop)


def estimate(m: ModelRecord) -> int:
    return m.spec.memory_estimate or 0


class Book:
    """The model table, the queue, and the decisions of the input being handled."""

    def __init__(self, presets: Iterable[PresetSpec], config: RouterConfig) -> None:
        self.config = config
        self.models = {name: ModelRecord(spec) for name, spec in preset_map(presets).items()}
        self.queue = WaitQueue()  # FIFO (A4), or fair order (queue_policy, fairshare.py)
        self.granted: dict[str, str] = {}  # proxy request id -> model
        self.use = RecentUse()  # per-owner recent use, kept under either policy
        self.holders: dict[str, str] = {}  # proxy request id -> its owner, while granted
        self.reserved: dict[str, frozenset[str]] = {}  # model -> owners it is reserved for
        self.loading_for: dict[str, tuple[str, float]] = {}  # model -> (owner, spawned at)
        self.settle_since: float | None = None  # the settle gate is closed while set
        self.available: int | None = None  # latest sample taken since it closed
        self.closing = False
        self.out: list[Decision] = []
        self.queue_before: tuple[QueueEntryView, ...] = ()

    # ---- views -------------------------------------------------------------------------------

    def model_view(self, name: str) -> ModelView:
        """Return a snapshot of one model; raise UnknownModelError."""
        m = self.known(name)
        fields = (m.state, m.stopping, m.in_flight, m.last_used, m.failures, m.spec.pinned)
        crash = m.crashes
        return ModelView(name, *fields, m.log_tail, crash.retry_at, crash.strikes, crash.reason)

    def entries(self) -> tuple[QueueEntryView, ...]:
        """Return the queue entries, head first."""
        return tuple(self.view(pos, e) for pos, e in enumerate(self.queue, start=1))

    def view(self, position: int, e: Entry) -> QueueEntryView:
        m = self.models[e.model]
        since = e.waiters[0].since if e.waiters else e.since  # arrival order: oldest first
        starting = self.fresh(m) and m.state is LOADING
        restart = e.restart_by is not None
        head = tuple(e.waiters[:QUEUE_VIEW_REQUESTS])
        n = len(e.waiters)
        return QueueEntryView(e.ticket, e.model, position, n, since, starting, restart, head)

    def next_deadline(self) -> float | None:
        """Return when tick() next has work (max wait, ttl, settle timeout); never poll."""
        times: list[float] = []  # a loop, not a comprehension: it runs after every input
        for m in self.models.values():
            if m.spec.ttl is not None and self.ttl_applies(m):
                times.append(m.last_used + m.spec.ttl)
        if self.config.max_wait is not None:
            oldest = (e.waiters[0].since for e in self.queue if e.waiters)  # arrival order
            times += [since + self.config.max_wait for since in oldest]
        if self.settle_since is not None:
            times.append(self.settle_since + self.config.settle_timeout)
        return min(times, default=None)

    def blocked(self, name: str, running: list[Holder] | None = None) -> str | None:
        """Why a request for ``name`` would wait without an end (blocked.py), or None."""
        holders = self.holding() if running is None else running
        return blocked_reason(name, holders, self.config.models_max)

    def holding(self) -> list[Holder]:
        """The running models and what keeps each (one pass over the table)."""
        return [
            Holder(m.spec.name, "" if m.stopping else self.kept(m))
            for m in self.models.values()
            if m.state in RUNNING
        ]

    def kept(self, m: ModelRecord) -> str:
        if m.state is STUCK:
            return "stuck"
        if m.spec.name in self.reserved:
            return "reserved"
        return "pinned" if m.spec.pinned else ""

    def charge_load(self, name: str, now: float) -> None:
        """A load ended (ready, or its child gone): its seconds count for who caused it."""
        caused = self.loading_for.pop(name, None)
        if caused is not None:
            self.use.charge(caused[0], caused[1], now)

    # ---- helpers -----------------------------------------------------------------------------

    def set_state(
        self, m: ModelRecord, to: ModelState, reason: str, *, stopping: bool | None = None
    ) -> None:
        """The one choke point: check ALLOWED, emit exactly one event, none if nothing changed."""
        if stopping is None:
            stopping = m.stopping and to in RUNNING  # the flag ends when the child is gone
        check_transition(m.state, to, stopping=stopping)
        if (to, stopping) == (m.state, m.stopping):
            return
        frm, m.state, m.stopping = m.state, to, stopping
        self.emit(StateChanged(m.spec.name, frm, to, stopping, reason))

    def stop(self, m: ModelRecord, reason: StopReason, trigger: Trigger, now: float) -> None:
        m.stop_reason, m.drain_then = reason, None
        if reason is StopReason.SHUTDOWN:
            why = "the router is shutting down"
        else:
            why = f"{reason} by {trigger.actor}" + (
                f" for {trigger.model}" if trigger.model else ""
            )
        self.set_state(m, m.state, why, stopping=True)  # running -> running+stopping
        if m.state is LOADING or reason is StopReason.HUNG:  # S4: killed at once
            self.emit(Kill(m.spec.name, reason, trigger, m.in_flight))
        else:
            idle = now - m.last_used
            self.emit(Stop(m.spec.name, reason, trigger, m.spec.stop_timeout, idle, m.in_flight))

    def grant(self, w: WaiterView, m: ModelRecord, now: float) -> None:
        self.hold(w, m, now)
        self.emit(Grant(w.request_id, m.spec.name, w.kind))

    def hold(self, w: WaiterView, m: ModelRecord, now: float) -> None:
        """A grant's bookkeeping: the model is used now and, for a proxy request, busy."""
        m.last_used = now
        if w.kind is RequestKind.PROXY:
            m.in_flight += 1
            self.granted[w.request_id] = m.spec.name
            owner = self.holders[w.request_id] = owner_of(w.actor)
            self.use.hold(owner, now)

    def reject(
        self, w: WaiterView, model: str, status: int, error_type: str, message: str,
        retry_after: int | None = None, details: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self.emit(Reject(w.request_id, model, status, error_type, message, retry_after, details))

    def cancel_entry(
        self, model: str, status: int, error_type: str, message: str,
        retry_after: int | None = None, details: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        for w in self.queue.remove(model):
            self.reject(w, model, status, error_type, message, retry_after, details)

    def crashed(self, m: ModelRecord, now: float, reason: str) -> None:
        """A ready child died unasked: a crash-loop strike if it was ready only briefly."""
        if m.ready_at is None:
            return
        delay = m.crashes.died(uptime=now - m.ready_at, now=now, reason=reason)
        if delay is None:
            return
        name = m.spec.name
        self.emit(BackedOff(name, delay, m.crashes.strikes, reason))
        text = self.backoff_text(m, delay)
        self.cancel_entry(name, 503, "unavailable_error", text, math.ceil(delay))

    def backoff_text(self, m: ModelRecord, left: float) -> str:
        n = m.crashes.strikes
        times = "once" if n == 1 else f"{n} times in a row"
        return (
            f"model name={m.spec.name} died soon after it started, {times} "
            f"(last: {m.crashes.reason}); it is held back for {math.ceil(left)} s before the "
            "next start"
        )

    def failed_load(self, m: ModelRecord, exit_code: int | None, tail: tuple[str, ...]) -> None:
        m.failures += 1
        m.log_tail = tail
        limit = self.config.quarantine_after
        if 0 < limit <= m.failures:
            # loading -> quarantined (A10: N consecutive failed loads)
            self.set_state(m, QUARANTINED, f"{m.failures} consecutive failed loads")
        else:
            # loading -> failed (A10: the next request retries)
            self.set_state(m, FAILED, f"load failed with exit code {exit_code}")
        text = f"model name={m.spec.name} failed to load"
        self.cancel_entry(m.spec.name, 500, "server_error", text, details=tail)

    def ttl_candidates(self) -> list[ModelRecord]:
        return [m for m in self.models.values() if m.spec.ttl is not None and self.ttl_applies(m)]

    def ttl_applies(self, m: ModelRecord) -> bool:
        """Idle, unpinned and serving: its ttl runs (the caller checked it has one). Asked
        after every input per model with a ttl only, so a table without ttls costs nothing."""
        return m.in_flight == 0 and m.state in EVICTABLE and not self.pinned(m) and self.fresh(m)

    def pinned(self, m: ModelRecord) -> bool:
        """Pinned by its preset, or reserved now (R1): never an eviction victim, no TTL."""
        return m.spec.pinned or m.spec.name in self.reserved

    def fresh(self, m: ModelRecord) -> bool:
        """Running, not stopping and not draining: it may take new requests."""
        return m.state in RUNNING and not m.stopping and m.drain_then is None

    def serving(self, m: ModelRecord) -> bool:
        return self.fresh(m) and m.state in SERVABLE

    def depth(self) -> int:
        return self.queue.depth()

    def known(self, name: str) -> ModelRecord:
        m = self.models.get(name)
        if m is None:
            raise UnknownModelError(f"no model named {name!r}")
        return m

    def stuck_text(self, name: str) -> str:
        return f"model name={name} is stuck: its process survived SIGKILL"

    def emit(self, decision: Decision) -> None:
        self.out.append(decision)

    def begin(self, *, queue_empty: bool = False) -> None:
        """Start gathering one input's decisions; ``queue_empty``: the caller knows the queue
        is empty (its snapshot, to compare at the end, is then ``()`` without asking)."""
        self.out, self.queue_before = [], () if queue_empty else self.entries()

    def taken(self) -> list[Decision]:
        """The decisions gathered since ``_begin``, handed over; the next input starts afresh."""
        out, self.out = self.out, []
        return out
