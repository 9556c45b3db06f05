"""The admission rules (A1-A12): run after every scheduler input, over the scheduler's book.

``Admission`` serves the entries whose model is up (A1), lets successive heads claim real free
slots (A3, A4, A6), then stops the least recently used idle models while demand exceeds what is
free or being freed (A5). It owns only when the fair order was last computed; everything else
is the ``Book`` (book.py) it is handed, changed through the book's choke point. Pure: no I/O,
no clock. ``scheduler.Scheduler`` owns it and runs it at the end of each input.
"""

from __future__ import annotations

import math

from routerpanel.router.book import Book, ModelRecord, estimate
from routerpanel.router.config import QueuePolicy
from routerpanel.router.decisions import (
    SCHEDULER_ACTOR,
    RequestKind,
    Settled,
    Spawn,
    StopReason,
    Trigger,
    WaiterView,
)
from routerpanel.router.fairshare import fair_keys, owner_of
from routerpanel.router.states import DOWN, EVICTABLE, LOADING, RUNNING, STUCK
from routerpanel.router.waitqueue import Entry


class Admission:
    """Serve, claim (A4, A6), then evict (A5), over a book (see module doc)."""

    def __init__(self, book: Book) -> None:
        self._book = book
        self._ordered = False  # the fair order was computed during this input
        self._placed = 0  # the queue's entries made when it was last computed

    # ---- admission ---------------------------------------------------------------------------

    def admit(self, now: float) -> None:
        """Run after every input: serve, claim (A4, A6), then evict (A5)."""
        if self._book.closing:
            return
        self._settle_timeout(now)
        self._reject_oversized()
        self._reject_blocked()
        self._ordered = False
        if self._book.queue.made != self._placed:  # a new entry: give it its place at once
            self._order(now)
        for entry in list(self._book.queue):
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
        if self._ordered or self._book.config.queue_policy is not QueuePolicy.FAIR:
            return
        self._ordered, self._placed = True, self._book.queue.made
        if len(self._book.queue) < 2:
            return
        entries = (
            (e.model, e.ticket, e.waiters[0].since if e.waiters else e.since,
             e.restart_by is not None)
            for e in self._book.queue
        )  # fmt: skip
        waiting = self._book.queue.waiting()
        self._book.queue.reorder(
            fair_keys(entries, waiting, self._book.use, now, self._book.config.max_wait)
        )

    def _reject_oversized(self) -> None:
        budget = self._book.config.memory_budget
        for entry in list(self._book.queue):
            need = estimate(self._book.models[entry.model])
            # A3: it could never fit, so evicting for it would be futile
            if budget is not None and need > budget:
                text = f"model name={entry.model} needs {need} bytes, more than the memory "
                self._book.cancel_entry(
                    entry.model, 500, "server_error", f"{text}budget ({budget})"
                )

    def _reject_blocked(self) -> None:
        """Waiters that were queued before every slot became held (a pin, a reservation) and
        did not ask to wait: answered now rather than at max wait (8b)."""
        if self._book.config.models_max <= 0 or not self._book.queue:
            return
        running = self._book.holding()
        if len(running) < self._book.config.models_max or any(not h.kept for h in running):
            return  # the usual case: a slot is free or can be freed
        for entry in list(self._book.queue):
            if self._book.models[entry.model].state in RUNNING or entry.restart_by is not None:
                continue
            impatient = [w for w in entry.waiters if not w.patient]
            if impatient and (why := self._book.blocked(entry.model, running)):
                for w in impatient:
                    self._book.queue.leave(w.request_id)
                    self._book.reject(w, entry.model, 503, "unavailable_error", why)

    def _serve_entry(self, entry: Entry, now: float) -> None:
        m = self._book.models[entry.model]
        if self._book.serving(m):  # A1 for waiters: the model became loaded or sleeping
            served, left = self._members_first(entry), []
        elif self._book.fresh(m) and m.state is LOADING:  # A9: a load is answered once spawned
            served = [w for w in entry.waiters if w.kind is RequestKind.LOAD]
            left = [w for w in entry.waiters if w.kind is RequestKind.PROXY]
        else:
            return
        self._book.queue.take(entry, served, left)
        for w in served:
            self._book.grant(w, m, now)

    def _members_first(self, entry: Entry) -> list[WaiterView]:
        """The entry's waiters in the order they are granted: arrival order, except that on a
        reserved model the owners it is reserved for go first (R2), each group in arrival order.
        """
        members = self._book.reserved.get(entry.model)
        if not members:
            return entry.waiters
        first = [w for w in entry.waiters if owner_of(w.actor) in members]
        if not first:
            return entry.waiters
        return first + [w for w in entry.waiters if owner_of(w.actor) not in members]

    def _claim(self, now: float) -> None:
        """Let successive heads spawn while capacity is real (A4, A6)."""
        config = self._book.config
        if not config.unlimited:
            running = sum(1 for m in self._book.models.values() if m.state in RUNNING)
            if running >= config.models_max:
                return  # no slot: no entry can claim one, whatever the order
        self._order(now)
        for entry in list(self._book.queue):
            m = self._book.models[entry.model]
            if m.state in RUNNING:  # starting, or waiting for its own child's exit: no new slot
                continue
            if m.crashes.remaining(now) is not None:  # crash-loop back-off: it holds no slot
                continue
            if not self._has_capacity(m, now):
                break  # A4: no entry overtakes a blocked one ahead of it
            first = entry.waiters[0] if entry.waiters else None
            actor = first.actor if first else (entry.restart_by or SCHEDULER_ACTOR)
            request = first.request_id if first else None
            trigger = Trigger(actor, m.spec.name, request, self._book.depth())
            m.last_used = now
            self._book.loading_for[m.spec.name] = (owner_of(actor), now)
            self._book.set_state(
                m, LOADING, f"spawn for entry #{entry.ticket}"
            )  # unloaded -> loading
            self._book.emit(Spawn(m.spec.name, m.spec, entry.ticket, trigger))
            self._serve_entry(entry, now)

    def _has_capacity(self, m: ModelRecord, now: float) -> bool:
        """A3: a free slot (stopping and stuck count), the budget, and the settle gate."""
        config = self._book.config
        running = [x for x in self._book.models.values() if x.state in RUNNING]
        if not config.unlimited and len(running) >= config.models_max:
            return False
        if config.memory_budget is None:
            return True
        if sum(map(estimate, running)) + estimate(m) > config.memory_budget:
            return False
        return self._gate_open(m, now)

    def _gate_open(self, m: ModelRecord, now: float) -> bool:
        """Open the settle gate once a sample covers the estimate plus headroom."""
        since, available = self._book.settle_since, self._book.available
        if since is None:
            return True
        if available is None or available < estimate(m) + self._book.config.memory_headroom:
            return False
        self._book.emit(Settled(m.spec.name, now - since, "memory", available))
        self._book.settle_since = self._book.available = None
        return True

    def _settle_timeout(self, now: float) -> None:
        since = self._book.settle_since
        if since is None or now < since + self._book.config.settle_timeout:
            return
        head = next(
            (e.model for e in self._book.queue if self._book.models[e.model].state in DOWN), None
        )
        if head is not None:  # audit only a wait somebody waited through
            self._book.emit(Settled(head, now - since, "timeout", self._book.available))
        self._book.settle_since = self._book.available = None

    def _evict(self, now: float) -> None:
        """A5: while demand exceeds what is free or being freed, stop the LRU idle model."""
        queued = self._book.queue.models()
        if self._pick_victim(queued) is None:
            return  # nothing could be stopped for any need: wait (the loop below would too)
        self._order(now)
        free_n, free_b = self.room(queued)
        needs: list[Entry | None] = [None]  # None: the deficit after lowering a limit
        needs += [
            e for e in self._book.queue
            if self._book.models[e.model].state in DOWN
            and self._book.models[e.model].crashes.remaining(now) is None
        ]  # fmt: skip
        for entry in needs:
            need_n, need_b = (
                (0, 0) if entry is None else (1, estimate(self._book.models[entry.model]))
            )
            while free_n < need_n or free_b < need_b:
                victim = self._pick_victim(queued)
                if victim is None:
                    return  # wait: the next release or exit re-evaluates (never poll)
                reason, trigger = self._eviction_cause(entry)
                # loaded|sleeping -> +stopping (LRU victim for the entry's model)
                self._book.stop(victim, reason, trigger, now)
                free_n, free_b = free_n + 1, free_b + estimate(victim)
            free_n, free_b = free_n - need_n, free_b - need_b

    def room(self, queued: set[str]) -> tuple[float, float]:
        """Return the slots and bytes free or being freed; negative after a limit was lowered.

        A stopping child frees its slot, unless it is stuck or its own entry waits to reuse it.
        """
        config = self._book.config
        running = freeing = used = freed = 0  # one pass: it runs after every release
        for m in self._book.models.values():
            if m.state in RUNNING:
                running += 1
                estimate = m.spec.memory_estimate or 0  # estimate(m)
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
            return StopReason.SHRINK, Trigger(SCHEDULER_ACTOR, queue_depth=self._book.depth())
        first = entry.waiters[0] if entry.waiters else None
        actor = first.actor if first else (entry.restart_by or SCHEDULER_ACTOR)
        request = first.request_id if first else None
        return StopReason.EVICTION, Trigger(actor, entry.model, request, self._book.depth())

    def _pick_victim(self, queued: set[str]) -> ModelRecord | None:
        """Return the idle, evictable, unpinned, unwanted model used longest ago (A5, A12)."""
        candidates = [
            m
            for m in self._book.models.values()
            if self._book.fresh(m) and m.state in EVICTABLE and m.in_flight == 0
            and not self._book.pinned(m) and m.spec.name not in queued
        ]  # fmt: skip
        return min(candidates, key=lambda m: (m.last_used, m.spec.name), default=None)
