"""The state vocabulary, the transition table and the scheduler's one choke point (STYLE 1-2)."""

from __future__ import annotations

import pytest

from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import StateChanged
from routerpanel.router.scheduler import Scheduler
from routerpanel.router.states import (
    ALLOWED,
    DOWN,
    EVICTABLE,
    FAILED_STATES,
    RUNNING,
    SERVABLE,
    SPAWNABLE,
    STOPPABLE,
    IllegalTransitionError,
    ModelState,
    api_failed,
    api_status,
    check_transition,
)

S = ModelState


def _scheduler() -> Scheduler:
    return Scheduler([PresetSpec(name="a", argv=("llama-server",))], RouterConfig())


class TestTheTable:
    def test_it_lists_every_state_as_a_source(self) -> None:
        assert set(ALLOWED) == set(ModelState)

    def test_it_holds_exactly_the_documented_edges(self) -> None:
        edges = {(frm, to) for frm, targets in ALLOWED.items() for to in targets}
        assert edges == {
            (S.UNLOADED, S.LOADING),
            (S.FAILED, S.LOADING),
            (S.FAILED, S.UNLOADED),  # a reload clears failed
            (S.QUARANTINED, S.UNLOADED),  # edited or retried
            (S.LOADING, S.LOADED),
            (S.LOADING, S.UNLOADED),
            (S.LOADING, S.FAILED),
            (S.LOADING, S.QUARANTINED),
            (S.LOADING, S.STUCK),
            (S.LOADED, S.SLEEPING),
            (S.LOADED, S.UNLOADED),
            (S.LOADED, S.FAILED),
            (S.LOADED, S.STUCK),
            (S.SLEEPING, S.LOADING),  # waking up
            (S.SLEEPING, S.LOADED),
            (S.SLEEPING, S.UNLOADED),
            (S.SLEEPING, S.FAILED),
            (S.SLEEPING, S.STUCK),
            (S.STUCK, S.UNLOADED),
            (S.STUCK, S.FAILED),
        }

    def test_every_way_out_of_running_is_an_exit_and_every_way_in_is_a_spawn(self) -> None:
        for frm, targets in ALLOWED.items():
            for to in targets:
                if frm in RUNNING and to not in RUNNING:
                    assert to in DOWN
                if frm not in RUNNING and to in RUNNING:
                    assert (frm, to) in {(S.UNLOADED, S.LOADING), (S.FAILED, S.LOADING)}

    def test_the_groups_are_what_the_rules_say(self) -> None:
        assert set(RUNNING) == {S.LOADING, S.LOADED, S.SLEEPING, S.STUCK}  # A3: stuck counts
        assert set(SERVABLE) == set(EVICTABLE) == {S.LOADED, S.SLEEPING}  # A1, A5, A12
        assert set(STOPPABLE) == RUNNING - {S.STUCK}
        assert set(SPAWNABLE) == {S.UNLOADED, S.FAILED}  # quarantined needs an edit or a load
        assert set(DOWN) == set(ModelState) - RUNNING


class TestTheApiValue:
    @pytest.mark.parametrize(
        ("state", "status", "failed"),
        [
            (S.UNLOADED, "unloaded", False),
            (S.LOADING, "loading", False),
            (S.LOADED, "loaded", False),
            (S.SLEEPING, "sleeping", False),
            (S.FAILED, "unloaded", True),
            (S.QUARANTINED, "unloaded", True),
            (S.STUCK, "unloaded", True),
        ],
    )
    def test_it_maps_to_llama_cpp_status_and_failed_flag(
        self, state: ModelState, status: str, failed: bool
    ) -> None:
        assert api_status(state) == status
        assert api_failed(state) is failed
        assert (state in FAILED_STATES) is failed

    def test_the_values_are_llama_cpp_strings(self) -> None:
        assert [s.value for s in (S.UNLOADED, S.LOADING, S.LOADED, S.SLEEPING)] == [
            "unloaded",
            "loading",
            "loaded",
            "sleeping",
        ]


class TestCheckTransition:
    def test_it_refuses_an_edge_the_table_does_not_list(self) -> None:
        with pytest.raises(IllegalTransitionError, match="unloaded -> loaded"):
            check_transition(S.UNLOADED, S.LOADED, stopping=False)

    def test_it_refuses_a_stopping_flag_without_a_child(self) -> None:
        with pytest.raises(IllegalTransitionError, match="cannot be stopping"):
            check_transition(S.LOADED, S.UNLOADED, stopping=True)

    def test_a_stuck_model_is_always_stopping(self) -> None:
        with pytest.raises(IllegalTransitionError, match="stuck"):
            check_transition(S.LOADED, S.STUCK, stopping=False)
        check_transition(S.LOADED, S.STUCK, stopping=True)

    def test_staying_put_is_always_legal(self) -> None:
        for state in ModelState:
            check_transition(state, state, stopping=state is S.STUCK)


class TestTheChokePoint:
    """``Book.set_state`` (the scheduler's book) is the only writer of a model's state (STYLE 2)."""

    def test_it_emits_exactly_one_event_per_change(self) -> None:
        s = _scheduler()
        m = s._book.models["a"]
        s._book.set_state(m, S.LOADING, "spawn")
        assert s._book.out == [StateChanged("a", S.UNLOADED, S.LOADING, False, "spawn")]
        assert m.state is S.LOADING

    def test_it_emits_nothing_when_nothing_changes(self) -> None:
        s = _scheduler()
        m = s._book.models["a"]
        s._book.set_state(m, S.UNLOADED, "no-op")
        assert s._book.out == []

    def test_the_stopping_flag_is_a_change_of_its_own(self) -> None:
        s = _scheduler()
        m = s._book.models["a"]
        s._book.set_state(m, S.LOADING, "spawn")
        s._book.set_state(m, S.LOADING, "kill", stopping=True)
        s._book.set_state(m, S.LOADING, "again", stopping=True)
        assert [(e.to_state, e.stopping) for e in s._book.out if isinstance(e, StateChanged)] == [
            (S.LOADING, False),
            (S.LOADING, True),
        ]

    def test_the_flag_clears_when_the_child_is_gone(self) -> None:
        s = _scheduler()
        m = s._book.models["a"]
        s._book.set_state(m, S.LOADING, "spawn")
        s._book.set_state(m, S.LOADING, "kill", stopping=True)
        s._book.set_state(m, S.UNLOADED, "exit")
        assert (m.state, m.stopping) == (S.UNLOADED, False)

    def test_it_refuses_an_illegal_edge_and_changes_nothing(self) -> None:
        s = _scheduler()
        m = s._book.models["a"]
        with pytest.raises(IllegalTransitionError):
            s._book.set_state(m, S.SLEEPING, "bogus")
        assert m.state is S.UNLOADED
        assert s._book.out == []
