"""The audit log page: filters, paging, CSV and JSON export, the eviction detail view."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from models_app.models import AuditEvent, AuditKind
from models_app.panel.views.audit_log import PAGE_SIZE

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


def record(kind: str, model: str, actor: str, minutes_ago: float = 0, **fields: object) -> int:
    row = AuditEvent.objects.record(kind, model=model, actor=actor, **fields)
    AuditEvent.objects.filter(pk=row.pk).update(
        time=timezone.now() - timedelta(minutes=minutes_ago)
    )
    return row.pk


@pytest.fixture
def rows() -> dict[str, int]:
    return {
        "old_load": record(AuditKind.READY, "alpha", "user:ada", minutes_ago=120),
        "eviction": record(
            AuditKind.EVICTION,
            "alpha",
            "key:bob/ci",
            minutes_ago=30,
            trigger_model="beta",
            reason="least recently used idle model, stopped for beta",
            queue_depth=2,
            idle_seconds=42.0,
            stop_seconds=0.5,
            memory_before=8 << 30,
            memory_after=6 << 30,
            details={"victim_rss": 2147483648},
        ),
        "beta_ready": record(AuditKind.READY, "beta", "key:bob/ci", minutes_ago=29),
        "settings": record(AuditKind.SETTINGS_CHANGED, "", "user:ada", minutes_ago=5),
    }


def shown(response: object) -> list[int]:
    return [row.pk for row in response.context["page"]]  # type: ignore[attr-defined]


class TestFilters:
    def test_it_lists_newest_first(self, viewer_client: Client, rows: dict[str, int]) -> None:
        response = viewer_client.get("/audit/")
        order = ["settings", "beta_ready", "eviction", "old_load"]
        assert shown(response) == [rows[name] for name in order]

    def test_it_filters_by_model_kind_actor_and_time(
        self, viewer_client: Client, rows: dict[str, int]
    ) -> None:
        assert shown(viewer_client.get("/audit/?model=alpha")) == [
            rows["eviction"],
            rows["old_load"],
        ]
        assert shown(viewer_client.get("/audit/?kind=eviction")) == [rows["eviction"]]
        assert shown(viewer_client.get("/audit/?actor=bob")) == [
            rows["beta_ready"],
            rows["eviction"],
        ]
        since = (timezone.localtime() - timedelta(minutes=60)).strftime("%Y-%m-%dT%H:%M")
        until = (timezone.localtime() - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M")
        response = viewer_client.get(f"/audit/?since={since}&until={until}")
        assert shown(response) == [rows["beta_ready"], rows["eviction"]]

    def test_a_range_that_ends_before_it_starts_is_an_error(self, viewer_client: Client) -> None:
        response = viewer_client.get("/audit/?since=2026-01-02T00:00&until=2026-01-01T00:00")
        assert "The end is before the start." in response.content.decode()

    def test_it_pages(self, viewer_client: Client) -> None:
        for n in range(PAGE_SIZE + 5):
            record(AuditKind.READY, f"m{n}", "scheduler", minutes_ago=n)
        first = viewer_client.get("/audit/?kind=ready")
        assert len(shown(first)) == PAGE_SIZE
        assert "Page 1 of 2" in first.content.decode()
        assert 'href="?kind=ready&amp;page=2"' in first.content.decode()
        second = viewer_client.get("/audit/?kind=ready&page=2")
        assert [AuditEvent.objects.get(pk=pk).model for pk in shown(second)] == [
            f"m{n}" for n in range(PAGE_SIZE, PAGE_SIZE + 5)
        ]


class TestExport:
    def test_csv_has_every_field_and_follows_the_filters(
        self, viewer_client: Client, rows: dict[str, int]
    ) -> None:
        response = viewer_client.get("/audit/?model=alpha&format=csv")
        assert response["Content-Type"] == "text/csv; charset=utf-8"
        assert response["Content-Disposition"].startswith('attachment; filename="audit-')
        table = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
        assert [int(r["id"]) for r in table] == [rows["eviction"], rows["old_load"]]
        eviction = table[0]
        assert eviction["kind"] == "eviction" and eviction["trigger_model"] == "beta"
        assert eviction["memory_before"] == str(8 << 30)
        assert json.loads(eviction["details"]) == {"victim_rss": 2147483648}

    def test_json_export(self, viewer_client: Client, rows: dict[str, int]) -> None:
        response = viewer_client.get("/audit/?kind=eviction&format=json")
        data = json.loads(b"".join(response.streaming_content))
        assert len(data) == 1
        assert data[0]["id"] == rows["eviction"] and data[0]["queue_depth"] == 2
        assert data[0]["time"].endswith("+00:00")


class TestDetail:
    def test_an_eviction_shows_every_field_and_what_happened_around_it(
        self, viewer_client: Client, rows: dict[str, int]
    ) -> None:
        text = viewer_client.get(f"/audit/{rows['eviction']}/").content.decode()
        assert "to make room for <strong>beta</strong>" in text
        assert "requested by <strong>key:bob/ci</strong>" in text
        assert "after 42 s idle" in text and "with 2 requests queued" in text
        labels = (
            "Trigger model, Queue depth, Memory before, Memory after, Idle seconds, "
            "Stop seconds, Settle seconds, Load seconds, Force killed, Exit code, Router id, Seq"
        )
        for label in labels.split(", "):
            assert f"<dt>{label}</dt>" in text, label
        assert "8.0 GiB" in text and "&quot;victim_rss&quot;: 2147483648" in text
        assert f'href="/audit/{rows["beta_ready"]}/"' in text  # beta's ready, just after

    def test_an_unknown_row_is_a_404(self, viewer_client: Client) -> None:
        assert viewer_client.get("/audit/999/").status_code == 404
