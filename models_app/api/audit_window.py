"""Refused API requests, audited off the request path and rate-limited: ``AuditWindow``, the
base of failed logins (``auth.LoginFailures``) and of scoped keys' refusals
(``scopes.KeyRefusals``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

log = logging.getLogger(__name__)


class AuditWindow:
    """Audit refusals without letting a flood flood the audit table (DESIGN §6, issue 5).

    The first refusal after a quiet spell is written at once (one row); the ones that follow
    within ``window`` seconds are counted and written as one row when the window ends, and so
    on while refusals keep coming — at most two rows per window, whatever the request rate.
    A row says how many, and for each of ``FIELDS`` which values how often (at most
    ``MAX_DISTINCT`` each). Writes run in a thread; ``count`` never blocks the request.
    """

    MAX_DISTINCT = 20  # values kept per field and row; the rest are counted as "other"
    FIELDS: tuple[str, ...] = ()

    def __init__(
        self, writer: Callable[[int, dict[str, Any]], None], *, window: float = 60.0
    ) -> None:
        self._writer = writer
        self.window = window
        self._open = False
        self._count = 0
        self._values: dict[str, Counter[str]] = {name: Counter() for name in self.FIELDS}
        self._tasks: set[asyncio.Task[Any]] = set()

    def count(self, **values: str) -> None:
        """Count one refusal; ``values`` has one value for each of ``FIELDS``."""
        self._count += 1
        for name, value in values.items():
            _add(self._values[name], value, self.MAX_DISTINCT)
        if not self._open:  # quiet until now: say so at once, then aggregate
            self._open = True
            self._write()
            asyncio.get_running_loop().call_later(self.window, self._window_ended)

    def _window_ended(self) -> None:
        if self._count == 0:
            self._open = False
            return
        self._write()
        asyncio.get_running_loop().call_later(self.window, self._window_ended)

    def _write(self) -> None:
        details: dict[str, Any] = {"window_seconds": self.window}
        details |= {name: dict(counter.most_common()) for name, counter in self._values.items()}
        count, self._count = self._count, 0
        self._values = {name: Counter() for name in self.FIELDS}
        write = sync_to_async(self._writer, thread_sensitive=False)
        task = asyncio.ensure_future(self._guarded(write, count, details))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _guarded(write: Any, count: int, details: dict[str, Any]) -> None:
        try:
            await write(count, details)
        except Exception:  # the database may be down: a lost audit row must not break the API
            log.warning("could not audit %d refused API requests", count, exc_info=True)

    async def drain(self) -> None:
        """Wait for the writes under way (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _add(counter: Counter[str], value: str, limit: int) -> None:
    if value in counter or len(counter) < limit:
        counter[value] += 1
    else:
        counter["other"] += 1
