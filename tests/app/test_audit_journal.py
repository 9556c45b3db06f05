"""The audit journal: every row is on disk the moment it is made; the writer stores rows from
it, in order, each exactly once — after a database outage, and by the next router after a
crash or kill -9. The "database" here is the test database behind a switch (PostgreSQL for real
is tests/services/test_audit_outage.py; kill -9 of a real serve is tests/chaos).
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from models_app.audit import journal as audit_journal
from models_app.audit.journal import DIR_NAME, Journal
from models_app.audit.writer import AuditWriter, DatabaseUnavailable, store_rows
from models_app.models import AuditEvent, AuditKind
from routerpanel.router.catalogue import Event
from routerpanel.router.engine import EngineEvent

pytestmark = pytest.mark.django_db(transaction=True)


class Switch:
    """``store_rows`` behind a switch; ``fail_after`` lets that many calls through first."""

    def __init__(self) -> None:
        self.down = False
        self.fail_after: int | None = None
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        with self.lock:
            self.calls += 1
            if self.fail_after is not None:
                if self.fail_after == 0:
                    raise DatabaseUnavailable("connection refused")
                self.fail_after -= 1
            elif self.down:
                raise DatabaseUnavailable("connection refused")
        store_rows(rows)


def lease_event(seq: int) -> EngineEvent:
    data = {"lease_id": f"l{seq}", "request_id": f"r{seq}", "model": "m"}
    return EngineEvent(seq, Event.LEASE_EXPIRED, time.time(), data)


def stored(router_id: str) -> list[int]:
    rows = AuditEvent.objects.filter(router_id=router_id).order_by("id")
    return list(rows.values_list("seq", flat=True))


def journaled(writer: AuditWriter, *, pending: bool = False) -> list[int]:
    """The seqs of the rows in the writer's journal files (finished, or pending ones)."""
    key = "p" if pending else "r"
    seqs = []
    for path in sorted(writer.journal.directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if key in record:
                seqs.append(record[key]["seq"])
    return seqs


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def switch() -> Switch:
    return Switch()


@pytest.fixture
def writer(tmp_path: Path, switch: Switch) -> Any:
    w = AuditWriter(
        tmp_path / DIR_NAME,
        router_id="r1",
        store=switch,
        interval=0.01,
        retry_interval=0.05,
        max_retry_interval=0.2,
        batch_size=3,
    ).start()
    yield w
    w.close(5.0)


def test_rows_written_while_the_database_is_down_are_stored_in_order_once_it_is_back(
    writer: AuditWriter, switch: Switch
) -> None:
    for seq in range(1, 6):
        writer(lease_event(seq))
    assert writer.flush(10)
    switch.down = True
    calls = switch.calls
    for seq in range(6, 16):
        writer(lease_event(seq))
    wait_for(lambda: switch.calls > calls and writer.outages == 1)
    assert journaled(writer) == list(range(1, 16)) and stored("r1") == [1, 2, 3, 4, 5]
    switch.down = False
    for seq in range(16, 21):
        writer(lease_event(seq))
    assert writer.flush(10)
    assert stored("r1") == list(range(1, 21))
    assert writer.outages == 1
    assert (writer.produced, writer.stored) == (20, 20)


def test_a_drain_cut_short_resumes_without_writing_a_row_twice(
    writer: AuditWriter, switch: Switch
) -> None:
    switch.down = True
    for seq in range(1, 11):
        writer(lease_event(seq))
    wait_for(lambda: writer.outages == 1)
    switch.fail_after = 2  # the next drain stores two chunks of 3, then the database goes
    wait_for(lambda: switch.fail_after == 0 and writer.stored == 6)
    assert stored("r1") == [1, 2, 3, 4, 5, 6]
    switch.fail_after = None
    switch.down = False
    assert writer.flush(10)
    assert stored("r1") == list(range(1, 11)) and writer.stored == 10


def test_rows_journaled_at_close_are_written_by_the_next_router(
    tmp_path: Path, switch: Switch
) -> None:
    journal = tmp_path / DIR_NAME
    first = AuditWriter(journal, router_id="boot-1", store=switch, interval=0.01).start()
    switch.down = True
    for seq in range(1, 4):
        first(lease_event(seq))
    first.close(5.0)
    assert journaled(first) == [1, 2, 3]
    assert stored("boot-1") == []

    switch.down = False
    second = AuditWriter(journal, router_id="boot-2", store=switch, interval=0.01).start()
    second(lease_event(1))
    assert second.flush(10)
    second.close(5.0)
    assert stored("boot-1") == [1, 2, 3] and stored("boot-2") == [1]
    assert [p.name for p in journal.iterdir() if "boot-1" in p.name] == []
    ids = list(AuditEvent.objects.order_by("id").values_list("router_id", flat=True))
    assert ids == ["boot-1", "boot-1", "boot-1", "boot-2"]  # the dead boot's journal first


def test_a_legacy_spool_holding_rows_already_stored_adds_nothing_twice(tmp_path: Path) -> None:
    """A crash between the database's commit and the spool's deletion leaves such a spool."""
    spool = tmp_path / "audit-spool.jsonl"
    row = {"seq": 7, "time": time.time(), "kind": AuditKind.CRASH, "model": "m", "details": {}}
    row["router_id"] = "boot-1"
    store_rows([row])
    spool.write_text(json.dumps(row) + "\n" + '{"seq": 8, "cut sho')  # and a torn last line
    writer = AuditWriter(tmp_path / DIR_NAME, router_id="boot-2", interval=0.01,
                         legacy_spool=spool).start()  # fmt: skip
    writer.close(5.0)
    assert stored("boot-1") == [7] and not spool.exists()


def test_a_stop_row_still_waiting_when_its_router_dies_is_stored_incomplete(
    tmp_path: Path, switch: Switch
) -> None:
    journal = tmp_path / DIR_NAME
    first = AuditWriter(journal, router_id="boot-1", store=switch, interval=0.01)
    state = {"model": "m", "from": "loaded", "to": "loaded", "stopping": True, "action": "stop",
             "stop_reason": "unload", "stop_timeout": 10, "trigger": {"actor": "user:bob"},
             "reason": "unload by user:bob"}  # fmt: skip
    first(EngineEvent(5, Event.MODEL_STATE, time.time(), state))
    assert journaled(first, pending=True) == [5]  # on disk before the stop is carried out
    first.journal.close()  # kill -9: no close(), no thread ever ran
    second = AuditWriter(journal, router_id="boot-2", store=switch, interval=0.01).start()
    second.close(5.0)
    row = AuditEvent.objects.get(router_id="boot-1", seq=5)
    assert (row.kind, row.actor, row.model) == ("unload", "user:bob", "m")
    assert row.details["incomplete"] == ["exit", "router stopped"]


def test_segments_rotate_and_each_row_is_stored_once(tmp_path: Path, switch: Switch) -> None:
    journal = tmp_path / DIR_NAME
    writer = AuditWriter(journal, router_id="r9", store=switch, interval=0.01, segment_bytes=600,
                         batch_size=4).start()  # fmt: skip
    for seq in range(1, 41):
        writer(lease_event(seq))
        if seq == 20:
            switch.down = True
    wait_for(lambda: writer.outages == 1)
    assert len(list(journal.iterdir())) > 5
    switch.down = False
    assert writer.flush(10)
    assert stored("r9") == list(range(1, 41))
    writer.close(5.0)
    assert [p.name for p in journal.iterdir()] == [writer.journal.current.name]


def test_a_segment_made_while_the_reader_reads_is_not_taken_for_complete(tmp_path: Path) -> None:
    # The reader is handed ``current`` and then lists the directory; a rotation in between makes
    # a segment newer than the ``current`` it holds. Taking that one for "rotated away from"
    # deleted it under the writer, and every row written to it afterwards was lost (a CI run
    # lost rows this way: flush() never saw them stored).
    journal = Journal(tmp_path / DIR_NAME, "boot-1", segment_bytes=10)
    journal.append([audit_journal.final({"seq": 1})])
    held = journal.current  # what the reader was handed, before the writer rotated
    journal.append([audit_journal.final({"seq": 2})])
    assert journal.current != held
    reader = audit_journal.JournalReader(tmp_path / DIR_NAME, "boot-1")
    batch = reader.read(held, 100)
    assert [row["seq"] for row in batch.rows] == [1, 2]
    assert batch.done == []  # neither the one it holds nor the newer one is complete yet
    reader.stored(batch)
    assert journal.current.exists()
    batch = reader.read(journal.current, 100)
    assert batch.done == [held]  # once it knows of the newer one, the older is complete
    journal.close()


def test_a_flush_asked_while_an_attempt_fails_is_not_put_off_by_the_back_off(
    tmp_path: Path,
) -> None:
    # The attempt under way when the database comes back fails and sets the next try 30 s
    # away. The flush asked meanwhile must still try at once (it used to wait out the back-off:
    # a flush that returned False under load).
    entered, release = threading.Event(), threading.Event()
    failing = [True]

    def store(rows: list[dict[str, Any]]) -> None:
        if failing[0]:
            entered.set()
            release.wait(10)
            failing[0] = False
            raise DatabaseUnavailable("connection refused")
        store_rows(rows)

    writer = AuditWriter(tmp_path / DIR_NAME, router_id="r8", store=store, interval=0.01,
                         retry_interval=30.0).start()  # fmt: skip
    writer(lease_event(1))
    assert entered.wait(10)
    flushed: list[bool] = []
    asking = threading.Thread(target=lambda: flushed.append(writer.flush(5)))
    asking.start()
    time.sleep(0.2)  # the flush has asked (it asks first thing, then waits)
    release.set()
    asking.join(10)
    assert flushed == [True]
    assert stored("r8") == [1]
    writer.close(5.0)


def test_a_row_with_overlong_text_is_clipped_to_its_column(writer: AuditWriter) -> None:
    data = {"lease_id": "x", "request_id": "r" * 500, "model": "m" * 300}
    writer(EngineEvent(1, Event.LEASE_EXPIRED, time.time(), data))
    assert writer.flush(10)
    row = AuditEvent.objects.get(router_id="r1")
    assert len(row.model) == 200 and len(row.trigger_request) == 200


class TestAFullDisk:
    """A write the disk refuses (ENOSPC, EIO, EROFS) never raises into the router: the rows
    wait in memory, in order, and are written before anything newer once it takes them."""

    @staticmethod
    def lines(journal: Journal) -> list[dict[str, Any]]:
        assert journal.current is not None
        return [json.loads(line) for line in journal.current.read_text().splitlines()]

    def test_rows_wait_in_memory_and_are_written_in_order_when_space_returns(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        journal = Journal(tmp_path / DIR_NAME, "boot-1")
        journal.append([{"r": {"seq": 1}}])
        real_write = os.write
        full = True

        def write(fd: int, data: bytes) -> int:
            if full:  # the disk takes a few bytes of the record, then no more
                real_write(fd, data[:7])
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(audit_journal.os, "write", write)
        journal.append([{"r": {"seq": 2}}])
        journal.append([{"r": {"seq": 3}}])
        assert journal.problem == "could not write the audit journal: No space left on device"
        assert journal.backlogged == 2
        assert self.lines(journal) == [{"r": {"seq": 1}}]  # no half record left behind
        assert journal.retry() is False  # still full
        full = False
        assert journal.retry() is True
        assert journal.problem is None and journal.backlogged == 0
        assert [x["r"]["seq"] for x in self.lines(journal)] == [1, 2, 3]
        journal.append([{"r": {"seq": 4}}])
        assert [x["r"]["seq"] for x in self.lines(journal)] == [1, 2, 3, 4]
