"""Audit rows for what the web side changes: presets and settings in the admin and by import
(field-level diffs, the actor), failed API logins (rate-limited, off the request path), and
the audit log's admin page, which nobody may change."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer
from django.contrib.auth import get_user_model
from django.test import Client

from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore, KeyTable, LoginFailures, record_in_database
from models_app.models import AuditEvent, AuditKind, Preset, RouterSettings
from models_app.presets.files import import_presets
from models_app.routing.client import RouterClient
from tests.support.admin import FORM
from tests.support.asgi import AsgiClient, django_stand_in
from tests.support.opened import opened

CHANGE_SETTINGS = {
    "models_max": "2", "memory_headroom": "0", "settle_timeout": "10", "max_waiters": "",
    "max_wait": "600", "queue_policy": "fifo", "default_stop_timeout": "10",
    "default_hang_timeout": "60",
    "quarantine_after": "3",
    "server_binary": "llama-server", "global_args": "[]", "memory_budget": "",
    "audit_retention_days": "90",
}  # fmt: skip


@pytest.fixture
def admin_client(db: Any) -> Client:
    user = get_user_model().objects.create_superuser("admin", "", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


def rows(kind: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=kind).order_by("id"))


class TestPresetAdmin:
    def test_create_change_and_delete_are_audited_with_a_field_diff(
        self, admin_client: Client
    ) -> None:
        form = {**FORM, "name": "org/tiny:Q8_0"}
        assert admin_client.post("/admin/models_app/preset/add/", form).status_code == 302
        preset = Preset.objects.get()
        (created,) = rows(AuditKind.PRESET_CREATED)
        assert created.actor == "user:admin" and created.model == "org/tiny:Q8_0"
        assert created.details["changes"]["stop_timeout"] == [None, 15]

        url = f"/admin/models_app/preset/{preset.pk}/change/"
        changed_form = {**form, "stop_timeout": "30", "args": '[["ctx-size", "8192"]]'}
        changed_form |= opened(admin_client, url)  # the version the change page carries
        assert admin_client.post(url, changed_form).status_code == 302
        (changed,) = rows(AuditKind.PRESET_CHANGED)
        assert changed.details["changes"] == {
            "args": [[["ctx-size", "4096"]], [["ctx-size", "8192"]]],
            "stop_timeout": [15, 30],
        }
        assert changed.reason == "args, stop_timeout"

        url = f"/admin/models_app/preset/{preset.pk}/delete/"
        assert admin_client.post(url, {"post": "yes"}).status_code == 302
        (deleted,) = rows(AuditKind.PRESET_DELETED)
        assert deleted.model == "org/tiny:Q8_0" and deleted.actor == "user:admin"
        assert deleted.details["changes"]["name"] == ["org/tiny:Q8_0", None]

    def test_saving_without_a_change_writes_no_row(self, admin_client: Client) -> None:
        form = {**FORM, "name": "org/tiny:Q8_0"}
        admin_client.post("/admin/models_app/preset/add/", form)
        preset = Preset.objects.get()
        url = f"/admin/models_app/preset/{preset.pk}/change/"
        assert admin_client.post(url, form | opened(admin_client, url)).status_code == 302
        assert rows(AuditKind.PRESET_CHANGED) == []


class TestSettingsAdmin:
    def test_a_settings_change_is_audited_with_its_diff(self, admin_client: Client) -> None:
        RouterSettings.load()
        url = "/admin/models_app/routersettings/1/change/"
        body = CHANGE_SETTINGS | opened(admin_client, url)
        assert admin_client.post(url, body).status_code == 302
        (row,) = rows(AuditKind.SETTINGS_CHANGED)
        assert row.actor == "user:admin"
        assert row.details["changes"] == {
            "audit_retention_days": [None, 90],
            "models_max": [4, 2],
        }


class TestImport:
    FILE = "[*]\nc = 4096\n[m1]\nmodel = /m/1.gguf\n[m2]\nmodel = /m/2.gguf\n"

    def test_an_import_from_the_command_line_is_audited_as_cli(self, db: Any) -> None:
        import_presets(self.FILE)
        created = rows(AuditKind.PRESET_CREATED)
        assert [(r.model, r.actor) for r in created] == [("m1", "cli"), ("m2", "cli")]
        (settings_row,) = rows(AuditKind.SETTINGS_CHANGED)
        assert settings_row.details["changes"]["global_args"] == [[], [["c", "4096"]]]

        import_presets("[m1]\nmodel = /m/new.gguf\n", replace=True)
        (changed,) = rows(AuditKind.PRESET_CHANGED)
        assert changed.details["changes"] == {"model_path": ["/m/1.gguf", "/m/new.gguf"]}
        (deleted,) = rows(AuditKind.PRESET_DELETED)
        assert deleted.model == "m2"

    def test_an_import_by_a_user_names_the_user_and_a_dry_run_writes_nothing(self, db: Any) -> None:
        user = get_user_model().objects.create_user("bob")
        import_presets(self.FILE, dry_run=True, user=user)
        assert not AuditEvent.objects.exists()
        import_presets(self.FILE, user=user)
        assert {r.actor for r in AuditEvent.objects.all()} == {"user:bob"}

    def test_the_import_command_is_audited_as_cli(self, db: Any, tmp_path: Any) -> None:
        from django.core.management import call_command

        path = tmp_path / "p.ini"
        path.write_text(self.FILE)
        call_command("import_presets", str(path), stdout=open("/dev/null", "w"))  # noqa: SIM115
        assert {r.actor for r in rows(AuditKind.PRESET_CREATED)} == {"cli"}


class TestAuditLogAdmin:
    def test_superusers_can_read_the_log_but_not_add_change_or_delete(
        self, admin_client: Client
    ) -> None:
        row = AuditEvent.objects.record(AuditKind.CRASH, model="m", reason="exit code 1")
        listing = admin_client.get("/admin/models_app/auditevent/?kind__exact=crash")
        assert listing.status_code == 200 and b"exit code 1" in listing.content
        assert b"delete_selected" not in listing.content
        assert admin_client.get("/admin/models_app/auditevent/add/").status_code == 403
        change_url = f"/admin/models_app/auditevent/{row.pk}/change/"
        page = admin_client.get(change_url)
        assert page.status_code == 200 and b'name="_save"' not in page.content  # view only
        assert admin_client.post(change_url, {"reason": "edited"}).status_code == 403
        delete_url = f"/admin/models_app/auditevent/{row.pk}/delete/"
        assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
        row.refresh_from_db()
        assert row.reason == "exit code 1"

    def test_the_list_filters_by_kind(self, admin_client: Client) -> None:
        page = admin_client.get("/admin/models_app/auditevent/")
        assert b"By kind" in page.content and b"By force killed" in page.content


class TestLoginFailures:
    async def test_a_flood_of_401s_writes_at_most_two_rows_per_window(self) -> None:
        written: list[tuple[int, dict[str, Any]]] = []
        failures = LoginFailures(
            lambda count, details: written.append((count, details)), window=0.3
        )
        scope = {"client": ("10.0.0.9", 5555), "path": "/v1/chat/completions"}
        for n in range(500):
            failures.note(scope, {b"authorization": f"Bearer wrong-{n % 3}".encode()})
        await failures.drain()
        assert [count for count, _ in written] == [1]  # the first one at once
        await asyncio.sleep(0.4)
        await failures.drain()
        assert [count for count, _ in written] == [1, 499]  # the rest as one row
        assert written[1][1]["clients"] == {"10.0.0.9": 499}
        assert len(written[1][1]["keys"]) == 3 and "wrong" not in str(written[1][1])
        await asyncio.sleep(0.4)
        assert len(written) == 2  # quiet: the window closed without a row
        failures.note(scope, {})
        await failures.drain()
        assert written[-1][0] == 1 and written[-1][1]["keys"] == {"none": 1}

    @pytest.mark.django_db(transaction=True)
    async def test_a_401_from_the_api_lands_in_the_audit_log(self) -> None:
        failures = LoginFailures(record_in_database, window=60)
        app = Api(
            django_stand_in,
            router=RouterClient(InMemoryChannelLayer(), timeout=1.0),
            keys=KeyStore(lambda: KeyTable(True, {}), None),
            config=ApiConfig(),
            login_failures=failures,
        )
        call = await AsgiClient(app).post(
            "/v1/chat/completions", {"model": "m"}, headers={"authorization": "Bearer nope"}
        )
        assert call.status == 401
        await failures.drain()
        row = await AuditEvent.objects.aget(kind=AuditKind.AUTH_FAILED)
        assert row.actor == "anonymous" and row.details["count"] == 1
        assert row.details["paths"] == {"/v1/chat/completions": 1}
        await app.aclose()
