"""The snapshot's rows kept between changes (``facts.Rows``) are what a full rebuild makes, at every
step of a life: loads, an eviction with a queue, requests in flight, memory samples, a crash and
its back-off, a reload that changes, pins and removes presets, an unload. And the rows of models
that do not run are the very objects of the last snapshot while nothing changed."""

from __future__ import annotations

from typing import Any

from routerpanel.router.commands import MemorySampled
from routerpanel.router.facts import Rows
from routerpanel.router.memory import ChildMemory, SystemMemory
from tests.support.engine import Harness, preset
from tests.support.waits import settled

pytest_plugins = ("tests.support.engine",)  # the h fixture: Engine, fake supervisor, clock

SYSTEM = SystemMemory(16 << 30, 8 << 30, 8 << 30, 0, 0, None)


WALL = ("state_since", "last_used", "loaded_at")  # wall-clock readings of the fake clock's times


def same_as_rebuilt(h: Harness) -> list[dict[str, Any]]:
    kept = h.engine.snapshot()["models"]
    h.engine._facts._rows = Rows()  # forget: the next snapshot builds every row
    rebuilt = h.engine.snapshot()["models"]
    assert without_wall(kept) == without_wall(rebuilt)
    return kept


def without_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k not in WALL}
        if row["backoff"]:
            row["backoff"] = {k: v for k, v in row["backoff"].items() if k != "until"}
        out.append(row)
    return out


async def sample(h: Harness, rss: int) -> None:
    children = tuple(ChildMemory(n, h.model(n)["pid"], rss, 1) for n in h.sup.children)
    h.sup.post(MemorySampled(SYSTEM, children))
    await h.idle()


async def test_kept_rows_equal_a_rebuild_through_a_models_life(h: Harness) -> None:
    same_as_rebuilt(h)
    await h.warm("a", "b")
    same_as_rebuilt(h)
    await sample(h, 100 << 20)  # not a counted change: the running rows are made again
    assert next(m for m in same_as_rebuilt(h) if m["name"] == "a")["memory"] == 100 << 20
    await sample(h, 200 << 20)
    assert next(m for m in h.engine.snapshot()["models"] if m["name"] == "a")["memory"] == 200 << 20

    lease = await h.engine.acquire("a", request_id="held", actor="user:ada")
    same_as_rebuilt(h)
    waiting = h.acquire("c")  # b is evicted for c; c waits in the queue meanwhile
    await h.idle()
    same_as_rebuilt(h)
    await h.exit("b")
    same_as_rebuilt(h)
    h.sup.ready("c")
    await h.idle()
    await settled(waiting)
    same_as_rebuilt(h)
    h.engine.release(lease.lease_id)
    await h.idle()
    same_as_rebuilt(h)

    await h.exit("c", code=1)  # a crash: failed, back-off
    same_as_rebuilt(h)
    await h.engine.reload([preset("a", pinned=True), preset("b", stop_timeout=3), preset("d")])
    await h.idle()
    rows = same_as_rebuilt(h)
    assert [m["name"] for m in rows] == ["a", "b", "d"] and rows[0]["pinned"]
    await h.engine.unload("a")
    await h.idle()
    await h.exit("a")
    same_as_rebuilt(h)


async def test_rows_of_models_that_do_not_run_are_kept_while_nothing_changes(h: Harness) -> None:
    await h.warm("a")
    first = {m["name"]: m for m in h.engine.snapshot()["models"]}
    await sample(h, 100 << 20)  # memory samples change only running rows
    second = {m["name"]: m for m in h.engine.snapshot()["models"]}
    assert second["b"] is first["b"] and second["c"] is first["c"]
    assert second["a"] is not first["a"] and second["a"]["memory"] == 100 << 20
    await h.engine.load("b")  # a counted change: every row is made again
    await h.idle()
    third = {m["name"]: m for m in h.engine.snapshot()["models"]}
    assert third["c"] is not second["c"]
