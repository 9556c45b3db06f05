"""Why a queue entry waits and what would help (issue 19), from the dashboard's snapshot: the
rules of ``models_app/queue_reasons.py`` (dashboard.js has the same, checked in the browser
tier), and the page without JavaScript: the queue table and the card say the same."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from models_app.models import Preset
from models_app.panel.queue_reasons import reason
from tests.support.panel import RouterStub, model_row

pytest_plugins = ("tests.support.panel",)


def entry(model: str, position: int = 1, **fields: Any) -> dict[str, Any]:
    return {"model": model, "position": position, "waiters": 1, "since": 0.0,
            "starting": False, "restart": False, "requests": []} | fields  # fmt: skip


def test_a_full_house_names_each_holder_and_what_would_free_a_slot() -> None:
    models = [
        model_row("model-a", "loaded", in_flight=2),
        model_row("model-b", "loaded", pinned=True),
        model_row("model-c", "unloaded"),
    ]
    got = reason(entry("model-c"), models, {"models_max": 2, "max_wait": None})
    assert got["status"] == "waiting"
    assert got["text"] == ("waiting for a slot: model-a is busy (2 requests), model-b is pinned"
                           " — unpin it or raise Max running models")  # fmt: skip
    assert got["limit"] == "no max wait: it waits until it can start (Settings: Max wait)"


def test_busy_models_without_a_pin_say_wait_for_a_request() -> None:
    models = [model_row("a", "loaded", in_flight=1), model_row("b", "unloaded")]
    got = reason(entry("b"), models, {"models_max": 1, "max_wait": 30.0})
    assert got["text"] == ("waiting for a slot: a is busy (1 request) — wait for a request to"
                           " finish or raise Max running models")  # fmt: skip
    assert got["limit"] == "gives up after 30 s"


def test_an_idle_holder_is_about_to_be_stopped() -> None:
    models = [model_row("a", "loaded"), model_row("b", "unloaded")]
    got = reason(entry("b"), models, {"models_max": 1})
    assert got["text"].startswith("waiting for a slot: a is idle (it will be stopped")


def test_a_starting_entry_says_loading_or_which_model_it_waits_to_stop() -> None:
    loading = [model_row("a", "loading")]
    assert reason(entry("a", starting=True), loading, {"models_max": 1})["status"] == "loading"
    victim = [model_row("a", "loaded", stopping=True), model_row("b", "unloaded")]
    got = reason(entry("b", starting=True), victim, {"models_max": 1})
    assert (got["status"], got["text"]) == ("stopping", "waiting for a to stop")


def test_slots_free_but_behind_others_restart_and_unlimited() -> None:
    models = [model_row("a", "unloaded"), model_row("b", "unloaded")]
    assert reason(entry("b", 2), models, {"models_max": 0})["text"] == (
        "waiting behind 1 earlier entry"
    )
    assert reason(entry("a"), models, {"models_max": 0})["text"] == "waiting for its turn"
    assert reason(entry("a", restart=True), models, {})["status"] == "restart"


@pytest.mark.django_db
def test_the_page_without_javascript_says_why_in_the_queue_and_on_the_card(
    viewer_client: Client, panel_router: RouterStub
) -> None:
    Preset.objects.create(name="model-c")
    panel_router.models = [
        model_row("model-a", "loaded", in_flight=2),
        model_row("model-b", "loaded", pinned=True),
        model_row("model-c", "unloaded", queue_position=1),
        model_row("model-d", "loading", queue_position=2),
    ]
    panel_router.queue = [entry("model-c"), entry("model-d", 2, starting=True)]
    text = viewer_client.get("/").content.decode()
    why = ("model-a is busy (2 requests), model-b is pinned, model-d is loading — unpin it or"
           " raise Max running models")  # fmt: skip
    queue = text[text.index('id="queue-body"') :]
    assert f"waiting for a slot: {why}" in queue and "no max wait" in queue
    assert 'data-field="queue-status">loading<' in queue
    card_c = text[text.index('data-model="model-c"') :]
    card_c = card_c[: card_c.index("</article>")]
    assert why in card_c and 'data-field="queued" >' in card_c  # queued #1, shown
    card_d = text[text.index('data-model="model-d"') :]
    card_d = card_d[: card_d.index("</article>")]
    assert 'data-field="queued" hidden' in card_d  # loading, not "queued #2" at once
    assert 'data-field="queue-reason" role="status" hidden' in card_d
