"""API keys and users in the panel: keys shown once, last use, revoke; admins see and manage
everyone's keys and the users' roles."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from models_app.accounts.roles import Role, role_of
from models_app.models import ApiKey, AuditEvent, AuditKind, hash_api_key
from tests.support.panel import make_user

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


class TestKeys:
    def test_a_new_key_is_shown_once_after_a_redirect_and_stored_hashed(
        self, viewer_client: Client
    ) -> None:
        response = viewer_client.post("/keys/", {"name": "laptop", "priority": "normal"})
        assert (response.status_code, response["Location"]) == (302, "/keys/")
        shown = viewer_client.get("/keys/")
        assert shown["Cache-Control"] == "no-store"
        secret = shown.context["created"][1]
        assert secret.startswith("rp-") and secret in shown.content.decode()
        key = ApiKey.objects.get()
        assert key.hash == hash_api_key(secret) and key.owner.username == "vera"
        again = viewer_client.get("/keys/").content.decode()  # a reload: neither shown nor issued
        assert secret not in again and f"{key.prefix}…" in again and "never" in again
        assert ApiKey.objects.count() == 1

    def test_the_form_sets_the_keys_scope(self, viewer_client: Client) -> None:
        fields = {"name": "batch", "models": " qwen*,, llama-3* ", "max_concurrent": "2"}
        viewer_client.post("/keys/", fields | {"priority": "low"})
        key = ApiKey.objects.get()
        assert (key.model_patterns, key.max_concurrent, key.priority) == (
            "qwen*, llama-3*",
            2,
            "low",
        )
        text = viewer_client.get("/keys/").content.decode()
        assert "<code>qwen*</code>, <code>llama-3*</code>" in text
        assert "at most 2 at once · low priority" in text

    def test_the_form_and_the_scope_page_set_queue_comments(self, viewer_client: Client) -> None:
        """Issue 17.7: a checkbox; the key list says so; a change is audited."""
        fields = {"name": "watch", "priority": "normal", "queue_comments": "on"}
        viewer_client.post("/keys/", fields)
        key = ApiKey.objects.get()
        assert key.queue_comments
        assert "normal priority · queue comments" in viewer_client.get("/keys/").content.decode()
        page = viewer_client.get(f"/keys/{key.pk}/scope/").content.decode()
        assert re.search(r'<input type="checkbox" name="queue_comments"[^>]* checked>', page)
        viewer_client.post(f"/keys/{key.pk}/scope/", {"priority": "normal"})  # unticked
        assert not ApiKey.objects.get().queue_comments
        rescoped = AuditEvent.objects.get(kind=AuditKind.KEY_RESCOPED)
        assert rescoped.details["changes"] == {"queue_comments": [True, False]}

    def test_bad_scope_values_are_field_errors_and_nothing_is_issued(
        self, viewer_client: Client
    ) -> None:
        fields = {"name": "x", "models": "qwen 7b", "max_concurrent": "0", "priority": "urgent"}
        response = viewer_client.post("/keys/", fields)
        assert response.status_code == 200
        errors = response.context["form"].errors
        assert set(errors) == {"models", "max_concurrent", "priority"}
        assert not ApiKey.objects.exists()

    def test_a_name_in_use_is_a_field_error(self, viewer_client: Client, viewer: object) -> None:
        ApiKey.objects.issue(viewer, "laptop")
        response = viewer_client.post("/keys/", {"name": "laptop"})
        assert response.status_code == 200
        assert "already has an active key named" in response.content.decode()

    def test_last_use_shows_and_a_user_sees_and_revokes_only_their_own(
        self, viewer_client: Client, viewer: object
    ) -> None:
        mine, _ = ApiKey.objects.issue(viewer, "mine")
        ApiKey.objects.filter(pk=mine.pk).update(last_used_at=timezone.now())
        theirs, _ = ApiKey.objects.issue(make_user("bob", Role.VIEWER), "theirs")
        text = viewer_client.get("/keys/").content.decode()
        assert "mine" in text and "theirs" not in text and "never" not in text
        assert viewer_client.get(f"/keys/{theirs.pk}/revoke/").status_code == 403
        assert viewer_client.post(f"/keys/{theirs.pk}/revoke/").status_code == 403
        assert not ApiKey.objects.get(pk=theirs.pk).revoked
        assert viewer_client.post(f"/keys/{mine.pk}/revoke/").status_code == 302
        assert ApiKey.objects.get(pk=mine.pk).revoked

    def test_revoking_asks_first_on_a_page_of_its_own(
        self, viewer_client: Client, viewer: object
    ) -> None:
        key, _ = ApiKey.objects.issue(viewer, "laptop")
        listing = viewer_client.get("/keys/").content.decode()
        assert f'href="/keys/{key.pk}/revoke/"' in listing  # a link: no POST from the list
        page = viewer_client.get(f"/keys/{key.pk}/revoke/")
        text = page.content.decode()
        assert page.status_code == 200 and "Revoke the key “laptop”?" in text
        assert 'method="post"' in text and f"{key.prefix}…" in text
        assert not ApiKey.objects.get(pk=key.pk).revoked  # asking changes nothing
        done = viewer_client.post(f"/keys/{key.pk}/revoke/", follow=True)
        assert "Revoked laptop" in done.content.decode()
        assert ApiKey.objects.get(pk=key.pk).revoked

    def test_admins_see_everyones_keys_and_issue_and_revoke_for_others(
        self, admin_client: Client
    ) -> None:
        bob = make_user("bob", Role.VIEWER)
        theirs, _ = ApiKey.objects.issue(bob, "theirs")
        text = admin_client.get("/keys/").content.decode()
        assert "theirs" in text and '<th scope="col">Owner</th>' in text
        response = admin_client.post(
            "/keys/", {"name": "ci", "owner": bob.pk, "priority": "normal"}
        )
        assert response.status_code == 302
        assert bob.api_keys.filter(name="ci").exists()
        assert admin_client.post(f"/keys/{theirs.pk}/revoke/").status_code == 302
        assert ApiKey.objects.get(pk=theirs.pk).revoked

    def test_only_admins_give_a_key_high_priority(
        self, viewer_client: Client, admin_client: Client
    ) -> None:
        refused = viewer_client.post("/keys/", {"name": "mine", "priority": "high"})
        assert "priority" in refused.context["form"].errors
        assert 'value="high"' not in viewer_client.get("/keys/").content.decode()
        admin_client.post("/keys/", {"name": "urgent", "priority": "high"})
        assert list(ApiKey.objects.values_list("name", "priority")) == [("urgent", "high")]

    def test_the_owner_changes_a_keys_scope_and_the_secret_stays(
        self, viewer_client: Client, viewer: object
    ) -> None:
        key, secret = ApiKey.objects.issue(viewer, "laptop")
        listing = viewer_client.get("/keys/").content.decode()
        assert f'href="/keys/{key.pk}/scope/"' in listing
        page = viewer_client.get(f"/keys/{key.pk}/scope/").content.decode()
        assert "Scope of the key “laptop”" in page and 'value="high"' not in page
        fields = {"models": "demo-*", "max_concurrent": "3", "priority": "low"}
        done = viewer_client.post(f"/keys/{key.pk}/scope/", fields, follow=True)
        assert "Saved laptop: models demo-*; at most 3 at once; priority low." in (
            done.content.decode()
        )
        key.refresh_from_db()
        assert (key.model_patterns, key.max_concurrent, key.priority) == ("demo-*", 3, "low")
        assert key.hash == hash_api_key(secret)
        viewer_client.post(f"/keys/{key.pk}/scope/", {"models": "", "priority": "normal"})
        key.refresh_from_db()
        assert (key.patterns, key.max_concurrent) == ((), None)

    def test_a_user_may_keep_the_high_priority_an_admin_gave_but_not_take_it(
        self, viewer_client: Client, viewer: object
    ) -> None:
        given, _ = ApiKey.objects.issue(viewer, "given", priority="high")
        mine, _ = ApiKey.objects.issue(viewer, "mine")
        kept = viewer_client.post(f"/keys/{given.pk}/scope/", {"priority": "high"})
        assert kept.status_code == 302
        taken = viewer_client.post(f"/keys/{mine.pk}/scope/", {"priority": "high"})
        assert "priority" in taken.context["form"].errors
        assert ApiKey.objects.get(pk=mine.pk).priority == "normal"

    def test_others_keys_and_revoked_keys_cannot_be_rescoped(
        self, viewer_client: Client, viewer: object, admin_client: Client
    ) -> None:
        theirs, _ = ApiKey.objects.issue(make_user("bob", Role.VIEWER), "theirs")
        assert viewer_client.get(f"/keys/{theirs.pk}/scope/").status_code == 403
        done = admin_client.post(f"/keys/{theirs.pk}/scope/", {"priority": "high"})
        assert done.status_code == 302 and ApiKey.objects.get(pk=theirs.pk).priority == "high"
        old, _ = ApiKey.objects.issue(viewer, "old")
        old.revoke()
        assert viewer_client.get(f"/keys/{old.pk}/scope/").status_code == 404

    def test_creating_rescoping_and_revoking_a_key_are_audited_with_who_did_it(
        self, viewer_client: Client, viewer: object
    ) -> None:
        viewer_client.post("/keys/", {"name": "laptop", "priority": "normal"})
        key = ApiKey.objects.get()
        created = AuditEvent.objects.get(kind=AuditKind.KEY_CREATED)
        assert (created.actor, created.details["key"]) == ("user:vera", "key:vera/laptop")
        fields = {"models": "demo-*", "max_concurrent": "2", "priority": "normal"}
        viewer_client.post(f"/keys/{key.pk}/scope/", fields)
        viewer_client.post(f"/keys/{key.pk}/scope/", fields)  # the same again: no second row
        rescoped = AuditEvent.objects.get(kind=AuditKind.KEY_RESCOPED)
        assert rescoped.details["changes"] == {
            "max_concurrent": [None, 2],
            "models": ["all", "demo-*"],
        }
        assert rescoped.reason == "key:vera/laptop: max_concurrent, models"
        viewer_client.post(f"/keys/{key.pk}/revoke/")
        viewer_client.post(f"/keys/{key.pk}/revoke/")  # twice: revoked once
        revoked = AuditEvent.objects.get(kind=AuditKind.KEY_REVOKED)
        assert (revoked.actor, revoked.details["prefix"]) == ("user:vera", key.prefix)

    def test_a_viewer_cannot_issue_a_key_for_someone_else(self, viewer_client: Client) -> None:
        bob = make_user("bob", Role.VIEWER)
        viewer_client.post("/keys/", {"name": "sneaky", "owner": bob.pk, "priority": "normal"})
        assert ApiKey.objects.get().owner.username == "vera"


class TestUsers:
    def test_an_admin_creates_a_user_with_a_role_and_changes_it(self, admin_client: Client) -> None:
        response = admin_client.post(
            "/users/", {"username": "carol", "password": "a-long-pass-phrase-9", "role": "operator"}
        )
        assert response.status_code == 302
        carol = get_user_model().objects.get(username="carol")
        assert role_of(carol) is Role.OPERATOR and carol.check_password("a-long-pass-phrase-9")
        admin_client.post(f"/users/{carol.pk}/role/", {"role": "none"})
        assert role_of(get_user_model().objects.get(pk=carol.pk)) is Role.NONE

    def test_a_weak_password_and_a_taken_name_are_field_errors(self, admin_client: Client) -> None:
        response = admin_client.post(
            "/users/", {"username": "ada", "password": "123", "role": "viewer"}
        )
        text = response.content.decode()
        assert response.status_code == 200
        assert "That user name is taken." in text and "This password is too short." in text

    def test_an_admin_cannot_change_their_own_role(
        self, admin_client: Client, admin: object
    ) -> None:
        response = admin_client.post(f"/users/{admin.pk}/role/", {"role": "viewer"}, follow=True)
        assert "You cannot change your own role" in response.content.decode()
        assert role_of(get_user_model().objects.get(pk=admin.pk)) is Role.ADMIN
