"""A lease's progress (models_app.api.lease): where a byte that went out is reported.

An in-process lease reports each chunk straight to the engine's hang watchdog, through a call
bound to the lease when the request starts (``RouterClient.progress_of``), not looked up per
chunk; a lease from a router in another process only notes the time, which its next renewal
carries. The engine here is a recorder: the watchdog itself is tested in
tests/unit/test_engine_watchdog.py and, end to end, in tests/chaos/test_hung_child.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from models_app import bridge
from models_app.api.lease import LeaseKeeper
from models_app.bridge import Grant, RouterClient


@dataclass
class RecordingEngine:
    progressed: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def progress(self, lease_id: str) -> None:
        self.progressed.append(lease_id)

    def release(self, lease_id: str) -> None:
        self.released.append(lease_id)


@dataclass
class Host:
    engine: RecordingEngine | None
    boot: str = "boot-1"
    loop: None = None


@pytest.fixture
def host() -> Iterator[Host]:
    host = Host(RecordingEngine())
    bridge.register_local(host)  # type: ignore[arg-type]
    try:
        yield host
    finally:
        bridge.register_local(None)


def grant(lease_id: str, ttl: float) -> Grant:
    return Grant("req-1", lease_id, "m", 8080, ttl)


async def test_an_in_process_lease_reports_each_chunk_to_the_engine(host: Host) -> None:
    lease = LeaseKeeper(RouterClient(), grant("lease-1", math.inf))
    for _ in range(3):
        lease.progress()
    assert host.engine is not None
    assert host.engine.progressed == ["lease-1"] * 3
    await lease.release()
    assert host.engine.released == ["lease-1"]


async def test_a_remote_lease_notes_the_time_and_calls_no_engine(host: Host) -> None:
    lease = LeaseKeeper(RouterClient(), grant("lease-2", 30.0))
    try:
        started = lease.last_byte
        lease.progress()
        assert lease.last_byte >= started
        assert host.engine is not None and host.engine.progressed == []
    finally:
        lease._open = False  # nothing to give back: no router holds it
        if lease._timer is not None:
            lease._timer.cancel()


async def test_without_an_engine_in_process_a_local_grant_reports_nowhere() -> None:
    bridge.register_local(None)
    assert RouterClient().progress_of(grant("lease-3", math.inf)) is None
    lease = LeaseKeeper(RouterClient(), grant("lease-3", math.inf))
    lease.progress()  # the router stopped meanwhile: a chunk going out must not fail
