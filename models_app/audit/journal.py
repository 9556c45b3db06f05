"""The audit journal: every audit row on disk before the decision it records takes effect.

The router's loop appends each row to a JSON-lines *segment* in ``$DATA_DIR/audit-journal/``
the moment the mapper makes it — synchronously, in the engine's publish path, so before the
child is spawned or stopped and before a client hears its answer. A ``kill -9`` one instant
later loses nothing: the kernel has the bytes. The database writer (audit_writer.py) reads the
segments from a thread and stores their rows; rows carry (boot id, seq), unique in the table,
so a row read twice is stored once.

Records, one JSON object per line:

* ``{"r": row}`` — a finished row, to be stored;
* ``{"p": row, "w": [...]}`` — a *pending* stop row, still waiting for the victim's exit (``w``
  names what it waits for). A later ``{"r": ...}`` of the same seq supersedes it. If its router
  dies first, the next router stores it as it stands, marked incomplete.

Segments are named ``<creation ns>-<boot>.jsonl`` (so they sort in time) and rotated past
``segment_bytes``; the pending rows are copied into each new segment, so an old segment can be
deleted once stored. Segments of another boot are complete (that router is gone: one router per
data dir), and are stored and deleted first, oldest first. The legacy ``audit-spool.jsonl`` of
earlier versions is read the same way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Row = dict[str, Any]
DIR_NAME = "audit-journal"
LEGACY_SPOOL = "audit-spool.jsonl"
SEGMENT_BYTES = 8 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _dumps(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()


class Journal:
    """The appending side, owned by the router's loop (one writer per data dir)."""

    def __init__(self, directory: Path, boot: str, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = directory
        self.boot = boot
        self.segment_bytes = segment_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # close() may come from another thread
        self._fd: int | None = None
        self.current: Path | None = None
        self._size = 0
        self.appended = 0  # records written
        # Records a write could not take (a full disk, EIO, a read-only data dir), oldest first:
        # kept in memory and written before anything newer once the disk takes them again.
        self._backlog: list[bytes] = []
        self.problem: str | None = None  # why the last write failed, while it fails

    @property
    def backlogged(self) -> int:
        """Records waiting in memory for the disk."""
        return sum(chunk.count(b"\n") for chunk in self._backlog)

    def append(
        self,
        records: Iterable[dict[str, Any]],
        pending: Callable[[], Iterable[tuple[Row, list[str]]]] = list,
    ) -> None:
        """Write records now (one ``write``); rotate first if the segment is full. A write
        that fails keeps them, in order, for ``retry`` (never raises: the router goes on).

        ``pending()``: the rows still waiting, copied into a new segment when rotating.
        """
        data = b"".join(_dumps(r) for r in records)
        if not data:
            return
        with self._lock:
            self._backlog.append(data)
            self._write(pending)

    def retry(self, pending: Callable[[], Iterable[tuple[Row, list[str]]]] = list) -> bool:
        """Write what the backlog holds; True when nothing is left in memory."""
        with self._lock:
            if self._backlog:
                self._write(pending)
            return not self._backlog

    def _write(self, pending: Callable[[], Iterable[tuple[Row, list[str]]]]) -> None:
        data = b"".join(self._backlog)
        try:
            if self._fd is None or self._size >= self.segment_bytes:
                self._rotate(pending())
            assert self._fd is not None
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, "a short write: the disk is full")
        except OSError as exc:
            self._undo_partial()
            if self.problem is None:
                log.warning("audit journal: %s; rows wait in memory until it can be written", exc)
            self.problem = f"could not write the audit journal: {exc.strerror or exc}"
            return
        self._size += len(data)
        self.appended += data.count(b"\n")
        self._backlog.clear()
        if self.problem is not None:
            log.warning("audit journal: written again; no row was lost")
            self.problem = None

    def _undo_partial(self) -> None:
        """Cut a partly written record off the segment: the next write starts on a line."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # shrinking a file needs no space
                os.ftruncate(self._fd, self._size)

    def _rotate(self, pending: Iterable[tuple[Row, list[str]]]) -> None:
        """Start a new segment; the old one stays current if the new one cannot be made."""
        rows = () if self._fd is None else pending  # the boot's first segment: nothing before
        name = f"{time.time_ns():020d}-{_UNSAFE.sub('_', self.boot)}.jsonl"
        path = self.directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        header = b"".join(_dumps({"p": row, "w": list(waiting)}) for row, waiting in rows)
        try:
            if header and os.write(fd, header) != len(header):
                raise OSError(errno.ENOSPC, "a short write: the disk is full")
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self.current, self._size = fd, path, len(header)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def final(row: Row) -> dict[str, Any]:
    return {"r": row}


def pending(row: Row, waiting: list[str]) -> dict[str, Any]:
    return {"p": row, "w": waiting}


@dataclass
class Segment:
    path: Path
    boot: str
    offset: int = 0  # bytes already read (and stored, for our own boot)


@dataclass
class Batch:
    """Rows read from segments, ready to store; ``done`` are the segments they complete."""

    rows: list[Row] = field(default_factory=list)
    advance: dict[Path, int] = field(default_factory=dict)  # path -> new offset once stored
    done: list[Path] = field(default_factory=list)  # delete these once stored


class JournalReader:
    """The reading side, owned by the database writer's thread (see module doc)."""

    def __init__(self, directory: Path, boot: str, legacy_spool: Path | None = None) -> None:
        self.directory = directory
        self.boot = boot
        self.legacy_spool = legacy_spool
        self._offsets: dict[Path, int] = {}

    def segments(self) -> list[Segment]:
        found = sorted(self.directory.glob("*.jsonl")) if self.directory.exists() else []
        out = [
            Segment(path, path.stem.split("-", 1)[-1], self._offsets.get(path, 0)) for path in found
        ]
        legacy = self.legacy_spool
        if legacy is not None and legacy.exists():
            out.insert(0, Segment(legacy, "legacy", self._offsets.get(legacy, 0)))
        return out

    @property
    def _own(self) -> str:
        return _UNSAFE.sub("_", self.boot)

    def read(self, current: Path | None, limit: int) -> Batch:
        """Collect up to about ``limit`` rows: dead boots' segments whole, then our own."""
        batch = Batch()
        segments = self.segments()
        dead = [s for s in segments if s.boot != self._own]
        if dead:
            boot = dead[0].boot  # one dead boot at a time, all its segments together
            group = [s for s in dead if s.boot == boot]
            batch.rows = recover([rec for s in group for rec, _ in _lines(s.path, 0)])
            batch.done = [s.path for s in group]
            return batch
        for seg in segments:
            end, whole = seg.offset, True
            for record, after in _lines(seg.path, seg.offset):
                if len(batch.rows) >= limit:
                    whole = False
                    break
                if "r" in record:
                    batch.rows.append(record["r"])
                end = after
            if end > seg.offset:
                batch.advance[seg.path] = end
            if whole and _before(seg.path, current):  # rotated away from: complete once read
                batch.done.append(seg.path)
            if not whole or len(batch.rows) >= limit:
                break
        return batch

    def stored(self, batch: Batch) -> None:
        """The batch's rows are in the database: move on, delete completed segments."""
        self._offsets.update(batch.advance)
        for path in batch.done:
            path.unlink(missing_ok=True)
            self._offsets.pop(path, None)


def _before(path: Path, current: Path | None) -> bool:
    """Whether the writer has rotated past ``path``. By name (segments are named by the time
    they were made), not ``!= current``: a segment being made while we read is newer than the
    ``current`` we were handed, and must not be taken for complete and deleted under the writer."""
    return current is not None and path.name < current.name


def _lines(path: Path, offset: int) -> list[tuple[dict[str, Any], int]]:
    """Parse the complete lines after ``offset``: each record with the offset just after it."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return []
    out: list[tuple[dict[str, Any], int]] = []
    position = 0
    while (newline := data.find(b"\n", position)) >= 0:
        line, position = data[position:newline], newline + 1
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a crash while appending
            log.warning("audit journal %s: a line at byte %d is not JSON, skipped", path, offset)
            record = {}
        if isinstance(record, dict) and not ("r" in record or "p" in record) and record:
            record = {"r": record}  # the legacy spool: bare rows
        out.append((record, offset + position))
    return out


def recover(records: list[dict[str, Any]]) -> list[Row]:
    """A dead router's records as rows to store: finished rows, then its pending rows that
    never finished, marked incomplete ("the router stopped before …")."""
    finished: dict[tuple[Any, Any], Row] = {}
    waiting: dict[tuple[Any, Any], tuple[Row, list[str]]] = {}
    for record in records:
        if "r" in record:
            row = record["r"]
            finished[(row.get("router_id"), row.get("seq"))] = row
        else:
            row = record["p"]
            waiting[(row.get("router_id"), row.get("seq"))] = (row, list(record.get("w") or []))
    rows = list(finished.values())  # in the order they were finished
    for key, (row, missing) in waiting.items():
        if key in finished:
            continue
        row = dict(row)
        row["details"] = dict(row.get("details") or {})
        row["details"]["incomplete"] = sorted(set(missing) | {"router stopped"})
        rows.append(row)
    return rows
