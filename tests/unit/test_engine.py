"""The engine with a recording fake supervisor and a fake clock: no sleeps, no processes.

The test plays the children: ``sup.ready(name)`` and ``sup.exit(name)`` post what the real
supervisor would, and ``await engine.until_idle()`` waits until the engine has handled it
(STYLE 9). Time moves only when a test calls ``clock.advance``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest

from routerpanel.router.catalogue import Event
from routerpanel.router.commands import MemorySampled
from routerpanel.router.config import PresetSpec, RouterConfig, StartupError
from routerpanel.router.engine import Engine, RouterError
from routerpanel.router.memory import ChildMemory, SystemMemory
from routerpanel.router.supervisor import (
    ChildState,
    ChildStuck,
    LogLine,
)
from tests.support.engine import (
    FakeClock,
    Harness,
    engine_config,
    make,
    preset,
    shut_down,
    turns,
)
from tests.support.waits import settled

pytest_plugins = ("tests.support.engine",)  # the h fixture: Engine, fake supervisor, clock


def state(engine: Engine) -> tuple[object, ...]:
    """The engine's snapshot without wall-clock readings, and its scheduler's own view."""
    wall = ("state_since", "last_used", "loaded_at")
    snapshot = engine.snapshot()
    models = [{k: v for k, v in m.items() if k not in wall} for m in snapshot.pop("models")]
    return snapshot, models, engine._scheduler.models(), engine._scheduler.queue()


# ---- admission ------------------------------------------------------------------------------


class TestGrantQueueEvict:
    async def test_a_request_for_a_loaded_model_is_granted_at_once_with_its_port(
        self, h: Harness
    ) -> None:
        await h.warm("a")
        lease = await h.engine.acquire("a", request_id="r1")
        assert (lease.model, lease.port) == ("a", h.sup.port("a"))
        assert lease.expires_at == h.clock.now + 30.0
        assert h.model("a")["in_flight"] == 1
        h.engine.release(lease.lease_id)
        h.engine.release(lease.lease_id)  # idempotent
        await h.idle()
        assert h.model("a")["in_flight"] == 0

    async def test_with_an_empty_inbox_the_grant_is_made_in_the_callers_own_step(
        self, h: Harness
    ) -> None:
        """Issue 16.1: no hop through the inbox task (one loop turn is enough to be granted;
        through the queue it takes the owner's turn and the caller's again)."""
        await h.warm("a")
        task = h.acquire("a")
        await asyncio.sleep(0)  # the task's first step, nothing else
        assert task.done() and task.result().model == "a"
        h.engine.release(task.result().lease_id)
        assert h.model("a")["in_flight"] == 0  # the release, too, at once

    async def test_an_acquire_behind_a_posted_command_waits_its_turn(self, h: Harness) -> None:
        """Order of inputs: an unload already in the inbox is handled before the acquire that
        follows it, so the acquire queues for the next instance instead of being granted on
        the one that is stopping."""
        await h.warm("a")
        unloading = asyncio.ensure_future(h.engine.unload("a"))
        task = h.acquire("a")  # created after the unload: its step runs after the unload's
        await asyncio.sleep(0)
        assert not task.done()  # the unload was in the inbox: the acquire was posted behind it
        await h.idle()
        assert unloading.done() and not task.done()
        assert h.model("a")["stopping"]  # the acquire waits for the next instance

    async def test_a_release_from_inside_a_handler_is_posted_not_nested(self, h: Harness) -> None:
        await h.warm("a")
        lease = await h.engine.acquire("a", request_id="r1")
        h.engine._inbox.handling = True  # as if a handler (or a tap it calls) released it
        try:
            h.engine.release(lease.lease_id)
        finally:
            h.engine._inbox.handling = False
        assert h.engine._inbox.qsize() == 1 and h.model("a")["in_flight"] == 1
        await h.idle()
        assert h.model("a")["in_flight"] == 0

    async def test_grant_now_leaves_the_state_acquire_leaves(self) -> None:
        """The hot path (issue 16.5) against the general one, on two engines fed the same
        inputs: the same lease, snapshot, queue, fair-share use and receipt, and again after
        the release."""
        engines = [await make("a", "b", models_max=2) for _ in range(2)]
        try:
            for engine, sup, _ in engines:
                await engine.load("a")
                sup.ready("a")
                await engine.until_idle()
            (fast, _, _), (general, _, _) = engines
            kw: dict[str, Any] = {"request_id": "r1", "actor": "user:alice", "priority": "high"}
            now = fast.grant_now("a", **kw)
            lease = await general.acquire("a", renewable=False, **kw)
            assert now is not None
            fields = ("request_id", "model", "port", "expires_at", "actor", "receipt", "host")
            assert [getattr(now, f) for f in fields] == [getattr(lease, f) for f in fields]
            assert now.expires_at == math.inf
            assert state(fast) == state(general)
            assert fast.lease_for("r1") == now and general.lease_for("r1") == lease
            fast.release(now.lease_id)
            general.release(lease.lease_id)
            assert state(fast) == state(general)
            assert fast.snapshot()["models"][0]["in_flight"] == 0
        finally:
            for engine, sup, _ in engines:
                await shut_down(Harness(engine, sup, _))

    async def test_grant_now_declines_what_it_cannot_answer_at_once(self, h: Harness) -> None:
        """None, and nothing changed, for a model to load, an unknown name, a request id in
        use, a queue that holds anyone, an input waiting in the inbox (order), and a call
        from inside a handler; ``acquire`` then answers as it always did."""
        assert h.engine.grant_now("a", request_id="x1") is None  # not loaded: acquire spawns
        assert h.engine.grant_now("nope", request_id="x1") is None
        await h.warm("a", "b")
        held = await h.engine.acquire("a", request_id="x1")
        assert h.engine.grant_now("a", request_id="x1") is None  # in use: acquire says 400
        busy_b = await h.engine.acquire("b", request_id="xb")
        waiting = h.acquire("c")  # models_max 2, both busy: c queues
        await h.idle()
        assert h.engine.queue_position("c") == 1
        assert h.engine.grant_now("a", request_id="x2") is None
        waiting.cancel()
        await h.idle()
        h.engine.release(busy_b.lease_id)
        assert h.engine.queue_position("c") == 0
        h.engine.note(Event.ROUTER_STARTED, {})  # an input waits in the inbox
        assert h.engine.grant_now("a", request_id="x3") is None
        await h.idle()
        h.engine._inbox.handling = True  # as if a handler (or a tap it calls) asked
        try:
            assert h.engine.grant_now("a", request_id="x4") is None
        finally:
            h.engine._inbox.handling = False
        assert h.model("a")["in_flight"] == 1  # only x1 holds it
        lease = h.engine.grant_now("a", request_id="x5")
        assert lease is not None and h.model("a")["in_flight"] == 2
        h.engine.release(lease.lease_id)
        h.engine.release(held.lease_id)
        await h.idle()
        assert h.model("a")["in_flight"] == 0

    async def test_a_request_for_an_unloaded_model_waits_for_its_spawn_and_ready(
        self, h: Harness
    ) -> None:
        task = h.acquire("a")
        await h.idle()
        assert h.sup.spawned() == ["a"] and not task.done()
        assert h.model("a")["state"] == "loading" and h.model("a")["queue_waiters"] == 1
        h.sup.ready("a")
        await h.idle()
        assert task.result().port == h.sup.port("a")

    async def test_it_evicts_the_oldest_idle_model_and_spawns_only_after_its_exit(
        self, h: Harness
    ) -> None:
        await h.warm("a")
        h.clock.advance(1)
        await h.warm("b")
        task = h.acquire("c", actor="alice", request_id="r-c")
        await h.idle()
        assert h.sup.stopped() == ["a"]
        assert h.sup.spawned() == ["a", "b"]  # A6: no spawn while the victim lives
        assert h.model("a")["stopping"] and not task.done()
        (evicted,) = h.of(Event.MODEL_EVICTED)
        assert evicted["victim"] == "a" and evicted["idle_for"] == 1.0
        trigger = {"actor": "alice", "model": "c", "request_id": "r-c", "queue_depth": 1}
        assert evicted["trigger"] == trigger and evicted["queue_depth"] == 1
        await h.exit("a")
        assert h.sup.spawned() == ["a", "b", "c"]
        h.sup.ready("c")
        await h.idle()
        assert task.result().model == "c"

    async def test_the_model_state_event_names_the_trigger_of_the_stop(self, h: Harness) -> None:
        await h.warm("a", "b")
        h.acquire("c", actor="alice")
        await h.idle()
        stop = next(e for e in h.of(Event.MODEL_STATE) if e["model"] == "a" and e["stopping"])
        assert stop["action"] == "stop" and stop["stop_timeout"] == 10.0
        assert stop["stop_reason"] == "eviction"
        assert stop["trigger"]["model"] == "c" and stop["trigger"]["actor"] == "alice"

    @engine_config(preset("a", stop_timeout=3.5), preset("b", stop_timeout=0.0), "c", models_max=2)
    async def test_each_stop_takes_its_own_preset_s_stop_timeout(self, h: Harness) -> None:
        """S4: the deadline is the victim's own stop-timeout, not the router's default, for an
        eviction, an unload and a shutdown alike (the other tests only ever see 10.0)."""
        await h.warm("a")
        h.clock.advance(1)
        await h.warm("b")
        h.acquire("c")
        await h.idle()
        assert h.sup.calls[-1] == ("stop", "a", 3.5)  # the LRU victim, for c
        await h.exit("a")
        h.sup.ready("c")
        await h.idle()
        await h.engine.unload("b", actor="ops")
        assert h.sup.calls[-1] == ("stop", "b", 0.0)  # 0: killed at once by the supervisor
        await h.exit("b")
        await shut_down(h)
        assert ("stop", "c", 10.0) in h.sup.calls  # c has no stop-timeout of its own

    async def test_a_busy_model_is_never_the_victim(self, h: Harness) -> None:
        await h.warm("a", "b")
        busy = await h.engine.acquire("a", request_id="busy")
        h.clock.advance(5)
        await h.engine.acquire("b", request_id="recent")
        h.acquire("c")
        await h.idle()
        assert h.sup.stopped() == h.sup.killed() == []  # both busy: wait, never poll
        h.engine.release(busy.lease_id)
        await h.idle()
        assert h.sup.stopped() == ["a"]

    async def test_cancelling_a_queued_acquire_frees_its_place(self, h: Harness) -> None:
        await h.warm("a", "b")
        held = [await h.engine.acquire(m, request_id=f"hold-{m}") for m in ("a", "b")]
        first = h.acquire("c")
        second = h.acquire("c")
        await h.idle()
        assert h.model("c")["queue_waiters"] == 2
        first.cancel()
        await h.idle()
        assert h.model("c")["queue_waiters"] == 1
        second.cancel()
        await h.idle()
        assert h.engine.snapshot()["queue"] == []  # A7: an empty entry leaves
        for lease in held:
            h.engine.release(lease.lease_id)
        await h.idle()
        assert h.sup.stopped() == h.sup.killed() == [] and h.sup.spawned() == ["a", "b"]

    @engine_config("a", "b", "c", "d", models_max=2)
    async def test_a_cancelled_entry_lets_the_next_one_take_the_slot(self, h: Harness) -> None:
        await h.warm("a", "b")
        held = await h.engine.acquire("a", request_id="hold-a")
        await h.engine.acquire("b", request_id="hold-b")
        doomed = h.acquire("c")
        h.clock.advance(1)
        later = h.acquire("d")
        await h.idle()
        doomed.cancel()
        await h.idle()
        h.engine.release(held.lease_id)
        await h.idle()
        assert h.sup.stopped() == ["a"]  # evicted for d, the head now (A7)
        await h.exit("a")
        assert h.sup.spawned() == ["a", "b", "d"]
        h.sup.ready("d")
        await h.idle()
        assert (await settled(later)).model == "d"

    async def test_cancel_by_request_id_answers_the_waiter_with_499(self, h: Harness) -> None:
        await h.warm("a", "b")
        await h.engine.acquire("a", request_id="x")
        await h.engine.acquire("b", request_id="y")
        task = h.acquire("c", request_id="gone")
        await h.idle()
        h.engine.cancel("gone")
        await h.idle()
        with pytest.raises(RouterError) as err:
            await settled(task)
        assert err.value.status == 499
        assert h.engine.snapshot()["queue"] == []

    async def test_an_operator_cancels_one_queued_request_by_id(self, h: Harness) -> None:
        await h.warm("a", "b")
        await h.engine.acquire("a", request_id="x")
        await h.engine.acquire("b", request_id="y")
        doomed, kept = h.acquire("c", request_id="c1"), h.acquire("c", request_id="c2")
        await h.idle()
        (entry,) = h.engine.snapshot()["queue"]
        assert [r["request_id"] for r in entry["requests"]] == ["c1", "c2"]
        assert await h.engine.cancel_queued(request_id="c1", actor="op:alice") == ["c1"]
        with pytest.raises(RouterError) as err:
            await settled(doomed)
        assert err.value.status == 499 and "op:alice" in err.value.message
        assert not kept.done() and h.model("c")["queue_waiters"] == 1
        (cancelled,) = h.of(Event.QUEUE_CANCELLED)
        assert cancelled == {
            "model": "c",
            "request_ids": ["c1"],
            "actor": "op:alice",
            "by_model": False,
        }

    async def test_an_operator_cancels_a_models_whole_entry(self, h: Harness) -> None:
        await h.warm("a", "b")
        await h.engine.acquire("a", request_id="x")
        await h.engine.acquire("b", request_id="y")
        waiters = [h.acquire("c") for _ in range(3)]
        await h.idle()
        ids = await h.engine.cancel_queued(model="c", actor="op")
        assert len(ids) == 3 and h.engine.snapshot()["queue"] == []
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert [getattr(r, "status", None) for r in results] == [499, 499, 499]

    async def test_cancelling_nothing_is_a_404_and_bad_arguments_a_400(self, h: Harness) -> None:
        with pytest.raises(RouterError) as err:
            await h.engine.cancel_queued(model="c")
        assert err.value.status == 404 and "no queued request" in err.value.message
        with pytest.raises(RouterError) as err:
            await h.engine.cancel_queued(request_id="nobody")
        assert err.value.status == 404
        with pytest.raises(RouterError) as err:
            await h.engine.cancel_queued(model="nope")
        assert err.value.status == 404 and "not found" in err.value.message
        with pytest.raises(RouterError) as err:
            await h.engine.cancel_queued(model="c", request_id="r")
        assert err.value.status == 400

    async def test_the_snapshot_says_since_when_each_model_is_in_its_state(
        self, h: Harness
    ) -> None:
        before = h.model("a")["state_since"]
        assert before is not None and before <= time.time()
        await h.warm("a")
        loaded = h.model("a")["state_since"]
        assert loaded >= before and h.model("b")["state_since"] == before
        assert h.model("a")["load_seconds"] == 0.25  # the ETA a queued entry shows next time
        assert h.model("b")["load_seconds"] is None

    async def test_cancel_of_a_granted_request_releases_its_lease(self, h: Harness) -> None:
        await h.warm("a")
        await h.engine.acquire("a", request_id="x")
        h.engine.cancel("x")
        await h.idle()
        assert h.model("a")["in_flight"] == 0

    async def test_a_task_cancelled_after_its_grant_does_not_leak_the_lease(
        self, h: Harness
    ) -> None:
        task = h.acquire("a")
        await h.idle()
        h.sup.ready("a")
        task.cancel()  # the grant and the cancellation race
        await h.idle()
        assert h.model("a")["in_flight"] == 0

    async def test_unknown_models_and_autoload_off_are_answered_like_llama_cpp(
        self, h: Harness
    ) -> None:
        with pytest.raises(RouterError) as err:
            await h.engine.acquire("nope", request_id="r")
        assert (err.value.status, err.value.message) == (400, "model 'nope' not found")
        assert err.value.body() == {
            "error": {"code": 400, "message": "model 'nope' not found",
                      "type": "invalid_request_error"}
        }  # fmt: skip
        with pytest.raises(RouterError) as err:
            await h.engine.acquire("a", request_id="r", autoload=False)
        assert (err.value.status, err.value.message) == (400, "model is not loaded")
        with pytest.raises(RouterError) as err:
            await h.engine.load("nope")
        assert (err.value.status, err.value.error_type) == (404, "not_found_error")
        with pytest.raises(RouterError) as err:
            await h.engine.unload("nope")
        assert (err.value.status, err.value.message) == (400, "model 'nope' not found")
        with pytest.raises(RouterError) as err:
            await h.engine.unload("a")
        assert (err.value.status, err.value.message) == (400, "model is not running")

    @engine_config(preset("a", aliases=("alpha",)), "b", models_max=2)
    async def test_an_alias_resolves_to_its_model(self, h: Harness) -> None:
        assert h.engine.resolve("alpha") == "a" and h.engine.resolve("zzz") is None
        await h.warm("a")
        lease = await h.engine.acquire("alpha", request_id="r")
        assert lease.model == "a"

    async def test_a_failed_load_rejects_the_waiters_with_500_and_the_log_lines(
        self, h: Harness
    ) -> None:
        task = h.acquire("a")
        await h.idle()
        await h.exit("a", code=1)
        with pytest.raises(RouterError) as err:
            await settled(task)
        assert (err.value.status, err.value.message) == (500, "model name=a failed to load")
        assert err.value.details == ("bye",)
        (exited,) = h.of(Event.MODEL_EXITED)
        assert exited["expected"] is False and exited["state"] == "failed"

    async def test_a_spawn_that_raises_is_a_failed_load(self, h: Harness) -> None:
        h.sup.fail_spawn.add("a")
        task = h.acquire("a")
        await h.idle()
        with pytest.raises(RouterError) as err:
            await settled(task)
        assert err.value.status == 500
        assert h.model("a")["state"] == "failed"

    async def test_a_load_is_answered_once_spawned(self, h: Harness) -> None:
        await h.engine.load("a", actor="ops")
        assert h.sup.spawned() == ["a"] and h.model("a")["status"] == "loading"
        with pytest.raises(RouterError) as err:
            await h.engine.load("a")
        assert err.value.message == "model is already running"

    async def test_a_kill_during_a_slow_spawn_is_delivered_when_the_child_starts(
        self, h: Harness
    ) -> None:
        h.sup.hold = asyncio.Event()
        await h.engine.load("a")
        await h.engine.unload("a")
        assert ("kill", "a") in h.sup.calls and "a" not in h.sup.children
        h.sup.hold.set()
        await h.idle()
        assert h.sup.calls.count(("kill", "a")) == 2  # again, once it existed


class TestALoadThatCannotStart:
    """Check before you evict (issue 44.1): a model whose program or files are missing is
    refused before its request joins the queue, so nobody is evicted for it."""

    @staticmethod
    def missing(*names: str) -> Any:
        def preflight(spec: PresetSpec) -> str | None:
            if spec.name in names:
                return f"llama-server not found: /opt/llama/bin/llama-server (preset {spec.name})"
            return None

        return preflight

    async def test_it_is_refused_at_once_and_evicts_nobody(self) -> None:
        engine, sup, _ = await make("a", "b", "c", models_max=2, preflight=self.missing("c"))
        h = Harness(engine, sup, FakeClock())
        sub = engine.subscribe(maxsize=1000)
        try:
            await h.warm("a", "b")
            with pytest.raises(RouterError) as refused:
                await engine.acquire("c", request_id="r-c", actor="alice")
            assert refused.value.status == 503
            assert refused.value.message == (
                "llama-server not found: /opt/llama/bin/llama-server (preset c)"
            )
            with pytest.raises(RouterError):
                await engine.load("c", actor="ops")
            await h.idle()
            assert sup.stopped() == sup.killed() == [] and sup.spawned() == ["a", "b"]
            assert engine.snapshot()["queue"] == []
            c = next(m for m in engine.snapshot()["models"] if m["name"] == "c")
            assert c["cannot_start"] == refused.value.message
            events = [e for e in sub.take(1000) if e.type == Event.MODEL_REFUSED]
            assert [(e.data["actor"], e.data["kind"]) for e in events] == [
                ("alice", "request"),
                ("ops", "load"),
            ]
        finally:
            await shut_down(h)

    async def test_a_running_model_is_not_checked_again(self) -> None:
        checked: list[str] = []

        def preflight(spec: PresetSpec) -> str | None:
            checked.append(spec.name)
            return None

        engine, sup, _ = await make("a", models_max=2, preflight=preflight)
        h = Harness(engine, sup, FakeClock())
        try:
            checked.clear()  # the start checks every preset once
            await h.warm("a")
            assert checked == ["a"]  # the load
            lease = await engine.acquire("a", request_id="r1")
            engine.release(lease.lease_id)
            assert checked == ["a"]  # a request for a loaded model: no check
        finally:
            await shut_down(h)


class TestExitsAndUnload:
    async def test_unload_stops_the_model_and_its_exit_is_a_clean_unload(self, h: Harness) -> None:
        await h.warm("a")
        await h.engine.unload("a", actor="ops")
        assert h.sup.calls[-1] == ("stop", "a", 10.0)
        assert h.model("a")["stopping"] and h.model("a")["status"] == "loaded"
        h.sup.exit("a", code=None, signal=9)  # SIGKILLed at the deadline: still asked for
        await h.idle()
        exited = h.of(Event.MODEL_EXITED)[-1]
        assert exited["clean"] and exited["state"] == "unloaded" and exited["signal"] == 9
        assert h.model("a")["state"] == "unloaded" and h.model("a")["pid"] is None

    async def test_a_crash_while_serving_is_reported_failed(self, h: Harness) -> None:
        await h.warm("a")
        await h.exit("a", code=3)
        exited = h.of(Event.MODEL_EXITED)[-1]
        assert not exited["clean"] and exited["exit_code"] == 3
        assert h.model("a")["failed"] and h.model("a")["last_exit"]["exit_code"] == 3

    async def test_a_stuck_child_is_reported_and_keeps_its_slot(self, h: Harness) -> None:
        await h.warm("a")
        await h.engine.unload("a")
        h.sup.post(ChildStuck("a", 101, 5.0))
        await h.idle()
        assert h.of(Event.MODEL_STUCK) == [
            {"model": "a", "pid": 101, "seconds_since_kill": 5.0, "from_state": "loaded"}
        ]
        assert h.model("a")["state"] == "stuck"

    async def test_sleep_and_wake_lines_move_the_state(self, h: Harness) -> None:
        await h.warm("a")
        h.sup.post(ChildState("a", "sleeping", {}))
        await h.idle()
        assert h.model("a")["status"] == "sleeping"
        h.sup.post(ChildState("a", "loading", {"value": 0.5}))
        await h.idle()
        assert h.model("a")["status"] == "loading" and h.model("a")["progress"] == {"value": 0.5}


# ---- time -----------------------------------------------------------------------------------


class TestTime:
    @engine_config("a", "b", models_max=2, lease_ttl=10.0)
    async def test_a_lease_not_renewed_expires_and_frees_the_model(self, h: Harness) -> None:
        await h.warm("a")
        lease = await h.engine.acquire("a", request_id="r", actor="user:f")
        h.clock.advance(6)
        assert h.engine.renew(lease.lease_id)
        h.clock.advance(6)
        h.engine.clock_changed()
        await h.idle()
        assert h.model("a")["in_flight"] == 1  # renewed at +6: lives until +16
        h.clock.advance(5)
        h.engine.clock_changed()
        await h.idle()
        assert h.of(Event.LEASE_EXPIRED) == [
            {"lease_id": lease.lease_id, "request_id": "r", "model": "a", "actor": "user:f",
             "why": "not renewed"}
        ]  # fmt: skip
        assert h.model("a")["in_flight"] == 0
        assert not h.engine.renew(lease.lease_id)
        assert not h.engine.renew("unknown")

    @engine_config("a", "b", models_max=2, lease_ttl=10.0)
    async def test_a_dropped_lease_ends_at_once_and_says_why(self, h: Harness) -> None:
        await h.warm("a")
        lease = await h.engine.acquire("a", request_id="r", actor="user:f")
        h.engine.drop(lease.lease_id, why="disconnected")  # its holder's connection closed
        h.engine.drop(lease.lease_id, why="disconnected")  # idempotent: one event
        await h.idle()
        assert h.model("a")["in_flight"] == 0  # no clock moved: not the TTL
        assert h.of(Event.LEASE_EXPIRED) == [
            {"lease_id": lease.lease_id, "request_id": "r", "model": "a", "actor": "user:f",
             "why": "disconnected"}
        ]  # fmt: skip
        assert not h.engine.renew(lease.lease_id)

    @engine_config(preset("a", ttl=60.0), "b", models_max=2)
    async def test_an_idle_model_is_stopped_at_its_ttl(self, h: Harness) -> None:
        await h.warm("a")
        h.clock.advance(59)
        h.engine.clock_changed()
        await h.idle()
        assert h.sup.stopped() == h.sup.killed() == []
        h.clock.advance(1)
        h.engine.clock_changed()
        await h.idle()
        assert h.sup.stopped() == ["a"]

    @engine_config("a", "b", models_max=1, max_wait=30.0)
    async def test_a_waiter_past_max_wait_gets_503_with_retry_after(self, h: Harness) -> None:
        await h.warm("a")
        await h.engine.acquire("a", request_id="busy")
        task = h.acquire("b")
        await h.idle()
        h.clock.advance(30)
        h.engine.clock_changed()
        await h.idle()
        with pytest.raises(RouterError) as err:
            await settled(task)
        assert err.value.status == 503 and err.value.retry_after == 5

    async def test_the_timer_sleeps_until_the_earliest_deadline_and_then_ticks(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Nobody ticks by hand here: the event loop runs on the fake clock (as aiotools'
        VirtualClock does), so the timer's own timeout fires once the clock passes its deadline."""
        loop = asyncio.get_running_loop()
        clock = FakeClock()
        clock.now = loop.time()  # no jump: whatever the loop has scheduled keeps its meaning
        monkeypatch.setattr(loop, "time", clock)
        engine, sup, _ = await make(
            preset("a", ttl=5.0), "b", models_max=2, lease_ttl=30.0, clock=clock
        )
        h = Harness(engine, sup, clock)
        try:
            await h.warm("a", "b")
            ready = clock.now  # a's ttl runs from here
            clock.advance(1.0)
            lease = await engine.acquire("b", request_id="r")  # expires at +31 s, after a's ttl
            handled: list[object] = []  # every command the owner loop takes from now on
            handlers = engine._inbox.handlers
            for kind, handler in list(handlers.items()):
                handlers[kind] = lambda cmd, run=handler: (handled.append(cmd), run(cmd))
            for second in (1.5, 2.5, 3.5, 4.5, 4.9):  # not a polling period: nothing runs
                clock.advance(ready + second - clock.now)
                await turns()
                assert handled == [], f"the engine woke at +{second} s: {handled}"
            assert sup.stopped() == sup.killed() == []
            clock.advance(0.2)  # past a's ttl (+5 s), long before the lease expires
            await turns()
            assert (sup.stopped(), sup.killed()) == (["a"], [])
            engine.release(lease.lease_id)
        finally:
            await shut_down(h)


# ---- events and snapshot --------------------------------------------------------------------


class TestEvents:
    async def test_every_event_has_the_next_seq(self, h: Harness) -> None:
        await h.warm("a", "b")
        h.acquire("c")
        await h.idle()
        await h.exit("a")
        seqs = [e.seq for e in h.events]
        assert seqs == list(range(1, len(seqs) + 1))
        types = {e.type for e in h.events}
        assert {
            Event.ROUTER_STARTED,
            Event.MODEL_STATE,
            Event.QUEUE_CHANGED,
            Event.MODEL_EVICTED,
        } <= types
        assert Event.MODEL_EXITED in types

    @engine_config("a", "b", "c", models_max=3)
    async def test_a_slow_subscriber_sees_a_gap_instead_of_blocking_the_engine(
        self, h: Harness
    ) -> None:
        slow = h.engine.subscribe(maxsize=3)
        await h.warm("a", "b", "c")  # many events; nobody reads `slow`
        assert h.engine.snapshot()["seq"] == 7 and slow.dropped == 3
        first = await anext(slow)
        assert first.seq == h.engine.snapshot()["seq"] - 2  # the oldest ones were dropped
        slow.close()

    async def test_the_snapshot_has_every_field_and_is_json(self, h: Harness) -> None:
        await h.warm("a")
        lease = await h.engine.acquire("a", request_id="r")
        h.acquire("c")
        await h.idle()
        snap = h.engine.snapshot()
        json.dumps(snap)
        assert set(snap) == {"seq", "models", "queue", "memory", "config", "queue_policy",
                             "reservations"}  # fmt: skip
        a = h.model("a")
        assert set(a) == {
            "name", "aliases", "state", "state_since", "status", "failed", "stopping", "pid",
            "port",
            "in_flight", "holders", "last_used", "loaded_at", "load_seconds", "queue_position",
            "queue_waiters", "memory",
            "pinned", "stop_timeout", "hang_timeout", "nodes", "backoff", "exit_code", "last_exit",
            "args", "info", "progress", "cannot_start",
        }  # fmt: skip
        assert (a["port"], a["in_flight"], a["info"]) == (lease.port, 1, {"id": "a"})
        port = str(h.sup.port("a"))
        assert a["args"] == [
            "llama-server",
            "-m",
            "/m/a.gguf",
            "--host",
            "127.0.0.1",
            "--port",
            port,
        ]
        never = h.model("b")["args"]  # never spawned: --port 0, as llama.cpp (ROUTER_SPEC 4.3)
        assert never == ["llama-server", "-m", "/m/b.gguf", "--host", "127.0.0.1", "--port", "0"]
        assert h.model("c")["queue_position"] == 1 and snap["queue"][0]["model"] == "c"
        assert snap["config"]["models_max"] == 2 and snap["seq"] == h.events[-1].seq

    async def test_log_lines_are_events(self, h: Harness) -> None:
        h.sup.post(LogLine("a", "stderr", "hello", 1.0))
        await h.idle()
        assert h.of(Event.MODEL_LOG)[-1] == {
            "model": "a",
            "stream": "stderr",
            "text": "hello",
            "time": 1.0,
        }


# ---- reload, settings, start, shutdown ----------------------------------------------------------


class TestReloadAndSettings:
    async def test_reload_restarts_only_the_changed_running_model(self, h: Harness) -> None:
        await h.warm("a", "b")
        new_a = PresetSpec(name="a", argv=("llama-server", "-m", "/m/a2.gguf"))
        result = await h.engine.reload([new_a, preset("b"), preset("d")], actor="admin")
        assert result == {"added": ["d"], "removed": ["c"], "changed": ["a"], "restarted": ["a"]}
        assert h.sup.stopped() == ["a"]
        await h.exit("a")
        assert h.sup.spawned()[-1] == "a"
        assert h.model("a")["args"][:3] == list(new_a.argv)
        assert h.engine.resolve("c") is None and h.engine.resolve("d") == "d"
        assert h.of(Event.PRESETS_RELOADED)[0]["actor"] == "admin"

    async def test_reload_with_colliding_names_is_refused_and_changes_nothing(
        self, h: Harness
    ) -> None:
        with pytest.raises(ValueError):
            await h.engine.reload([preset("a"), preset("a")])
        assert h.engine.resolve("c") == "c"

    @engine_config("a", "b", "c", models_max=1)
    async def test_raising_models_max_claims_the_free_slot_at_once(self, h: Harness) -> None:
        await h.warm("a")
        await h.engine.acquire("a", request_id="busy")
        h.acquire("b")
        await h.idle()
        assert h.sup.spawned() == ["a"]
        await h.engine.update_settings(RouterConfig(models_max=2), actor="admin")
        assert h.sup.spawned() == ["a", "b"]
        (changed,) = h.of(Event.SETTINGS_CHANGED)
        assert changed["actor"] == "admin" and changed["config"]["models_max"] == 2


class TestStartAndShutdown:
    async def test_load_on_startup_models_are_spawned_at_start(self) -> None:
        engine, sup, _ = await make(preset("a", load_on_startup=True), "b", models_max=2)
        assert sup.spawned() == ["a"]
        shutdown = asyncio.create_task(engine.shutdown())
        await engine.until_idle()
        assert (sup.killed(), sup.stopped()) == (["a"], [])  # loading: killed at once (S4)
        sup.exit("a", code=None, signal=9)
        await asyncio.wait_for(shutdown, 5)

    async def test_more_startup_models_than_models_max_refuse_to_start(self) -> None:
        specs = [preset(n, load_on_startup=True) for n in ("a", "b", "c")]
        engine, sup, _ = await make(*specs, start=False, models_max=2)
        refusal = r"^number of models to load on startup \(3\) exceeds models_max \(2\)$"
        with pytest.raises(StartupError, match=refusal):
            await engine.start()
        assert sup.spawned() == []

    async def test_shutdown_rejects_waiters_and_stops_every_child(self, h: Harness) -> None:
        await h.warm("a", "b")
        busy = await h.engine.acquire("a", request_id="busy")
        task = h.acquire("c")
        await h.idle()
        assert h.engine.why_ended(busy.lease_id) is None
        shutdown = asyncio.create_task(h.engine.shutdown())
        await h.idle()
        with pytest.raises(RouterError) as err:
            await settled(task)
        assert err.value.status == 503
        # A request still being answered learns why when its child's answer breaks off.
        ended = h.engine.why_ended(busy.lease_id)
        assert ended is not None and (ended.status, ended.message) == (
            503, "router is shutting down"
        )  # fmt: skip
        assert sorted(h.sup.stopped()) == ["a", "b"]  # busy or not
        assert not shutdown.done()  # it awaits the exits
        await h.exit("a")
        await h.exit("b")
        await asyncio.wait_for(shutdown, 5)
        await h.engine.shutdown()  # idempotent
        assert h.of(Event.ROUTER_STOPPING)
        with pytest.raises(RouterError) as err:
            await h.engine.acquire("a", request_id="late")
        assert err.value.status == 503


class TestMemory:
    async def test_each_sample_and_the_snapshot_say_who_has_requests_in_flight(
        self, h: Harness
    ) -> None:
        await h.warm("a", "b")
        for rid, actor in (("r1", "user:alice"), ("r2", "user:alice"), ("r3", "key:bob/ci")):
            await h.engine.acquire("a", request_id=rid, actor=actor)
        h.sup.post(MemorySampled(SystemMemory(16 << 30, 8 << 30, 8 << 30, 0, 0, None), ()))
        await h.idle()
        (sample,) = h.of(Event.MEMORY_SAMPLE)
        by = {"user:alice": 2, "key:bob/ci": 1}
        assert sample["in_flight"] == {"a": {"n": 3, "by": by}}  # b is idle: not listed
        assert h.model("a")["holders"] == by and h.model("b")["holders"] == {}

    async def test_a_memory_sample_is_an_event_a_history_row_and_the_models_rss(
        self, h: Harness
    ) -> None:
        await h.warm("a")
        system = SystemMemory(16 << 30, 8 << 30, 8 << 30, 0, 0, None)
        child = ChildMemory("a", h.model("a")["pid"], 123 << 20, 1)
        h.sup.post(MemorySampled(system, (child,)))
        await h.idle()
        (sample,) = h.of(Event.MEMORY_SAMPLE)
        assert sample["children"] == {"a": {"pid": child.pid, "rss": 123 << 20}}
        assert sample.pop("in_flight") == {}  # nothing is running a request
        assert h.engine.memory_history() == [sample]
        assert h.engine.snapshot()["memory"]["available"] == 8 << 30
        assert h.model("a")["memory"] == 123 << 20


def test_queue_rows_are_made_once_per_waiting_request_and_dropped_when_it_leaves() -> None:
    from routerpanel.router.decisions import QueueEntryView, RequestKind, WaiterView
    from routerpanel.router.payloads import RequestRows, queue_data

    def wall(t: float) -> float:
        return t + 100.0

    a, b = (WaiterView(r, RequestKind.PROXY, "u", 1.0) for r in ("ra", "rb"))
    rows = RequestRows()
    first = queue_data([QueueEntryView(1, "m", 1, 2, 1.0, False, False, (a, b))], wall, rows)
    again = queue_data([QueueEntryView(1, "m", 1, 1, 1.0, False, False, (b,))], wall, rows)
    assert first["entries"][0]["requests"][1] is again["entries"][0]["requests"][0]  # reused
    assert again == queue_data([QueueEntryView(1, "m", 1, 1, 1.0, False, False, (b,))], wall)
    assert again["entries"][0]["requests"] == [
        {"request_id": "rb", "kind": "proxy", "actor": "u", "since": 101.0}
    ]
    assert len(rows._rows) == 1  # ra's row went with it
