"""The scheduler's request inputs: a request's way in (rules (1)-(9)) and its way out.

``Arrivals`` answers, queues or grants one arriving request, knows when a proxy request can be
granted at once without an admission pass (issue 16.5's hot path), and releases a finished
one. It owns no state of its own: everything is the scheduler's ``Book`` (book.py), changed
through the book's choke point. ``scheduler.Scheduler`` owns it, starts and ends each input.
"""

from __future__ import annotations

import math

from routerpanel.router.book import RETRY_AFTER, Book, ModelRecord
from routerpanel.router.decisions import SCHEDULER_ACTOR, RequestKind, Trigger, WaiterView
from routerpanel.router.states import DOWN, QUARANTINED, RUNNING, STUCK, UNLOADED


class Arrivals:
    """Admit, queue or reject arriving requests, release finished ones (see module doc)."""

    def __init__(self, book: Book) -> None:
        self._book = book

    def in_use(self, request_id: str) -> bool:
        """The id is waiting or granted: a second request may not take it."""
        return self._book.queue.holds(request_id) or request_id in self._book.granted

    def at_once(self, m: ModelRecord, kind: RequestKind) -> bool:
        """The hot path: a proxy request for a model that serves, nothing queued, not closing.

        (1)-(6b) cannot apply to such a model, and admission after the grant has nothing to do:
        a grant frees nothing and the queue stays empty (no queue event either).
        """
        return (
            kind is RequestKind.PROXY
            and not self._book.queue
            and not self._book.closing
            and not m.removed
            and self._book.serving(m)
        )

    def arrive(self, w: WaiterView, name: str, now: float) -> None:
        """Answer, grant or queue one request (``Scheduler.request_arrived``).

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
        (8b) Every slot is held by a model only an operator can stop (pinned, reserved, stuck)
             and the request is not patient: 503 at once with the reason (blocked.py).
        (9) Otherwise join the model's entry, at the tail if new (A2); admission follows.
        """
        m = self._book.models.get(name)
        load = w.kind is RequestKind.LOAD
        if (m is None or m.removed) and load:  # (1)
            return self._book.reject(w, name, 404, "not_found_error", "model is not found")
        if m is None or m.removed:  # (1)
            return self._book.reject(
                w, name, 400, "invalid_request_error", f"model '{name}' not found"
            )
        if self._book.closing:  # (2)
            return self._book.reject(w, name, 503, "unavailable_error", "router is shutting down")
        if load and m.state in RUNNING and not m.stopping:  # (3)
            return self._book.reject(
                w, name, 400, "invalid_request_error", "model is already running"
            )
        if load and m.state is QUARANTINED:  # (4) one more failure quarantines it again
            m.failures = max(0, self._book.config.quarantine_after - 1)
            # quarantined -> unloaded (retried by an explicit load, A10)
            self._book.set_state(m, UNLOADED, f"quarantine lifted by a load from {w.actor}")
        if m.state is QUARANTINED:  # (5) A10: fail fast, no spawn
            text = f"model name={name} failed to load (quarantined after {m.failures} "
            text += "consecutive failures: edit the preset or load it explicitly)"
            return self._book.reject(w, name, 500, "server_error", text, details=m.log_tail)
        if m.state is STUCK:  # (6)
            text = self._book.stuck_text(name)
            return self._book.reject(w, name, 503, "unavailable_error", text, RETRY_AFTER)
        if load and m.crashes.strikes:  # (6b) an explicit load resets the back-off
            m.crashes.clear()
        left = m.crashes.remaining(now) if m.state in DOWN else None
        if left is not None:  # (6b)
            text = self._book.backoff_text(m, left)
            return self._book.reject(w, name, 503, "unavailable_error", text, math.ceil(left))
        if self._book.serving(m):  # (7) A1
            return self._book.grant(w, m, now)
        entry = self._book.queue.entry_for(name)
        limit = self._book.config.max_waiters
        if entry is not None and limit is not None and len(entry.waiters) >= limit:  # (8) A8
            text = f"too many requests are waiting for model name={name} (max_waiters={limit})"
            return self._book.reject(w, name, 503, "unavailable_error", text, RETRY_AFTER)
        if not w.patient and m.state not in RUNNING and (why := self._book.blocked(name)):  # (8b)
            return self._book.reject(w, name, 503, "unavailable_error", why)
        self._book.queue.join(w, name, now)  # (9) A2

    def finish(self, request_id: str, now: float) -> None:
        """Release a granted request (a waiting one leaves); a drained model stops (A14)."""
        if self._book.queue.holds(request_id):
            self._book.queue.leave(request_id)
        name = self._book.granted.pop(request_id, None)
        if (owner := self._book.holders.pop(request_id, None)) is not None:
            self._book.use.release(owner, now)
        m = self._book.models.get(name) if name is not None else None
        if m is not None:
            m.in_flight -= 1
            m.last_used = now  # §15.26: finishing is use too
            if m.in_flight == 0 and m.drain_then is not None and not m.stopping:
                # loaded -> loaded+stopping (drained for a reload or removal, A14)
                self._book.stop(m, m.drain_then, Trigger(SCHEDULER_ACTOR), now)
