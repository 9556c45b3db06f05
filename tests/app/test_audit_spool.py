"""The audit writer's spool: when the database refuses rows they wait in a JSON-lines file, and
are written first, in order, each exactly once, when it answers again — also by the next router
after a crash. The "database" here is the test database behind a switch (PostgreSQL for real is
tests/services/test_audit_outage.py).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from models_app.audit_writer import AuditWriter, DatabaseUnavailable, Spool, store_rows
from models_app.models import AuditEvent, AuditKind
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
    return EngineEvent(seq, "lease.expired", time.time(), data)


def stored(router_id: str) -> list[int]:
    rows = AuditEvent.objects.filter(router_id=router_id).order_by("id")
    return list(rows.values_list("seq", flat=True))


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
        tmp_path / "audit-spool.jsonl",
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
    for seq in range(6, 16):
        writer(lease_event(seq))
    wait_for(lambda: writer.spooled >= 10)
    assert writer.spool.path.exists() and stored("r1") == [1, 2, 3, 4, 5]
    switch.down = False
    for seq in range(16, 21):
        writer(lease_event(seq))
    assert writer.flush(10)
    assert stored("r1") == list(range(1, 21))
    assert not writer.spool.path.exists() and writer.outages == 1
    assert (writer.produced, writer.stored) == (20, 20)


def test_a_drain_cut_short_resumes_without_writing_a_row_twice(
    writer: AuditWriter, switch: Switch
) -> None:
    switch.down = True
    for seq in range(1, 11):
        writer(lease_event(seq))
    wait_for(lambda: writer.spooled >= 10)
    switch.fail_after = 2  # the next drain stores two chunks of 3, then the database goes
    wait_for(lambda: switch.fail_after == 0 and writer.stored == 6)
    assert stored("r1") == [1, 2, 3, 4, 5, 6]
    switch.fail_after = None
    switch.down = False
    assert writer.flush(10)
    assert stored("r1") == list(range(1, 11)) and writer.stored == 10


def test_rows_spooled_at_close_are_written_by_the_next_router(
    tmp_path: Path, switch: Switch
) -> None:
    spool = tmp_path / "audit-spool.jsonl"
    first = AuditWriter(spool, router_id="boot-1", store=switch, interval=0.01).start()
    switch.down = True
    for seq in range(1, 4):
        first(lease_event(seq))
    first.close(5.0)
    assert [row["seq"] for row in Spool(spool).read()] == [1, 2, 3]
    assert stored("boot-1") == []

    switch.down = False
    second = AuditWriter(spool, router_id="boot-2", store=switch, interval=0.01).start()
    second(lease_event(1))
    assert second.flush(10)
    second.close(5.0)
    assert stored("boot-1") == [1, 2, 3] and stored("boot-2") == [1]
    assert not spool.exists()
    ids = list(AuditEvent.objects.order_by("id").values_list("router_id", flat=True))
    assert ids == ["boot-1", "boot-1", "boot-1", "boot-2"]  # the spool first


def test_a_spool_holding_rows_already_stored_adds_nothing_twice(tmp_path: Path) -> None:
    """A crash between the database's commit and the spool's deletion leaves such a spool."""
    spool = tmp_path / "audit-spool.jsonl"
    row = {"seq": 7, "time": time.time(), "kind": AuditKind.CRASH, "model": "m", "details": {}}
    row["router_id"] = "boot-1"
    store_rows([row])
    spool.write_text(json.dumps(row) + "\n" + '{"seq": 8, "cut sho')  # and a torn last line
    writer = AuditWriter(spool, router_id="boot-2", interval=0.01).start()
    writer.close(5.0)
    assert stored("boot-1") == [7] and not spool.exists()


def test_a_row_with_overlong_text_is_clipped_to_its_column(writer: AuditWriter) -> None:
    data = {"lease_id": "x", "request_id": "r" * 500, "model": "m" * 300}
    writer(EngineEvent(1, "lease.expired", time.time(), data))
    assert writer.flush(10)
    row = AuditEvent.objects.get(router_id="r1")
    assert len(row.model) == 200 and len(row.trigger_request) == 200
