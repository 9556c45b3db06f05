"""Store the router's audit rows: journaled first, then written to the database by a thread.

``AuditWriter`` is the listener the router host registers, called synchronously for every
engine event in the engine's own publish path (``Engine.add_tap``). On the router's loop it only
feeds the mapper (mapper.py) and appends what it makes to the journal (journal.py):
a few microseconds, no database. A thread reads the journal and stores rows in batches with
``AuditEvent.objects.record_many``, which skips rows already stored (by boot id and seq). While
the database is unavailable the rows simply wait in the journal; the thread retries with
back-off, and when the database answers again it stores them, in order, each exactly once, and
records how long the outage lasted. A router killed mid-way leaves its journal for the next one,
which stores it first (DESIGN §6, §10).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, DataError, IntegrityError, connection

from models_app.audit.journal import (
    DIR_NAME,
    LEGACY_SPOOL,
    Journal,
    JournalReader,
    final,
    pending,
)
from models_app.audit.mapper import AuditMapper, new_router_id, stop_reason
from models_app.audit.rows import AUDIT_TAIL_LINES, Row
from models_app.audit.stops import AFTER_EXIT, STOP_GRACE
from models_app.db import drop_stale_connections
from models_app.models import AuditEvent
from routerpanel.router.engine import Engine
from routerpanel.router.feed import EngineEvent

__all__ = [
    "AUDIT_TAIL_LINES", "AuditMapper", "AuditWriter", "DatabaseUnavailable", "new_router_id",
    "stop_reason", "store_rows",
]  # fmt: skip

log = logging.getLogger(__name__)
JOURNAL_RETRY = 1.0  # seconds between two tries to write rows the journal could not take

_LIMITS = {
    "kind": 32, "model": 200, "from_state": 16, "to_state": 16, "actor": 200, "reason": 500,
    "trigger_model": 200, "trigger_request": 200, "router_id": 64, "node": 64,
}  # fmt: skip


# ---- storing ---------------------------------------------------------------------------------


class DatabaseUnavailable(Exception):
    """The rows could not be written now; they stay in the journal and are tried again later."""


def to_event(row: Row) -> AuditEvent:
    """Build the AuditEvent of a row (strings clipped to their columns, time from epoch)."""
    fields = dict(row)
    fields["time"] = datetime.fromtimestamp(float(fields["time"]), tz=UTC)
    for name, limit in _LIMITS.items():
        value = fields.get(name)
        if value is None and name in fields:
            fields[name] = ""
        elif isinstance(value, str) and len(value) > limit:
            fields[name] = value[: limit - 1] + "…"
    return AuditEvent(**fields)


def store_rows(rows: list[Row]) -> None:
    """Write rows in one statement; raise DatabaseUnavailable when the database cannot take them.

    Rows whose (router_id, seq) is stored already are skipped, so writing a batch twice is safe.
    A row the database refuses as data (it would be refused forever) is logged and dropped
    rather than blocking every row behind it.
    """
    drop_stale_connections()  # a connection the server closed since the last batch
    events = [to_event(row) for row in rows]
    try:
        AuditEvent.objects.record_many(events)
    except (DataError, IntegrityError):
        _store_one_by_one(events)
    except DatabaseError as exc:
        connection.close()
        raise DatabaseUnavailable(str(exc).strip()) from exc


def _store_one_by_one(events: list[AuditEvent]) -> None:
    for event in events:
        try:
            AuditEvent.objects.record_many([event])
        except (DataError, IntegrityError):
            log.exception("audit row refused by the database, dropped: %s", event.__dict__)
        except DatabaseError as exc:
            connection.close()
            raise DatabaseUnavailable(str(exc).strip()) from exc


class AuditWriter:
    """The router host's audit listener: map and journal on the loop, store from a thread.

    ``writer(event)`` is called on the router's loop and never blocks on the database.
    ``start()`` starts the thread; ``flush()`` blocks until every row produced so far is in the
    database (tests, the shutdown path); ``close()`` writes the waiting rows incomplete, tries
    once more to store everything and stops the thread — rows the database does not take stay
    in the journal for the next start. Call ``close`` off the loop (``aclose``).
    """

    def __init__(
        self,
        journal_dir: Path,
        *,
        router_id: str | None = None,
        settle_expected: Callable[[], bool] = lambda: False,
        store: Callable[[list[Row]], None] = store_rows,
        batch_size: int = 500,
        interval: float = 0.2,
        retry_interval: float = 1.0,
        max_retry_interval: float = 30.0,
        stop_grace: float = STOP_GRACE,
        after_exit: float = AFTER_EXIT,
        legacy_spool: Path | None = None,
        segment_bytes: int | None = None,
        on_outage_over: Callable[[float], None] | None = None,
        on_journal_back: Callable[[float, int], None] | None = None,
        node: str = "",
    ) -> None:
        self.router_id = router_id or new_router_id()
        self.node = node  # several hosts (issue 18): every row names the node that wrote it
        extra = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
        self.journal = Journal(journal_dir, self.router_id, **extra)
        self.reader = JournalReader(journal_dir, self.router_id, legacy_spool)
        self.mapper = AuditMapper(
            self._produce,
            on_pending=self._pending,
            settle_expected=settle_expected,
            stop_grace=stop_grace,
            after_exit=after_exit,
        )
        self._store = store
        self.batch_size = batch_size
        self.interval = interval
        self.retry_interval = retry_interval
        self.max_retry_interval = max_retry_interval
        self.on_outage_over = on_outage_over
        self.on_journal_back = on_journal_back  # (seconds it failed, rows it held) on the loop
        self._wake = threading.Event()
        self._journal_failed = asyncio.Event()  # the journal holds rows in memory (a full disk)
        self._closing = threading.Event()
        self._done = threading.Condition()
        self._thread: threading.Thread | None = None
        self._next_retry = 0.0
        # Set by flush and close: try at once, back-off or not. A flag, because an attempt that
        # fails while they ask sets _next_retry after them.
        self._retry_now = False
        self._backoff = retry_interval
        self._down_since: float | None = None
        self.produced = 0  # rows journaled as finished (this boot)
        self.stored = 0  # of those, rows the database has taken
        self.recovered = 0  # rows of earlier boots stored from their journals
        self.outages = 0
        self.closed = False

    @classmethod
    def for_engine(cls, engine: Engine, **kwargs: Any) -> AuditWriter:
        """The writer of the router host: journal in the data dir, settle rows in memory mode."""
        kwargs.setdefault("settle_expected", lambda: engine.config.memory_budget is not None)
        data = Path(settings.DATA_DIR)
        kwargs.setdefault("legacy_spool", data / LEGACY_SPOOL)
        return cls(data / DIR_NAME, **kwargs)

    # ---- the loop side ----------------------------------------------------------------------

    def __call__(self, event: EngineEvent) -> None:
        self.mapper.feed(event)

    def _produce(self, row: Row) -> None:
        row["router_id"] = self.router_id
        row.setdefault("node", self.node)  # a node.changed row names the node it is about
        self.journal.append([final(row)], self.mapper.pending)
        self.produced += 1
        self._wake.set()
        if self.journal.problem is not None:
            self._journal_failed.set()

    def _pending(self, row: Row, waiting: list[str]) -> None:
        row["router_id"] = self.router_id
        row.setdefault("node", self.node)
        self.journal.append([pending(row, waiting)], self.mapper.pending)
        if self.journal.problem is not None:
            self._journal_failed.set()

    async def run_until_cancelled(self) -> None:
        """Write again what the journal could not take (a full disk), once a second while it
        cannot; when cancelled (the host stops), close off the loop: nothing waiting is lost."""
        try:
            while True:
                await self._journal_failed.wait()
                since, held = time.monotonic(), 0
                while True:
                    held = max(held, self.journal.backlogged)  # before it is written
                    if self.journal.retry(self.mapper.pending):
                        break
                    await asyncio.sleep(JOURNAL_RETRY)
                self._journal_failed.clear()
                self._wake.set()  # the rows are on disk: store them now
                if self.on_journal_back is not None:
                    self.on_journal_back(time.monotonic() - since, held)
        finally:
            self.mapper.finish_all()  # on the loop: the mapper is the loop's
            await asyncio.to_thread(self.close, 10.0)

    # ---- control ----------------------------------------------------------------------------

    def start(self) -> AuditWriter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="audit writer", daemon=True)
            self._thread.start()
        return self

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until every row produced so far is stored; False if the database is not back."""
        target = self.produced
        self._retry_now = True  # not just _next_retry = 0: a failing attempt would overwrite it
        self._wake.set()
        with self._done:
            return self._done.wait_for(lambda: self.stored >= target, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after one last attempt to store everything (bounded by ``timeout``)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._retry_now = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("audit writer still busy after %.0f s; rows stay journaled", timeout)
        else:
            self._drain()  # never started: do the work here
        self.journal.close()
        self.closed = True

    # ---- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                self._wake.wait(self.interval)
                self._wake.clear()
                if self._retry_now or time.monotonic() >= self._next_retry:
                    self._retry_now = False
                    self._drain()
            self._drain()
        finally:
            connection.close()

    def _drain(self) -> None:
        """Store what the journal holds, batch by batch, until it is empty or the database fails."""
        while True:
            batch = self.reader.read(self.journal.current, self.batch_size)
            if not (batch.rows or batch.advance or batch.done):
                return
            try:
                if batch.rows:
                    self._store(batch.rows)
            except DatabaseUnavailable as exc:
                self._outage(exc)
                return
            self.reader.stored(batch)
            self._stored(batch.rows)
            self._recovered()

    def _outage(self, exc: DatabaseUnavailable) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.outages += 1
            log.warning("audit: database unavailable (%s); rows wait in the journal", exc)
        self._next_retry = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.max_retry_interval)

    def _recovered(self) -> None:
        self._backoff = self.retry_interval
        if self._down_since is None:
            return
        seconds, self._down_since = time.monotonic() - self._down_since, None
        log.warning("audit: the database is back after %.1f s; journaled rows written", seconds)
        if self.on_outage_over is not None:
            self.on_outage_over(seconds)

    def _stored(self, rows: list[Row]) -> None:
        """Count this router's rows (a journal may hold an earlier router's too)."""
        with self._done:
            own = sum(1 for row in rows if row.get("router_id") == self.router_id)
            self.stored += own
            self.recovered += len(rows) - own
            self._done.notify_all()
