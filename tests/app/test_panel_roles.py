"""Roles are enforced on every panel view and form POST, not only by hiding buttons."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client

from models_app.accounts.roles import Role, ensure_groups, role_of, set_role
from models_app.models import ApiKey, AuditEvent, AuditKind, Preset
from tests.support.panel import PASSWORD, RouterStub, client_for, make_user, model_row

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


@pytest.fixture
def preset() -> Preset:
    return Preset.objects.create(name="demo-small", model_path="/models/small.gguf")


@pytest.fixture
def event() -> AuditEvent:
    return AuditEvent.objects.record(AuditKind.EVICTION, model="demo-small", actor="user:x")


def pages(preset: Preset, event: AuditEvent) -> dict[str, Role]:
    """Every GET page and the least role that may open it."""
    return {
        "/": Role.VIEWER,
        "/presets/": Role.VIEWER,
        f"/presets/{preset.pk}/": Role.VIEWER,
        "/presets/export/": Role.VIEWER,
        "/presets/export/?llama=1": Role.VIEWER,
        "/audit/": Role.VIEWER,
        "/audit/?format=csv": Role.VIEWER,
        "/audit/?format=json": Role.VIEWER,
        f"/audit/{event.pk}/": Role.VIEWER,
        "/logs/demo-small/": Role.VIEWER,
        "/logs/demo-small.log": Role.VIEWER,
        "/settings/": Role.VIEWER,
        "/keys/": Role.VIEWER,
        "/memory/history/?range=24h": Role.VIEWER,
        "/presets/new/": Role.ADMIN,
        f"/presets/{preset.pk}/edit/": Role.ADMIN,
        f"/presets/{preset.pk}/clone/": Role.ADMIN,
        f"/presets/{preset.pk}/delete/": Role.ADMIN,
        "/presets/import/": Role.ADMIN,
        "/users/": Role.ADMIN,
    }


def posts(preset: Preset, other_key: ApiKey) -> dict[str, tuple[dict[str, Any], Role]]:
    """Every form POST, a body that would succeed, and the least role that may send it."""
    return {
        "/actions/model/": ({"action": "load", "model": "demo-small"}, Role.OPERATOR),
        "/presets/new/": ({"name": "x"}, Role.ADMIN),
        f"/presets/{preset.pk}/edit/": ({"name": "demo-small"}, Role.ADMIN),
        f"/presets/{preset.pk}/clone/": ({"name": "y"}, Role.ADMIN),
        f"/presets/{preset.pk}/delete/": ({}, Role.ADMIN),
        "/presets/import/": ({"text": "[m]\nctx-size = 1\n", "apply": "1"}, Role.ADMIN),
        "/settings/": ({"models_max": "1"}, Role.ADMIN),
        "/users/": ({"username": "new", "password": "x", "role": "admin"}, Role.ADMIN),
        f"/users/{other_key.owner_id}/role/": ({"role": "admin"}, Role.ADMIN),
        f"/keys/{other_key.pk}/revoke/": ({}, Role.ADMIN),
        f"/keys/{other_key.pk}/scope/": ({"models": "x", "priority": "low"}, Role.ADMIN),
    }


class TestGroups:
    def test_the_role_groups_exist_after_migrate_and_creating_them_again_changes_nothing(
        self,
    ) -> None:
        assert set(Group.objects.values_list("name", flat=True)) >= {"viewer", "operator", "admin"}
        ensure_groups()
        call_command("migrate", verbosity=0)
        assert Group.objects.filter(name__in=["viewer", "operator", "admin"]).count() == 3

    def test_a_superuser_is_an_admin_and_a_user_without_a_group_has_no_role(self) -> None:
        boss = get_user_model().objects.create_superuser("boss", "", PASSWORD)
        nobody = get_user_model().objects.create_user("nobody", password=PASSWORD)
        assert role_of(boss) is Role.ADMIN
        assert role_of(nobody) is Role.NONE

    def test_the_highest_group_wins(self) -> None:
        user = make_user("both", Role.VIEWER)
        user.groups.add(Group.objects.get(name="operator"))
        assert role_of(get_user_model().objects.get(pk=user.pk)) is Role.OPERATOR
        set_role(user, Role.NONE)
        assert role_of(get_user_model().objects.get(pk=user.pk)) is Role.NONE


class TestPages:
    def test_anonymous_visitors_are_sent_to_the_panels_sign_in_page(
        self, panel_router: RouterStub, preset: Preset, event: AuditEvent
    ) -> None:
        for url in pages(preset, event):
            response = Client().get(url)
            assert response.status_code == 302, url
            assert response["Location"].startswith("/login/?next="), url

    @pytest.mark.parametrize(
        "role", [Role.NONE, Role.VIEWER, Role.OPERATOR, Role.ADMIN], ids=lambda r: r.label
    )
    def test_each_page_opens_for_its_role_and_above_only(
        self, role: Role, panel_router: RouterStub, preset: Preset, event: AuditEvent
    ) -> None:
        panel_router.models = [model_row("demo-small", "loaded")]
        client = client_for(make_user(f"user-{role.label}", role))
        for url, needed in pages(preset, event).items():
            response = client.get(url)
            expected = 200 if role >= needed else 403
            assert response.status_code == expected, (url, role, response.status_code)

    def test_the_sign_in_page_signs_in_and_lands_on_the_dashboard(
        self, panel_router: RouterStub
    ) -> None:
        make_user("vera", Role.VIEWER)
        client = Client(enforce_csrf_checks=True)
        page = client.get("/login/")
        token = page.cookies["csrftoken"].value
        response = client.post(
            "/login/", {"username": "vera", "password": PASSWORD, "csrfmiddlewaretoken": token}
        )
        assert response.status_code == 302 and response["Location"] == "/"
        assert client.get("/").status_code == 200


class TestForgedPosts:
    @pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR], ids=lambda r: r.label)
    def test_a_post_above_the_users_role_is_refused_and_changes_nothing(
        self, role: Role, panel_router: RouterStub, preset: Preset
    ) -> None:
        owner = make_user("someone", Role.VIEWER)
        other_key, _ = ApiKey.objects.issue(owner, "laptop")
        client = client_for(make_user(f"forger-{role.label}", role))
        before = (list(Preset.objects.values()), AuditEvent.objects.count())
        for url, (body, needed) in posts(preset, other_key).items():
            if role >= needed:
                continue
            response = client.post(url, body)
            assert response.status_code == 403, (url, role, response.status_code)
        assert (list(Preset.objects.values()), AuditEvent.objects.count()) == before
        assert not panel_router.of_kind("load") and not panel_router.of_kind("reload")
        assert not ApiKey.objects.get(pk=other_key.pk).revoked
        assert not get_user_model().objects.filter(username="new").exists()

    def test_a_viewers_forged_load_never_reaches_the_router(self, panel_router: RouterStub) -> None:
        client = client_for(make_user("vera", Role.VIEWER))
        response = client.post("/actions/model/", {"action": "load", "model": "demo-small"})
        assert response.status_code == 403
        assert panel_router.calls == []

    def test_an_operator_may_load_from_the_form(self, panel_router: RouterStub) -> None:
        client = client_for(make_user("otto", Role.OPERATOR))
        response = client.post("/actions/model/", {"action": "load", "model": "demo-small"})
        assert response.status_code == 302
        assert panel_router.of_kind("load") == [{"model": "demo-small", "actor": "user:otto"}]

    def test_a_viewers_forged_cancel_never_reaches_the_router(
        self, panel_router: RouterStub
    ) -> None:
        client = client_for(make_user("vera", Role.VIEWER))
        body = {"action": "cancel", "model": "demo-small", "request_id": "r1"}
        assert client.post("/actions/model/", body).status_code == 403
        assert panel_router.calls == []

    def test_an_operator_cancels_one_queued_request_or_all_from_the_form(
        self, panel_router: RouterStub
    ) -> None:
        client = client_for(make_user("otto", Role.OPERATOR))
        one = {"action": "cancel", "model": "demo-small", "request_id": "r1"}
        assert client.post("/actions/model/", one).status_code == 302
        assert client.post("/actions/model/", {"action": "cancel", "model": "m"}).status_code == 302
        assert panel_router.of_kind("cancel_queued") == [
            {"queued_request": "r1", "actor": "user:otto"},
            {"model": "m", "actor": "user:otto"},
        ]

    def test_every_form_needs_its_csrf_token(
        self, panel_router: RouterStub, preset: Preset
    ) -> None:
        owner = make_user("someone", Role.VIEWER)
        other_key, _ = ApiKey.objects.issue(owner, "laptop")
        admin = get_user_model().objects.create_superuser("root", "", PASSWORD)
        client = client_for(admin, csrf=True)
        for url, (body, _) in posts(preset, other_key).items():
            response = client.post(url, body)
            assert response.status_code == 403, url
            assert b"CSRF" in response.content, url
        client.post("/logout/")  # no token: refused too
        assert client.get("/").status_code == 200
        assert all(kind == "snapshot" for kind, _ in panel_router.calls)

    def test_a_deactivated_user_loses_the_panel(self, panel_router: RouterStub) -> None:
        user = make_user("gone", Role.ADMIN)
        client = client_for(user)
        user.is_active = False
        user.save()
        assert client.get("/").status_code == 302
