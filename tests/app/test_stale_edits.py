"""Two admins editing one thing: a form carries the version it was opened at, and a save made
against an older version is refused — who changed it, when, their values beside yours — and
nothing is written; saving the refused form again replaces their change knowingly
(``models_app/edits.py``). Presets, the router settings, a node's settings and quotas."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.test import Client

from models_app.accounts.roles import Role
from models_app.models import AuditEvent, AuditKind, NodeSettings, Preset, Quota, RouterSettings
from tests.support.opened import opened, versions
from tests.support.panel import RouterStub, client_for, make_user
from tests.support.preset_form import form
from tests.support.settings_form import body

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


@pytest.fixture
def bea_client(db: None) -> Client:
    return client_for(make_user("bea", Role.ADMIN))


@pytest.fixture
def preset() -> Preset:
    return Preset.objects.create(name="demo", model_path="/m/demo.gguf")


def edit_url(preset: Preset) -> str:
    return f"/presets/{preset.pk}/edit/"


class TestPreset:
    def test_a_stale_save_is_refused_naming_who_and_showing_both_then_saved_knowingly(
        self, admin_client: Client, bea_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        url = edit_url(preset)
        ada_opened, bea_opened = opened(admin_client, url), opened(bea_client, url)
        saved = admin_client.post(url, form(name="demo", stop_timeout="5", ttl="300") | ada_opened)
        assert saved.status_code == 302

        refused = bea_client.post(url, form(name="demo", aliases_text="small") | bea_opened)
        assert refused.status_code == 200
        text = refused.content.decode()
        assert "demo was changed by ada at " in text and "after you opened this form" in text
        stale = refused.context["form"].stale
        rows = {label: (theirs, yours) for label, theirs, yours in stale.rows()}
        assert rows["Stop timeout"] == ("5", "—") and rows["Idle TTL"] == ("300", "—")
        assert rows["Aliases"] == ("—", "small")
        assert 'value="small"' in text  # what bea typed is kept on the page
        preset.refresh_from_db()
        assert (preset.stop_timeout, preset.ttl, preset.aliases) == (5, 300, [])  # ada's stand
        assert AuditEvent.objects.filter(kind=AuditKind.PRESET_CHANGED).count() == 1
        assert len(panel_router.of_kind("reload")) == 1  # only ada's save reached the router

        again = refused.context["form"]["seen_version"].value()  # the refused page's version
        body = form(name="demo", aliases_text="small") | {"seen_version": again}
        assert bea_client.post(url, body).status_code == 302
        preset.refresh_from_db()
        assert (preset.stop_timeout, preset.ttl, preset.aliases) == (None, None, ["small"])
        last = AuditEvent.objects.filter(kind=AuditKind.PRESET_CHANGED).latest("pk")
        assert last.actor == "user:bea" and last.details["changes"]["ttl"] == [300, None]

    def test_a_change_made_outside_the_panel_makes_the_form_stale_too(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        url = edit_url(preset)
        version = opened(admin_client, url)
        Preset.objects.filter(pk=preset.pk).update(ttl=60)  # a script, an import: no audit row
        refused = admin_client.post(url, form(name="demo", stop_timeout="9") | version)
        assert "demo was changed by someone after you opened this form" in (
            refused.content.decode()
        )
        assert Preset.objects.get().stop_timeout is None

    def test_a_write_of_fields_the_form_does_not_edit_leaves_it_current(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        url = edit_url(preset)
        version = opened(admin_client, url)
        # what the task does after a save: the GGUF facts and estimate, never edited in the form
        Preset.objects.filter(pk=preset.pk).update(gguf_estimate=1 << 30, gguf_facts={"n": 1})
        assert admin_client.post(url, form(name="demo", ttl="30") | version).status_code == 302
        assert Preset.objects.get().ttl == 30

    def test_a_save_without_a_version_is_refused_with_a_reason(
        self, admin_client: Client, panel_router: RouterStub, preset: Preset
    ) -> None:
        refused = admin_client.post(edit_url(preset), form(name="demo", ttl="30"))
        assert "This form was opened before saves were checked: reload it." in (
            refused.content.decode()
        )
        assert Preset.objects.get().ttl is None


@pytest.mark.django_db(transaction=True)
def test_two_saves_at_once_on_one_version_one_wins_and_one_is_told(
    admin: Any, panel_router: RouterStub
) -> None:
    preset = Preset.objects.create(name="demo", model_path="/m/demo.gguf")
    clients = [client_for(admin), client_for(make_user("bea", Role.ADMIN))]
    url = edit_url(preset)
    version = opened(clients[0], url)
    start, answers = threading.Barrier(2, timeout=30), [0, 0]

    def save(n: int) -> None:
        start.wait()
        body = form(name="demo", ttl=str(100 + n)) | version
        answers[n] = clients[n].post(url, body).status_code

    threads = [threading.Thread(target=save, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(answers) == [200, 302]  # one saved; the other was refused, not lost silently
    winner = answers.index(302)
    assert Preset.objects.get().ttl == 100 + winner
    assert AuditEvent.objects.filter(kind=AuditKind.PRESET_CHANGED).count() == 1


class TestSettings:
    def test_the_router_settings(
        self, admin_client: Client, bea_client: Client, panel_router: RouterStub
    ) -> None:
        stale_body = body(models_max="3")  # bea opens the form
        assert admin_client.post("/settings/", body(max_waiters="7")).status_code == 302
        refused = bea_client.post("/settings/", stale_body)
        text = refused.content.decode()
        assert "The router settings were changed by ada at " in text
        assert RouterSettings.load().models_max != 3 and RouterSettings.load().max_waiters == 7
        rows = {
            label: (theirs, yours) for label, theirs, yours in refused.context["form"].stale.rows()
        }
        assert rows["Max waiters"] == ("7", "—")

    def test_a_nodes_settings(
        self, admin_client: Client, bea_client: Client, panel_router: RouterStub
    ) -> None:
        NodeSettings.objects.create(node="studio-2", models_max=2)
        name = "node-studio-2-seen_version"
        seen = versions(bea_client, "/settings/")[name]

        def post(client: Client, version: str, models_max: str) -> str:
            data = {"node-studio-2-node": "studio-2", "node-studio-2-models_max": models_max,
                    "node-studio-2-memory_budget": "", "node-studio-2-settle_timeout": "",
                    name: version}  # fmt: skip
            return client.post("/settings/nodes/studio-2/", data, follow=True).content.decode()

        assert "Saved the settings of node studio-2" in post(admin_client, seen, "3")
        text = post(bea_client, seen, "1")
        assert "Node studio-2&#x27;s settings were changed by ada at " in text
        assert "Max running models: theirs 3, yours 1." in text
        assert NodeSettings.objects.get().models_max == 3


class TestQuota:
    def test_a_quota_changed_since_the_page_opened_is_not_overwritten(
        self, admin_client: Client, bea_client: Client, viewer: Any, operator: Any
    ) -> None:
        bea_page = opened(bea_client, "/usage/")
        body = {"subject": f"user:{viewer.pk}", "tokens_per_day": "5000"}
        admin_client.post("/usage/quotas/", body | opened(admin_client, "/usage/"))

        later = {"subject": f"user:{viewer.pk}", "requests_per_minute": "30"} | bea_page
        text = bea_client.post("/usage/quotas/", later, follow=True).content.decode()
        assert "The quota of user vera was changed by ada at " in text
        assert "Tokens per day: theirs 5000, yours —" in text
        quota = Quota.objects.get(user=viewer)
        assert (quota.tokens_per_day, quota.requests_per_minute) == (5000, None)

        other = {"subject": f"user:{operator.pk}", "requests_per_minute": "30"} | bea_page
        text = bea_client.post("/usage/quotas/", other, follow=True).content.decode()
        assert "Quota of user otto: 30 requests per minute." in text  # untouched since: saved

        removed = {"subject": f"user:{viewer.pk}"} | opened(bea_client, "/usage/")
        assert (
            "no quota" in bea_client.post("/usage/quotas/", removed, follow=True).content.decode()
        )
        assert not Quota.objects.filter(user=viewer).exists()  # a fresh page: saved


class TestDjangoAdmin:
    def test_a_stale_admin_form_is_refused_and_saving_it_again_replaces(
        self, panel_router: RouterStub
    ) -> None:
        from django.contrib.auth import get_user_model

        from tests.support.admin import FORM

        make = get_user_model().objects.create_superuser
        admin_client, bea_client = (client_for(make(n, password="x")) for n in ("root", "bea"))

        name = "org/tiny:Q8_0"
        assert (
            admin_client.post("/admin/models_app/preset/add/", {**FORM, "name": name}).status_code
            == 302
        )
        preset = Preset.objects.get()
        url = f"/admin/models_app/preset/{preset.pk}/change/"
        bea_opened = opened(bea_client, url)
        Preset.objects.filter(pk=preset.pk).update(ttl=300)  # changed meanwhile, elsewhere

        refused = bea_client.post(url, {**FORM, "name": name, "ttl": "5"} | bea_opened)
        assert refused.status_code == 200
        text = refused.content.decode()
        assert f"{name} was changed by someone after you opened this form" in text
        assert "Idle TTL: theirs 300, yours 5" in text
        assert Preset.objects.get().ttl == 300
        again = refused.context["adminform"].form["seen_version"].value()
        done = bea_client.post(url, {**FORM, "name": name, "ttl": "5", "seen_version": again})
        assert done.status_code == 302 and Preset.objects.get().ttl == 5
