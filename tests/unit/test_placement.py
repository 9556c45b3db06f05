"""Placement across nodes (issue 18): the rule P1-P5 of ``routerpanel.router.placement``."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routerpanel.router.placement import (
    ModelView,
    NodeView,
    NoEligibleNode,
    Placement,
    eligible,
    place,
)

GIB = 1 << 30


def node(
    name: str,
    *,
    live: bool = True,
    models_max: int = 2,
    running: int | None = None,
    memory: int | None = 8 * GIB,
    **models: ModelView,
) -> NodeView:
    count = sum(1 for m in models.values() if m.state in ("loading", "loaded", "sleeping"))
    return NodeView(
        name=name,
        live=live,
        models_max=models_max,
        running=count if running is None else running,
        memory_available=memory,
        models=models,
    )


def idle(last_used: float, **kwargs: object) -> ModelView:
    return ModelView(state="loaded", last_used=last_used, **kwargs)  # type: ignore[arg-type]


class TestEligible:
    @pytest.mark.parametrize(
        ("nodes", "node_name", "expected"),
        [
            ((), "studio-1", True),
            (("studio-1", "studio-2"), "studio-2", True),
            (("studio-1",), "studio-2", False),
            (("studio-1",), "", True),  # the single router of team mode knows every preset
        ],
    )
    def test_a_preset_runs_on_the_nodes_it_names_or_any(
        self, nodes: tuple[str, ...], node_name: str, expected: bool
    ) -> None:
        assert eligible(nodes, node_name) is expected


class TestP1WhereItIs:
    def test_the_node_where_the_model_is_loaded_wins_over_a_free_slot(self) -> None:
        views = [
            node("a", models_max=1, m=idle(1.0)),
            node("b", memory=64 * GIB),
        ]
        assert place("m", (), views) == Placement("a", "loaded on a", held=True)

    @pytest.mark.parametrize(
        ("model", "reason"),
        [
            (ModelView(state="loading"), "loading on b"),
            (ModelView(state="sleeping"), "sleeping on b"),
            (ModelView(state="unloaded", queued=True), "being started on b"),
        ],
    )
    def test_loading_sleeping_or_queued_there_counts_as_held(
        self, model: ModelView, reason: str
    ) -> None:
        views = [node("a", memory=64 * GIB), node("b", m=model)]
        assert place("m", (), views) == Placement("b", reason, held=True)

    def test_a_loaded_copy_beats_a_loading_one(self) -> None:
        views = [node("a", m=ModelView(state="loading")), node("b", m=idle(1.0))]
        assert place("m", (), views).node == "b"

    def test_a_stopping_copy_does_not_hold_it(self) -> None:
        views = [
            node("a", models_max=1, m=ModelView(state="loaded", stopping=True)),
            node("b"),
        ]
        assert place("m", (), views) == Placement("b", "free slot on b")

    def test_a_copy_on_a_node_that_is_not_eligible_or_lost_does_not_count(self) -> None:
        views = [
            node("a", m=idle(1.0)),
            node("b", live=False, m=idle(1.0)),
            node("c", memory=GIB),
        ]
        assert place("m", ("b", "c"), views).node == "c"


class TestP2ToP5:
    def test_a_free_slot_beats_more_memory(self) -> None:
        views = [
            node("a", models_max=1, memory=64 * GIB, x=idle(1.0)),
            node("b", models_max=2, memory=GIB, x=idle(1.0)),
        ]
        assert place("m", (), views) == Placement("b", "free slot on b")

    def test_unlimited_models_max_always_has_a_free_slot(self) -> None:
        views = [
            node("a", models_max=0, running=50, memory=GIB),
            node("b", models_max=1, running=1),
        ]
        assert place("m", (), views).node == "a"

    def test_between_free_slots_the_most_memory_left_wins(self) -> None:
        views = [node("a", memory=4 * GIB), node("b", memory=16 * GIB), node("c", memory=None)]
        assert place("m", (), views) == Placement("b", "free slot on b, most memory left")

    def test_unknown_memory_counts_as_least(self) -> None:
        views = [node("a", memory=None), node("b", memory=1)]
        assert place("m", (), views).node == "b"

    def test_with_no_free_slot_the_most_memory_left_wins(self) -> None:
        views = [
            node("a", models_max=1, memory=2 * GIB, x=idle(1.0)),
            node("b", models_max=1, memory=3 * GIB, y=idle(9.0)),
        ]
        assert place("m", (), views) == Placement("b", "most memory left on b")

    def test_then_the_least_recently_used_idle_victim(self) -> None:
        views = [
            node("a", models_max=2, x=idle(5.0), y=idle(3.0)),
            node("b", models_max=2, z=idle(2.0), w=idle(7.0)),
        ]
        expected = Placement("b", "least recently used idle victim on b (z)")
        assert place("m", (), views) == expected

    def test_busy_pinned_and_stopping_models_are_no_victims(self) -> None:
        views = [
            node("a", models_max=1, x=idle(1.0, busy=True)),
            node("b", models_max=1, y=idle(2.0, pinned=True)),
            node("c", models_max=2, z=idle(1.0, stopping=True), v=ModelView(state="loading")),
            node("d", models_max=1, w=idle(9.0)),
        ]
        assert place("m", (), views).node == "d"

    def test_a_node_with_no_victim_ranks_last_but_is_still_chosen_alone(self) -> None:
        views = [node("a", models_max=1, x=idle(1.0, busy=True))]
        placed = place("m", (), views)
        assert placed.node == "a"
        assert "nothing idle to evict" in placed.reason

    def test_finally_the_name(self) -> None:
        views = [node("b"), node("a")]
        assert place("m", (), views) == Placement("a", "free slot on a (first by name)")

    def test_only_the_nodes_the_preset_names_are_considered(self) -> None:
        views = [node("a", memory=64 * GIB), node("b", memory=GIB)]
        assert place("m", ("b",), views).node == "b"


class TestErrors:
    def test_no_live_eligible_node_names_the_eligible_and_the_lost(self) -> None:
        views = [node("a"), node("b", live=False)]
        with pytest.raises(NoEligibleNode) as caught:
            place("m", ("b", "c"), views)
        assert str(caught.value) == (
            "no eligible node is live for model 'm': eligible b, c; lost: b; never seen: c"
        )
        assert (caught.value.eligible, caught.value.lost) == (("b", "c"), ("b",))

    def test_every_node_lost(self) -> None:
        with pytest.raises(NoEligibleNode, match=r"eligible a; lost: a$"):
            place("m", (), [node("a", live=False)])

    def test_no_node_at_all(self) -> None:
        with pytest.raises(NoEligibleNode, match="no node is known to run model 'm'"):
            place("m", (), [])

    def test_a_node_given_twice_is_a_bug_in_the_caller(self) -> None:
        with pytest.raises(ValueError, match="given twice"):
            place("m", (), [node("a"), node("a")])


# ---- properties ---------------------------------------------------------------------------------

NAMES = ["a", "b", "c", "d"]
MODELS = ["m", "x", "y"]
model_views = st.builds(
    ModelView,
    state=st.sampled_from(["unloaded", "loading", "loaded", "sleeping", "failed", "stuck"]),
    stopping=st.booleans(),
    queued=st.booleans(),
    last_used=st.integers(0, 5).map(float),
    busy=st.booleans(),
    pinned=st.booleans(),
)


@st.composite
def node_views(draw: st.DrawFn, name: str) -> NodeView:
    return NodeView(
        name=name,
        live=draw(st.booleans()),
        models_max=draw(st.integers(0, 3)),
        running=draw(st.integers(0, 4)),
        memory_available=draw(st.one_of(st.none(), st.integers(0, 4).map(lambda n: n * GIB))),
        models=draw(st.dictionaries(st.sampled_from(MODELS), model_views, max_size=3)),
    )


@st.composite
def worlds(draw: st.DrawFn) -> tuple[tuple[str, ...], list[NodeView]]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
    views = [draw(node_views(name)) for name in names]
    wanted = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
    return tuple(wanted), views


def _holds(view: NodeView) -> bool:
    model = view.models.get("m")
    if model is None:
        return False
    running = model.state in ("loading", "loaded", "sleeping") and not model.stopping
    return running or model.queued


def _candidates(wanted: tuple[str, ...], views: list[NodeView]) -> list[NodeView]:
    return [v for v in views if v.live and (not wanted or v.name in wanted)]


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_the_choice_is_eligible_and_live_or_the_error_says_why(
    world: tuple[tuple[str, ...], list[NodeView]],
) -> None:
    wanted, views = world
    candidates = _candidates(wanted, views)
    if not candidates:
        with pytest.raises(NoEligibleNode) as caught:
            place("m", wanted, views)
        lost = sorted(v.name for v in views if not v.live and (not wanted or v.name in wanted))
        assert list(caught.value.lost) == lost
        assert list(caught.value.eligible) == sorted(wanted or [v.name for v in views])
        return
    chosen = place("m", wanted, views)
    assert chosen.node in {v.name for v in candidates}
    assert chosen.reason


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_node_holding_the_model_always_wins(
    world: tuple[tuple[str, ...], list[NodeView]],
) -> None:
    wanted, views = world
    holders = {v.name for v in _candidates(wanted, views) if _holds(v)}
    if holders:
        assert place("m", wanted, views).node in holders


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_free_slot_always_beats_no_free_slot(
    world: tuple[tuple[str, ...], list[NodeView]],
) -> None:
    wanted, views = world
    candidates = _candidates(wanted, views)
    if any(_holds(v) for v in candidates) or not any(v.free_slot for v in candidates):
        return
    chosen = place("m", wanted, views)
    assert next(v for v in views if v.name == chosen.node).free_slot


@settings(max_examples=300, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_the_choice_is_deterministic_whatever_the_order_of_the_views(
    world: tuple[tuple[str, ...], list[NodeView]], rnd: random.Random
) -> None:
    wanted, views = world
    if not _candidates(wanted, views):
        return
    first = place("m", wanted, views)
    shuffled = list(views)
    rnd.shuffle(shuffled)
    assert place("m", tuple(reversed(wanted)), shuffled) == first
    assert place("m", wanted, views) == first
