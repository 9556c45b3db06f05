"""Thousands of presets: the dashboard's socket sends a bounded snapshot (the running and queued
models, counts, a page of the rest), the dashboard and presets pages page and search."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from models_app.accounts.roles import Role
from models_app.models import Preset
from models_app.panel.dashboard_view import BUDGET, PER_PAGE
from tests.support.dashboard_socket import connect, receive
from tests.support.panel import RouterStub, make_user, model_row

pytest_plugins = ("tests.support.panel",)

COUNT = 3_000  # past 1,600 the whole snapshot no longer fitted one WebSocket frame (1 MiB)


def name(n: int) -> str:
    return f"team/model-{n:05d}:Q4_K_M"


def args(n: int) -> list[str]:
    return ["llama-server", "-m", f"/models/{name(n)}.gguf", "--ctx-size", "8192", "--port", "0"]


@pytest.fixture
def many(panel_router: RouterStub, db: None) -> RouterStub:
    Preset.objects.bulk_create(
        Preset(name=name(n), model_path=f"/m/{n}.gguf") for n in range(COUNT)
    )
    panel_router.models = [model_row(name(n), "loaded" if n < 2 else "unloaded", args=args(n))
                           for n in range(COUNT)]  # fmt: skip
    return panel_router


def cards(page: str) -> list[str]:
    return re.findall(r'class="model-card[^"]*" data-model="([^"]+)"', page)


@pytest.mark.django_db(transaction=True)
async def test_the_socket_sends_a_bounded_snapshot_and_the_page_asked_for(many: RouterStub) -> None:
    full = len(json.dumps({"models": many.models}))
    user = await sync_to_async(make_user)("vera", Role.VIEWER)
    socket = await connect(user)
    message = await receive(socket, "snapshot")
    size = len(json.dumps(message))
    snap = message["snapshot"]
    assert size < BUDGET < full, (size, full)
    assert len(snap["models"]) == 2 + PER_PAGE
    assert snap["counts"]["models"] == COUNT and snap["counts"]["running"] == 2
    assert set(message["presets"]) == {m["name"] for m in snap["models"]}  # the shown ones
    await socket.disconnect()

    socket = await connect(user, "/ws/dashboard/?q=model-02999")
    snap = (await receive(socket, "snapshot"))["snapshot"]
    assert [m["name"] for m in snap["models"]] == [name(0), name(1), name(2999)]
    await socket.disconnect()


@pytest.mark.django_db
def test_the_dashboard_pages_and_searches(many: RouterStub, admin_client: Client) -> None:
    page = admin_client.get("/").content.decode()
    assert len(cards(page)) == 2 + PER_PAGE
    assert f"{COUNT} models, 2 running." in page and "Page 1 of 63" in page
    assert 'data-ws="/ws/dashboard/"' in page
    second = admin_client.get("/?page=2").content.decode()
    assert cards(second)[2] == name(2 + PER_PAGE)
    assert 'data-ws="/ws/dashboard/?page=2"' in second  # its socket sends the same page
    found = admin_client.get("/?q=model-0299").content.decode()
    assert cards(found) == [name(0), name(1)] + [name(n) for n in range(2990, 3000)]
    assert "matching “model-0299”: 1–10 of 10" in found

    many.down = True  # the router away: the database's presets, paged the same way
    assert len(cards(admin_client.get("/").content.decode())) == PER_PAGE


@pytest.mark.django_db
def test_the_presets_page_pages_and_searches(many: RouterStub, admin_client: Client) -> None:
    page = admin_client.get("/presets/").content.decode()
    assert page.count('<td data-label="Model">') == 100
    assert "1–100 of 3000 · page 1 of 30" in page
    last = admin_client.get("/presets/?page=30").content.decode()
    assert name(2999) in last and name(0) not in last
    Preset.objects.filter(name=name(1234)).update(aliases=["my-favourite"])
    found = admin_client.get("/presets/?q=FAVOURITE").content.decode()
    assert found.count('<td data-label="Model">') == 1 and name(1234) in found
    assert "1 of 3000 match" in found
    assert (
        "No preset matches “nothing-like-it”."
        in admin_client.get("/presets/?q=nothing-like-it").content.decode()
    )
