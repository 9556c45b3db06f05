"""Follow the database: reload presets and settings whenever any process changed them.

The database is the one source of truth for presets, router settings and node settings. Whoever
writes them — the panel, ``manage.py import_presets`` while ``serve`` runs, the Django admin,
another web process, a script, plain SQL — raises one counter through triggers
(``models.ConfigChange``, migration 0021). Each router reads that one row every ``INTERVAL``
seconds, and when it moved, reads the presets and settings once and hands them to its engine:
new presets appear, a changed one whose model runs is restarted (A14, as a panel edit does), a
removed one is drained and stopped first. Nothing polls whole tables; a change reaches every
router within about ``INTERVAL`` plus the reload.

The reads run on one thread of their own (one database connection), so a database that hangs
delays only this watch, never the panel's or the engine's own queries. A failed read is retried
at the next interval; the watch never stops the router.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

log = logging.getLogger(__name__)

INTERVAL = 0.5  # seconds between two reads of the counter
ACTOR = "database"  # who reloads: a change made outside this router's own panel


def read_version() -> int:
    """The counter now (0 before the first change)."""
    from models_app.models import ConfigChange

    found = ConfigChange.objects.filter(pk=1).values_list("version", flat=True).first()
    return int(found or 0)


def _read_on_own_thread() -> int:
    close_old_connections()  # a connection the database dropped (an outage) is not reused
    return read_version()


class ConfigWatch:
    """Call ``reload`` once for every change of the counter (see the module doc)."""

    def __init__(
        self,
        reload: Callable[[str], Awaitable[object]],
        *,
        interval: float = INTERVAL,
        read: Callable[[], int] = _read_on_own_thread,
    ) -> None:
        self._reload = reload
        self._interval = interval
        self._read = read
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="config watch")
        self.version: int | None = None  # the last counter seen
        self.reloads = 0

    async def _version(self) -> int | None:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, self._read)
        except Exception as exc:  # the database is away: ask again at the next interval
            log.debug("could not read the config counter: %s", exc)
            return None

    async def run(self) -> None:
        """Watch until cancelled. The first reading is the baseline: the router has just read
        the presets and settings it starts with."""
        try:
            while self.version is None:
                self.version = await self._version()
                if self.version is None:
                    await asyncio.sleep(self._interval)
            while True:
                await asyncio.sleep(self._interval)
                await self.check()
        finally:
            self._thread.shutdown(wait=False, cancel_futures=True)

    async def check(self) -> None:
        """Read the counter once; reload when it moved since the last reading."""
        now = await self._version()
        if now is None or now == self.version:
            return
        self.version = now
        self.reloads += 1
        try:
            await self._reload(ACTOR)
        except Exception:
            log.exception("reloading presets and settings after a database change failed")
