"""A lease's progress (models_app.api.lease): where a byte that went out is reported.

An in-process lease reports each chunk straight to the engine's hang watchdog, through a call
bound to the lease when the request starts (``Grant.progress``, from the transport that
granted it), not looked up per
chunk; a lease from a router in another process only notes the time, which its next renewal
carries. The engine here is a recorder: the watchdog itself is tested in
tests/unit/test_engine_watchdog.py and, end to end, in tests/chaos/test_hung_child.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from models_app.api.lease import LeaseKeeper
from models_app.routing import transport
from models_app.routing.layer import Layer
from models_app.routing.wire import Grant
from routerpanel.router.errors import Lease


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
    transport.install(host)  # type: ignore[arg-type]
    try:
        yield host
    finally:
        transport.install(None)


def grant(lease_id: str, ttl: float) -> Grant:
    """A grant as a transport makes it: in process (``ttl`` inf) from the installed host, else
    from the channel layer's."""
    local = transport.installed()
    owner = local if math.isinf(ttl) and local is not None else Layer()
    return Grant(Lease(lease_id, "req-1", "m", 8080, 0.0), ttl, owner=owner)


async def test_an_in_process_lease_reports_each_chunk_to_the_engine(host: Host) -> None:
    lease = LeaseKeeper(grant("lease-1", math.inf))
    for _ in range(3):
        lease.progress()
    assert host.engine is not None
    assert host.engine.progressed == ["lease-1"] * 3
    await lease.release()
    assert host.engine.released == ["lease-1"]


async def test_a_remote_lease_notes_the_time_and_calls_no_engine(host: Host) -> None:
    lease = LeaseKeeper(grant("lease-2", 30.0))
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
    host = Host(RecordingEngine())
    transport.install(host)  # type: ignore[arg-type]
    made = grant("lease-3", math.inf)
    host.engine = None  # the router stopped after the grant
    transport.install(None)
    assert made.progress() is None
    lease = LeaseKeeper(made)
    lease.progress()  # the router stopped meanwhile: a chunk going out must not fail
