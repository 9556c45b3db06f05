"""Decide admission and eviction: the pure core of the router engine (DESIGN §4, STYLE 6-7).

``Scheduler`` owns the model table (state, stopping flag, in-flight count, last_used, consecutive
failed loads) and the FIFO queue (one entry per model; its waiters share it, A2). It does no I/O,
never logs, sleeps or reads a clock: every input takes ``now`` (monotonic seconds) and returns
``list[Decision]`` (decisions.py) in the order things happened. One owner calls it; no locks.
It owns a ``Book`` (book.py: the table, the queue, one input's decisions) and an ``Admission``
(admission.py: A1-A12 over that book), and runs admission at the end of each input. Its parts
work on that book: ``Arrivals`` (arrivals.py: a request's way in, rules (1)-(9), and out),
``Children`` (children.py: what a child reports) and ``reconcile`` (reconcile.py: a reload, A14).

Inputs (all keyword ``now``):
  request_arrived(request_id, model, actor=, kind=)  a proxy request or a load (A9) wants a model
  request_finished(request_id)    a granted proxy request ended (or its lease expired)
  waiter_left(request_id)         a waiting client went away (A7); on a granted one = finished
  child_state(model, state)       child protocol line: "loading" (progress or waking from sleep),
                                  "ready", "sleeping"; child_ready(model) is "ready"
  child_exited(model, exit_code, log_tail=)   the child was reaped (exit_code None: never started)
  child_stuck(model)              the group survived SIGKILL past the grace period (S6)
  child_hung(model)               the watchdog found a busy child making no progress: kill it
  unload(model, actor=)           an explicit unload; raises NotRunningError if nothing runs
  cancel_waiting(actor=, model=, request_id=)   an operator rejects queued requests (499)
  reload(presets, actor=)         new presets (A14)
  settings_changed(config)        new RouterConfig (its queue_policy: fifo or fair, fairshare.py)
  set_reservations(reserved)      the models reserved now -> the owners each is for (issue 17.6)
  memory_sample(available)        available bytes, for the settle gate (memory mode)
  tick()                          max wait (A8), TTL (A11), settle timeout; call at next_deadline()
  shutdown(actor=)                reject all waiters, stop every child, admit nothing more
Read-only: model(name), models(), queue(), next_deadline(), recent_use(now), reservations(),
config.

Reservations (issue 17.6) come in as data, the whole current set each time (idempotent):
  R1 A reserved model is pinned while reserved: never an eviction victim (A5), no TTL (A11).
     Its load in advance is the engine's: an ordinary load (A9) through the queue, so unload
     before load (A6) and models_max hold. When the reservation ends it is unpinned and
     behaves as usual (it stays loaded until it is evicted or its TTL passes).
  R2 In a reserved model's queue entry the owners it is reserved for are granted first, each
     group in arrival order: the one exception to arrival order inside an entry. Others are
     still served, in the same pass; max wait (A8) applies to everyone as before.

Fair share (issue 17.5): the scheduler keeps each owner's recent use itself (fairshare.py:
model-seconds held from grant to finish, plus seconds of the loads their requests caused, from
spawn to ready or exit, over a 15-minute sliding window) under either policy. Under
``queue_policy = fair`` every input first puts the entries in fair order (urgent entries oldest
first, then priority class, then the owners' recent use, then arrival); claiming (A4) and
eviction (A5) then follow that order exactly as they follow arrival order under ``fifo``.
Waiters inside one entry are always served in arrival order.

Decisions: Grant(request_id, model, kind); Reject(request_id, model, status, error_type, message,
retry_after, details); Spawn(model, spec, ticket, trigger); Stop(model, reason, trigger,
stop_timeout, idle_for, in_flight); Kill(model, reason, trigger, in_flight). Events:
StateChanged(model, from_state, to_state, stopping, reason); QueueChanged(entries) (positions,
per-entry waiters, depth); Settled(model, waited, by, available); PresetsReloaded(...).

Contract for the caller:
  * Apply decisions in order. The model is ``loading`` and counted from the Spawn on.
  * After Spawn(m), call child_exited(m) exactly once when that child is gone (a spawn that fails
    is an exit with exit_code None); child_ready/child_state may come before it.
  * After Stop(m) or Kill(m), call child_exited(m) when the exit is observed; the stop deadline
    and SIGKILL are the supervisor's (S4), reported as child_stuck(m) if the group survives (S6).
    A load timeout (S3) is the supervisor's too: it kills the child and reports the exit.
  * After Grant of a proxy request, call request_finished(request_id) exactly once. A Reject is
    final. Unknown request ids in request_finished/waiter_left are ignored (idempotent).
  * Unknown model names raise UnknownModelError, except in request_arrived, which answers the
    request like llama.cpp: 400 ``model '<x>' not found`` (proxy) or 404 (load).

Semantics decided here:
  * last_used is set at spawn, at ready, at every grant and when a request finishes, so a long
    request leaves its model recently used (ROUTER_SPEC §15.26).
  * A stop we asked for ends ``unloaded``, never ``failed``, whatever the exit code (§15.15).
    An unasked exit while loading is a failed load (A10); while serving, ``failed`` unless 0.
  * Only an explicit unload or shutdown stops a model with requests in flight. A reload drains:
    the model takes no new requests and stops when its last one finishes (A14).
  * An unload rejects the model's waiters with llama.cpp's 400 ``model name=<x> is not running``.
  * A load of a stopping model queues for the next instance (llama.cpp answers 400).
  * Stuck models fail their requests fast (503): a reap may never come.
  * A ready child that dies unasked (or is killed as hung) within CRASH_WINDOW of readiness is
    a crash-loop strike: no respawn for 1, 2, 4 … 60 s; proxy requests meanwhile get 503 with
    Retry-After; an explicit load clears the back-off (backoff.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from routerpanel.router.admission import Admission
from routerpanel.router.arrivals import Arrivals
from routerpanel.router.book import (
    QUEUE_VIEW_REQUESTS,
    RETRY_AFTER,
    WATCHDOG_ACTOR,
    Book,
    NotRunningError,
    UnknownModelError,
)
from routerpanel.router.children import Children, ChildState
from routerpanel.router.config import PresetSpec, QueuePolicy, RouterConfig, preset_map
from routerpanel.router.decisions import (
    SCHEDULER_ACTOR,
    Decision,
    ModelView,
    Priority,
    QueueChanged,
    QueueEntryView,
    RequestKind,
    StopReason,
    Trigger,
    WaiterView,
    priority_of,
)
from routerpanel.router.reconcile import reconcile
from routerpanel.router.states import LOADED, RUNNING

__all__ = [
    "QUEUE_VIEW_REQUESTS", "RETRY_AFTER", "WATCHDOG_ACTOR", "ChildState", "NotRunningError",
    "Scheduler", "UnknownModelError",
]  # fmt: skip


class Scheduler:
    """Own the model table and the queue; turn inputs into decisions (see the module docstring)."""

    def __init__(self, presets: Iterable[PresetSpec], config: RouterConfig) -> None:
        self._book = Book(presets, config)  # the table, the queue, one input's decisions
        self._admission = Admission(self._book)  # A1-A12, run at the end of each input
        self._arrivals = Arrivals(self._book)  # a request's way in (1)-(9) and out
        self._children = Children(self._book)  # what a child reports: state, exit, S6, hung

    # ---- read-only ---------------------------------------------------------------------------

    @property
    def config(self) -> RouterConfig:
        """Return the limits in force."""
        return self._book.config

    def model(self, name: str) -> ModelView:
        """Return a snapshot of one model; raise UnknownModelError."""
        return self._book.model_view(name)

    def servable(self, name: str) -> bool:
        """May a request for ``name`` be granted now, without a load (A1)? False if unknown."""
        m = self._book.models.get(name)
        return m is not None and self._book.serving(m)

    def loaded(self, name: str) -> bool:
        """Is ``name`` loaded (not sleeping, not loading) and not stopping? False if unknown.
        The hang watchdog asks this per busy model on every input (no view built)."""
        m = self._book.models.get(name)
        return m is not None and m.state is LOADED and not m.stopping

    def reservations(self) -> dict[str, frozenset[str]]:
        """Return the models reserved now and the owners each is reserved for (issue 17.6)."""
        return dict(self._book.reserved)

    def recent_use(self, now: float) -> dict[str, float]:
        """Return each owner's model-seconds in the fair-share window, most first."""
        return self._book.use.snapshot(now)

    def models(self) -> tuple[ModelView, ...]:
        """Return every model, by name (removed ones still running included)."""
        return tuple(self.model(name) for name in sorted(self._book.models))

    def queue(self) -> tuple[QueueEntryView, ...]:
        """Return the queue entries, head first."""
        return self._book.entries()

    def next_deadline(self) -> float | None:
        """Return when tick() next has work (max wait, ttl, settle timeout); never poll."""
        return self._book.next_deadline()

    def _end(self, now: float) -> list[Decision]:
        """Run admission, say whether the queue changed, and hand the decisions over."""
        self._admission.admit(now)
        after = self._book.entries()
        if after != self._book.queue_before:
            self._book.emit(QueueChanged(after))
        return self._book.taken()

    # ---- inputs ------------------------------------------------------------------------------

    def request_arrived(
        self,
        request_id: str,
        model: str,
        *,
        now: float,
        actor: str = "anonymous",
        kind: RequestKind = RequestKind.PROXY,
        priority: Priority | str = Priority.NORMAL,
        patient: bool = False,
    ) -> list[Decision]:
        """Admit, queue or reject one request by the rules (1)-(9) of ``Arrivals.arrive``;
        ``priority`` is its key's class (fair policy); ``patient``: it waits even when no slot
        can free up (8b)."""
        if self._arrivals.in_use(request_id):
            raise ValueError(f"request id {request_id!r} is already in use")
        waiter = WaiterView(request_id, kind, actor, now, priority_of(priority), patient)
        m = self._book.models.get(model)
        if m is not None and self._arrivals.at_once(m, kind):  # (7) on an empty queue
            self._book.begin(queue_empty=True)
            self._book.grant(waiter, m, now)
            return self._book.taken()
        self._book.begin()
        self._arrivals.arrive(waiter, model, now)
        return self._end(now)

    def grant_at_once(
        self,
        request_id: str,
        model: str,
        *,
        now: float,
        actor: str = "anonymous",
        priority: Priority | str = Priority.NORMAL,
    ) -> bool:
        """``request_arrived`` of a proxy request, for the engine's hot path (issue 16.5):
        when it would answer with one ``Grant`` and nothing else (7), make that grant and
        return True, without a list of decisions; otherwise change nothing and return False,
        and the caller takes ``request_arrived``. The property machine checks both against
        each other on every arrival that takes this way.
        """
        m = self._book.models.get(model)
        if m is None or not self._arrivals.at_once(m, RequestKind.PROXY):
            return False
        if self._arrivals.in_use(request_id):
            return False  # request_arrived says why
        waiter = WaiterView(request_id, RequestKind.PROXY, actor, now, priority_of(priority))
        self._book.hold(waiter, m, now)
        return True

    def request_finished(self, request_id: str, *, now: float) -> list[Decision]:
        """Release a granted proxy request; a waiting one leaves instead (A7).

        The hot path: with nothing queued and no settle wait, the admission pass after a
        release has nothing to serve, claim or evict for, and no queue event to send, so it
        is skipped, unless a limit lowered while models were busy is now exceeded (A5's
        shrink). The property machine checks this against the full pass on every step.
        """
        quiet = self._finishes_quietly()
        self._book.begin(queue_empty=quiet)
        self._arrivals.finish(request_id, now)
        if quiet and min(self._admission.room(set())) >= 0:
            return self._book.taken()
        return self._end(now)

    def _finishes_quietly(self) -> bool:  # the property machine's twin turns it off
        return not self._book.queue and self._book.settle_since is None

    def waiter_left(self, request_id: str, *, now: float) -> list[Decision]:
        """Remove a waiter whose client went away (A7); a granted request is finished instead."""
        if request_id in self._book.granted:
            return self.request_finished(request_id, now=now)
        self._book.begin()
        self._book.queue.leave(request_id)  # A7: an entry left empty leaves
        return self._end(now)

    def child_state(self, model: str, state: ChildState, *, now: float) -> list[Decision]:
        """Mirror a child's state line; lines that fit no edge are ignored (llama.cpp aborts)."""
        self._children.state(model, state, now)
        return self._end(now)

    def child_ready(self, model: str, *, now: float) -> list[Decision]:
        """Mark the model loaded and grant its waiters."""
        return self.child_state(model, "ready", now=now)

    def child_exited(
        self, model: str, *, now: float, exit_code: int | None, log_tail: Sequence[str] = ()
    ) -> list[Decision]:
        """Record a reaped child: its slot is free now (A6); a failed load answers 500 (A10)."""
        self._children.exited(model, now, exit_code, log_tail)
        return self._end(now)

    def child_stuck(self, model: str, *, now: float) -> list[Decision]:
        """Keep a child that survived SIGKILL counted (S6); its waiters fail fast."""
        self._children.stuck(model)
        return self._end(now)

    def child_hung(self, model: str, *, now: float) -> list[Decision]:
        """Kill a child the watchdog found busy without progress (``Children.hung``)."""
        self._children.hung(model, now)
        return self._end(now)

    def backoff_if_died(self, model: str, *, now: float) -> float | None:
        """The crash-loop back-off ``model``'s child would bring if it died now (None: none)."""
        return self._children.backoff_if_died(model, now)

    def unload(self, model: str, *, now: float, actor: str) -> list[Decision]:
        """Stop the model now, busy or not; idempotent while it is already stopping."""
        m = self._book.known(model)
        if m.state not in RUNNING:
            raise NotRunningError(f"model {model!r} is not running")
        self._book.begin()
        if not m.stopping:
            # loaded -> loaded+stopping (unload by actor); loading is killed (S4)
            self._book.stop(
                m, StopReason.UNLOAD, Trigger(actor, queue_depth=self._book.depth()), now
            )
        text = f"model name={model} is not running"
        self._book.cancel_entry(model, 400, "invalid_request_error", text)
        return self._end(now)

    def cancel_waiting(
        self, *, now: float, actor: str, model: str | None = None, request_id: str | None = None
    ) -> list[Decision]:
        """Reject queued requests for an operator: one by id, or all of a model's entry.

        Each gets 499 ``cancelled`` (a status clients do not retry, unlike 503). Granted
        requests are running and untouched; a reload restart's hold on the entry stays (A14).
        Returns no Reject when nothing matched; the caller tells the operator.
        """
        if (model is None) == (request_id is None):
            raise ValueError("cancel_waiting takes exactly one of model or request_id")
        self._book.begin()
        if request_id is not None:
            entry = self._book.queue.entry_of(request_id)
            chosen = [w for w in entry.waiters if w.request_id == request_id] if entry else []
        else:
            entry = self._book.queue.entry_for(model or "")
            chosen = list(entry.waiters) if entry else []
        for w in chosen:
            assert entry is not None
            self._book.queue.leave(w.request_id)
            text = f"the request was cancelled by {actor} while queued for model name={entry.model}"
            self._book.reject(w, entry.model, 499, "cancelled", text)
        return self._end(now)

    def reload(self, presets: Iterable[PresetSpec], *, now: float, actor: str) -> list[Decision]:
        """Reconcile with new presets; restart only running models whose command changed (A14).

        A removed model's waiters get 400 ``not found``; its child is stopped once idle. A changed
        running model drains, stops and is spawned again through a held queue entry. Any reload
        clears ``failed`` (llama.cpp 2.21); an edited preset also lifts a quarantine (A10).
        The rules are reconcile.py's.
        """
        new = preset_map(presets)
        self._book.begin()
        reconcile(self._book, new, now, actor)
        return self._end(now)

    def settings_changed(self, config: RouterConfig, *, now: float) -> list[Decision]:
        """Apply new limits: more slots are claimed at once, fewer shrink to the cap (A5)."""
        self._book.begin()
        if config.queue_policy is QueuePolicy.FIFO:
            self._book.queue.fifo()  # back to arrival order after fair
        self._book.config = config
        if config.memory_budget is None:
            self._book.settle_since = self._book.available = None
        return self._end(now)

    def set_reservations(
        self, reserved: Mapping[str, Iterable[str]], *, now: float
    ) -> list[Decision]:
        """Replace the reservations: ``reserved`` maps each model reserved now to the owners
        (``user:<name>``) it is reserved for (R1, R2). Unknown models are ignored. Unpinning a
        model may let a waiting entry evict it at once (A5)."""
        self._book.begin()
        self._book.reserved = {
            name: frozenset(owners)
            for name, owners in reserved.items()
            if name in self._book.models
        }
        return self._end(now)

    def memory_sample(self, available: int, *, now: float) -> list[Decision]:
        """Feed the settle gate; only samples taken after the last exit count."""
        self._book.begin()
        if self._book.settle_since is not None:
            self._book.available = available
        return self._end(now)

    def tick(self, *, now: float) -> list[Decision]:
        """Expire waiters past max_wait (A8), stop models idle past their ttl (A11), re-admit."""
        self._book.begin()
        max_wait = self._book.config.max_wait
        expired = [
            (w, e.model) for e in self._book.queue for w in e.waiters
            if max_wait is not None and now - w.since >= max_wait
        ]  # fmt: skip
        for w, model in expired:
            self._book.queue.leave(w.request_id)
            text = f"waited {max_wait:g} s for model name={model}; retry later"
            self._book.reject(w, model, 503, "unavailable_error", text, RETRY_AFTER)
        for m in self._book.ttl_candidates():
            if now - m.last_used >= (m.spec.ttl or 0):
                # loaded -> loaded+stopping (idle past its ttl, A11)
                self._book.stop(m, StopReason.TTL, Trigger(SCHEDULER_ACTOR), now)
        return self._end(now)

    def shutdown(self, *, now: float, actor: str) -> list[Decision]:
        """Reject every waiter and stop every child, busy or not; admit nothing afterwards."""
        self._book.begin()
        self._book.closing = True
        for entry in list(self._book.queue):
            self._book.cancel_entry(
                entry.model, 503, "unavailable_error", "router is shutting down"
            )
        for m in self._book.models.values():
            if m.state in RUNNING and not m.stopping:
                self._book.stop(m, StopReason.SHUTDOWN, Trigger(actor), now)  # running -> +stopping
        return self._end(now)
