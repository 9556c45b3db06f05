"""The engine's side of reservations (issue 17.6): the whole set comes in as data; a model newly
reserved and not running is loaded in advance by the actor ``reservation`` through the queue
(unload before load holds); the snapshot says what is reserved for whom."""

from __future__ import annotations

from routerpanel.router.catalogue import Event
from routerpanel.router.engine import RESERVATION_ACTOR
from tests.support.engine import Harness

pytest_plugins = ("tests.support.engine",)


async def test_a_newly_reserved_model_is_loaded_in_advance_by_the_queue(h: Harness) -> None:
    await h.warm("a", "b")
    answer = await h.engine.set_reservations({"c": ["user:alice"], "zzz": ["user:bob"]})
    assert answer == {"reserved": ["c"], "loading": ["c"], "unknown": ["zzz"]}
    await h.idle()
    assert h.sup.stopped() == ["a"]  # unload before load: the LRU idle model goes first
    assert "c" not in h.sup.spawned()
    await h.exit("a")
    assert h.sup.spawned()[-1] == "c"
    spawn = [e for e in h.of(Event.MODEL_STATE) if e["model"] == "c" and e["to"] == "loading"]
    assert spawn[-1]["trigger"]["actor"] == RESERVATION_ACTOR
    assert h.engine.snapshot()["reservations"] == {"c": ["user:alice"]}


async def test_the_same_set_again_loads_nothing_and_a_running_model_is_not_loaded(
    h: Harness,
) -> None:
    await h.warm("a")
    assert (await h.engine.set_reservations({"a": ["user:alice"]}))["loading"] == []
    await h.idle()
    assert h.sup.spawned() == ["a"]
    again = await h.engine.set_reservations({"a": ["user:alice"]})
    assert (again["reserved"], again["loading"]) == (["a"], [])
    assert (await h.engine.set_reservations({}))["reserved"] == []
    assert h.engine.snapshot()["reservations"] == {}
