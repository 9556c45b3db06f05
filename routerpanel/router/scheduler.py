"""Decide admission and eviction: the pure core of the router engine (DESIGN §4, STYLE 6-7).

``Scheduler`` owns the model table (state, stopping flag, in-flight count, last_used, consecutive
failed loads) and the FIFO queue (one entry per model; its waiters share it, A2). It does no I/O,
never logs, sleeps or reads a clock: every input takes ``now`` (monotonic seconds) and returns
``list[Decision]`` (decisions.py) in the order things happened. One owner calls it; no locks.

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
  settings_changed(config)        new RouterConfig
  memory_sample(available)        available bytes, for the settle gate (memory mode)
  tick()                          max wait (A8), TTL (A11), settle timeout; call at next_deadline()
  shutdown(actor=)                reject all waiters, stop every child, admit nothing more
Read-only: model(name), models(), queue(), next_deadline(), config.

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

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from routerpanel.router.backoff import CrashLoop
from routerpanel.router.config import PresetSpec, RouterConfig, preset_map
from routerpanel.router.decisions import (
    SCHEDULER_ACTOR,
    BackedOff,
    Decision,
    Grant,
    Kill,
    ModelView,
    PresetsReloaded,
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
from routerpanel.router.states import (
    DOWN,
    EVICTABLE,
    FAILED,
    LOADED,
    LOADING,
    QUARANTINED,
    RUNNING,
    SERVABLE,
    SLEEPING,
    STUCK,
    UNLOADED,
    ModelState,
    check_transition,
)

RETRY_AFTER = 5  # seconds suggested to clients turned away by a queue limit (A8)
WATCHDOG_ACTOR = "watchdog"
QUEUE_VIEW_REQUESTS = 5  # waiters listed per entry in queue() and its events: O(entries)
ChildState = Literal["loading", "ready", "sleeping"]


class UnknownModelError(LookupError):
    """The scheduler has no model by that name (the adapter resolves names and aliases)."""


class NotRunningError(ValueError):
    """An unload of a model with no child (llama.cpp: 400 ``model is not running``)."""


@dataclass(slots=True)
class _Model:
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


@dataclass(slots=True)
class _Entry:
    """One model's place in the queue; ``waiters`` are in arrival order, so oldest first."""

    ticket: int
    model: str
    since: float
    waiters: list[WaiterView] = field(default_factory=list)  # immutable: views share them
    restart_by: str | None = None  # a reload restart holds the entry without waiters (A14)


def _estimate(m: _Model) -> int:
    return m.spec.memory_estimate or 0


class Scheduler:
    """Own the model table and the queue; turn inputs into decisions (see the module docstring)."""

    def __init__(self, presets: Iterable[PresetSpec], config: RouterConfig) -> None:
        self._config = config
        self._models = {name: _Model(spec) for name, spec in preset_map(presets).items()}
        self._queue: list[_Entry] = []  # FIFO (A4)
        self._waiting: dict[str, _Entry] = {}
        self._granted: dict[str, str] = {}  # proxy request id -> model
        self._tickets = itertools.count(1)
        self._settle_since: float | None = None  # the settle gate is closed while set
        self._available: int | None = None  # latest sample taken since it closed
        self._closing = False
        self._out: list[Decision] = []
        self._queue_before: tuple[QueueEntryView, ...] = ()

    # ---- inputs ------------------------------------------------------------------------------

    def request_arrived(
        self,
        request_id: str,
        model: str,
        *,
        now: float,
        actor: str = "anonymous",
        kind: RequestKind = RequestKind.PROXY,
    ) -> list[Decision]:
        """Admit, queue or reject one request.

        (1) Unknown (or removed) model: 400 ``model '<x>' not found``; a load gets 404.
        (2) Shutting down: 503.
        (3) A load of a running model that is not stopping: 400 ``model is already running``.
        (4) A load of a quarantined model lifts the quarantine for one more try (A10).
        (5) A proxy request for a quarantined model fails fast: 500 (A10).
        (6) A stuck model: 503 (S6).
        (6b) A crash-looping model in its back-off: a load clears it; a proxy request gets 503
             with Retry-After until the back-off ends (backoff.py).
        (7) Loaded or sleeping, not stopping, not draining: Grant at once (A1, A12).
        (8) The model's entry already has max_waiters: 503 with Retry-After (A8).
        (9) Otherwise join the model's entry, at the tail if new (A2); admission follows.
        """
        if request_id in self._waiting or request_id in self._granted:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._begin()
        self._arrive(WaiterView(request_id, kind, actor, now), model, now)
        return self._end(now)

    def _arrive(self, w: WaiterView, name: str, now: float) -> None:
        m = self._models.get(name)
        load = w.kind is RequestKind.LOAD
        if (m is None or m.removed) and load:  # (1)
            return self._reject(w, name, 404, "not_found_error", "model is not found")
        if m is None or m.removed:  # (1)
            return self._reject(w, name, 400, "invalid_request_error", f"model '{name}' not found")
        if self._closing:  # (2)
            return self._reject(w, name, 503, "unavailable_error", "router is shutting down")
        if load and m.state in RUNNING and not m.stopping:  # (3)
            return self._reject(w, name, 400, "invalid_request_error", "model is already running")
        if load and m.state is QUARANTINED:  # (4) one more failure quarantines it again
            m.failures = max(0, self._config.quarantine_after - 1)
            # quarantined -> unloaded (retried by an explicit load, A10)
            self._set_state(m, UNLOADED, f"quarantine lifted by a load from {w.actor}")
        if m.state is QUARANTINED:  # (5) A10: fail fast, no spawn
            text = f"model name={name} failed to load (quarantined after {m.failures} "
            text += "consecutive failures: edit the preset or load it explicitly)"
            return self._reject(w, name, 500, "server_error", text, details=m.log_tail)
        if m.state is STUCK:  # (6)
            text = self._stuck_text(name)
            return self._reject(w, name, 503, "unavailable_error", text, RETRY_AFTER)
        if load and m.crashes.strikes:  # (6b) an explicit load resets the back-off
            m.crashes.clear()
        left = m.crashes.remaining(now) if m.state in DOWN else None
        if left is not None:  # (6b)
            text = self._backoff_text(m, left)
            return self._reject(w, name, 503, "unavailable_error", text, math.ceil(left))
        if self._servable(m):  # (7) A1
            return self._grant(w, m, now)
        entry = self._entry_for(name)
        limit = self._config.max_waiters
        if entry is not None and limit is not None and len(entry.waiters) >= limit:  # (8) A8
            text = f"too many requests are waiting for model name={name} (max_waiters={limit})"
            return self._reject(w, name, 503, "unavailable_error", text, RETRY_AFTER)
        if entry is None:  # (9) A2
            entry = _Entry(next(self._tickets), name, now)
            self._queue.append(entry)
        entry.waiters.append(w)
        self._waiting[w.request_id] = entry

    def request_finished(self, request_id: str, *, now: float) -> list[Decision]:
        """Release a granted proxy request; a waiting one leaves instead (A7)."""
        self._begin()
        if request_id in self._waiting:
            self._leave(request_id)
        name = self._granted.pop(request_id, None)
        m = self._models.get(name) if name is not None else None
        if m is not None:
            m.in_flight -= 1
            m.last_used = now  # §15.26: finishing is use too
            if m.in_flight == 0 and m.drain_then is not None and not m.stopping:
                # loaded -> loaded+stopping (drained for a reload or removal, A14)
                self._stop(m, m.drain_then, Trigger(SCHEDULER_ACTOR), now)
        return self._end(now)

    def waiter_left(self, request_id: str, *, now: float) -> list[Decision]:
        """Remove a waiter whose client went away (A7); a granted request is finished instead."""
        if request_id in self._granted:
            return self.request_finished(request_id, now=now)
        self._begin()
        self._leave(request_id)
        return self._end(now)

    def child_state(self, model: str, state: ChildState, *, now: float) -> list[Decision]:
        """Mirror a child's state line; lines that fit no edge are ignored (llama.cpp aborts)."""
        m = self._known(model)
        self._begin()
        if state == "ready" and m.state in (LOADING, SLEEPING):
            m.failures, m.last_used = 0, now
            if m.ready_at is None:
                m.ready_at = now
            self._set_state(m, LOADED, "child ready")  # loading|sleeping -> loaded
        elif state == "sleeping" and m.state is LOADED:
            self._set_state(m, SLEEPING, "child went to sleep")  # loaded -> sleeping (A12)
        elif state == "loading" and m.state is SLEEPING:
            self._set_state(m, LOADING, "child waking up")  # sleeping -> loading
        return self._end(now)

    def child_ready(self, model: str, *, now: float) -> list[Decision]:
        """Mark the model loaded and grant its waiters."""
        return self.child_state(model, "ready", now=now)

    def child_exited(
        self, model: str, *, now: float, exit_code: int | None, log_tail: Sequence[str] = ()
    ) -> list[Decision]:
        """Record a reaped child: its slot is free now (A6); a failed load answers 500 (A10)."""
        m = self._known(model)
        if m.state not in RUNNING:
            raise ValueError(f"model {model!r} has no child to exit (state {m.state})")
        self._begin()
        tail = tuple(log_tail)
        if m.stop_reason is StopReason.HUNG:
            m.log_tail = tail
            # loaded|sleeping|stuck -> failed (killed by the watchdog: it stopped responding)
            self._set_state(m, FAILED, "killed: it stopped responding")
            self._crashed(m, now, "killed: it stopped responding")
        elif m.stop_reason is not None:  # asked to stop: a clean unload, whatever the code
            self._set_state(m, UNLOADED, f"stopped ({m.stop_reason})")  # running -> unloaded
        elif m.state is LOADING:
            self._failed_load(m, exit_code, tail)
        else:
            m.log_tail = tail
            to = UNLOADED if exit_code == 0 else FAILED
            # loaded|sleeping|stuck -> failed (or unloaded on code 0): it exited unasked
            self._set_state(m, to, f"child exited with code {exit_code}")
            self._crashed(m, now, f"exit code {exit_code}")
        m.stop_reason = m.drain_then = m.ready_at = None
        if m.removed:
            del self._models[model]
        if self._config.memory_budget is not None:  # the settle gate closes (memory mode)
            self._settle_since, self._available = now, None
        return self._end(now)

    def _crashed(self, m: _Model, now: float, reason: str) -> None:
        """A ready child died unasked: a crash-loop strike if it was ready only briefly."""
        if m.ready_at is None:
            return
        delay = m.crashes.died(uptime=now - m.ready_at, now=now, reason=reason)
        if delay is None:
            return
        name = m.spec.name
        self._emit(BackedOff(name, delay, m.crashes.strikes, reason))
        text = self._backoff_text(m, delay)
        self._cancel_entry(name, 503, "unavailable_error", text, math.ceil(delay))

    def _backoff_text(self, m: _Model, left: float) -> str:
        n = m.crashes.strikes
        times = "once" if n == 1 else f"{n} times in a row"
        return (
            f"model name={m.spec.name} died soon after it started, {times} "
            f"(last: {m.crashes.reason}); it is held back for {math.ceil(left)} s before the "
            "next start"
        )

    def _failed_load(self, m: _Model, exit_code: int | None, tail: tuple[str, ...]) -> None:
        m.failures += 1
        m.log_tail = tail
        limit = self._config.quarantine_after
        if 0 < limit <= m.failures:
            # loading -> quarantined (A10: N consecutive failed loads)
            self._set_state(m, QUARANTINED, f"{m.failures} consecutive failed loads")
        else:
            # loading -> failed (A10: the next request retries)
            self._set_state(m, FAILED, f"load failed with exit code {exit_code}")
        text = f"model name={m.spec.name} failed to load"
        self._cancel_entry(m.spec.name, 500, "server_error", text, details=tail)

    def child_stuck(self, model: str, *, now: float) -> list[Decision]:
        """Keep a child that survived SIGKILL counted (S6); its waiters fail fast."""
        m = self._known(model)
        if m.state not in RUNNING:
            raise ValueError(f"model {model!r} has no child to be stuck (state {m.state})")
        self._begin()
        m.drain_then = None
        self._set_state(m, STUCK, "survived SIGKILL", stopping=True)  # running -> stuck
        self._cancel_entry(model, 503, "unavailable_error", self._stuck_text(model), RETRY_AFTER)
        return self._end(now)

    def child_hung(self, model: str, *, now: float) -> list[Decision]:
        """Kill a child the watchdog found busy without progress; its slot frees at the exit.

        Idempotent while it is already stopping. The exit makes it ``failed`` and counts as a
        crash-loop strike, so a child that hangs on every request is not respawned at once.
        """
        m = self._known(model)
        self._begin()
        if m.state in RUNNING and not m.stopping:
            # loaded|sleeping -> +stopping (hung: SIGKILL at once, a hung child reads no stdin)
            self._stop(m, StopReason.HUNG, Trigger(WATCHDOG_ACTOR, queue_depth=self._depth()), now)
        return self._end(now)

    def unload(self, model: str, *, now: float, actor: str) -> list[Decision]:
        """Stop the model now, busy or not; idempotent while it is already stopping."""
        m = self._known(model)
        if m.state not in RUNNING:
            raise NotRunningError(f"model {model!r} is not running")
        self._begin()
        if not m.stopping:
            # loaded -> loaded+stopping (unload by actor); loading is killed (S4)
            self._stop(m, StopReason.UNLOAD, Trigger(actor, queue_depth=self._depth()), now)
        text = f"model name={model} is not running"
        self._cancel_entry(model, 400, "invalid_request_error", text)
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
        self._begin()
        if request_id is not None:
            entry = self._waiting.get(request_id)
            chosen = [w for w in entry.waiters if w.request_id == request_id] if entry else []
        else:
            entry = self._entry_for(model or "")
            chosen = list(entry.waiters) if entry else []
        for w in chosen:
            assert entry is not None
            self._leave(w.request_id)
            text = f"the request was cancelled by {actor} while queued for model name={entry.model}"
            self._reject(w, entry.model, 499, "cancelled", text)
        return self._end(now)

    def reload(self, presets: Iterable[PresetSpec], *, now: float, actor: str) -> list[Decision]:
        """Reconcile with new presets; restart only running models whose command changed (A14).

        A removed model's waiters get 400 ``not found``; its child is stopped once idle. A changed
        running model drains, stops and is spawned again through a held queue entry. Any reload
        clears ``failed`` (llama.cpp 2.21); an edited preset also lifts a quarantine (A10).
        """
        new = preset_map(presets)
        self._begin()
        removed = [name for name, m in self._models.items() if name not in new and not m.removed]
        for name in removed:
            self._remove(self._models[name], now, actor)
        added: list[str] = []
        changed: list[str] = []
        restarted: list[str] = []
        for name, spec in new.items():
            m = self._models.get(name)
            if m is None:
                self._models[name] = _Model(spec)
                added.append(name)
                continue
            if m.removed:  # back before its old child exited: keep it
                m.removed = False
                m.drain_then = None if m.drain_then is StopReason.REMOVED else m.drain_then
            old, m.spec = m.spec, spec
            if m.state is FAILED:
                self._set_state(m, UNLOADED, "reload clears failed")  # failed -> unloaded
            if spec == old:
                continue
            changed.append(name)
            m.failures = 0
            if m.state is QUARANTINED:
                self._set_state(m, UNLOADED, "preset edited")  # quarantined -> unloaded (A10)
            if spec.command != old.command and m.state in RUNNING and not m.stopping:
                self._restart(m, now, actor)
                restarted.append(name)
        lists = (tuple(added), tuple(removed), tuple(changed), tuple(restarted))
        self._emit(PresetsReloaded(actor, *lists))
        return self._end(now)

    def _remove(self, m: _Model, now: float, actor: str) -> None:
        name = m.spec.name
        m.removed = True
        self._cancel_entry(name, 400, "invalid_request_error", f"model '{name}' not found")
        if m.state not in RUNNING:
            del self._models[name]
        elif not m.stopping and m.in_flight > 0:
            m.drain_then = StopReason.REMOVED
        elif not m.stopping:
            self._stop(m, StopReason.REMOVED, Trigger(actor), now)  # loaded -> loaded+stopping

    def _restart(self, m: _Model, now: float, actor: str) -> None:
        entry = self._entry_for(m.spec.name)
        if entry is None:
            entry = _Entry(next(self._tickets), m.spec.name, now)
            self._queue.append(entry)
        entry.restart_by = actor
        if m.in_flight > 0:
            m.drain_then = StopReason.RELOAD  # no new requests; stop when the last one ends
        else:
            self._stop(m, StopReason.RELOAD, Trigger(actor), now)  # loaded -> loaded+stopping

    def settings_changed(self, config: RouterConfig, *, now: float) -> list[Decision]:
        """Apply new limits: more slots are claimed at once, fewer shrink to the cap (A5)."""
        self._begin()
        self._config = config
        if config.memory_budget is None:
            self._settle_since = self._available = None
        return self._end(now)

    def memory_sample(self, available: int, *, now: float) -> list[Decision]:
        """Feed the settle gate; only samples taken after the last exit count."""
        self._begin()
        if self._settle_since is not None:
            self._available = available
        return self._end(now)

    def tick(self, *, now: float) -> list[Decision]:
        """Expire waiters past max_wait (A8), stop models idle past their ttl (A11), re-admit."""
        self._begin()
        max_wait = self._config.max_wait
        expired = [
            (w, e.model) for e in self._queue for w in e.waiters
            if max_wait is not None and now - w.since >= max_wait
        ]  # fmt: skip
        for w, model in expired:
            self._leave(w.request_id)
            text = f"waited {max_wait:g} s for model name={model}; retry later"
            self._reject(w, model, 503, "unavailable_error", text, RETRY_AFTER)
        for m in self._ttl_candidates():
            if now - m.last_used >= (m.spec.ttl or 0):
                # loaded -> loaded+stopping (idle past its ttl, A11)
                self._stop(m, StopReason.TTL, Trigger(SCHEDULER_ACTOR), now)
        return self._end(now)

    def shutdown(self, *, now: float, actor: str) -> list[Decision]:
        """Reject every waiter and stop every child, busy or not; admit nothing afterwards."""
        self._begin()
        self._closing = True
        for entry in list(self._queue):
            self._cancel_entry(entry.model, 503, "unavailable_error", "router is shutting down")
        for m in self._models.values():
            if m.state in RUNNING and not m.stopping:
                self._stop(m, StopReason.SHUTDOWN, Trigger(actor), now)  # running -> +stopping
        return self._end(now)

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

    def models(self) -> tuple[ModelView, ...]:
        """Return every model, by name (removed ones still running included)."""
        return tuple(self.model(name) for name in sorted(self._models))

    def queue(self) -> tuple[QueueEntryView, ...]:
        """Return the queue entries, head first."""
        return tuple(self._view(pos, e) for pos, e in enumerate(self._queue, start=1))

    def _view(self, position: int, e: _Entry) -> QueueEntryView:
        m = self._models[e.model]
        since = e.waiters[0].since if e.waiters else e.since  # arrival order: oldest first
        starting = self._fresh(m) and m.state is LOADING
        restart = e.restart_by is not None
        head = tuple(e.waiters[:QUEUE_VIEW_REQUESTS])
        n = len(e.waiters)
        return QueueEntryView(e.ticket, e.model, position, n, since, starting, restart, head)

    def next_deadline(self) -> float | None:
        """Return when tick() next has work (max wait, ttl, settle timeout); never poll."""
        times = [m.last_used + (m.spec.ttl or 0) for m in self._ttl_candidates()]
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
        for entry in list(self._queue):
            self._serve_entry(entry, now)
        self._claim(now)
        self._evict(now)

    def _reject_oversized(self) -> None:
        budget = self._config.memory_budget
        for entry in list(self._queue):
            need = _estimate(self._models[entry.model])
            # A3: it could never fit, so evicting for it would be futile
            if budget is not None and need > budget:
                text = f"model name={entry.model} needs {need} bytes, more than the memory "
                self._cancel_entry(entry.model, 500, "server_error", f"{text}budget ({budget})")

    def _serve_entry(self, entry: _Entry, now: float) -> None:
        m = self._models[entry.model]
        if self._servable(m):  # A1 for waiters: the model became loaded or sleeping
            served, entry.waiters = entry.waiters, []
        elif self._fresh(m) and m.state is LOADING:  # A9: a load is answered once spawned
            served = [w for w in entry.waiters if w.kind is RequestKind.LOAD]
            entry.waiters = [w for w in entry.waiters if w.kind is RequestKind.PROXY]
        else:
            return
        entry.restart_by = None
        for w in served:
            del self._waiting[w.request_id]
            self._grant(w, m, now)
        if not entry.waiters:
            self._queue.remove(entry)

    def _claim(self, now: float) -> None:
        """Let successive heads spawn while capacity is real (A4, A6)."""
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
            self._set_state(m, LOADING, f"spawn for entry #{entry.ticket}")  # unloaded -> loading
            self._emit(Spawn(m.spec.name, m.spec, entry.ticket, trigger))
            self._serve_entry(entry, now)

    def _has_capacity(self, m: _Model, now: float) -> bool:
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

    def _gate_open(self, m: _Model, now: float) -> bool:
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
        config, queued = self._config, {e.model for e in self._queue}
        running = [m for m in self._models.values() if m.state in RUNNING]
        # A stopping child frees a slot, unless stuck or its own entry waits to reuse it.
        freeing = [m for m in running if m.stopping and m.state is not STUCK]
        freeing = [m for m in freeing if m.spec.name not in queued]
        free_n = math.inf if config.unlimited else config.models_max - len(running) + len(freeing)
        budget = config.memory_budget
        free_b = math.inf if budget is None else budget - sum(map(_estimate, running))
        free_b += sum(map(_estimate, freeing))
        needs: list[_Entry | None] = [None]  # None: the deficit after lowering a limit
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

    def _eviction_cause(self, entry: _Entry | None) -> tuple[StopReason, Trigger]:
        if entry is None:
            return StopReason.SHRINK, Trigger(SCHEDULER_ACTOR, queue_depth=self._depth())
        first = entry.waiters[0] if entry.waiters else None
        actor = first.actor if first else (entry.restart_by or SCHEDULER_ACTOR)
        request = first.request_id if first else None
        return StopReason.EVICTION, Trigger(actor, entry.model, request, self._depth())

    def _pick_victim(self, queued: set[str]) -> _Model | None:
        """Return the idle, evictable, unpinned, unwanted model used longest ago (A5, A12)."""
        candidates = [
            m
            for m in self._models.values()
            if self._fresh(m) and m.state in EVICTABLE and m.in_flight == 0
            and not m.spec.pinned and m.spec.name not in queued
        ]  # fmt: skip
        return min(candidates, key=lambda m: (m.last_used, m.spec.name), default=None)

    # ---- helpers -----------------------------------------------------------------------------

    def _set_state(
        self, m: _Model, to: ModelState, reason: str, *, stopping: bool | None = None
    ) -> None:
        """The one choke point: check ALLOWED, emit exactly one event, none if nothing changed."""
        if stopping is None:
            stopping = m.stopping and to in RUNNING  # the flag ends when the child is gone
        check_transition(m.state, to, stopping=stopping)
        if (to, stopping) == (m.state, m.stopping):
            return
        frm, m.state, m.stopping = m.state, to, stopping
        self._emit(StateChanged(m.spec.name, frm, to, stopping, reason))

    def _stop(self, m: _Model, reason: StopReason, trigger: Trigger, now: float) -> None:
        m.stop_reason, m.drain_then = reason, None
        why = f"{reason} by {trigger.actor}" + (f" for {trigger.model}" if trigger.model else "")
        self._set_state(m, m.state, why, stopping=True)  # running -> running+stopping
        if m.state is LOADING or reason is StopReason.HUNG:  # S4: killed at once
            self._emit(Kill(m.spec.name, reason, trigger, m.in_flight))
        else:
            idle = now - m.last_used
            self._emit(Stop(m.spec.name, reason, trigger, m.spec.stop_timeout, idle, m.in_flight))

    def _grant(self, w: WaiterView, m: _Model, now: float) -> None:
        m.last_used = now
        if w.kind is RequestKind.PROXY:
            m.in_flight += 1
            self._granted[w.request_id] = m.spec.name
        self._emit(Grant(w.request_id, m.spec.name, w.kind))

    def _reject(
        self, w: WaiterView, model: str, status: int, error_type: str, message: str,
        retry_after: int | None = None, details: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        self._emit(Reject(w.request_id, model, status, error_type, message, retry_after, details))

    def _cancel_entry(
        self, model: str, status: int, error_type: str, message: str,
        retry_after: int | None = None, details: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        entry = self._entry_for(model)
        if entry is None:
            return
        self._queue.remove(entry)
        for w in entry.waiters:
            del self._waiting[w.request_id]
            self._reject(w, model, status, error_type, message, retry_after, details)

    def _leave(self, request_id: str) -> None:
        entry = self._waiting.pop(request_id, None)
        if entry is None:
            return
        entry.waiters = [w for w in entry.waiters if w.request_id != request_id]
        if not entry.waiters and entry.restart_by is None:  # A7: an empty entry leaves
            self._queue.remove(entry)

    def _ttl_candidates(self) -> list[_Model]:
        return [
            m
            for m in self._models.values()
            if m.spec.ttl is not None and not m.spec.pinned and self._fresh(m)
            and m.state in EVICTABLE and m.in_flight == 0
        ]  # fmt: skip

    def _fresh(self, m: _Model) -> bool:
        """Running, not stopping and not draining: it may take new requests."""
        return m.state in RUNNING and not m.stopping and m.drain_then is None

    def _servable(self, m: _Model) -> bool:
        return self._fresh(m) and m.state in SERVABLE

    def _entry_for(self, model: str) -> _Entry | None:
        return next((e for e in self._queue if e.model == model), None)

    def _depth(self) -> int:
        return sum(len(e.waiters) for e in self._queue)

    def _known(self, name: str) -> _Model:
        m = self._models.get(name)
        if m is None:
            raise UnknownModelError(f"no model named {name!r}")
        return m

    def _stuck_text(self, name: str) -> str:
        return f"model name={name} is stuck: its process survived SIGKILL"

    def _emit(self, decision: Decision) -> None:
        self._out.append(decision)

    def _begin(self) -> None:
        self._out, self._queue_before = [], self.queue()

    def _end(self, now: float) -> list[Decision]:
        self._admit(now)
        after = self.queue()
        if after != self._queue_before:
            self._emit(QueueChanged(after))
        out, self._out = self._out, []
        return out
