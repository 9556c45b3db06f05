"""What one dashboard shows of a snapshot (``models_app.panel.dashboard_view``): every running
model, the first queue entries' models, and one page of the others, searched and ranked; never
near a WebSocket frame's limit, whatever the number of presets."""

from __future__ import annotations

import json
from typing import Any

from models_app.panel.dashboard_view import BUDGET, PER_PAGE, QUEUE_ENTRIES, View, select


def row(name: str, state: str = "unloaded", **extra: Any) -> dict[str, Any]:
    argv = ["llama-server", "-m", f"/models/{name}.gguf", "--ctx-size", "8192"]
    base = {"name": name, "aliases": [], "state": state, "stopping": False, "pinned": False}
    return base | {"args": argv} | extra


def snapshot(count: int, running: int = 2, queued: int = 0) -> dict[str, Any]:
    models = [row(f"team/model-{n:05d}") for n in range(count)]
    for m in models[:running]:
        m["state"] = "loaded"
    queue = [{"model": m["name"], "waiters": 3, "requests": []}
             for m in models[running : running + queued]]  # fmt: skip
    return {"seq": 7, "models": models, "queue": queue, "config": {"models_max": running}}


def names(selected: dict[str, Any]) -> list[str]:
    return [m["name"] for m in selected["models"]]


def test_ten_thousand_presets_give_a_bounded_snapshot_that_counts_the_rest() -> None:
    snap = snapshot(10_000, running=2, queued=150)
    full = len(json.dumps(snap))
    shown = select(snap, View())
    assert len(shown["models"]) == 2 + QUEUE_ENTRIES + PER_PAGE
    assert len(shown["queue"]) == QUEUE_ENTRIES
    assert shown["counts"] == {"models": 10_000, "running": 2, "queue_entries": 150,
                               "waiters": 450, "matching": 10_000 - 2 - QUEUE_ENTRIES,
                               "shown": PER_PAGE}  # fmt: skip
    size = len(json.dumps(shown))
    assert size <= BUDGET and full > 4 * BUDGET, (size, full)  # Daphne's frame limit: 1 MiB
    assert shown["seq"] == 7 and shown["config"] == snap["config"]


def test_running_and_queued_models_are_always_shown_and_never_twice() -> None:
    snap = snapshot(500, running=3, queued=4)
    shown = names(select(snap, View(page=5)))
    assert shown[:7] == [f"team/model-{n:05d}" for n in range(7)]
    assert len(shown) == len(set(shown))


def test_pages_search_and_the_last_page() -> None:
    snap = snapshot(200, running=0)
    second = select(snap, View(page=2))
    assert names(second)[0] == f"team/model-{PER_PAGE:05d}"
    assert second["view"] == {"q": "", "page": 2, "pages": 5, "per_page": PER_PAGE}
    assert select(snap, View(page=99))["view"]["page"] == 5  # past the end: the last page
    snap["models"][150]["aliases"] = ["Nice-Alias"]
    found = select(snap, View(q="nice-al"))
    assert names(found) == ["team/model-00150"] and found["counts"]["matching"] == 1
    assert names(select(snap, View(q="model-0019")))[:2] == ["team/model-00190", "team/model-00191"]


def test_models_that_need_attention_come_first_then_pinned_ones() -> None:
    snap = snapshot(300, running=0)
    snap["models"][299]["state"] = "failed"
    snap["models"][298]["cannot_start"] = "model file not found: /models/x.gguf"
    snap["models"][297]["pinned"] = True
    assert names(select(snap, View()))[:3] == [
        "team/model-00298", "team/model-00299", "team/model-00297"
    ]  # fmt: skip


def test_a_log_pages_model_is_shown_wherever_it_sorts() -> None:
    snap = snapshot(1_000, running=0)
    assert "team/model-00777" in names(select(snap, View(model="team/model-00777")))
    assert "team/model-00777" not in names(select(snap, View()))


def test_very_large_rows_shrink_the_page_to_stay_within_the_budget() -> None:
    snap = snapshot(400, running=0)
    for m in snap["models"]:
        m["args"] = ["--flag"] * 2_000  # about 20 KB a row
    shown = select(snap, View())
    assert len(json.dumps(shown)) <= BUDGET
    assert 1 <= shown["view"]["per_page"] < PER_PAGE


def test_the_view_comes_from_a_query_string_and_makes_one() -> None:
    view = View.of({"q": "  llama ", "page": "3", "model": "m"})
    assert (view.q, view.page, view.model) == ("llama", 3, "m")
    assert View.of({"page": "x"}).page == 1 and View.of({"page": "-4"}).page == 1
    assert view.query() == "q=llama&page=3" and view.query(1) == "q=llama"
