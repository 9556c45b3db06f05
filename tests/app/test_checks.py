"""System checks report settings that parse but are wrong, under stable ids."""

from __future__ import annotations

import pytest
from django.test import override_settings

from models_app import checks


def ids(found: list) -> list[str]:  # type: ignore[type-arg]
    return [item.id for item in found]


def test_an_unsupported_database_engine_is_an_error() -> None:
    databases = {"default": {"ENGINE": "django.db.backends.mysql"}}
    with override_settings(DATABASES=databases):
        assert ids(checks.check_database()) == ["routerpanel.E001"]
    assert checks.check_database() == []


def test_a_redis_url_with_another_scheme_is_an_error() -> None:
    with override_settings(REDIS_URL="http://127.0.0.1:6379"):
        assert ids(checks.check_redis_url()) == ["routerpanel.E002"]
    with override_settings(REDIS_URL="redis://127.0.0.1:6379/0"):
        assert checks.check_redis_url() == []


def test_a_read_only_data_dir_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert checks.check_data_dir() == []
    # Tests may run as root, who can write anywhere: make the directory look read-only instead.
    monkeypatch.setattr(checks.os, "access", lambda path, mode: False)
    assert ids(checks.check_data_dir()) == ["routerpanel.E003"]


def test_a_missing_server_binary_is_a_warning() -> None:
    with override_settings(ROUTERPANEL={"SERVER_BIN": "no-such-llama-server --flag"}):
        assert ids(checks.check_server_bin()) == ["routerpanel.W001"]
    with override_settings(ROUTERPANEL={"SERVER_BIN": "python3 -m x"}):
        assert checks.check_server_bin() == []


def test_serve_server_bin_is_what_the_check_looks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from models_app import runtime

    monkeypatch.setattr(runtime.OPTIONS, "server_bin", "python3 -m routerpanel.router.simserver")
    with override_settings(ROUTERPANEL={"SERVER_BIN": "no-such-llama-server"}):
        assert checks.check_server_bin() == []


def test_debug_beyond_loopback_is_a_warning() -> None:
    with override_settings(DEBUG=True, ALLOWED_HOSTS=["0.0.0.0", "localhost"]):
        assert ids(checks.check_debug_exposure()) == ["routerpanel.W002"]
    with override_settings(DEBUG=True, ALLOWED_HOSTS=["localhost"]):
        assert checks.check_debug_exposure() == []


def test_a_short_secret_key_is_a_warning() -> None:
    with override_settings(SECRET_KEY="short"):
        assert ids(checks.check_secret_key()) == ["routerpanel.W003"]
