"""System checks report settings that parse but are wrong, under stable ids."""

from __future__ import annotations

import pytest
from django.test import override_settings

from models_app import checks
from models_app.models import Preset, RouterSettings


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


@pytest.mark.django_db
class TestMissingServerBinary:
    """W001: only when a preset would run the default binary and it is not on PATH."""

    MISSING = {"SERVER_BIN": "no-such-llama-server --flag"}

    def test_a_preset_that_runs_the_missing_default_is_a_warning(self) -> None:
        Preset.objects.create(name="uses-default")
        with override_settings(ROUTERPANEL=self.MISSING):
            found = checks.check_server_bin()
        assert ids(found) == ["routerpanel.W001"]
        assert "'no-such-llama-server'" in found[0].msg and "uses-default" in found[0].msg

    def test_no_preset_means_no_warning(self) -> None:
        with override_settings(ROUTERPANEL=self.MISSING):
            assert checks.check_server_bin() == []

    def test_presets_with_their_own_server_bin_do_not_need_the_default(self) -> None:
        Preset.objects.create(name="own", server_bin="python3 -m routerpanel.router.simserver")
        Preset.objects.create(name="off", enabled=False)
        with override_settings(ROUTERPANEL=self.MISSING):
            assert checks.check_server_bin() == []

    def test_a_server_bin_in_the_global_section_covers_every_preset(self) -> None:
        Preset.objects.create(name="inherits")
        row = RouterSettings.load()
        row.server_binary = "no-such-llama-server"
        row.save()
        with override_settings(ROUTERPANEL=self.MISSING):
            assert ids(checks.check_server_bin()) == ["routerpanel.W001"]
            row.global_args = [["server-bin", "python3 -m routerpanel.router.simserver"]]
            row.save()
            assert checks.check_server_bin() == []

    def test_the_stored_server_binary_is_the_default(self) -> None:
        Preset.objects.create(name="uses-default")
        row = RouterSettings.load()
        row.server_binary = "python3 -m x"
        row.save()
        with override_settings(ROUTERPANEL=self.MISSING):
            assert checks.check_server_bin() == []

    def test_serve_server_bin_is_what_the_check_looks_for(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from models_app import runtime

        Preset.objects.create(name="uses-default")
        RouterSettings.objects.update_or_create(pk=1, defaults={"server_binary": "nope-bin"})
        assert ids(checks.check_server_bin()) == ["routerpanel.W001"]
        sim = "python3 -m routerpanel.router.simserver"
        monkeypatch.setattr(runtime, "_started", runtime.Runtime(server_bin=sim))
        assert checks.check_server_bin() == []


def test_debug_beyond_loopback_is_a_warning() -> None:
    with override_settings(DEBUG=True, ALLOWED_HOSTS=["0.0.0.0", "localhost"]):
        assert ids(checks.check_debug_exposure()) == ["routerpanel.W002"]
    with override_settings(DEBUG=True, ALLOWED_HOSTS=["localhost"]):
        assert checks.check_debug_exposure() == []


def test_a_short_secret_key_is_a_warning() -> None:
    with override_settings(SECRET_KEY="short"):
        assert ids(checks.check_secret_key()) == ["routerpanel.W003"]
