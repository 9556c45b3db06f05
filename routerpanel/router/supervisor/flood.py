"""Keep a child that floods its output from flooding the router (S7).

Every line a child writes becomes a ``LogLine`` in the engine's inbox and an event for every
listener (the dashboard, the logs page). A child in a print loop can write a million lines a
second; handled one by one they would starve the engine's single loop and every request behind
it. ``LogBudget`` is a token bucket per child: ``rate`` lines a second, bursts of ``burst``. Past
it, output is still read (a child blocked on a full pipe would hang) but only counted: the last
complete line of each chunk is kept for the log ring, so a crash report still shows the end, and
once a second one line says how many were not shown. Every line counts, whatever its prefix:
state lines of the child protocol are handled within a budget of their own (``STATE_RATE``, far
above what a child sends), and malformed ones are counted, with one line a second that says how
many, never one note per line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from routerpanel.router.supervisor.protocol import STATE_PREFIX

STATE_MARKER = STATE_PREFIX.encode()
RATE = 200.0  # lines per second shown live
BURST = 2000.0
# State lines of the child protocol have a budget of their own: a real child sends a few a
# second (load progress), so these are never reached by one; past them (a child writing lines
# that merely start with the prefix) they are counted like any line, not parsed one by one.
STATE_RATE = 100.0
STATE_BURST = 1000.0
# Past the budget, a pause after each chunk read: at 64 KiB a read that caps the router's work
# at ~6 MB/s of output (~90,000 lines/s) — far above any real logging; a faster child waits
# on its full pipe, as it would on a slow terminal.
FLOOD_PAUSE = 0.01


@dataclass(slots=True)
class LogBudget:
    """A token bucket of log lines (owned by one child's reader; time passed in)."""

    rate: float = RATE
    burst: float = BURST
    tokens: float = BURST
    stamp: float = 0.0
    dropped: int = 0  # lines counted but not shown since the last report
    reported_at: float = 0.0

    def allow(self, now: float) -> bool:
        """Take one line's token; False when the child is over its budget."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def over(self, now: float) -> bool:
        """Whether a whole chunk should be counted instead of split (no token left)."""
        self._refill(now)
        return self.tokens < 1.0

    def count(self, lines: int) -> None:
        self.dropped += lines

    def flush(self) -> int | None:
        """Return the lines dropped since the last report, now (the pipe has ended)."""
        n, self.dropped = self.dropped, 0
        return n or None

    def report(self, now: float) -> int | None:
        """Return the lines dropped since the last report, at most once a second."""
        if self.dropped and now - self.reported_at >= 1.0:
            n, self.dropped, self.reported_at = self.dropped, 0, now
            return n
        return None

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now


def last_line(chunk: bytes) -> str | None:
    """The last complete line of ``chunk`` (without its newline), or None if it has none."""
    end = chunk.rfind(b"\n")
    if end < 0:
        return None
    start = chunk.rfind(b"\n", 0, end) + 1
    return chunk[start:end].decode("utf-8", "replace").rstrip("\r")


def holds_marker(marker: bytes | None, pending: Callable[[int], bytes], chunk: bytes) -> bool:
    """Whether a state line starts in ``chunk``, or in the unfinished line before it
    (``pending(n)`` gives its last n bytes: a marker may be cut between two reads)."""
    if marker is None:
        return False
    return marker in pending(len(marker) - 1) + chunk
