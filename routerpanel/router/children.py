"""The scheduler's child inputs: what the supervisor and the watchdog report of a child.

``Children`` turns a child's state line, its exit, its surviving SIGKILL (S6) and the watchdog's
finding that it hung into state changes and decisions on the scheduler's ``Book`` (book.py),
through the book's choke point. It owns no state of its own. Each input starts the book's
gathering (``Book.begin``) once its arguments are checked; ``scheduler.Scheduler`` owns it and
runs admission after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from routerpanel.router.book import RETRY_AFTER, WATCHDOG_ACTOR, Book
from routerpanel.router.decisions import StopReason, Trigger
from routerpanel.router.states import FAILED, LOADED, LOADING, RUNNING, SLEEPING, STUCK, UNLOADED

ChildState = Literal["loading", "ready", "sleeping"]


class Children:
    """Mirror what a child reports into the book (see module doc)."""

    def __init__(self, book: Book) -> None:
        self._book = book

    def state(self, model: str, state: ChildState, now: float) -> None:
        """Mirror a child's state line; lines that fit no edge are ignored (llama.cpp aborts)."""
        m = self._book.known(model)
        self._book.begin()
        if state == "ready" and m.state in (LOADING, SLEEPING):
            self._book.charge_load(model, now)
            m.failures, m.last_used = 0, now
            if m.ready_at is None:
                m.ready_at = now
            self._book.set_state(m, LOADED, "child ready")  # loading|sleeping -> loaded
        elif state == "sleeping" and m.state is LOADED:
            self._book.set_state(m, SLEEPING, "child went to sleep")  # loaded -> sleeping (A12)
        elif state == "loading" and m.state is SLEEPING:
            self._book.set_state(m, LOADING, "child waking up")  # sleeping -> loading

    def exited(
        self, model: str, now: float, exit_code: int | None, log_tail: Sequence[str]
    ) -> None:
        """Record a reaped child: its slot is free now (A6); a failed load answers 500 (A10)."""
        m = self._book.known(model)
        if m.state not in RUNNING:
            raise ValueError(f"model {model!r} has no child to exit (state {m.state})")
        self._book.begin()
        self._book.charge_load(model, now)
        tail = tuple(log_tail)
        if m.stop_reason is StopReason.HUNG:
            m.log_tail = tail
            # loaded|sleeping|stuck -> failed (killed by the watchdog: it stopped responding)
            self._book.set_state(m, FAILED, "killed: it stopped responding")
            self._book.crashed(m, now, "killed: it stopped responding")
        elif m.stop_reason is not None:  # asked to stop: a clean unload, whatever the code
            self._book.set_state(m, UNLOADED, f"stopped ({m.stop_reason})")  # running -> unloaded
        elif m.state is LOADING:
            self._book.failed_load(m, exit_code, tail)
        else:
            m.log_tail = tail
            to = UNLOADED if exit_code == 0 else FAILED
            # loaded|sleeping|stuck -> failed (or unloaded on code 0): it exited unasked
            self._book.set_state(m, to, f"child exited with code {exit_code}")
            self._book.crashed(m, now, f"exit code {exit_code}")
        m.stop_reason = m.drain_then = m.ready_at = None
        if m.removed:
            del self._book.models[model]
        if self._book.config.memory_budget is not None:  # the settle gate closes (memory mode)
            self._book.settle_since, self._book.available = now, None

    def stuck(self, model: str) -> None:
        """Keep a child that survived SIGKILL counted (S6); its waiters fail fast."""
        m = self._book.known(model)
        if m.state not in RUNNING:
            raise ValueError(f"model {model!r} has no child to be stuck (state {m.state})")
        self._book.begin()
        m.drain_then = None
        self._book.set_state(m, STUCK, "survived SIGKILL", stopping=True)  # running -> stuck
        self._book.cancel_entry(
            model, 503, "unavailable_error", self._book.stuck_text(model), RETRY_AFTER
        )

    def hung(self, model: str, now: float) -> None:
        """Kill a child the watchdog found busy without progress; its slot frees at the exit.

        Idempotent while it is already stopping. The exit makes it ``failed`` and counts as a
        crash-loop strike, so a child that hangs on every request is not respawned at once.
        """
        m = self._book.known(model)
        self._book.begin()
        if m.state in RUNNING and not m.stopping:
            # loaded|sleeping -> +stopping (hung: SIGKILL at once, a hung child reads no stdin)
            self._book.stop(
                m, StopReason.HUNG, Trigger(WATCHDOG_ACTOR, queue_depth=self._book.depth()), now
            )

    def backoff_if_died(self, model: str, now: float) -> float | None:
        """The crash-loop back-off ``model``'s child would bring if it died now (None: none)."""
        m = self._book.known(model)
        if m.ready_at is None:
            return None
        return m.crashes.next_delay(uptime=now - m.ready_at)
