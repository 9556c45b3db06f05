"""The dashboard and logs pages without JavaScript, and the memory history they chart."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from models_app.models import AuditEvent, AuditKind, MemoryRollup, Preset
from models_app.panel.views.logs import shown
from tests.support.panel import RouterStub, model_row

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


@pytest.fixture
def stub(panel_router: RouterStub) -> RouterStub:
    Preset.objects.create(name="demo-small", memory_estimate=64 << 20)
    Preset.objects.create(name="demo-large")
    panel_router.models = [
        model_row(
            "demo-small",
            "loaded",
            pinned=True,
            in_flight=3,
            holders={"user:alice": 2, "key:bob/ci": 1},
        ),
        model_row("demo-large", "loading", progress={"value": 0.25}),
        model_row("demo-medium", "unloaded", load_seconds=3.5),
    ]
    panel_router.queue = [
        {"ticket": 3, "model": "demo-medium", "position": 1, "waiters": 2, "since": 0.0,
         "starting": False, "restart": False,
         "requests": [{"request_id": "req-alice-1", "kind": "proxy", "actor": "key:alice/laptop",
                       "since": 0.0},
                      {"request_id": "load-9", "kind": "load", "actor": "user:otto",
                       "since": 1.0}]}
    ]  # fmt: skip
    return panel_router


def card(text: str, name: str) -> str:
    start = text.index(f'data-model="{name}"')
    return text[start : text.index("</article>", start)]


class TestDashboard:
    def test_cards_show_state_in_words_and_shape_and_the_operators_buttons(
        self, operator_client: Client, stub: RouterStub
    ) -> None:
        text = operator_client.get("/").content.decode()
        small = card(text, "demo-small")
        assert 'data-field="state-text">loaded<' in small and ">●<" in small
        assert "⚑ pinned" in small and "64.0 MiB" in small and "4242" in small
        assert 'data-field="in_flight">3<' in small and "user:alice ×2, key:bob/ci" in small
        assert '<button name="action" value="unload" data-show="running" >' in small
        large = card(text, "demo-large")
        assert 'value="25"' in large and "25%" in large and ">◐<" in large
        assert '<td data-label="Model">demo-medium</td>' in text  # the queue
        assert 'name="csrfmiddlewaretoken"' in small

    def test_the_queue_lists_its_requests_with_a_cancel_form_for_each_and_for_all(
        self, operator_client: Client, stub: RouterStub
    ) -> None:
        text = operator_client.get("/").content.decode()
        entry = text[text.index('<tr class="queue-entry" data-model="demo-medium">') :]
        entry = entry[: entry.index("</tr>")]
        assert "req-alice-1" in entry and "key:alice/laptop" in entry
        assert '<span class="badge">load</span>' in entry  # a queued load says so
        assert entry.count('name="action" value="cancel"') == 3  # two requests and "all"
        assert 'name="request_id" value="req-alice-1"' in entry
        assert "Cancel all" in entry
        assert "loads in ~3.5 s" in entry  # its last load's time, from the snapshot

    def test_a_card_says_how_long_the_model_is_in_its_state(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        stub.models[0]["state_since"] = time.time() - 75
        text = viewer_client.get("/").content.decode()
        assert "for 1 min 1" in card(text, "demo-small")  # 75 s, or 76 on a slow machine

    def test_a_card_says_why_its_model_cannot_start(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        why = "llama-server not found: /opt/llama/bin/llama-server (preset demo-medium)"
        stub.models[2]["cannot_start"] = why
        stub.models[0]["cannot_start"] = "model file not found: /m/x.gguf (preset demo-small)"
        text = viewer_client.get("/").content.decode()
        medium = card(text, "demo-medium")
        assert f'data-field="cannot_start" role="status" >Cannot start: {why}<' in medium
        small = card(text, "demo-small")  # it runs: an older check says nothing of it now
        assert 'data-field="cannot_start" role="status" hidden>' in small

    def test_no_load_time_is_promised_while_only_an_operator_can_free_a_slot(
        self, operator_client: Client, stub: RouterStub
    ) -> None:
        stub.models[1] = model_row("demo-large", "loaded", pinned=True)  # both slots pinned
        text = operator_client.get("/").content.decode()
        entry = text[text.index('<tr class="queue-entry" data-model="demo-medium">') :]
        entry = entry[: entry.index("</tr>")]
        assert ">blocked<" in entry and "loads in" not in entry

    def test_a_viewer_gets_no_action_buttons(self, viewer_client: Client, stub: RouterStub) -> None:
        text = viewer_client.get("/").content.decode()
        assert 'name="action"' not in text and "/actions/model/" not in text
        assert "req-alice-1" in text and "Cancel" not in text  # sees the queue, cannot cancel

    def test_without_the_router_it_lists_the_presets_and_says_so(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        stub.down = True
        text = viewer_client.get("/").content.decode()
        assert "Router unavailable." in text and "router unavailable" in text
        assert 'data-model="demo-small"' in text and 'data-state="unknown"' in text

    def test_the_feed_shows_the_latest_audit_rows(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        row = AuditEvent.objects.record(AuditKind.EVICTION, model="demo-small", actor="user:o")
        text = viewer_client.get("/").content.decode()
        assert f'href="/audit/{row.pk}/">eviction</a> <strong>demo-small</strong>' in text


class TestMemoryHistory:
    def test_the_last_hour_comes_from_the_router_as_columns(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        stub.memory = [
            {"time": 1.0, "system": {"used": 10, "available": 90, "swap_used": 0, "wired": None},
             "children": {}},
            {"time": 2.0, "system": {"used": 20, "available": 80, "swap_used": 0, "wired": None},
             "children": {"demo-small": {"pid": 1, "rss": 5}}},
        ]  # fmt: skip
        data = viewer_client.get("/memory/history/?range=1h").json()
        assert data["available"] is True
        assert data["columns"]["used"] == [10, 20]
        assert data["columns"]["models"] == {"demo-small": [None, 5]}

    def test_a_nodes_last_hour_comes_from_that_nodes_router(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        """Several hosts: the chart's node picker asks for one node's ring."""
        data = viewer_client.get("/memory/history/?range=1h&node=studio-2").json()
        assert data["available"] is True
        assert stub.of_kind("memory")[-1]["node"] == "studio-2"
        refused = viewer_client.get("/memory/history/?range=1h&node=no%20such")
        assert refused.status_code == 400 and "node name" in refused.json()["reason"]

    def test_a_nodes_24_hours_come_from_its_own_rollups(self, viewer_client: Client) -> None:
        minute = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=1)
        for node, used in (("studio-1", 5), ("studio-2", 7)):
            MemoryRollup.objects.create(minute=minute, scope="system", model="", used_avg=used,
                                        samples=60, used_min=used, used_max=used,
                                        available_avg=1, swap_used_avg=0, node=node)  # fmt: skip
        data = viewer_client.get("/memory/history/?range=24h&node=studio-2").json()
        assert data["available"] is True and [u for u in data["system"]["used"] if u] == [7]
        alone = viewer_client.get("/memory/history/?range=24h").json()  # the unnamed router's
        assert alone["available"] is False

    def test_24_hours_come_from_the_rollups(self, viewer_client: Client) -> None:
        minute = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=1)
        common = {"samples": 60, "used_min": 1, "used_max": 9}
        MemoryRollup.objects.create(minute=minute, scope="system", model="", used_avg=5,
                                    available_avg=95, swap_used_avg=0, **common)  # fmt: skip
        MemoryRollup.objects.create(minute=minute, scope="model", model="demo-small", used_avg=3,
                                    **common)  # fmt: skip
        old = minute - timedelta(days=2)
        MemoryRollup.objects.create(minute=old, scope="system", model="", used_avg=7, **common)
        data = viewer_client.get("/memory/history/?range=24h").json()
        assert data["available"] is True and data["time"] == [minute.timestamp()]
        assert data["system"] == {"used": [5.0], "used_max": [9.0], "available": [95.0],
                                  "swap_used": [0.0]}  # fmt: skip
        assert data["models"] == {"demo-small": [3.0]}
        week = viewer_client.get("/memory/history/?range=7d").json()
        assert week["bucket"] == 600  # two points and a gap between them: nothing rolled up
        assert week["system"]["used"] == [7.0, None, 5.0] and len(week["time"]) == 3
        assert week["window"][1] - week["window"][0] == 7 * 86400  # the axis spans 7 days

    def test_no_rollups_yet_is_said(self, viewer_client: Client) -> None:
        data = viewer_client.get("/memory/history/?range=7d").json()
        assert data["available"] is False and "no rollups yet" in data["reason"]
        assert viewer_client.get("/memory/history/?range=1y").json()["available"] is False


class TestLogs:
    def test_the_logs_page_shows_the_ring_without_javascript(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        stub.logs = {"org/m:Q4_K_M": [{"time": 0.0, "stream": "stderr", "text": "<b>loading</b>"}]}
        Preset.objects.create(name="org/m:Q4_K_M")
        text = viewer_client.get("/logs/org/m:Q4_K_M/").content.decode()
        assert "&lt;b&gt;loading&lt;/b&gt;" in text  # escaped
        assert 'data-model="org/m:Q4_K_M"' in text
        assert stub.of_kind("logs")[-1] == {"model": "org/m:Q4_K_M"}

    def test_a_line_shows_one_timestamp_and_its_level(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        stub.logs = {"demo-small": [
            {"time": 1.0, "stream": "stderr", "text": "12:00:01.250 simserver ERROR: no file"},
            {"time": 2.0, "stream": "stderr", "text": "W llama: low memory"},
            {"time": 3.5, "stream": "router", "text": "spawning (attempt 1)"},
        ]}  # fmt: skip
        text = viewer_client.get("/logs/demo-small/").content.decode()
        assert '<div class="line s-stderr lv-error"><span class="t">12:00:01.250</span>' in text
        assert '<span class="x">simserver ERROR: no file</span>' in text  # its clock moved out
        assert '<div class="line s-stderr lv-warn">' in text
        local = shown({"time": 3.5, "stream": "router", "text": "x"})["clock"]
        assert re.fullmatch(r"\d{2}:\d{2}:03\.500", local)  # no clock of its own: the router's
        assert f'<span class="t">{local}</span><span class="x">spawning (attempt 1)</span>' in text
        assert 'href="/logs/demo-small.log"' in text

    def test_the_download_is_the_raw_ring_as_a_text_attachment(
        self, viewer_client: Client, stub: RouterStub
    ) -> None:
        stub.logs = {"org/m:Q4_K_M": [{"time": 0.5, "stream": "stderr", "text": "12:00 <b>x</b>"}]}
        response = viewer_client.get("/logs/org/m:Q4_K_M.log")
        assert response.status_code == 200
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        assert response["Content-Disposition"] == 'attachment; filename="org_m_Q4_K_M.log"'
        assert response.content.decode() == "1970-01-01T00:00:00.500Z stderr 12:00 <b>x</b>\n"
        assert viewer_client.get("/logs/x.log/").status_code == 200  # the page of model x.log
        assert stub.of_kind("logs")[-1] == {"model": "x.log"}
