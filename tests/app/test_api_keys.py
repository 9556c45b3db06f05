"""Users' API keys: stored hashed, shown once (management command and admin), revocable."""

from __future__ import annotations

import hashlib
import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.test import Client

from models_app.models import ApiKey, AuditEvent, AuditKind, hash_api_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> object:
    return get_user_model().objects.create_user("alice", password="pw-for-tests-only")


@pytest.fixture
def admin_client() -> Client:
    user = get_user_model().objects.create_superuser("admin", "", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


class TestApiKeyModel:
    def test_issuing_stores_only_a_hash_and_a_prefix(self, alice: object) -> None:
        key, secret = ApiKey.objects.issue(alice, "laptop")
        assert secret.startswith("rp-") and len(secret) > 40
        key.refresh_from_db()
        assert key.hash == hashlib.sha256(secret.encode()).hexdigest() == hash_api_key(secret)
        assert key.prefix == secret[:10]
        assert secret not in {str(v) for v in ApiKey.objects.values().get(pk=key.pk).values()}
        assert key.actor == "key:alice/laptop"

    def test_two_keys_never_share_a_secret(self, alice: object) -> None:
        secrets = {ApiKey.objects.issue(alice, f"k{n}")[1] for n in range(5)}
        assert len(secrets) == 5

    def test_an_active_name_is_unique_per_owner_until_revoked(self, alice: object) -> None:
        key, _ = ApiKey.objects.issue(alice, "laptop")
        with pytest.raises(IntegrityError), transaction.atomic():
            ApiKey.objects.issue(alice, "laptop")
        key.revoke()
        assert key.revoked and ApiKey.objects.active().count() == 0
        ApiKey.objects.issue(alice, "laptop")
        assert ApiKey.objects.active().count() == 1


class TestCreateApiKeyCommand:
    def test_it_prints_the_key_once_and_stores_its_hash(self, alice: object) -> None:
        out, err = StringIO(), StringIO()
        call_command("create_api_key", "alice", "ci", stdout=out, stderr=err)
        secret = out.getvalue().strip()
        assert "\n" not in secret
        key = ApiKey.objects.get()
        assert (key.name, key.hash) == ("ci", hash_api_key(secret))
        assert "not be shown again" in err.getvalue()
        assert secret not in err.getvalue()
        row = AuditEvent.objects.get(kind=AuditKind.KEY_CREATED)
        assert (row.actor, row.reason) == (
            "cli:create_api_key",
            "key:alice/ci (models all; no limit; priority normal)",
        )
        assert row.details["prefix"] == key.prefix
        assert secret not in json.dumps(row.details) and key.hash not in json.dumps(row.details)

    def test_it_refuses_an_unknown_user_and_a_taken_name(self, alice: object) -> None:
        with pytest.raises(CommandError, match="no user named 'bob'"):
            call_command("create_api_key", "bob", "ci", stdout=StringIO(), stderr=StringIO())
        call_command("create_api_key", "alice", "ci", stdout=StringIO(), stderr=StringIO())
        with pytest.raises(CommandError, match="already has an active key"):
            call_command("create_api_key", "alice", "ci", stdout=StringIO(), stderr=StringIO())
        assert AuditEvent.objects.filter(kind=AuditKind.KEY_CREATED).count() == 1  # not refused


class TestApiKeyAdmin:
    def test_adding_a_key_shows_it_once_and_never_the_hash(
        self, admin_client: Client, alice: object
    ) -> None:
        form = admin_client.get("/admin/models_app/apikey/add/").content.decode()
        assert 'name="hash"' not in form
        assert 'name="model_patterns"' in form and 'name="max_concurrent"' in form
        fields = {"owner": alice.pk, "name": "laptop", "priority": "normal"}  # as the form posts
        response = admin_client.post("/admin/models_app/apikey/add/", fields, follow=True)
        assert response.status_code == 200
        key = ApiKey.objects.get()
        shown = [str(m) for m in response.context["messages"]]
        secret = next(word for m in shown for word in m.split() if word.startswith("rp-"))
        assert hash_api_key(secret) == key.hash
        for page in (
            "/admin/models_app/apikey/",
            f"/admin/models_app/apikey/{key.pk}/change/",
        ):
            html = admin_client.get(page).content.decode()
            assert key.hash not in html and secret not in html
            assert key.prefix in html

    def test_the_revoke_action_revokes(self, admin_client: Client, alice: object) -> None:
        key, _ = ApiKey.objects.issue(alice, "laptop")
        response = admin_client.post(
            "/admin/models_app/apikey/",
            {"action": "revoke", "_selected_action": [key.pk]},
            follow=True,
        )
        assert response.status_code == 200
        key.refresh_from_db()
        assert key.revoked_at is not None


class TestScopedKeyCommand:
    def test_it_stores_the_scope_given_on_the_command_line(self, alice: object) -> None:
        err = StringIO()
        call_command(
            "create_api_key", "alice", "batch", "--models", "qwen*, llama-3*,,",
            "--max-concurrent", "2", "--priority", "low", stdout=StringIO(), stderr=err,
        )  # fmt: skip
        key = ApiKey.objects.get()
        assert key.patterns == ("qwen*", "llama-3*") and key.model_patterns == "qwen*, llama-3*"
        assert (key.max_concurrent, key.priority) == (2, "low")
        assert "models qwen*, llama-3*; at most 2 at once; priority low" in err.getvalue()

    def test_without_options_a_key_may_use_everything(self, alice: object) -> None:
        call_command("create_api_key", "alice", "ci", stdout=StringIO(), stderr=StringIO())
        key = ApiKey.objects.get()
        assert (key.patterns, key.max_concurrent, key.priority) == ((), None, "normal")
        assert not key.queue_comments

    def test_queue_comments_are_asked_for_on_the_command_line(self, alice: object) -> None:
        """Issue 17.7: the key's streams get the queue position as SSE comments."""
        err = StringIO()
        call_command(
            "create_api_key", "alice", "watch", "--queue-comments", stdout=StringIO(), stderr=err
        )
        assert ApiKey.objects.get().queue_comments
        assert "priority normal; queue comments)" in err.getvalue()
        row = AuditEvent.objects.get(kind=AuditKind.KEY_CREATED)
        assert row.details["queue_comments"] is True

    @pytest.mark.parametrize(
        ("option", "value", "message"),
        [
            ("--max-concurrent", "0", "whole number of at least 1"),
            ("--max-concurrent", "lots", "whole number of at least 1"),
            ("--priority", "urgent", "invalid choice"),
        ],
    )
    def test_bad_values_are_refused_before_anything_is_stored(
        self, alice: object, option: str, value: str, message: str
    ) -> None:
        with pytest.raises(CommandError, match=message):
            call_command("create_api_key", "alice", "ci", option, value, stdout=StringIO())
        assert not ApiKey.objects.exists()

    def test_a_pattern_with_a_space_is_refused(self, alice: object) -> None:
        with pytest.raises(CommandError, match="contains a space"):
            call_command("create_api_key", "alice", "ci", "--models", "qwen 7b", stdout=StringIO())
        assert not ApiKey.objects.exists()


class TestKeyTableFromTheDatabase:
    def test_it_carries_each_keys_scope_and_every_presets_names(self, alice: object) -> None:
        from models_app.api.auth import Caller, digest, load_from_database
        from models_app.models import Preset

        Preset.objects.create(name="qwen-7b", aliases=["fast", "q7"])
        _, secret = ApiKey.objects.issue(
            alice, "batch", model_patterns="qwen*", max_concurrent=3, priority="high"
        )
        table = load_from_database()
        assert table.keys[digest(secret)] == Caller(
            "key:alice/batch", ApiKey.objects.get().pk, ("qwen*",), 3, "high"
        )
        assert table.names["q7"] == table.names["qwen-7b"] == ("qwen-7b", "fast", "q7")
