"""Admission and eviction rules A1-A14 (DESIGN §4), one test class per rule, fake time only."""

from __future__ import annotations

import pytest

from routerpanel.router.config import (
    PresetSpec,
    RouterConfig,
    StartupError,
    preset_map,
    startup_loads,
)
from routerpanel.router.decisions import (
    Decision,
    Grant,
    Kill,
    PresetsReloaded,
    QueueChanged,
    Reject,
    RequestKind,
    Settled,
    Spawn,
    StateChanged,
    Stop,
    StopReason,
    Trigger,
)
from routerpanel.router.scheduler import (
    RETRY_AFTER,
    NotRunningError,
    Scheduler,
    UnknownModelError,
)
from routerpanel.router.states import ModelState
from tests.support.scheduler import (
    granted,
    of,
    preset,
    rejected,
    sched,
    spawned,
    state,
    stopped,
    warm,
)

GB = 1 << 30
LOAD = RequestKind.LOAD
S = ModelState


class TestA1GrantAtOnce:
    def test_a1_it_grants_a_loaded_model_at_once(self) -> None:
        s = sched("a")
        warm(s, "a", now=0)
        assert s.request_arrived("r1", "a", now=1) == [Grant("r1", "a", RequestKind.PROXY)]
        assert s.model("a").in_flight == 1

    def test_a1_a_stopping_model_queues_the_request_for_its_next_instance(self) -> None:
        s = sched("a")
        warm(s, "a", now=0)
        s.unload("a", now=1, actor="alice")
        out = s.request_arrived("r1", "a", now=2)
        assert granted(out) == [] and spawned(out) == []
        assert spawned(s.child_exited("a", now=3, exit_code=0)) == ["a"]
        assert granted(s.child_ready("a", now=4)) == ["r1"]


class TestA2OneEntryPerModel:
    def test_a2_requests_for_one_model_share_one_entry_one_eviction_and_one_spawn(self) -> None:
        s = sched("a", "x", models_max=1)
        warm(s, "a", now=0)
        first = s.request_arrived("r1", "x", now=1)
        second = s.request_arrived("r2", "x", now=2)
        assert stopped(first) == ["a"] and stopped(second) == []
        assert [(e.model, e.waiters) for e in s.queue()] == [("x", 2)]
        assert spawned(s.child_exited("a", now=3, exit_code=0)) == ["x"]
        assert granted(s.child_ready("x", now=4)) == ["r1", "r2"]


class TestA3Capacity:
    def test_a3_stopping_and_stuck_models_hold_their_slots(self) -> None:
        s = sched("a", "b", "x", models_max=2)
        warm(s, "a", now=0)
        warm(s, "b", now=1)
        s.unload("a", now=2, actor="alice")
        out = s.request_arrived("r1", "x", now=3)
        assert spawned(out) == [] and stopped(out) == []  # a's exit will free the slot
        out = s.child_stuck("a", now=4)
        assert state(s, "a") == (S.STUCK, True)
        assert stopped(out) == ["b"]  # a stuck slot is not "being freed": evict another
        assert spawned(s.child_exited("b", now=5, exit_code=0)) == ["x"]

    def test_a3_models_max_zero_or_less_is_unlimited(self) -> None:
        s = sched("a", "b", "c", "d", "e", models_max=0)
        out = [d for i, m in enumerate("abcde") for d in s.request_arrived(f"r{i}", m, now=i)]
        assert spawned(out) == list("abcde") and stopped(out) == []

    def test_a3_a_model_bigger_than_the_whole_budget_is_rejected(self) -> None:
        s = sched(preset("huge", memory_estimate=20 * GB), memory_budget=16 * GB)
        (reject,) = of(Reject, s.request_arrived("r1", "huge", now=0))
        assert (reject.status, reject.error_type) == (500, "server_error")
        assert "more than the memory budget" in reject.message
        assert s.queue() == ()

    def test_a3_settle_gate_holds_the_spawn_until_memory_is_available(self) -> None:
        big, small = preset("big", memory_estimate=8 * GB), preset("x", memory_estimate=6 * GB)
        s = sched(big, small, memory_budget=10 * GB, memory_headroom=1 * GB, settle_timeout=30)
        warm(s, "big", now=0)
        assert stopped(s.request_arrived("r1", "x", now=1)) == ["big"]  # 8 + 6 > 10: A5 bytes
        assert spawned(s.child_exited("big", now=2, exit_code=0)) == []  # gate closed
        assert spawned(s.memory_sample(5 * GB, now=3)) == []  # 5 < 6 + 1
        out = s.memory_sample(7 * GB, now=4)
        assert spawned(out) == ["x"]
        assert of(Settled, out) == [Settled("x", 2, "memory", 7 * GB)]

    def test_a3_settle_gate_opens_at_the_settle_timeout(self) -> None:
        big, small = preset("big", memory_estimate=8 * GB), preset("x", memory_estimate=6 * GB)
        s = sched(big, small, memory_budget=10 * GB, settle_timeout=5)
        warm(s, "big", now=0)
        s.request_arrived("r1", "x", now=1)
        s.child_exited("big", now=10, exit_code=0)
        assert s.next_deadline() == 15
        assert spawned(s.tick(now=14.9)) == []
        out = s.tick(now=15)
        assert spawned(out) == ["x"]
        assert of(Settled, out) == [Settled("x", 5, "timeout", None)]


class TestA4Fifo:
    def test_a4_several_free_slots_are_claimed_by_successive_heads_in_fifo_order(self) -> None:
        s = sched("a", "b", "c", "d", models_max=2)
        warm(s, "c", now=0, busy=True)
        warm(s, "d", now=0, busy=True)
        for i, model in enumerate("ab"):
            s.request_arrived(f"r{i}", model, now=1 + i)
        out = s.settings_changed(RouterConfig(models_max=4), now=5)
        assert spawned(out) == ["a", "b"]  # both at once: llama.cpp loads one at a time (§15.6)
        assert [d.ticket for d in of(Spawn, out)] == sorted(d.ticket for d in of(Spawn, out))

    def test_a4_a_later_entry_never_overtakes_a_blocked_head(self) -> None:
        busy, big = preset("c", memory_estimate=4 * GB), preset("a", memory_estimate=8 * GB)
        small = preset("b", memory_estimate=1 * GB)
        s = sched(busy, big, small, memory_budget=10 * GB, settle_timeout=0)
        rid = warm(s, "c", now=0, busy=True)
        s.request_arrived("r1", "a", now=1)  # 4 + 8 > 10 and c is busy: wait
        out = s.request_arrived("r2", "b", now=2)  # 4 + 1 fits, but a is ahead
        assert spawned(out) == []
        assert stopped(s.request_finished(rid, now=3)) == ["c"]
        assert spawned(s.child_exited("c", now=4, exit_code=0)) == ["a", "b"]


class TestA5Eviction:
    def test_a5_it_evicts_the_idle_model_used_longest_ago(self) -> None:
        s = sched("a", "b", "c", "x", models_max=3)
        for i, m in enumerate("abc"):
            warm(s, m, now=i)
        s.request_arrived("again", "a", now=4)
        s.request_finished("again", now=5)
        (stop,) = of(Stop, s.request_arrived("r1", "x", now=6, actor="alice"))
        assert stop.model == "b"
        assert stop.reason is StopReason.EVICTION
        assert stop.trigger == Trigger("alice", "x", "r1", 1)
        assert (stop.idle_for, stop.in_flight, stop.stop_timeout) == (5, 0, 10.0)
        assert state(s, "b") == (S.LOADED, True)

    def test_a5_it_never_evicts_a_busy_model_and_waits_for_a_release(self) -> None:
        s = sched("a", "b", "x", models_max=2)
        ra = warm(s, "a", now=0, busy=True)
        warm(s, "b", now=1, busy=True)
        out = s.request_arrived("r1", "x", now=2)
        assert stopped(out) == [] and spawned(out) == []
        assert stopped(s.request_finished(ra, now=3)) == ["a"]

    def test_a5_it_never_evicts_a_pinned_model(self) -> None:
        s = sched(preset("p", pinned=True), "b", "x", "y", models_max=2)
        warm(s, "p", now=0)
        warm(s, "b", now=1)
        assert stopped(s.request_arrived("r1", "x", now=2)) == ["b"]
        s.child_exited("b", now=3, exit_code=0)
        s.child_ready("x", now=4)
        s.request_finished("r1", now=5)
        assert stopped(s.request_arrived("r2", "y", now=6)) == ["x"]  # p is older, but pinned

    def test_a5_it_never_evicts_a_loading_model(self) -> None:
        s = sched("a", "x", models_max=1)
        s.request_arrived("r1", "a", now=0)
        s.waiter_left("r1", now=1)  # a keeps loading with nobody waiting
        assert stopped(s.request_arrived("r2", "x", now=2)) == []
        assert stopped(s.child_ready("a", now=3)) == ["a"]  # now idle and loaded

    def test_a5_it_counts_slots_already_being_freed(self) -> None:
        s = sched("a", "b", "x", "y", models_max=2)
        warm(s, "a", now=0)
        warm(s, "b", now=1)
        assert stopped(s.request_arrived("r1", "x", now=2)) == ["a"]
        assert stopped(s.request_arrived("r2", "x", now=3)) == []  # same entry
        assert stopped(s.tick(now=4)) == []  # a's slot is already on its way
        assert stopped(s.request_arrived("r3", "y", now=5)) == ["b"]  # a second entry

    def test_a5_in_memory_mode_it_evicts_until_enough_bytes_are_freed(self) -> None:
        models = [preset(n, memory_estimate=3 * GB) for n in "abc"]
        s = sched(*models, preset("x", memory_estimate=7 * GB), memory_budget=10 * GB)
        for i, m in enumerate("abc"):
            warm(s, m, now=i)
        assert stopped(s.request_arrived("r1", "x", now=5)) == ["a", "b"]  # 1 free + 3 + 3

    def test_a5_it_shrinks_to_a_lowered_models_max(self) -> None:
        s = sched("a", "b", "c", models_max=3)
        for i, m in enumerate("abc"):
            warm(s, m, now=i)
        out = s.settings_changed(RouterConfig(models_max=1), now=5)
        assert stopped(out) == ["a", "b"]
        assert {d.reason for d in of(Stop, out)} == {StopReason.SHRINK}

    def test_a5_a_release_with_nothing_queued_still_shrinks_to_a_lowered_limit(self) -> None:
        s = sched("a", "b", models_max=2)
        ra, rb = warm(s, "a", now=0, busy=True), warm(s, "b", now=1, busy=True)
        assert stopped(s.settings_changed(RouterConfig(models_max=1), now=2)) == []  # both busy
        out = s.request_finished(ra, now=3)  # nothing is queued: the release's fast path
        assert stopped(out) == ["a"]
        assert {d.reason for d in of(Stop, out)} == {StopReason.SHRINK}
        assert stopped(s.request_finished(rb, now=4)) == []  # a's stop already makes room


class TestA6UnloadBeforeLoad:
    def test_a6_it_spawns_only_after_the_victim_has_exited(self) -> None:
        s = sched("a", "x", models_max=1)
        warm(s, "a", now=0)
        out = s.request_arrived("r1", "x", now=1)
        assert stopped(out) == ["a"] and spawned(out) == []
        assert spawned(s.tick(now=100)) == []  # however long the stop takes
        out = s.child_exited("a", now=101, exit_code=0)
        changes = [(e.model, e.to_state) for e in of(StateChanged, out)]
        assert changes == [("a", S.UNLOADED), ("x", S.LOADING)]
        assert spawned(out) == ["x"]


class TestA7WaiterLeaves:
    def test_a7_a_waiter_that_leaves_removes_itself_and_its_empty_entry(self) -> None:
        s = sched("a", "x", "y", models_max=1)
        warm(s, "a", now=0, busy=True)
        for rid, model in (("r1", "x"), ("r2", "x"), ("r3", "y")):
            s.request_arrived(rid, model, now=1)
        (changed,) = of(QueueChanged, s.waiter_left("r2", now=2))
        assert [(e.model, e.position, e.waiters) for e in changed.entries] == [
            ("x", 1, 1),
            ("y", 2, 1),
        ]
        (changed,) = of(QueueChanged, s.waiter_left("r1", now=3))
        assert [(e.model, e.position) for e in changed.entries] == [("y", 1)]
        assert changed.depth == 1

    def test_a7_a_slot_freed_for_a_leaving_waiter_goes_to_the_next_entry(self) -> None:
        s = sched("a", "x", "y", models_max=1)
        warm(s, "a", now=0)
        assert stopped(s.request_arrived("r1", "x", now=1)) == ["a"]
        s.request_arrived("r2", "y", now=2)
        s.waiter_left("r1", now=3)
        assert spawned(s.child_exited("a", now=4, exit_code=0)) == ["y"]

    def test_a7_a_model_already_spawned_for_a_leaving_waiter_finishes_loading_and_stays(
        self,
    ) -> None:
        s = sched("x")
        assert spawned(s.request_arrived("r1", "x", now=0)) == ["x"]
        out = s.waiter_left("r1", now=1)
        assert stopped(out) == [] and s.queue() == ()
        s.child_ready("x", now=2)
        assert state(s, "x") == (S.LOADED, False)
        assert s.model("x").in_flight == 0

    def test_a7_leaving_twice_or_unknown_is_harmless(self) -> None:
        s = sched("x")
        s.request_arrived("r1", "x", now=0)
        s.waiter_left("r1", now=1)
        assert s.waiter_left("r1", now=2) == []
        assert s.request_finished("nobody", now=3) == []


class TestOperatorCancel:
    """An operator cancels queued requests (issue 6): one by id, or a model's whole entry."""

    def test_cancel_by_id_rejects_only_that_waiter_with_499_and_names_the_operator(self) -> None:
        s = sched("a", "x", models_max=1)
        warm(s, "a", now=0, busy=True)
        s.request_arrived("r1", "x", now=1, actor="bob")
        s.request_arrived("r2", "x", now=2)
        out = s.cancel_waiting(now=3, actor="op:alice", request_id="r1")
        (reject,) = of(Reject, out)
        assert (reject.request_id, reject.status, reject.error_type) == ("r1", 499, "cancelled")
        assert "cancelled by op:alice" in reject.message and "name=x" in reject.message
        (changed,) = of(QueueChanged, out)
        assert [(e.model, e.waiters, e.since) for e in changed.entries] == [("x", 1, 2)]
        assert s.waiter_left("r1", now=4) == []  # it is gone from the scheduler's books

    def test_cancel_by_model_empties_the_entry_and_the_slot_goes_to_the_next(self) -> None:
        s = sched("a", "x", "y", models_max=1)
        warm(s, "a", now=0)
        assert stopped(s.request_arrived("r1", "x", now=1)) == ["a"]
        s.request_arrived("r2", "x", now=2, kind=LOAD)
        s.request_arrived("r3", "y", now=3)
        out = s.cancel_waiting(now=4, actor="op", model="x")
        assert sorted(rejected(out)) == ["r1", "r2"]
        assert [e.model for e in s.queue()] == ["y"]
        assert spawned(s.child_exited("a", now=5, exit_code=0)) == ["y"]

    def test_nothing_to_cancel_returns_no_reject_and_granted_requests_are_untouched(self) -> None:
        s = sched("a", "x")
        warm(s, "a", now=0, busy=True)
        rid = "warm-a-0"
        assert s.cancel_waiting(now=1, actor="op", request_id=rid) == []
        assert s.cancel_waiting(now=1, actor="op", model="x") == []
        assert s.model("a").in_flight == 1
        with pytest.raises(ValueError):
            s.cancel_waiting(now=1, actor="op")

    def test_the_queue_view_lists_the_oldest_waiters_in_arrival_order_bounded(self) -> None:
        from routerpanel.router.scheduler import QUEUE_VIEW_REQUESTS

        s = sched("a", "x", models_max=1)
        warm(s, "a", now=0, busy=True)
        for i in range(QUEUE_VIEW_REQUESTS + 5):
            s.request_arrived(f"r{i}", "x", now=1 + i, actor=f"u{i}")
        (entry,) = s.queue()
        assert entry.waiters == QUEUE_VIEW_REQUESTS + 5 and entry.since == 1
        assert len(entry.requests) == QUEUE_VIEW_REQUESTS
        first = entry.requests[0]
        assert (first.request_id, first.actor, first.since, first.kind) == ("r0", "u0", 1, "proxy")
        s.waiter_left("r0", now=50)
        assert s.queue()[0].since == 2 and s.queue()[0].requests[0].request_id == "r1"


class TestA8QueueLimits:
    def test_a8_it_rejects_a_waiter_beyond_max_waiters_with_retry_after(self) -> None:
        s = sched("a", "x", "y", models_max=1, max_waiters=2)
        warm(s, "a", now=0, busy=True)
        s.request_arrived("r1", "x", now=1)
        s.request_arrived("r2", "x", now=1)
        (reject,) = of(Reject, s.request_arrived("r3", "x", now=1))
        assert (reject.request_id, reject.status, reject.error_type) == (
            "r3",
            503,
            "unavailable_error",
        )
        assert reject.retry_after == RETRY_AFTER
        assert "max_waiters=2" in reject.message
        assert rejected(s.request_arrived("r4", "y", now=1)) == []  # the limit is per model

    def test_a8_it_rejects_waiters_that_waited_longer_than_max_wait(self) -> None:
        s = sched("a", "x", models_max=1, max_wait=30)
        warm(s, "a", now=0, busy=True)
        s.request_arrived("r1", "x", now=0)
        s.request_arrived("r2", "x", now=10)
        assert s.next_deadline() == 30
        assert rejected(s.tick(now=29)) == []
        out = s.tick(now=30)
        assert rejected(out) == ["r1"]
        assert of(Reject, out)[0].retry_after == RETRY_AFTER
        assert s.next_deadline() == 40
        assert rejected(s.tick(now=40)) == ["r2"]
        assert s.queue() == ()


class TestA9LoadsQueueToo:
    def test_a9_a_load_waits_behind_earlier_entries_and_is_answered_at_spawn(self) -> None:
        s = sched("a", "x", "y", models_max=1)
        ra = warm(s, "a", now=0, busy=True)
        s.request_arrived("r1", "x", now=1)
        s.request_arrived("L", "y", now=2, kind=LOAD, actor="ops")
        assert stopped(s.request_finished(ra, now=3)) == ["a"]
        assert spawned(s.child_exited("a", now=4, exit_code=0)) == ["x"]  # x first: FIFO
        s.child_ready("x", now=5)
        s.request_finished("r1", now=6)
        out = s.child_exited("x", now=7, exit_code=0)
        assert spawned(out) == ["y"]
        assert of(Grant, out) == [Grant("L", "y", LOAD)]  # like llama.cpp: right after spawn
        assert s.model("y").in_flight == 0  # a load holds nothing

    def test_a9_a_load_of_a_running_model_is_rejected_like_llama_cpp(self) -> None:
        s = sched("a")
        warm(s, "a", now=0)
        (reject,) = of(Reject, s.request_arrived("L", "a", now=1, kind=LOAD))
        assert (reject.status, reject.message) == (400, "model is already running")


class TestA10FailedLoads:
    def test_a10_a_failed_load_answers_its_waiters_500_with_the_log_lines(self) -> None:
        s = sched("x")
        s.request_arrived("r1", "x", now=0)
        s.request_arrived("r2", "x", now=0)
        tail = ("llama_model_load: error loading model", "main: exiting due to model loading error")
        out = s.child_exited("x", now=1, exit_code=1, log_tail=tail)
        assert rejected(out) == ["r1", "r2"]
        reject = of(Reject, out)[0]
        assert (reject.status, reject.error_type) == (500, "server_error")
        assert (reject.message, reject.details) == ("model name=x failed to load", tail)
        view = s.model("x")
        assert (view.state, view.api_status, view.failed, view.failures) == (
            S.FAILED,
            "unloaded",
            True,
            1,
        )
        assert spawned(s.request_arrived("r3", "x", now=2)) == ["x"]  # a failed model retries

    def fail(self, s: Scheduler, rid: str, now: float) -> list[Decision]:
        s.request_arrived(rid, "x", now=now)
        return s.child_exited("x", now=now, exit_code=1, log_tail=("boom",))

    def test_a10_after_n_consecutive_failed_loads_it_is_quarantined_and_fails_fast(self) -> None:
        s = sched("x", quarantine_after=2)
        self.fail(s, "r1", 0)
        out = self.fail(s, "r2", 1)
        assert [e.to_state for e in of(StateChanged, out)] == [S.QUARANTINED]
        out = s.request_arrived("r3", "x", now=2)
        assert spawned(out) == []
        (reject,) = of(Reject, out)
        assert reject.status == 500 and reject.message.startswith("model name=x failed to load")
        assert reject.details == ("boom",)

    def test_a10_a_successful_load_resets_the_count(self) -> None:
        s = sched("x", quarantine_after=2)
        self.fail(s, "r1", 0)
        s.request_arrived("r2", "x", now=1)
        s.child_ready("x", now=2)
        s.request_finished("r2", now=3)
        s.child_exited("x", now=4, exit_code=139)  # a crash while serving is not a failed load
        assert s.model("x").state is S.FAILED
        self.fail(s, "r3", 5)
        assert s.model("x").state is S.FAILED

    def test_a10_an_explicit_load_retries_a_quarantined_model_once(self) -> None:
        s = sched("x", quarantine_after=2)
        self.fail(s, "r1", 0)
        self.fail(s, "r2", 1)
        out = s.request_arrived("L", "x", now=2, kind=LOAD, actor="ops")
        assert spawned(out) == ["x"] and granted(out) == ["L"]
        s.child_exited("x", now=3, exit_code=1)
        assert s.model("x").state is S.QUARANTINED  # one more failure is enough

    def test_a10_editing_the_preset_lifts_the_quarantine(self) -> None:
        s = sched("x", quarantine_after=1)
        self.fail(s, "r1", 0)
        assert s.model("x").state is S.QUARANTINED
        s.reload([preset("x", load_timeout=600)], now=1, actor="admin")
        assert (s.model("x").state, s.model("x").failures) == (S.UNLOADED, 0)
        assert spawned(s.request_arrived("r2", "x", now=2)) == ["x"]


class TestA11Ttl:
    def test_a11_an_idle_model_past_its_ttl_is_stopped(self) -> None:
        s = sched(preset("a", ttl=60))
        warm(s, "a", now=0)
        assert s.next_deadline() == 60
        assert stopped(s.tick(now=59)) == []
        (stop,) = of(Stop, s.tick(now=60))
        assert (stop.model, stop.reason, stop.idle_for) == ("a", StopReason.TTL, 60)
        assert s.next_deadline() is None

    def test_a11_ttl_counts_from_the_end_of_the_last_request(self) -> None:
        s = sched(preset("a", ttl=60))
        rid = warm(s, "a", now=0, busy=True)
        assert stopped(s.tick(now=90)) == []  # busy
        s.request_finished(rid, now=100)  # last_used moves to the end (§15.26)
        assert stopped(s.tick(now=159)) == []
        assert stopped(s.tick(now=160)) == ["a"]

    def test_a11_a_pinned_model_ignores_its_ttl(self) -> None:
        s = sched(preset("a", ttl=60, pinned=True))
        warm(s, "a", now=0)
        assert stopped(s.tick(now=10_000)) == [] and s.next_deadline() is None


class TestA12Sleeping:
    def test_a12_a_sleeping_model_is_granted_at_once_and_wakes_itself(self) -> None:
        s = sched("a")
        warm(s, "a", now=0)
        s.child_state("a", "sleeping", now=1)
        assert granted(s.request_arrived("r1", "a", now=2)) == ["r1"]
        s.child_state("a", "loading", now=3)  # the child reloads its weights
        assert granted(s.request_arrived("r2", "a", now=4)) == []  # waits for ready
        assert granted(s.child_ready("a", now=5)) == ["r2"]

    def test_a12_a_sleeping_model_keeps_its_slot_and_is_evictable(self) -> None:
        s = sched("a", "x", models_max=1)
        warm(s, "a", now=0)
        s.child_state("a", "sleeping", now=1)
        out = s.request_arrived("r1", "x", now=2)
        assert spawned(out) == []  # it still holds the slot
        assert [d.model for d in of(Stop, out)] == ["a"]  # graceful, not a kill
        assert spawned(s.child_exited("a", now=3, exit_code=0)) == ["x"]


class TestA13Startup:
    def test_a13_it_returns_the_startup_models_in_name_order(self) -> None:
        presets = [preset(n, load_on_startup=n != "b") for n in "cba"]
        assert startup_loads(presets, RouterConfig(models_max=2)) == ("a", "c")

    def test_a13_more_startup_models_than_models_max_refuses_to_start(self) -> None:
        presets = [preset(n, load_on_startup=True) for n in "abc"]
        with pytest.raises(
            StartupError,
            match=r"^number of models to load on startup \(3\) exceeds models_max \(2\)$",
        ):
            startup_loads(presets, RouterConfig(models_max=2))

    def test_a13_unlimited_models_max_allows_any_number(self) -> None:
        presets = [preset(n, load_on_startup=True) for n in "abc"]  # llama.cpp refuses: §15.3
        assert startup_loads(presets, RouterConfig(models_max=0)) == ("a", "b", "c")

    def test_a13_startup_loads_go_through_the_queue(self) -> None:
        presets = [preset(n, load_on_startup=True) for n in "ab"]
        s = Scheduler(presets, RouterConfig(models_max=2))
        out = [
            d
            for name in startup_loads(presets, s.config)
            for d in s.request_arrived(f"startup:{name}", name, now=0, kind=LOAD, actor="startup")
        ]
        assert spawned(out) == ["a", "b"]
        assert granted(out) == ["startup:a", "startup:b"]


class TestA14Reload:
    def test_a14_it_restarts_only_running_models_whose_command_changed(self) -> None:
        s = sched("a", "b", "c", "d")
        for i, m in enumerate("abc"):
            warm(s, m, now=i)
        new_a = PresetSpec(name="a", argv=("llama-server", "-m", "/models/a.gguf", "-c", "8192"))
        presets = [new_a, preset("b", ttl=300), preset("c"), preset("d", env=(("X", "1"),))]
        out = s.reload(presets, now=5, actor="admin")
        assert stopped(out) == ["a"]
        assert of(Stop, out)[0].reason is StopReason.RELOAD
        assert of(PresetsReloaded, out) == [
            PresetsReloaded("admin", (), (), ("a", "b", "d"), ("a",))
        ]
        out = s.child_exited("a", now=6, exit_code=0)
        assert [d.spec for d in of(Spawn, out)] == [new_a]
        assert of(Spawn, out)[0].trigger.actor == "admin"

    def test_a14_a_busy_changed_model_restarts_after_its_requests_finish(self) -> None:
        s = sched("a")
        rid = warm(s, "a", now=0, busy=True)
        out = s.reload([preset("a", env=(("A", "1"),))], now=1, actor="admin")
        assert stopped(out) == []
        assert granted(s.request_arrived("r2", "a", now=2)) == []  # not to the old command
        assert stopped(s.request_finished(rid, now=3)) == ["a"]
        assert spawned(s.child_exited("a", now=4, exit_code=0)) == ["a"]
        assert granted(s.child_ready("a", now=5)) == ["r2"]

    def test_a14_a_draining_model_is_not_servable_so_no_autoload_answers_not_loaded(self) -> None:
        s = sched("a")
        rid = warm(s, "a", now=0, busy=True)
        assert s.servable("a") and not s.servable("nope")
        s.reload([preset("a", env=(("A", "1"),))], now=1, actor="admin")
        assert s.model("a").state is S.LOADED and not s.servable("a")  # the engine asks this
        assert stopped(s.request_finished(rid, now=2)) == ["a"]
        assert spawned(s.child_exited("a", now=3, exit_code=0)) == ["a"]  # the new command
        assert not s.servable("a")  # loading
        s.child_ready("a", now=4)
        assert s.servable("a")

    def test_a14_it_stops_removed_models_and_rejects_their_waiters(self) -> None:
        s = sched("a", "x", models_max=1)
        ra = warm(s, "a", now=0, busy=True)
        s.request_arrived("r1", "x", now=1)
        out = s.reload([preset("a")], now=2, actor="admin")
        (reject,) = of(Reject, out)
        assert (reject.request_id, reject.status, reject.message) == (
            "r1",
            400,
            "model 'x' not found",
        )
        out = s.reload([], now=3, actor="admin")
        assert stopped(out) == []  # a is busy: it drains first
        assert stopped(s.request_finished(ra, now=4)) == ["a"]
        s.child_exited("a", now=5, exit_code=0)
        with pytest.raises(UnknownModelError):
            s.model("a")
        assert of(Reject, s.request_arrived("r2", "a", now=6))[0].status == 400

    def test_a14_a_reload_clears_failed_like_llama_cpp(self) -> None:
        s = sched("x")
        s.request_arrived("r1", "x", now=0)
        s.child_exited("x", now=1, exit_code=1)
        s.reload([preset("x")], now=2, actor="admin")
        assert s.model("x").state is S.UNLOADED


class TestUnloadAndExits:
    def test_an_unload_of_a_loading_model_kills_it_and_answers_its_waiters(self) -> None:
        s = sched("x")
        s.request_arrived("r1", "x", now=0)
        out = s.unload("x", now=1, actor="alice")
        assert of(Kill, out) == [Kill("x", StopReason.UNLOAD, Trigger("alice", None, None, 1), 0)]
        assert [(d.status, d.message) for d in of(Reject, out)] == [
            (400, "model name=x is not running")
        ]
        s.child_exited("x", now=2, exit_code=1)  # SIGKILL: asked for, so not failed (§15.15)
        assert (s.model("x").state, s.model("x").failures) == (S.UNLOADED, 0)

    def test_an_unload_stops_a_busy_model_and_is_idempotent(self) -> None:
        s = sched("a")
        warm(s, "a", now=0, busy=True)
        (stop,) = of(Stop, s.unload("a", now=1, actor="alice"))
        assert (stop.in_flight, stop.trigger.actor) == (1, "alice")
        assert stopped(s.unload("a", now=2, actor="bob")) == []

    def test_an_unload_of_a_model_that_is_not_running_raises(self) -> None:
        s = sched("a")
        with pytest.raises(NotRunningError):
            s.unload("a", now=0, actor="alice")
        with pytest.raises(UnknownModelError):
            s.unload("nope", now=0, actor="alice")

    def test_an_unknown_model_is_rejected_400_for_a_proxy_and_404_for_a_load(self) -> None:
        s = sched("a")
        (proxy,) = of(Reject, s.request_arrived("r1", "nope", now=0))
        (load,) = of(Reject, s.request_arrived("r2", "nope", now=0, kind=LOAD))
        assert (proxy.status, proxy.message) == (400, "model 'nope' not found")
        assert (load.status, load.error_type) == (404, "not_found_error")
        with pytest.raises(UnknownModelError):
            s.child_ready("nope", now=0)

    def test_a_crash_while_serving_marks_failed_and_the_next_request_respawns(self) -> None:
        s = sched("a")
        warm(s, "a", now=0)
        s.child_exited("a", now=1, exit_code=139, log_tail=("Segmentation fault",))
        assert (s.model("a").state, s.model("a").log_tail) == (S.FAILED, ("Segmentation fault",))
        assert spawned(s.request_arrived("r1", "a", now=2)) == ["a"]

    def test_a_stuck_model_fails_its_requests_fast(self) -> None:
        s = sched("a")
        warm(s, "a", now=0)
        s.unload("a", now=1, actor="alice")
        s.request_arrived("r1", "a", now=2)
        assert rejected(s.child_stuck("a", now=3)) == ["r1"]
        assert of(Reject, s.request_arrived("r2", "a", now=4))[0].status == 503
        s.child_exited("a", now=5, exit_code=None)
        assert spawned(s.request_arrived("r3", "a", now=6)) == ["a"]

    def test_child_lines_that_fit_no_edge_are_ignored(self) -> None:
        s = sched("a")
        assert s.child_state("a", "sleeping", now=0) == []
        with pytest.raises(ValueError, match="no child"):
            s.child_exited("a", now=0, exit_code=0)

    def test_a_reused_request_id_is_refused(self) -> None:
        s = sched("a")
        s.request_arrived("r1", "a", now=0)
        with pytest.raises(ValueError, match="already in use"):
            s.request_arrived("r1", "a", now=0)

    def test_shutdown_rejects_every_waiter_and_stops_every_child(self) -> None:
        s = sched("a", "b", "x", models_max=2)
        warm(s, "a", now=0, busy=True)
        s.request_arrived("r1", "b", now=1)
        s.request_arrived("r2", "x", now=2)
        out = s.shutdown(now=3, actor="system")
        assert rejected(out) == ["r1", "r2"]  # waiting for b's ready, and queued for x
        assert sorted(stopped(out)) == ["a", "b"]
        assert of(Reject, s.request_arrived("r3", "a", now=4))[0].status == 503


class TestConfig:
    def test_it_refuses_host_and_port_in_argv(self) -> None:
        with pytest.raises(ValueError, match="--port"):
            PresetSpec(name="a", argv=("llama-server", "--port", "8080"))

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("stop_timeout", -1, "stop_timeout must be a number of seconds >= 0"),
            ("ttl", -1, "ttl must be a positive number"),
            ("memory_estimate", -5, "memory_estimate must be >= 0"),
            ("aliases", ("a",), "aliases must be distinct and differ from the name"),
            ("env", (("A=B", "1"),), "env names"),
            ("nodes", ("studio 1",), "node name 'studio 1' may only use letters"),
            ("nodes", ("a", "a"), "node 'a' is named twice"),
            ("nodes", ["a"], "nodes must be a tuple"),
        ],
    )
    def test_preset_validation_names_the_field(
        self, field: str, value: object, message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            PresetSpec(name="a", argv=("llama-server",), **{field: value})  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("models_max", 1.5, "models_max must be an integer"),
            ("memory_budget", 0, "memory_budget must be >= 1"),
            ("max_waiters", 0, "max_waiters must be >= 1"),
            ("max_wait", 0, "max_wait must be a positive number"),
            ("quarantine_after", -1, "quarantine_after must be >= 0"),
            ("lease_ttl", float("nan"), "lease_ttl must be a positive number"),
        ],
    )
    def test_router_config_validation_names_the_field(
        self, field: str, value: object, message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            RouterConfig(**{field: value})  # type: ignore[arg-type]

    def test_colliding_aliases_are_refused(self) -> None:
        with pytest.raises(ValueError, match="collides"):
            preset_map([preset("a", aliases=("b",)), preset("b")])
