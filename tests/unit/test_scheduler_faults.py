"""Crash-loop back-off and the watchdog's kill of a hung child, in the pure scheduler."""

from __future__ import annotations

import pytest

from routerpanel.router.backoff import CRASH_WINDOW, MAX_DELAY, CrashLoop
from routerpanel.router.decisions import BackedOff, Kill, Reject, RequestKind, StopReason
from routerpanel.router.states import ModelState
from tests.support.scheduler import granted, of, preset, rejected, sched, spawned, stopped

S = ModelState


def ready(s: object, name: str, now: float, rid: str = "r") -> None:
    assert spawned(s.request_arrived(rid, name, now=now)) == [name]  # type: ignore[attr-defined]
    assert granted(s.child_ready(name, now=now)) == [rid]  # type: ignore[attr-defined]


class TestCrashLoop:
    def test_delays_double_up_to_the_cap(self) -> None:
        loop = CrashLoop()
        delays = [loop.died(uptime=0.1, now=0.0, reason="exit code 3") for _ in range(9)]
        assert delays == [1, 2, 4, 8, 16, 32, MAX_DELAY, MAX_DELAY, MAX_DELAY]

    def test_a_child_that_ran_longer_than_the_window_starts_the_count_again(self) -> None:
        loop = CrashLoop()
        loop.died(uptime=1.0, now=0.0, reason="x")
        loop.died(uptime=1.0, now=10.0, reason="x")
        assert loop.died(uptime=CRASH_WINDOW, now=100.0, reason="x") is None
        assert (loop.strikes, loop.remaining(100.0)) == (0, None)

    def test_next_delay_says_what_a_death_would_bring_without_recording_it(self) -> None:
        loop = CrashLoop()
        assert loop.next_delay(uptime=0.5) == 1.0
        assert loop.next_delay(uptime=CRASH_WINDOW) is None  # up long enough: no strike
        assert loop.strikes == 0
        loop.died(uptime=0.5, now=0.0, reason="x")
        assert loop.next_delay(uptime=0.5) == 2.0 == loop.died(uptime=0.5, now=1.0, reason="x")

    def test_remaining_counts_down_to_none(self) -> None:
        loop = CrashLoop()
        loop.died(uptime=0.0, now=5.0, reason="x")
        assert loop.remaining(5.25) == pytest.approx(0.75)
        assert loop.remaining(6.0) is None


class TestBackOffWhileServing:
    def test_a_quick_crash_holds_the_next_start_back_and_says_why(self) -> None:
        s = sched("a")
        ready(s, "a", 0.0)
        s.request_finished("r", now=0.1)
        out = s.child_exited("a", now=0.2, exit_code=3)
        assert [(b.seconds, b.strikes, b.reason) for b in of(BackedOff, out)] == [
            (1.0, 1, "exit code 3")
        ]
        out = s.request_arrived("r2", "a", now=0.5)
        [reject] = of(Reject, out)
        assert (reject.status, reject.retry_after) == (503, 1)
        assert "died soon after it started, once (last: exit code 3)" in reject.message
        assert spawned(out) == []

    def test_after_the_back_off_a_request_starts_it_again(self) -> None:
        s = sched("a")
        ready(s, "a", 0.0)
        s.request_finished("r", now=0.1)
        s.child_exited("a", now=0.2, exit_code=3)
        assert spawned(s.request_arrived("r2", "a", now=1.2)) == ["a"]

    def test_each_quick_crash_doubles_the_back_off(self) -> None:
        s = sched("a")
        now, seconds = 0.0, []
        for i in range(4):
            ready(s, "a", now, rid=f"r{i}")
            s.request_finished(f"r{i}", now=now)
            [backed] = of(BackedOff, s.child_exited("a", now=now + 0.1, exit_code=3))
            seconds.append(backed.seconds)
            now += 0.1 + backed.seconds + 0.01
        assert seconds == [1, 2, 4, 8]

    def test_an_explicit_load_clears_the_back_off(self) -> None:
        s = sched("a")
        ready(s, "a", 0.0)
        s.request_finished("r", now=0.0)
        s.child_exited("a", now=0.1, exit_code=3)
        out = s.request_arrived("l", "a", now=0.2, kind=RequestKind.LOAD)
        assert spawned(out) == ["a"]
        assert s.model("a").crash_strikes == 0
        assert s.model("a").backoff_until is None

    def test_a_crash_after_a_long_run_is_no_strike(self) -> None:
        s = sched("a")
        ready(s, "a", 0.0)
        s.request_finished("r", now=1.0)
        out = s.child_exited("a", now=CRASH_WINDOW + 1, exit_code=3)
        assert of(BackedOff, out) == []
        assert spawned(s.request_arrived("r2", "a", now=CRASH_WINDOW + 1.1)) == ["a"]

    def test_the_view_shows_the_back_off(self) -> None:
        s = sched("a")
        ready(s, "a", 0.0)
        s.request_finished("r", now=0.0)
        s.child_exited("a", now=0.5, exit_code=3)
        view = s.model("a")
        assert (view.backoff_until, view.crash_strikes, view.backoff_reason) == (
            1.5,
            1,
            "exit code 3",
        )

    def test_a_backing_off_model_is_no_reason_to_evict(self) -> None:
        s = sched("a", "b", models_max=1)
        ready(s, "a", 0.0)
        s.request_finished("r", now=0.0)
        s.child_exited("a", now=0.1, exit_code=3)
        ready(s, "b", 0.2, rid="rb")
        s.request_finished("rb", now=0.2)
        assert rejected(s.request_arrived("r3", "a", now=0.3)) == ["r3"]
        assert stopped(s.tick(now=0.4)) == []


class TestHungChild:
    def test_a_hung_child_is_killed_at_once_and_ends_failed(self) -> None:
        s = sched(preset("a", stop_timeout=30.0))
        ready(s, "a", 0.0)
        out = s.child_hung("a", now=70.0)
        [kill] = of(Kill, out)
        assert (kill.reason, kill.trigger.actor, kill.in_flight) == (StopReason.HUNG, "watchdog", 1)
        assert s.model("a").stopping
        s.request_finished("r", now=70.1)  # the engine ends its leases
        out = s.child_exited("a", now=70.2, exit_code=None)
        assert s.model("a").state is S.FAILED
        assert [b.reason for b in of(BackedOff, out)] == []  # ran 70 s: no crash loop

    def test_a_child_that_hangs_right_after_start_backs_off(self) -> None:
        s = sched("a")
        ready(s, "a", 0.0)
        s.child_hung("a", now=2.0)
        s.request_finished("r", now=2.0)
        out = s.child_exited("a", now=2.1, exit_code=None)
        assert [b.reason for b in of(BackedOff, out)] == ["killed: it stopped responding"]

    def test_a_second_verdict_while_stopping_changes_nothing(self) -> None:
        s = sched("a")
        ready(s, "a", 0.0)
        s.child_hung("a", now=5.0)
        assert s.child_hung("a", now=6.0) == []

    def test_the_freed_slot_goes_to_the_queue(self) -> None:
        s = sched("a", "b", models_max=1)
        ready(s, "a", 0.0)
        assert spawned(s.request_arrived("rb", "b", now=1.0)) == []  # a is busy: b waits
        s.child_hung("a", now=61.0)
        s.request_finished("r", now=61.0)
        assert spawned(s.child_exited("a", now=61.1, exit_code=None)) == ["b"]
