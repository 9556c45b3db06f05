"""How the supervisor reports: one ``post`` callback for every event, and a log ring per
model name (S7), kept across restarts and after the exit until the model is forgotten.

``Reporter`` is one of the supervisor's parts: the spawning core, the output reader and the
stopping part each hold it and report through it, never through each other.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from routerpanel.router.supervisor.child import Child
from routerpanel.router.supervisor.reports import LogLine, SupervisorEvent

log = logging.getLogger("routerpanel.router.supervisor")  # the package's name, as before the split


class Reporter:
    """Post every report through one callback; keep each name's log ring."""

    def __init__(self, post: Callable[[SupervisorEvent], None], log_lines: int) -> None:
        self._post_cb = post
        self._log_lines = log_lines
        self._logs: dict[str, deque[LogLine]] = {}

    def lines(self, name: str) -> list[LogLine]:
        """Return the ring buffer of ``name`` (kept after the exit, across restarts)."""
        return list(self._logs.get(name, ()))

    def forget(self, name: str) -> None:
        """Drop the ring buffer of a removed model."""
        self._logs.pop(name, None)

    def note(self, name: str, child: Child | None, text: str) -> None:
        """Report a line of the supervisor's own about ``name`` (stream ``router``)."""
        self.log(name, child, LogLine(name, "router", text, time.time()))

    def log(self, name: str, child: Child | None, line: LogLine) -> None:
        self.keep(child, line, name)
        self.post(line)

    def keep(self, child: Child | None, line: LogLine, name: str | None = None) -> None:
        """Put a line in the ring buffer and the child's last lines, without streaming it."""
        name = name or line.name
        ring = self._logs.get(name)
        if ring is None:
            ring = self._logs[name] = deque(maxlen=self._log_lines)
        ring.append(line)
        if child is not None:
            child.lines.append(line)

    def post(self, event: SupervisorEvent) -> None:
        try:
            self._post_cb(event)
        except Exception:  # a faulty consumer must not orphan a child
            log.exception("supervisor event consumer failed on %r", event)
