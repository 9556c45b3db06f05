"""The scheduler's core: the model table, the queue and the admission rules (A1-A12).

``Admission`` holds the state every scheduler input changes — one record per model, the FIFO
``WaitQueue`` (waitqueue.py), the granted requests, the settle gate — and runs admission after
every input: serve the entries whose model is up (A1), let successive heads claim real free
slots (A3, A4, A6), then stop the least recently used idle models while demand exceeds what is
free or being freed (A5). Its helpers are the one choke point for state changes
(``_set_state``, STYLE 2) and the only way decisions are emitted. Pure: no I/O, no clock.
``scheduler.Scheduler`` adds the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from routerpanel.router.backoff import CrashLoop
from routerpanel.router.blocked import Holder, blocked_reason
from routerpanel.router.config import PresetSpec, QueuePolicy, RouterConfig, preset_map
from routerpanel.router.decisions import (
    SCHEDULER_ACTOR,
    Decision,
    Grant,
    Kill,
    ModelView,
    QueueChanged,
    QueueEntryView,
    Reject,
    RequestKind,
    Settled,
    Spawn,
    StateChanged,
    Stop,
    StopReason,
    Trigger,
    WaiterView,
)
from routerpanel.router.fairshare import RecentUse, fair_keys, owner_of
from routerpanel.router.states import (
    DOWN,
    EVICTABLE,
    LOADED,
    LOADING,
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


def _estimate(m: ModelRecord) -> int:
    return m.spec.memory_estimate or 0


class Admission:
    """The model table, the queue, and admission after every input (see module doc)."""

    def __init__(self, presets: Iterable[PresetSpec], config: RouterConfig) -> None:
        self._config = config
        self._models = {name: ModelRecord(spec) for name, spec in preset_map(presets).items()}
        self._queue = WaitQueue()  # FIFO (A4), or fair order (queue_policy, fairshare.py)
        self._granted: dict[str, str] = {}  # proxy request id -> model
        self._use = RecentUse()  # per-owner recent use, kept under either policy
        self._holders: dict[str, str] = {}  # proxy request id -> its owner, while granted
        self._reserved: dict[str, frozenset[str]] = {}  # model -> owners it is reserved for
        self._loading_for: dict[str, tuple[str, float]] = {}  # model -> (owner, spawned at)
        self._ordered = False  # the fair order was computed during this input
        self._placed = 0  # the queue's entries made when it was last computed
        self._settle_since: float | None = None  # the settle gate is closed while set
        self._available: int | None = None  # latest sample taken since it closed
        self._closing = False
        self._out: list[Decision] = []
        self._queue_before: tuple[QueueEntryView, ...] = ()

    # ---- read-only ---------------------------------------------------------------------------

    @property
    def config(self) -> RouterConfig:
        """Return the limits in force."""
        return self._config

    def model(self, name: str) -> ModelView:
        """Return a snapshot of one model; raise UnknownModelError."""
        m = self._known(name)
        fields = (m.state, m.stopping, m.in_flight, m.last_used, m.failures, m.spec.pinned)
        crash = m.crashes
        return ModelView(name, *fields, m.log_tail, crash.retry_at, crash.strikes, crash.reason)

    def servable(self, name: str) -> bool:
        """May a request for ``name`` be granted now, without a load (A1)? False if unknown."""
        m = self._models.get(name)
        return m is not None and self._servable(m)

    def loaded(self, name: str) -> bool:
        """Is ``name`` loaded (not sleeping, not loading) and not stopping? False if unknown.
        The hang watchdog asks this per busy model on every input (no view built)."""
        m = self._models.get(name)
        return m is not None and m.state is LOADED and not m.stopping

    def reservations(self) -> dict[str, frozenset[str]]:
        """Return the models reserved now and the owners each is reserved for (issue 17.6)."""
        return dict(self._reserved)

    def recent_use(self, now: float) -> dict[str, float]:
        """Return each owner's model-seconds in the fair-share window, most first."""
        return self._use.snapshot(now)

    def models(self) -> tuple[ModelView, ...]:
        """Return every model, by name (removed ones still running included)."""
        return tuple(self.model(name) for name in sorted(self._models))

    def queue(self) -> tuple[QueueEntryView, ...]:
        """Return the queue entries, head first."""
        return tuple(self._view(pos, e) for pos, e in enumerate(self._queue, start=1))

    def _view(self, position: int, e: Entry) -> QueueEntryView:
        m = self._models[e.model]
        since = e.waiters[0].since if e.waiters else e.since  # arrival order: oldest first
        starting = self._fresh(m) and m.state is LOADING
        restart = e.restart_by is not None
        head = tuple(e.waiters[:QUEUE_VIEW_REQUESTS])
        n = len(e.waiters)
        return QueueEntryView(e.ticket, e.model, position, n, since, starting, restart, head)

    def next_deadline(self) -> float | None:
        """Return when tick() next has work (max wait, ttl, settle timeout); never poll."""
        times: list[float] = []  # a loop, not a comprehension: it runs after every input
        for m in self._models.values():
            if m.spec.ttl is not None and self._ttl_applies(m):
                times.append(m.last_used + m.spec.ttl)
        if self._config.max_wait is not None:
            oldest = (e.waiters[0].since for e in self._queue if e.waiters)  # arrival order
            times += [since + self._config.max_wait for since in oldest]
        if self._settle_since is not None:
            times.append(self._settle_since + self._config.settle_timeout)
        return min(times, default=None)

    # ---- admission ---------------------------------------------------------------------------

    def _admit(self, now: float) -> None:
        """Run after every input: serve, claim (A4, A6), then evict (A5)."""
        if self._closing:
            return
        self._settle_timeout(now)
        self._reject_oversized()
        self._reject_blocked()
        self._ordered = False
        if self._queue.made != self._placed:  # a new entry: give it its place at once
            self._order(now)
        for entry in list(self._queue):
            self._serve_entry(entry, now)
        self._claim(now)
        self._evict(now)

    def _order(self, now: float) -> None:
        """Under ``fair``, put the entries in fair-share order (fairshare.fair_keys); under
        ``fifo`` they stay in arrival order (A4).

        Computed at most once per input, and only when the order can matter: before a slot is
        claimed (a slot is free) or a model is evicted for the queue (an idle victim exists),
        and when a new entry joins (so positions shown place it). Between those, the order
        shown is the one last computed: use that drifts with time decides nothing until then.
        """
        if self._ordered or self._config.queue_policy is not QueuePolicy.FAIR:
            return
        self._ordered, self._placed = True, self._queue.made
        if len(self._queue) < 2:
            return
        entries = (
            (e.model, e.ticket, e.waiters[0].since if e.waiters else e.since,
             e.restart_by is not None)
            for e in self._queue
        )  # fmt: skip
        waiting = self._queue.waiting()
        self._queue.reorder(fair_keys(entries, waiting, self._use, now, self._config.max_wait))

    def _charge_load(self, name: str, now: float) -> None:
        """A load ended (ready, or its child gone): its seconds count for who caused it."""
        caused = self._loading_for.pop(name, None)
        if caused is not None:
            self._use.charge(caused[0], caused[1], now)

    def _reject_oversized(self) -> None:
        budget = self._config.memory_budget
        for entry in list(self._queue):
            need = _estimate(self._models[entry.model])
            # A3: it could never fit, so evicting for it would be futile
            if budget is not None and need > budget:
                text = f"model name={entry.model} needs {need} bytes, more than the memory "
                self._cancel_entry(entry.model, 500, "server_error", f"{text}budget ({budget})")

    def _blocked(self, name: str, running: list[Holder] | None = None) -> str | None:
        """Why a request for ``name`` would wait without an end (blocked.py), or None."""
        holders = self._holding() if running is None else running
        return blocked_reason(name, holders, self._config.models_max)

    def _holding(self) -> list[Holder]:
        """The running models and what keeps each (one pass over the table)."""
        return [
            Holder(m.spec.name, "" if m.stopping else self._kept(m))
            for m in self._models.values()
            if m.state in RUNNING
        ]

    def _kept(self, m: ModelRecord) -> str:
        if m.state is STUCK:
            return "stuck"
        if m.spec.name in self._reserved:
            return "reserved"
        return "pinned" if m.spec.pinned else ""

    def _reject_blocked(self) -> None:
        """Waiters that were queued before every slot became held (a pin, a reservation) and
        did not ask to wait: answered now rather than at max wait (8b)."""
        if self._config.models_max <= 0 or not self._queue:
            return
        running = self._holding()
        if len(running) < self._config.models_max or any(not h.kept for h in running):
            return  # the usual case: a slot is free or can be freed
        for entry in list(self._queue):
            if self._models[entry.model].state in RUNNING or entry.restart_by is not None:
                continue
            impatient = [w for w in entry.waiters if not w.patient]
            if impatient and (why := self._blocked(entry.model, running)):
                for w in impatient:
                    self._queue.leave(w.request_id)
                    self._reject(w, entry.model, 503, "unavailable_error", why)

    def _serve_entry(self, entry: Entry, now: float) -> None:
        m = self._models[entry.model]
        if self._servable(m):  # A1 for waiters: the model became loaded or sleeping
            served, left = self._members_first(entry), []
        elif self._fresh(m) and m.state is LOADING:  # A9: a load is answered once spawned
            served = [w for w in entry.waiters if w.kind is RequestKind.LOAD]
            left = [w for w in entry.waiters if w.kind is RequestKind.PROXY]
        else:
            return
        self._queue.take(entry, served, left)
        for w in served:
            self._grant(w, m, now)

    def _members_first(self, entry: Entry) -> list[WaiterView]:
        """The entry's waiters in the order they are granted: arrival order, except that on a
        reserved model the owners it is reserved for go first (R2), each group in arrival order.
        """
        members = self._reserved.get(entry.model)
        if not members:
            return entry.waiters
        first = [w for w in entry.waiters if owner_of(w.actor) in members]
        if not first:
            return entry.waiters
        return first + [w for w in entry.waiters if owner_of(w.actor) not in members]

    def _claim(self, now: float) -> None:
        """Let successive heads spawn while capacity is real (A4, A6)."""
        config = self._config
        if not config.unlimited:
            running = sum(1 for m in self._models.values() if m.state in RUNNING)
            if running >= config.models_max:
                return  # no slot: no entry can claim one, whatever the order
        self._order(now)
        for entry in list(self._queue):
            m = self._models[entry.model]
            if m.state in RUNNING:  # starting, or waiting for its own child's exit: no new slot
                continue
            if m.crashes.remaining(now) is not None:  # crash-loop back-off: it holds no slot
                continue
            if not self._has_capacity(m, now):
                break  # A4: no entry overtakes a blocked one ahead of it
            first = entry.waiters[0] if entry.waiters else None
            actor = first.actor if first else (entry.restart_by or SCHEDULER_ACTOR)
            request = first.request_id if first else None
            trigger = Trigger(actor, m.spec.name, request, self._depth())
            m.last_used = now
            self._loading_for[m.spec.name] = (owner_of(actor), now)
            self._set_state(m, LOADING, f"spawn for entry #{entry.ticket}")  # unloaded -> loading
            self._emit(Spawn(m.spec.name, m.spec, entry.ticket, trigger))
            self._serve_entry(entry, now)

    def _has_capacity(self, m: ModelRecord, now: float) -> bool:
        """A3: a free slot (stopping and stuck count), the budget, and the settle gate."""
        config = self._config
        running = [x for x in self._models.values() if x.state in RUNNING]
        if not config.unlimited and len(running) >= config.models_max:
            return False
        if config.memory_budget is None:
            return True
        if sum(map(_estimate, running)) + _estimate(m) > config.memory_budget:
            return False
        return self._gate_open(m, now)

    def _gate_open(self, m: ModelRecord, now: float) -> bool:
        """Open the settle gate once a sample covers the estimate plus headroom."""
        since, available = self._settle_since, self._available
        if since is None:
            return True
        if available is None or available < _estimate(m) + self._config.memory_headroom:
            return False
        self._emit(Settled(m.spec.name, now - since, "memory", available))
        self._settle_since = self._available = None
        return True

    def _settle_timeout(self, now: float) -> None:
        since = self._settle_since
        if since is None or now < since + self._config.settle_timeout:
            return
        head = next((e.model for e in self._queue if self._models[e.model].state in DOWN), None)
        if head is not None:  # audit only a wait somebody waited through
            self._emit(Settled(head, now - since, "timeout", self._available))
        self._settle_since = self._available = None

    def _evict(self, now: float) -> None:
        """A5: while demand exceeds what is free or being freed, stop the LRU idle model."""
        queued = self._queue.models()
        if self._pick_victim(queued) is None:
            return  # nothing could be stopped for any need: wait (the loop below would too)
        self._order(now)
        free_n, free_b = self._room(queued)
        needs: list[Entry | None] = [None]  # None: the deficit after lowering a limit
        needs += [
            e for e in self._queue
            if self._models[e.model].state in DOWN
            and self._models[e.model].crashes.remaining(now) is None
        ]  # fmt: skip
        for entry in needs:
            need_n, need_b = (0, 0) if entry is None else (1, _estimate(self._models[entry.model]))
            while free_n < need_n or free_b < need_b:
                victim = self._pick_victim(queued)
                if victim is None:
                    return  # wait: the next release or exit re-evaluates (never poll)
                reason, trigger = self._eviction_cause(entry)
                # loaded|sleeping -> +stopping (LRU victim for the entry's model)
                self._stop(victim, reason, trigger, now)
                free_n, free_b = free_n + 1, free_b + _estimate(victim)
            free_n, free_b = free_n - need_n, free_b - need_b

    def _room(self, queued: set[str]) -> tuple[float, float]:
        """Return the slots and bytes free or being freed; negative after a limit was lowered.

        A stopping child frees its slot, unless it is stuck or its own entry waits to reuse it.
        """
        config = self._config
        running = freeing = used = freed = 0  # one pass: it runs after every release
        for m in self._models.values():
            if m.state in RUNNING:
                running += 1
                estimate = m.spec.memory_estimate or 0  # _estimate(m)
                used += estimate
                if m.stopping and m.state is not STUCK and m.spec.name not in queued:
                    freeing += 1
                    freed += estimate
        free_n = math.inf if config.unlimited else config.models_max - running + freeing
        budget = config.memory_budget
        free_b = math.inf if budget is None else budget - used
        return free_n, free_b + freed

    def _eviction_cause(self, entry: Entry | None) -> tuple[StopReason, Trigger]:
        if entry is None:
            return StopReason.SHRINK, Trigger(SCHEDULER_ACTOR, queue_depth=self._depth())
        first = entry.waiters[0] if entry.waiters else None
        actor = first.actor if first else (entry.restart_by or SCHEDULER_ACTOR)
        request = first.request_id if first else None
        return StopReason.EVICTION, Trigger(actor, entry.model, request, self._depth())

    def _pick_victim(self, queued: set[str]) -> ModelRecord | None:
        """Return the idle, evictable, unpinned, unwanted model used longest ago (A5, A12)."""
        candidates = [
            m
            for m in self._models.values()
            if self._fresh(m) and m.state in EVICTABLE and m.in_flight == 0
            and not self._pinned(m) and m.spec.name not in queued
        ]  # fmt: skip
        return min(candidates, key=lambda m: (m.last_used, m.spec.name), default=None)

    # ---- helpers -----------------------------------------------------------------------------

    def _set_state(
        self, m: ModelRecord, to: ModelState, reason: str, *, stopping: bool | None = None
    ) -> None:
        """The one choke point: check ALLOWED, emit exactly one event, none if nothing changed."""
        if stopping is None:
            stopping = m.stopping and to in RUNNING  # the flag ends when the child is gone
        check_transition(m.state, to, stopping=stopping)
        if (to, stopping) == (m.state, m.stopping):
            return
        frm, m.state, m.stopping = m.state, to, stopping
        self._emit(StateChanged(m.spec.name, frm, to, stopping, reason))

    def _stop(self, m: ModelRecord, reason: StopReason, trigger: Trigger, now: float) -> None:
        m.stop_reason, m.drain_then = reason, None
        if reason is StopReason.SHUTDOWN:
            why = "the router is shutting down"
        else:
            why = f"{reason} by {trigger.actor}" + (
                f" for {trigger.model}" if trigger.model else ""
            )
        self._set_state(m, m.state, why, stopping=True)  # running -> running+stopping
        if m.state is LOADING or reason is StopReason.HUNG:  # S4: killed at once
            self._emit(Kill(m.spec.name, reason, trigger, m.in_flight))
        else:
            idle = now - m.last_used
            self._emit(Stop(m.spec.name, reason, trigger, m.spec.stop_timeout, idle, m.in_flight))

    def _grant(self, w: WaiterView, m: ModelRecord, now: float) -> None:
        self._hold(w, m, now)
        self._emit(Grant(w.request_id, m.spec.name, w.kind))

    def _hold(self, w: WaiterView, m: ModelRecord, now: float) -> None:
        """A grant's bookkeeping: the model is used now and, for a proxy request, busy."""
        m.last_used = now
        if w.kind is RequestKind.PROXY:
            m.in_flight += 1
            self._granted[w.request_id] = m.spec.name
            owner = self._holders[w.request_id] = owner_of(w.actor)
            self._use.hold(owner, now)

    def _reject(
        self, w: WaiterView, model: str, status: int, error_type: str, message: str,
        retry_after: int | None = None, details: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self._emit(Reject(w.request_id, model, status, error_type, message, retry_after, details))

    def _cancel_entry(
        self, model: str, status: int, error_type: str, message: str,
        retry_after: int | None = None, details: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        for w in self._queue.remove(model):
            self._reject(w, model, status, error_type, message, retry_after, details)

    def _ttl_candidates(self) -> list[ModelRecord]:
        return [m for m in self._models.values() if m.spec.ttl is not None and self._ttl_applies(m)]

    def _ttl_applies(self, m: ModelRecord) -> bool:
        """Idle, unpinned and serving: its ttl runs (the caller checked it has one). Asked
        after every input per model with a ttl only, so a table without ttls costs nothing."""
        return m.in_flight == 0 and m.state in EVICTABLE and not self._pinned(m) and self._fresh(m)

    def _pinned(self, m: ModelRecord) -> bool:
        """Pinned by its preset, or reserved now (R1): never an eviction victim, no TTL."""
        return m.spec.pinned or m.spec.name in self._reserved

    def _fresh(self, m: ModelRecord) -> bool:
        """Running, not stopping and not draining: it may take new requests."""
        return m.state in RUNNING and not m.stopping and m.drain_then is None

    def _servable(self, m: ModelRecord) -> bool:
        return self._fresh(m) and m.state in SERVABLE

    def _depth(self) -> int:
        return self._queue.depth()

    def _known(self, name: str) -> ModelRecord:
        m = self._models.get(name)
        if m is None:
            raise UnknownModelError(f"no model named {name!r}")
        return m

    def _stuck_text(self, name: str) -> str:
        return f"model name={name} is stuck: its process survived SIGKILL"

    def _emit(self, decision: Decision) -> None:
        self._out.append(decision)

    def _begin(self, *, queue_empty: bool = False) -> None:
        """Start gathering one input's decisions; ``queue_empty``: the caller knows the queue
        is empty (its snapshot, to compare at the end, is then ``()`` without asking)."""
        self._out, self._queue_before = [], () if queue_empty else self.queue()

    def _end(self, now: float) -> list[Decision]:
        """Run admission, say whether the queue changed, and hand the decisions over."""
        self._admit(now)
        after = self.queue()
        if after != self._queue_before:
            self._emit(QueueChanged(after))
        return self._taken()

    def _taken(self) -> list[Decision]:
        """The decisions gathered since ``_begin``, handed over; the next input starts afresh."""
        out, self._out = self._out, []
        return out
