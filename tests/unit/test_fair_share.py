"""Fair share (issue 17.5): recent use per owner, and the ``fair`` queue policy's order.

The scheduler is driven with a fake clock. Scenario of the issue: a heavy user has used the
machine and has a backlog; a light user then asks for another model. Under ``fifo`` the heavy
user's older entry is served first; under ``fair`` the light user's is.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routerpanel.router.config import QueuePolicy, RouterConfig
from routerpanel.router.decisions import Decision, Priority, RequestKind
from routerpanel.router.fairshare import RecentUse, owner_of, urgent_after
from routerpanel.router.scheduler import Scheduler
from tests.support.engine import Harness, engine_config
from tests.support.scheduler import granted, sched, spawned, warm
from tests.support.waits import settled

pytest_plugins = ("tests.support.engine",)  # the h fixture: Engine, fake supervisor, clock

HEAVY, LIGHT = "key:heavy/batch", "key:light/laptop"


def busy_machine(policy: str, **config: object) -> Scheduler:
    """models_max 1; the heavy user held ``c`` for 100 s and still holds it (one request)."""
    s = sched("a", "b", "c", models_max=1, queue_policy=policy, **config)
    s.request_arrived("h0", "c", now=0.0, actor=HEAVY)
    s.child_ready("c", now=0.0)
    return s


def backlog(s: Scheduler, at: float = 100.0) -> None:
    """The heavy user queues 3 requests for ``a``, then the light user one for ``b``."""
    for i in range(3):
        s.request_arrived(f"h{i + 1}", "a", now=at + i, actor=HEAVY)
    s.request_arrived("l1", "b", now=at + 5, actor=LIGHT)


# ---- recent use -------------------------------------------------------------------------------


def test_owner_of_puts_a_persons_keys_and_sessions_together() -> None:
    assert owner_of("key:alice/laptop") == owner_of("key:alice/ci") == "user:alice"
    assert owner_of("user:alice") == "user:alice"
    assert owner_of("key:api-key-1") == "key:api-key-1"  # a static key is its own owner
    assert owner_of("anonymous") == "anonymous"


def test_recent_use_counts_held_seconds_while_they_run_and_forgets_after_the_window() -> None:
    use = RecentUse(window=60.0, buckets=6)
    use.hold("u", 0.0)
    assert use.usage("u", 25.0) == pytest.approx(25.0)  # counted while it runs
    use.hold("u", 25.0)  # a second request at once: time counts twice
    use.release("u", 30.0)
    use.release("u", 30.0)
    assert use.usage("u", 30.0) == pytest.approx(35.0)
    use.charge("u", 30.0, 34.0)  # a load it caused
    assert use.usage("u", 40.0) == pytest.approx(39.0)
    assert use.usage("u", 85.0) == pytest.approx(4.0)  # only the load's bucket is left
    assert use.usage("u", 200.0) == 0.0
    assert use.snapshot(200.0) == {}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["hold", "release", "charge"]), st.floats(0, 40), st.floats(0, 9)
        ),
        max_size=30,
    ),
    st.floats(0, 200),
)
def test_recent_use_is_the_exact_use_since_the_windows_first_bucket(
    ops: list[tuple[str, float, float]], extra: float
) -> None:
    """Against a brute force: the integral of requests held, plus loads, over the window."""
    width, buckets = 10.0, 6
    use = RecentUse(window=width * buckets, buckets=buckets)
    now, held, spans = 0.0, 0, []  # spans: (start, end, times)
    since = 0.0
    for op, dt, length in ops:
        now += dt
        spans.append((since, now, held))
        since = now
        if op == "hold":
            use.hold("u", now)
            held += 1
        elif op == "release" and held:
            use.release("u", now)
            held -= 1
        elif op == "charge":
            use.charge("u", max(0.0, now - length), now)
            spans.append((max(0.0, now - length), now, 1))
    now += extra
    spans.append((since, now, held))
    start = (math.floor(now / width) - buckets + 1) * width
    expected = sum(max(0.0, min(b, now) - max(a, start)) * k for a, b, k in spans)
    assert use.usage("u", now) == pytest.approx(expected, abs=1e-6)


# ---- the fair order -----------------------------------------------------------------------------


def test_fifo_serves_the_heavy_backlog_first_in_arrival_order() -> None:
    s = busy_machine("fifo")
    backlog(s)
    out = s.request_finished("h0", now=110.0)  # c idle: evicted for the head entry
    assert [e.model for e in s.queue()] == ["a", "b"]
    out = s.child_exited("c", now=111.0, exit_code=0)
    assert spawned(out) == ["a"]


def test_fair_serves_the_light_user_before_the_heavy_users_backlog() -> None:
    s = busy_machine("fair")
    backlog(s)
    s.request_finished("h0", now=110.0)
    assert [e.model for e in s.queue()] == ["b", "a"]
    assert s.recent_use(110.0) == {"user:heavy": pytest.approx(110.0)}
    out = s.child_exited("c", now=111.0, exit_code=0)
    assert spawned(out) == ["b"]
    assert granted(s.child_ready("b", now=112.0)) == ["l1"]
    s.request_finished("l1", now=113.0)  # b idle: evicted for a, whose waiters go in order
    s.child_exited("b", now=114.0, exit_code=0)
    assert granted(s.child_ready("a", now=115.0)) == ["h1", "h2", "h3"]


def test_fair_counts_the_loads_an_owner_caused() -> None:
    s = sched("a", "b", "c", models_max=1, queue_policy="fair")
    s.request_arrived("h0", "c", now=0.0, actor=HEAVY, kind=RequestKind.LOAD)
    s.child_ready("c", now=30.0)  # a 30 s load, caused by the heavy user; nothing held
    assert s.recent_use(30.0) == {"user:heavy": pytest.approx(30.0)}
    s.request_arrived("h1", "a", now=31.0, actor=HEAVY)
    s.request_arrived("l1", "b", now=32.0, actor=LIGHT)
    assert spawned(s.child_exited("c", now=33.0, exit_code=0)) == ["b"]


def test_a_higher_priority_class_goes_first_whatever_its_use() -> None:
    s2 = busy_machine("fair")
    s2.request_arrived("l1", "b", now=100.0, actor=LIGHT, priority="low")
    s2.request_arrived("h1", "a", now=101.0, actor=HEAVY, priority="high")
    assert [e.model for e in s2.queue()] == ["a", "b"]  # high beats low, whatever the use
    assert spawned(_free(s2, 102.0)) == ["a"]


def test_an_entry_waiting_past_half_max_wait_is_served_before_newer_ones() -> None:
    s = busy_machine("fair", max_wait=60.0)
    assert urgent_after(60.0) == 30.0
    s.request_arrived("h1", "a", now=100.0, actor=HEAVY)
    s.request_arrived("l1", "b", now=110.0, actor=LIGHT, priority="high")
    assert [e.model for e in s.queue()] == ["b", "a"]
    assert spawned(_free(s, 131.0)) == ["a"]  # a waited 31 s: urgent, oldest first
    assert [e.model for e in s.queue()] == ["a", "b"]


def test_switching_back_to_fifo_restores_arrival_order() -> None:
    s = busy_machine("fair")
    backlog(s)
    s.tick(now=106.0)
    assert [e.model for e in s.queue()] == ["b", "a"]
    fifo = dataclasses.replace(s.config, queue_policy=QueuePolicy.FIFO)
    s.settings_changed(fifo, now=107.0)
    assert [e.model for e in s.queue()] == ["a", "b"]
    assert spawned(_free(s, 108.0)) == ["a"]


def test_fair_keeps_fifo_inside_one_entry_across_owners_and_classes() -> None:
    s = busy_machine("fair")
    for i, (who, klass) in enumerate([(HEAVY, "low"), (LIGHT, "high"), (HEAVY, "normal")]):
        s.request_arrived(f"w{i}", "a", now=100.0 + i, actor=who, priority=klass)
    _free(s, 110.0)
    assert granted(s.child_ready("a", now=111.0)) == ["w0", "w1", "w2"]


def test_queue_policy_is_checked_and_accepts_its_name() -> None:
    assert RouterConfig(queue_policy="fair").queue_policy is QueuePolicy.FAIR  # type: ignore[arg-type]
    assert RouterConfig().queue_policy is QueuePolicy.FIFO
    with pytest.raises(ValueError, match="queue_policy must be fifo or fair"):
        RouterConfig(queue_policy="lottery")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sched("a").request_arrived("r", "a", now=0.0, priority="urgent")
    assert Priority("high") is Priority.HIGH


def test_a_warm_model_still_grants_at_once_under_fair() -> None:
    s = sched("a", models_max=1, queue_policy="fair")
    warm(s, "a", now=0.0)
    assert granted(s.request_arrived("r", "a", now=1.0, actor=LIGHT)) == ["r"]


def _free(s: Scheduler, now: float) -> list[Decision]:
    """The heavy user's request on c ends and c's child exits: one slot to claim."""
    s.request_finished("h0", now=now)
    return s.child_exited("c", now=now, exit_code=0)


# ---- through the engine ---------------------------------------------------------------------


@engine_config("a", "b", "c", models_max=1, queue_policy="fair")
async def test_the_engine_passes_the_keys_class_and_shows_the_policy(h: Harness) -> None:
    """A high-priority acquire overtakes an older normal one; the snapshot names the policy
    and who used the machine; a settings change back to fifo reaches the scheduler."""
    await h.warm("c")
    busy = await h.engine.acquire("c", request_id="busy", actor=HEAVY)
    normal = h.acquire("a", actor=HEAVY)
    await h.idle()
    high = h.acquire("b", actor=LIGHT, priority="high")
    await h.idle()
    h.clock.advance(10)
    snap = h.engine.snapshot()
    assert snap["queue_policy"]["policy"] == "fair"
    assert snap["queue_policy"]["recent_use"] == {"user:heavy": pytest.approx(10.0)}
    assert [e["model"] for e in snap["queue"]] == ["b", "a"]
    h.engine.release(busy.lease_id)
    await h.exit("c")
    assert h.sup.spawned()[-1] == "b"
    h.sup.ready("b")
    await h.idle()
    assert high.done() and not normal.done()
    fifo = dataclasses.replace(h.engine.config, queue_policy=QueuePolicy.FIFO)
    await h.engine.update_settings(fifo, actor="admin")
    assert h.engine.snapshot()["queue_policy"]["policy"] == "fifo"
    with pytest.raises(ValueError):
        await h.engine.acquire("a", request_id="bad", priority="urgent")
    h.engine.release((await settled(high)).lease_id)
    await h.idle()
    await h.exit("b")
    h.sup.ready("a")
    await h.idle()
    assert normal.done()
