"""Back off from a child that keeps dying soon after it became ready (crash loops).

Quarantine (A10) covers children that never become ready. A child that loads, serves a request
and dies — a bad driver, an allocation that fails on the first prompt, a hung Metal queue the
watchdog kills — would otherwise be respawned by the very next request, forever. ``CrashLoop``
is the per-model record the scheduler keeps: every unasked death within ``CRASH_WINDOW`` seconds
of readiness is a strike, and strike n holds the next spawn back 1, 2, 4 … ``MAX_DELAY``
seconds. A child that stayed up longer than the window starts the count again; an explicit load
clears it. Pure: time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

CRASH_WINDOW = 60.0  # seconds after ready within which an unasked death is a strike
FIRST_DELAY = 1.0
MAX_DELAY = 60.0


@dataclass(slots=True)
class CrashLoop:
    """One model's crash-loop record (owned by the scheduler)."""

    strikes: int = 0
    retry_at: float | None = None  # no spawn before this (scheduler clock)
    reason: str = ""  # what the last strike was, in words

    def died(self, *, uptime: float, now: float, reason: str) -> float | None:
        """Record an unasked death after ``uptime`` seconds of readiness.

        Returns the back-off in seconds, or None when the child had run long enough for the
        death to be a first failure rather than a loop (the count starts again).
        """
        delay = self.next_delay(uptime=uptime)
        if delay is None:
            self.clear()
            return None
        self.strikes += 1
        self.retry_at, self.reason = now + delay, reason
        return delay

    def next_delay(self, *, uptime: float) -> float | None:
        """The back-off a death after ``uptime`` seconds of readiness would bring (None: none),
        without recording it: what to tell the clients of a child about to be killed."""
        if uptime >= CRASH_WINDOW:
            return None
        return min(MAX_DELAY, FIRST_DELAY * 2.0**self.strikes)

    def remaining(self, now: float) -> float | None:
        """Seconds until a spawn is allowed again, or None when it is allowed now."""
        if self.retry_at is None or now >= self.retry_at:
            return None
        return self.retry_at - now

    def clear(self) -> None:
        """Forget the strikes: an explicit load, or a child that ran long enough."""
        self.strikes, self.retry_at, self.reason = 0, None, ""
