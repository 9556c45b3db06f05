"""The hang watchdog in the engine: fake clock, fake supervisor, a scripted probe.

A busy model that sends no byte for its ``hang_timeout`` is probed; no answer, or the same
progress counters twice, kills it: its requests end with a clear error, its slot frees at the
exit and one ``model.hung`` event names what was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from routerpanel.router.address import ChildAddress
from routerpanel.router.catalogue import Event
from routerpanel.router.engine import Engine, EngineEvent
from routerpanel.router.errors import RouterError
from routerpanel.router.supervisor import ChildState
from routerpanel.router.watchdog import Busy, Reading, Verdict, Watchdog, probe_gap, slots_counters
from tests.support.engine import FakeClock, FakeSupervisor, make, preset


class ScriptedProbe:
    """Answer each probe with the next reading of a script (None: no answer in time)."""

    def __init__(self) -> None:
        self.readings: list[Reading | None] = []
        self.calls: list[tuple[int, float]] = []

    async def __call__(self, address: ChildAddress, timeout: float) -> Reading | None:
        self.calls.append((address.port, timeout))
        return self.readings.pop(0) if self.readings else Reading(((0, 1, 5),))


class Rig:
    def __init__(self, engine: Engine, sup: FakeSupervisor, clock: FakeClock, probe: Any) -> None:
        self.engine, self.sup, self.clock, self.probe = engine, sup, clock, probe
        self.events: list[EngineEvent] = []

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.engine.clock_changed()
        for _ in range(3):  # the tick, the probe task, its answer
            await self.engine.until_idle()
            await asyncio.sleep(0)

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.type == type_]


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    clock, probe = FakeClock(), ScriptedProbe()
    specs = [preset("a", hang_timeout=60.0), preset("b", hang_timeout=60.0), preset("off")]
    specs.append(preset("quick", hang_timeout=5.0))  # hangs within the crash-loop window
    engine, sup, _ = await make(*specs, start=False, clock=clock, prober=probe, models_max=1)
    r = Rig(engine, sup, clock, probe)
    sub = engine.subscribe(maxsize=10_000)

    async def collect() -> None:
        async for event in sub:
            r.events.append(event)

    collector = asyncio.create_task(collect())
    await engine.start()
    yield r
    shutdown = asyncio.create_task(engine.shutdown())
    await engine.until_idle()
    for name in list(r.sup.children):
        r.sup.exit(name)
    await asyncio.wait_for(shutdown, 5)
    await asyncio.wait_for(collector, 5)


async def busy(r: Rig, model: str = "a") -> str:
    await r.engine.load(model)
    r.sup.ready(model)
    await r.engine.until_idle()
    lease = await r.engine.acquire(
        model, request_id=f"{model}-1", actor="user:alice", renewable=False
    )
    return lease.lease_id


class TestTheWatchdogInTheEngine:
    async def test_a_silent_busy_child_that_does_not_answer_is_killed(self, rig: Rig) -> None:
        lease = await busy(rig)
        rig.probe.readings = [None]
        await rig.advance(59.0)
        assert rig.probe.calls == []  # not yet suspect
        await rig.advance(1.0)
        assert rig.probe.calls == [(rig.sup.port("a"), probe_gap(60.0))]
        assert ("kill", "a") in rig.sup.calls
        [hung] = rig.of(Event.MODEL_HUNG)
        assert hung["holders"] == {"user:alice": 1}
        assert hung["in_flight"] == 1 and hung["idle_seconds"] == 60.0
        assert "no answer to GET /slots" in hung["probe"]
        error = rig.engine.why_ended(lease)
        assert error is not None and error.status == 503
        assert "model name=a stopped responding (no progress for 60 s)" in error.message
        # It had been up for 60 s, the crash-loop window: nothing holds its next start back.
        assert error.message.endswith("the next request starts it again")
        assert error.retry_after == 1
        waiting = asyncio.create_task(rig.engine.acquire("b", request_id="b-1"))
        await rig.engine.until_idle()
        assert rig.sup.spawned() == ["a"]  # the slot frees at the exit, not before (A6)
        rig.sup.exit("a", code=None, signal=9)
        await rig.engine.until_idle()
        assert rig.sup.spawned() == ["a", "b"]
        state = next(m for m in rig.engine.snapshot()["models"] if m["name"] == "a")
        assert (state["state"], state["in_flight"]) == ("failed", 0)
        waiting.cancel()

    async def test_a_child_that_hangs_soon_after_it_started_tells_its_clients_the_back_off(
        self, rig: Rig
    ) -> None:
        lease = await busy(rig, "quick")
        rig.probe.readings = [None]
        await rig.advance(5.0)
        assert ("kill", "quick") in rig.sup.calls
        error = rig.engine.why_ended(lease)
        assert error is not None and error.status == 503
        assert error.message.endswith("a request starts it again after a back-off of 1 s")
        assert error.retry_after == 1
        rig.sup.exit("quick", code=None, signal=9)
        await rig.engine.until_idle()
        with pytest.raises(RouterError, match="held back for 1 s"):  # as the clients were told
            await rig.engine.acquire("quick", request_id="quick-2")

    async def test_bytes_on_a_request_keep_the_probe_away(self, rig: Rig) -> None:
        lease = await busy(rig)
        for _ in range(5):
            await rig.advance(50.0)
            rig.engine.progress(lease)
        assert rig.probe.calls == []
        assert rig.of(Event.MODEL_HUNG) == []

    async def test_progress_counters_that_move_keep_a_long_prompt_alive(self, rig: Rig) -> None:
        await busy(rig)
        rig.probe.readings = [Reading(((0, 7, n),)) for n in (100, 612, 1124, 1636)]
        await rig.advance(60.0)
        for _ in range(3):
            await rig.advance(probe_gap(60.0))
        assert len(rig.probe.calls) == 4
        assert rig.of(Event.MODEL_HUNG) == []
        assert ("kill", "a") not in rig.sup.calls

    async def test_counters_that_stand_still_between_two_probes_mean_hung(self, rig: Rig) -> None:
        await busy(rig)
        rig.probe.readings = [Reading(((0, 7, 100),)), Reading(((0, 7, 100),))]
        await rig.advance(60.0)
        assert ("kill", "a") not in rig.sup.calls
        await rig.advance(probe_gap(60.0))
        assert ("kill", "a") in rig.sup.calls
        assert "did not move" in rig.of(Event.MODEL_HUNG)[0]["probe"]

    async def test_a_byte_between_the_two_probes_clears_the_suspicion(self, rig: Rig) -> None:
        """The counters would stand still (a long prompt's slot reads the same twice), but a
        byte came between the probes: that is progress, so no second probe and no kill; a new
        suspicion needs another whole hang_timeout of silence."""
        lease = await busy(rig)
        rig.probe.readings = [Reading(((0, 7, 100),)), Reading(((0, 7, 100),))]
        await rig.advance(60.0)
        assert len(rig.probe.calls) == 1  # suspect: the first reading
        await rig.advance(1.0)
        rig.engine.progress(lease)  # a byte on its request
        await rig.advance(probe_gap(60.0))
        assert len(rig.probe.calls) == 1 and ("kill", "a") not in rig.sup.calls
        await rig.advance(60.0 - 1.0 - probe_gap(60.0) - 0.5)
        assert len(rig.probe.calls) == 1  # not yet a hang_timeout since the byte
        assert rig.of(Event.MODEL_HUNG) == []

    async def test_a_child_without_slots_is_only_asked_whether_it_lives(self, rig: Rig) -> None:
        await busy(rig)
        rig.probe.readings = [Reading(None, 200), None]
        await rig.advance(60.0)
        assert ("kill", "a") not in rig.sup.calls
        await rig.advance(30.0)
        assert len(rig.probe.calls) == 1  # /health again only after another hang_timeout
        await rig.advance(30.0)
        assert ("kill", "a") in rig.sup.calls

    async def test_a_model_without_a_hang_timeout_is_never_probed(self, rig: Rig) -> None:
        await busy(rig, "off")
        await rig.advance(3600.0)
        assert rig.probe.calls == []

    async def test_a_grant_on_the_hot_path_is_watched_too(self, rig: Rig) -> None:
        """``grant_now`` (issue 16.5) arms the timer as ``acquire`` does: the request's
        hang timeout runs from its grant."""
        await rig.engine.load("a")
        rig.sup.ready("a")
        await rig.engine.until_idle()
        lease = rig.engine.grant_now("a", request_id="a-1", actor="user:alice")
        assert lease is not None
        assert rig.engine._timer.deadline == rig.clock.now + 60.0  # armed by the grant itself
        rig.probe.readings = [None]
        await rig.advance(60.0)
        assert rig.probe.calls == [(rig.sup.port("a"), probe_gap(60.0))]
        assert ("kill", "a") in rig.sup.calls

    async def test_a_hang_timeout_given_by_a_reload_starts_the_watch(self) -> None:
        """The engine skips the watchdog's work while no preset has a hang timeout (it asks
        after every command); a reload that gives one must start it all the same."""
        clock, probe = FakeClock(), ScriptedProbe()
        engine, sup, _ = await make(preset("a"), clock=clock, prober=probe, models_max=1)
        r = Rig(engine, sup, clock, probe)
        try:
            await busy(r)
            await r.advance(120.0)
            assert probe.calls == []  # no hang timeout: never probed
            probe.readings = [None]  # the first probe may go out while the reload returns
            await engine.reload([preset("a", hang_timeout=60.0)])
            await r.advance(0.0)
            assert probe.calls == [(sup.port("a"), probe_gap(60.0))]
            assert ("kill", "a") in sup.calls
        finally:
            shutdown = asyncio.create_task(engine.shutdown())
            await engine.until_idle()
            for name in list(sup.children):
                sup.exit(name)
            await asyncio.wait_for(shutdown, 5)

    async def test_a_busy_model_being_stopped_is_left_to_its_stop_timeout(self, rig: Rig) -> None:
        """An unload of a busy model stops it at once; from then on its stop-timeout ends it,
        not the watchdog (no probe, however long it stays silent)."""
        await busy(rig)
        await rig.engine.unload("a")
        await rig.engine.until_idle()
        await rig.advance(3600.0)
        assert rig.probe.calls == []
        assert ("kill", "a") not in rig.sup.calls

    async def test_a_busy_model_that_reports_sleep_is_not_probed_until_it_is_loaded_again(
        self, rig: Rig
    ) -> None:
        """Only a loaded child is watched: a busy one that says it sleeps (or loads again) is
        not probed; once it says it is loaded, its silence counts again (here an hour of it:
        the probe goes out at once)."""
        await busy(rig)
        rig.sup.post(ChildState("a", "sleeping", {}))
        await rig.engine.until_idle()
        await rig.advance(3600.0)
        assert rig.probe.calls == []
        rig.probe.readings = [None]
        rig.sup.post(ChildState("a", "ready", {}))
        await rig.advance(0.0)
        assert len(rig.probe.calls) == 1
        assert ("kill", "a") in rig.sup.calls

    async def test_the_hung_kill_is_audited_once_with_its_stop_reason(self, rig: Rig) -> None:
        await busy(rig)
        rig.probe.readings = [None]
        await rig.advance(60.0)
        stops = [e for e in rig.of(Event.MODEL_STATE) if e["stop_reason"] == "hung"]
        assert [(s["action"], s["trigger"]["actor"]) for s in stops] == [("kill", "watchdog")]


class TestWatchdogRules:
    def test_a_new_child_starts_a_new_watch(self) -> None:
        dog = Watchdog()
        assert dog.due([Busy("a", 10.0, 0.0, 1)], 10.0) == ["a"]
        assert dog.judge("a", 1, Reading(((0, 1, 1),)), 11.0, 10.0) is Verdict.AGAIN
        assert dog.due([Busy("a", 10.0, 11.0, 2)], 12.0) == []  # restarted: watch from scratch
        assert dog.judge("a", 1, Reading(((0, 1, 1),)), 12.0, 10.0) is None  # stale answer

    def test_slots_counters_read_llama_servers_fields(self) -> None:
        slots = [
            {"id": 0, "is_processing": False},
            {
                "id": 1, "id_task": 42, "is_processing": True, "n_prompt_tokens_processed": 512,
                "next_token": [{"n_decoded": 3}],
            },
        ]  # fmt: skip
        assert slots_counters(slots) == ((1, 42, 515),)
        assert slots_counters({"not": "a list"}) is None
