"""Audit rows from the router: a real Engine (fake supervisor, fake clock) feeds an AuditWriter
that stores into the test database from its thread, exactly as the router host wires it.

The test plays the children (ready, exit, stuck) and the memory sampler; every test reads the
rows back from the database after ``flush()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from models_app.audit.writer import AuditWriter
from models_app.models import AuditEvent, AuditKind
from routerpanel.router.catalogue import Event
from routerpanel.router.commands import MemorySampled
from routerpanel.router.config import PresetSpec
from routerpanel.router.engine import Engine, EngineEvent
from routerpanel.router.memory import ChildMemory, SystemMemory
from routerpanel.router.supervisor import ChildExited, ChildStuck, Leftover, LogLine
from tests.support.engine import FakeClock, FakeSupervisor, make, preset
from tests.support.waits import settled

pytestmark = pytest.mark.django_db(transaction=True)
GIB = 1 << 30


class Rig:
    """An engine, its fake children, and the audit writer listening to it."""

    def __init__(self, engine: Engine, sup: FakeSupervisor, clock: FakeClock, writer: AuditWriter):
        self.engine, self.sup, self.clock, self.writer = engine, sup, clock, writer
        self.rid = 0
        self.tasks: list[asyncio.Task[Any]] = []

    async def idle(self) -> None:
        await self.engine.until_idle()
        await asyncio.sleep(0.01)  # let the listener task read what was published

    async def warm(self, *names: str) -> None:
        for name in names:
            await self.engine.load(name, actor="user:ops")
            self.sup.ready(name)
            await self.idle()

    def request(self, model: str, actor: str, request_id: str | None = None) -> asyncio.Task[Any]:
        self.rid += 1
        rid = request_id or f"req-{self.rid}"
        task = asyncio.create_task(self.engine.acquire(model, request_id=rid, actor=actor))
        self.tasks.append(task)
        return task

    def exit(self, name: str, **kw: Any) -> None:
        """Post the child's exit the way the real supervisor reports it."""
        pid = self.sup.children.pop(name)
        fields: dict[str, Any] = {
            "exit_code": 0, "signal": None, "duration": 12.0, "expected": True,
            "force_killed": False, "was_ready": True, "stop_seconds": 0.4, "error": None,
        }  # fmt: skip
        fields.update(kw)
        line = LogLine(name, "stderr", "bye", time.time())
        self.sup.post(ChildExited(name, pid, self.sup.port(name), last_lines=(line,), **fields))

    def sample(self, used: int, available: int, **rss: int) -> None:
        system = SystemMemory(64 * GIB, available, used, 8 * GIB, 1 * GIB, None)
        kids = tuple(ChildMemory(n, self.sup.children.get(n, 1), b, 1) for n, b in rss.items())
        self.sup.post(MemorySampled(system, kids))

    async def rows(self, kind: str | None = None) -> list[AuditEvent]:
        assert await asyncio.to_thread(self.writer.flush, 30.0), "rows not stored in time"
        rows = AuditEvent.objects.filter(router_id=self.writer.router_id).order_by("id")
        return [r async for r in (rows.filter(kind=kind) if kind else rows)]


@pytest.fixture
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    models, config = getattr(request, "param", (("a", "b", "c"), {"models_max": 1}))
    engine, sup, clock = await make(*models, start=False, **config)
    writer = AuditWriter(
        tmp_path / "spool.jsonl",
        router_id="test-router",
        interval=0.02,
        settle_expected=lambda: engine.config.memory_budget is not None,
    ).start()
    sub = engine.subscribe(maxsize=100_000)

    async def listen() -> None:  # what RouterHost._publish_events does for its listeners
        async for event in sub:
            writer(event)

    listener = asyncio.create_task(listen())
    await engine.start()
    rig = Rig(engine, sup, clock, writer)
    yield rig
    shutdown = asyncio.create_task(engine.shutdown())
    await rig.idle()
    for name in list(rig.sup.children):
        rig.exit(name)
    await asyncio.wait_for(shutdown, 10)
    await asyncio.wait_for(listener, 10)
    await asyncio.gather(*rig.tasks, return_exceptions=True)
    await asyncio.to_thread(writer.close, 10.0)


def config(*models: str | PresetSpec, **settings: Any) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("rig", [(models, settings)], indirect=True)


class TestEviction:
    async def test_the_row_names_victim_trigger_actor_depth_memory_and_stop(self, rig: Rig) -> None:
        await rig.warm("a")
        rig.sample(used=20 * GIB, available=44 * GIB, a=3 * GIB)
        rig.clock.advance(42)
        waiting = rig.request("b", "key:alice/laptop", request_id="chat-17")
        await rig.idle()
        assert rig.sup.stopped() == ["a"]
        rig.exit("a", stop_seconds=1.25)
        await rig.idle()
        rig.sample(used=17 * GIB, available=47 * GIB)
        await rig.idle()
        rig.sup.ready("b")
        await rig.idle()
        await settled(waiting)

        (row,) = await rig.rows(AuditKind.EVICTION)
        assert (row.model, row.from_state, row.to_state) == ("a", "loaded", "unloaded")
        assert (row.actor, row.trigger_model, row.trigger_request) == (
            "key:alice/laptop",
            "b",
            "chat-17",
        )
        assert row.queue_depth == 1 and row.idle_seconds == 42.0
        assert (row.memory_before, row.memory_after) == (20 * GIB, 17 * GIB)
        assert row.stop_seconds == 1.25 and row.force_killed is False and row.exit_code == 0
        assert row.settle_seconds is None  # no memory budget: no settle gate
        assert row.details["victim_rss"] == 3 * GIB
        assert row.details["memory_before"]["available"] == 44 * GIB
        assert row.details["memory_after"]["available"] == 47 * GIB
        assert row.router_id == "test-router" and row.seq is not None
        assert "incomplete" not in row.details

    @config(
        preset("a", memory_estimate=30 * GIB),
        preset("b", memory_estimate=30 * GIB),
        models_max=4,
        memory_budget=40 * GIB,
        settle_timeout=20.0,
    )
    async def test_in_memory_mode_it_records_how_long_the_settle_gate_waited(
        self, rig: Rig
    ) -> None:
        await rig.warm("a")
        waiting = rig.request("b", "user:bob")
        await rig.idle()
        rig.exit("a")
        await rig.idle()
        rig.clock.advance(2.5)
        rig.sample(used=10 * GIB, available=50 * GIB)  # enough for b's estimate: the gate opens
        await rig.idle()
        rig.sup.ready("b")
        await rig.idle()
        await settled(waiting)
        (row,) = await rig.rows(AuditKind.EVICTION)
        assert row.actor == "user:bob" and row.settle_seconds == 2.5
        assert row.details["settle_by"] == "memory" and row.memory_after == 10 * GIB

    @config("a", "b", models_max=2)
    async def test_lowering_models_max_names_it_and_the_admin_who_did(self, rig: Rig) -> None:
        await rig.warm("a", "b")
        lower = dataclasses.replace(rig.engine.config, models_max=1)
        await rig.engine.update_settings(lower, actor="user:ada")
        await rig.idle()
        assert rig.sup.stopped() == ["a"]
        rig.exit("a")
        await rig.idle()
        (row,) = await rig.rows(AuditKind.EVICTION)
        assert row.actor == "user:ada"
        assert row.reason == "over the limit after user:ada lowered Max running models to 1"

    @config(
        preset("a", memory_estimate=30 * GIB),
        preset("b", memory_estimate=30 * GIB),
        models_max=4,
        memory_budget=80 * GIB,
    )
    async def test_lowering_the_memory_budget_names_it_and_the_admin(self, rig: Rig) -> None:
        rig.writer.mapper.after_exit = -10.0  # no load waits: no settle ends the row, time does
        await rig.warm("a", "b")
        lower = dataclasses.replace(rig.engine.config, memory_budget=40 * GIB)
        await rig.engine.update_settings(lower, actor="user:ada")
        await rig.idle()
        assert rig.sup.stopped() == ["a"]
        rig.exit("a")
        await rig.idle()
        rig.sample(used=30 * GIB, available=34 * GIB)
        await rig.idle()
        (row,) = await rig.rows(AuditKind.EVICTION)
        assert row.actor == "user:ada"
        assert row.reason == "over the limit after user:ada lowered the memory budget to 40.0 GiB"

    async def test_a_forced_stop_writes_a_force_kill_row_too(self, rig: Rig) -> None:
        await rig.warm("a")
        rig.request("b", "anonymous")
        await rig.idle()
        rig.exit("a", exit_code=None, signal=9, force_killed=True, stop_seconds=10.02)
        await rig.idle()
        (eviction,) = await rig.rows(AuditKind.EVICTION)
        (kill,) = await rig.rows(AuditKind.FORCE_KILL)
        assert eviction.force_killed is True and eviction.stop_seconds == 10.02
        assert kill.model == "a" and kill.force_killed and kill.details["stop_seq"] == eviction.seq
        assert "stop-timeout (10.0 s)" in kill.reason

    async def test_a_row_whose_exit_never_comes_is_written_incomplete_after_the_timeout(
        self, rig: Rig
    ) -> None:
        rig.writer.mapper.stop_grace = -10.0  # the stop-timeout (10 s) has long passed
        await rig.warm("a")
        rig.request("b", "anonymous")
        await rig.idle()
        await asyncio.sleep(0.1)  # the row's timer fires
        (row,) = await rig.rows(AuditKind.EVICTION)
        assert row.details["incomplete"] == ["exit"] and row.stop_seconds is None


class TestLoads:
    async def test_loading_and_ready_rows_carry_the_requester_and_the_load_time(
        self, rig: Rig
    ) -> None:
        waiting = rig.request("a", "key:carol/ci", request_id="r-1")
        await rig.idle()
        rig.sup.ready("a")
        await rig.idle()
        await settled(waiting)
        (loading,) = await rig.rows(AuditKind.LOADING)
        (ready,) = await rig.rows(AuditKind.READY)
        assert (loading.model, loading.from_state, loading.to_state) == ("a", "unloaded", "loading")
        assert (loading.actor, loading.trigger_request) == ("key:carol/ci", "r-1")
        assert ready.actor == "key:carol/ci" and ready.load_seconds == 0.25
        (asked,) = await rig.rows(AuditKind.LOAD_REQUESTED)
        assert asked.reason == "loading at once: a slot was free"

    async def test_a_request_queued_behind_a_busy_router_is_a_load_request(self, rig: Rig) -> None:
        await rig.warm("a")
        lease = await rig.engine.acquire("a", request_id="busy", actor="user:x")  # a is busy
        rig.request("b", "user:y")
        await rig.idle()
        (row,) = await rig.rows(AuditKind.LOAD_REQUESTED)
        assert row.model == "b" and row.queue_depth == 1 and row.details["position"] == 1
        assert row.actor == "user:y" and row.trigger_request  # who queued it, and which request
        assert row.reason == "queued at position 1 until a slot is free"
        rig.engine.release(lease.lease_id)
        await rig.idle()

    async def test_an_operator_cancelling_queued_requests_is_a_row_with_their_ids(
        self, rig: Rig
    ) -> None:
        await rig.warm("a")
        lease = await rig.engine.acquire("a", request_id="busy", actor="user:x")
        waiting = [rig.request("b", "key:bob/ci") for _ in range(2)]
        await rig.idle()
        ids = await rig.engine.cancel_queued(model="b", actor="user:otto")
        await asyncio.gather(*waiting, return_exceptions=True)
        (row,) = await rig.rows(AuditKind.QUEUE_CANCELLED)
        assert (row.model, row.actor, row.queue_depth) == ("b", "user:otto", 2)
        assert row.details == {"request_ids": ids, "by_model": True}
        assert "2 answered 499" in row.reason
        rig.engine.release(lease.lease_id)
        await rig.idle()

    @config("a", "b", models_max=1, quarantine_after=2)
    async def test_failed_loads_and_the_quarantine_have_rows(self, rig: Rig) -> None:
        for _ in range(2):
            rig.request("a", "user:z")
            await rig.idle()
            rig.exit("a", exit_code=1, expected=False, was_ready=False, error="out of memory")
            await rig.idle()
        failed = await rig.rows(AuditKind.LOAD_FAILED)
        (quarantine,) = await rig.rows(AuditKind.QUARANTINE)
        assert [r.to_state for r in failed] == ["failed", "quarantined"]
        assert failed[0].exit_code == 1 and failed[0].reason == "out of memory"
        assert quarantine.reason == "2 consecutive failed loads"
        assert quarantine.details["last_lines"] == ["bye"]


class TestUnloads:
    async def test_a_manual_unload_names_who_asked_and_how_long_the_stop_took(
        self, rig: Rig
    ) -> None:
        await rig.warm("a")
        await rig.engine.unload("a", actor="user:dana")
        await rig.idle()
        rig.exit("a", stop_seconds=0.7)
        await rig.idle()
        (row,) = await rig.rows(AuditKind.UNLOAD)
        assert (row.actor, row.model, row.stop_seconds, row.to_state) == (
            "user:dana",
            "a",
            0.7,
            "unloaded",
        )

    @config(preset("a", ttl=5.0), "b", models_max=2)
    async def test_an_idle_ttl_unload_is_the_schedulers(self, rig: Rig) -> None:
        await rig.warm("a")
        rig.clock.advance(6)
        rig.engine.clock_changed()
        await rig.idle()
        rig.exit("a")
        await rig.idle()
        (row,) = await rig.rows(AuditKind.TTL)
        assert row.actor == "scheduler" and row.reason.startswith("ttl")

    @config("a", "b", models_max=2)
    async def test_a_reload_restart_is_a_reload_row(self, rig: Rig) -> None:
        await rig.warm("a")
        changed = dataclasses.replace(preset("a"), argv=("llama-server", "-m", "/m/new.gguf"))
        await rig.engine.reload([changed, preset("b")], actor="user:erin")
        await rig.idle()
        rig.exit("a")
        await rig.idle()
        (row,) = await rig.rows(AuditKind.RELOAD)
        assert row.actor == "user:erin" and row.model == "a"

    async def test_shutdown_stops_are_shutdown_rows(self, rig: Rig) -> None:
        await rig.warm("a")
        shutdown = asyncio.create_task(rig.engine.shutdown())
        await rig.idle()
        rig.exit("a")
        await asyncio.wait_for(shutdown, 10)
        (row,) = await rig.rows(AuditKind.SHUTDOWN)
        assert row.model == "a" and row.stop_seconds == 0.4
        assert (row.actor, row.reason) == ("router", "the router is shutting down")


class TestFailures:
    async def test_a_crash_while_serving_is_a_crash_row_with_the_last_lines(self, rig: Rig) -> None:
        await rig.warm("a")
        rig.exit("a", exit_code=139, expected=False, error="exited with code 139")
        await rig.idle()
        (row,) = await rig.rows(AuditKind.CRASH)
        assert (row.model, row.from_state, row.to_state, row.exit_code) == (
            "a",
            "loaded",
            "failed",
            139,
        )
        assert row.details["last_lines"] == ["bye"]

    async def test_a_stuck_child_is_a_stuck_row(self, rig: Rig) -> None:
        await rig.warm("a")
        await rig.engine.unload("a", actor="user:ops")
        await rig.idle()
        rig.sup.post(ChildStuck("a", rig.sup.children["a"], 12.5))
        await rig.idle()
        (row,) = await rig.rows(AuditKind.STUCK)
        assert row.model == "a" and row.to_state == "stuck" and "12.5 s" in row.reason
        assert row.actor == "user:ops"

    @config("a", models_max=1, lease_ttl=10.0)
    async def test_an_expired_lease_is_a_row_naming_the_request(self, rig: Rig) -> None:
        await rig.warm("a")
        await rig.engine.acquire("a", request_id="lost-1", actor="user:f")
        rig.clock.advance(11)
        rig.engine.clock_changed()
        await rig.idle()
        (row,) = await rig.rows(AuditKind.LEASE_EXPIRED)
        assert (row.model, row.trigger_request, row.actor) == ("a", "lost-1", "user:f")


class TestLeftovers:
    async def test_leftover_children_killed_at_start_are_one_row(self, tmp_path: Path) -> None:
        writer = AuditWriter(tmp_path / "spool.jsonl", router_id="boot-2")
        leftover = Leftover("a", 4242, 4242, ("llama-server",), 1.0, "killed", (4242, 4243))
        data = {"models": ["a"], "leftovers": [dataclasses.asdict(leftover)]}
        writer(EngineEvent(1, Event.ROUTER_STARTED, time.time(), data))
        await asyncio.to_thread(writer.close)
        row = await AuditEvent.objects.aget(router_id="boot-2")
        assert row.kind == AuditKind.LEFTOVER_KILLED and row.model == "a"
        assert row.details["leftovers"][0]["killed_pids"] == [4242, 4243]


async def test_every_row_is_stored_once_with_its_seq(rig: Rig) -> None:
    await rig.warm("a")
    for model in ("b", "c", "a"):
        waiting = rig.request(model, "user:g")
        await rig.idle()
        victim = next(iter(rig.sup.children))
        rig.exit(victim)
        await rig.idle()
        rig.sup.ready(model)
        await rig.idle()
        rig.engine.release(
            (await settled(waiting)).lease_id
        )  # idle again: the next one may evict it
    rows = await rig.rows()
    seqs = [r.seq for r in rows]
    assert len(seqs) == len(set(seqs)) == rig.writer.produced
    assert [r.kind for r in rows].count(AuditKind.EVICTION) == 3
