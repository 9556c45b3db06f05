"""Reservations in the scheduler (issue 17.6, R1-R2 in scheduler.py), fake time only.

R1: a reserved model is pinned while reserved — never an eviction victim, no TTL stop — and
behaves as usual again once the reservation ends. R2: in a reserved model's queue entry the
owners it is reserved for are granted first, each group in arrival order; the others are
still granted in the same pass and max wait applies to everyone.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routerpanel.router.decisions import (
    Decision,
    Grant,
    Reject,
    RequestKind,
    Spawn,
    Stop,
    StopReason,
)
from tests.support.scheduler import granted, of, preset, sched, spawned, stopped, warm

ALICE, BOB, CAROL = "user:alice", "user:bob", "user:carol"


class TestR1Pinned:
    def test_a_reserved_model_is_not_evicted_though_it_was_used_longest_ago(self) -> None:
        s = sched("big", "a", "x", models_max=2)
        warm(s, "big", now=0)
        warm(s, "a", now=1)
        s.set_reservations({"big": {ALICE}}, now=2)
        assert stopped(s.request_arrived("r1", "x", now=3)) == ["a"]  # big is older: pinned

    def test_with_only_reserved_models_a_request_is_answered_at_once_with_the_reason(
        self,
    ) -> None:
        """(8b): no release, exit or eviction can free a slot: no wait without an end."""
        s = sched("big", "x", models_max=1, max_wait=10.0)
        warm(s, "big", now=0)
        s.set_reservations({"big": {ALICE}}, now=1)
        decisions = s.request_arrived("r1", "x", now=2)
        assert stopped(decisions) == []
        (reject,) = of(Reject, decisions)
        assert (reject.request_id, reject.status, reject.retry_after) == ("r1", 503, None)
        assert reject.message == (
            "model name=x cannot start while nothing changes: all 1 slots are held (big is "
            "reserved); unpin one or raise models_max, or send X-RouterPanel-Wait: 1 to wait"
        )
        assert s.queue() == ()

    def test_a_patient_request_waits_for_the_reserved_models_and_max_wait_still_applies(
        self,
    ) -> None:
        s = sched("big", "x", models_max=1, max_wait=10.0)
        warm(s, "big", now=0)
        s.set_reservations({"big": {ALICE}}, now=1)
        assert stopped(s.request_arrived("r1", "x", now=2, patient=True)) == []
        assert of(Reject, s.tick(now=11)) == []
        (reject,) = of(Reject, s.tick(now=12))
        assert (reject.request_id, reject.status) == ("r1", 503)

    def test_a_waiting_request_is_answered_when_a_reservation_blocks_every_slot(self) -> None:
        s = sched("big", "a", "x", models_max=1)
        warm(s, "big", now=0)
        s.request_arrived("busy", "big", now=1)  # big is busy: x waits for it
        assert of(Reject, s.request_arrived("r1", "x", now=2)) == []
        (reject,) = of(Reject, s.set_reservations({"big": {ALICE}}, now=3))
        assert reject.request_id == "r1" and "big is reserved" in reject.message

    def test_the_end_of_the_reservation_makes_it_evictable_at_once_for_a_waiting_entry(
        self,
    ) -> None:
        s = sched("big", "x", models_max=1)
        warm(s, "big", now=0)
        s.set_reservations({"big": {ALICE}}, now=1)
        assert stopped(s.request_arrived("r1", "x", now=2, patient=True)) == []
        (stop,) = of(Stop, s.set_reservations({}, now=3))
        assert (stop.model, stop.reason) == ("big", StopReason.EVICTION)

    def test_no_ttl_stop_while_reserved_and_the_ttl_counts_again_after(self) -> None:
        s = sched(preset("big", ttl=5.0), models_max=1)
        warm(s, "big", now=0)
        s.set_reservations({"big": {ALICE}}, now=1)
        assert s.next_deadline() is None
        assert stopped(s.tick(now=100)) == []
        s.set_reservations({}, now=101)
        assert s.next_deadline() == 5.0  # idle since 0: due at once
        (stop,) = of(Stop, s.tick(now=101))
        assert (stop.model, stop.reason) == ("big", StopReason.TTL)

    def test_the_set_is_replaced_whole_and_unknown_models_are_ignored(self) -> None:
        s = sched("big", "a")
        s.set_reservations({"big": {ALICE}, "nope": {BOB}}, now=0)
        assert s.reservations() == {"big": frozenset({ALICE})}
        s.set_reservations({"a": [BOB]}, now=1)
        assert s.reservations() == {"a": frozenset({BOB})}
        assert s.model("big").pinned is False  # the preset's pin is not the reservation's


class TestR2MembersFirst:
    def entry_then_ready(self, arrivals: list[tuple[str, str]], members: set[str]) -> list[str]:
        """``arrivals`` (request id, actor) queue for "big" while it loads; return the order
        of the grants when it is ready."""
        s = sched("big", models_max=1)
        s.set_reservations({"big": members}, now=0)
        for i, (rid, actor) in enumerate(arrivals):
            out = s.request_arrived(rid, "big", now=1 + i, actor=actor)
            assert spawned(out) == (["big"] if i == 0 else [])
        return granted(s.child_ready("big", now=100))

    def test_members_are_granted_before_others_each_group_in_arrival_order(self) -> None:
        arrivals = [("n1", BOB), ("m1", ALICE), ("n2", CAROL), ("m2", "key:alice/laptop")]
        # key:alice/laptop belongs to user:alice (fairshare.owner_of)
        assert self.entry_then_ready(arrivals, {ALICE}) == ["m1", "m2", "n1", "n2"]

    def test_without_a_reservation_the_entry_is_served_in_arrival_order(self) -> None:
        s = sched("big", models_max=1)
        for i, (rid, actor) in enumerate([("n1", BOB), ("m1", ALICE)]):
            s.request_arrived(rid, "big", now=i, actor=actor)
        assert granted(s.child_ready("big", now=10)) == ["n1", "m1"]

    def test_a_loaded_reserved_model_grants_anyone_at_once(self) -> None:
        s = sched("big")
        warm(s, "big", now=0)
        s.set_reservations({"big": {ALICE}}, now=1)
        assert s.request_arrived("n1", "big", now=2, actor=BOB) == [
            Grant("n1", "big", RequestKind.PROXY)
        ]

    @settings(max_examples=200, deadline=None)
    @given(
        actors=st.lists(
            st.sampled_from([ALICE, BOB, CAROL, "key:bob/x", "anonymous"]), max_size=12
        ),
        members=st.sets(st.sampled_from([ALICE, BOB, CAROL])),
    )
    def test_property_members_first_fifo_within_each_group_nobody_left_out(
        self, actors: list[str], members: set[str]
    ) -> None:
        arrivals = [(f"r{i:02d}", actor) for i, actor in enumerate(actors)]
        if not arrivals:
            return
        order = self.entry_then_ready(arrivals, members)
        from routerpanel.router.fairshare import owner_of

        inside = [rid for rid, actor in arrivals if owner_of(actor) in members]
        outside = [rid for rid, actor in arrivals if owner_of(actor) not in members]
        assert order == inside + outside  # both groups whole, each in arrival order


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.booleans()), min_size=1, max_size=30
    ),
    reserved=st.sets(st.sampled_from(["a", "b", "c", "d"]), max_size=2),
)
def test_property_a_reserved_model_is_never_stopped_by_eviction_or_ttl(
    steps: list[tuple[str, bool]], reserved: set[str]
) -> None:
    """Requests for random models, some finishing at once, with ttl ticks between: any Stop is
    of an unreserved model; reserved ones that ran stay running."""
    s = sched(*(preset(m, ttl=2.0) for m in "abcd"), models_max=2)
    flying: list[str] = []
    stops: list[str] = []

    def world(out: list[Decision]) -> None:
        """Apply decisions as the engine would: children start and stop at once."""
        for d in out:
            if isinstance(d, Spawn):
                world(s.child_ready(d.model, now=now))
            elif isinstance(d, Stop):
                assert d.model not in reserved, f"reserved {d.model} stopped for {d.reason}"
                stops.append(d.model)
                world(s.child_exited(d.model, now=now, exit_code=0))
            elif isinstance(d, Grant):
                flying.append(d.request_id)

    now = 0.0
    world(s.set_reservations({m: {ALICE} for m in reserved}, now=now))
    for i, (model, finish) in enumerate(steps):
        now += 1.0
        world(s.request_arrived(f"r{i}", model, now=now))
        if finish and flying:
            world(s.request_finished(flying.pop(0), now=now))
        world(s.tick(now=now))
    while flying:  # everyone is served in the end; then the ttl stops only unreserved models
        world(s.request_finished(flying.pop(0), now=now))
    now += 10.0
    world(s.tick(now=now))
    assert all(s.model(m).state.value == "loaded" for m in reserved if m in {x for x, _ in steps})
