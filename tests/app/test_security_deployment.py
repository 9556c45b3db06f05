"""Deployment hygiene: HTTPS behind a proxy, HSTS, host names and origins (issue 13).

The settings are read from the environment once, at import, so the HTTPS wiring is checked in a
fresh interpreter per environment: there, a request that the proxy marks as HTTPS gets Secure
cookies and (when configured) HSTS, and one that it does not mark gets neither. A panel reached
under a host name it does not answer to says so instead of a bare 400 (the ``studio.local``
probe).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings

from models_app import checks

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, django
django.setup()
from django.conf import settings
from django.test import Client
client = Client()
plain = client.get("/login/")
https = Client().get("/login/", HTTP_X_FORWARDED_PROTO="https")
print(json.dumps({
    "proxy_header": settings.SECURE_PROXY_SSL_HEADER,
    "hsts_seconds": settings.SECURE_HSTS_SECONDS,
    "session_secure": settings.SESSION_COOKIE_SECURE,
    "plain_hsts": plain.headers.get("Strict-Transport-Security"),
    "plain_csrf_secure": bool(plain.cookies["csrftoken"]["secure"]),
    "https_hsts": https.headers.get("Strict-Transport-Security"),
    "https_csrf_secure": bool(https.cookies["csrftoken"]["secure"]),
}))
"""


def settings_under(tmp_path: Path, **env: str) -> dict[str, Any]:
    full = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ROUTERPANEL_")},
        "DJANGO_SETTINGS_MODULE": "routerpanel.settings",
        "ROUTERPANEL_DATA_DIR": str(tmp_path),
        "ALLOWED_HOSTS": "testserver",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_by_default_nothing_is_https_only(tmp_path: Path) -> None:
    found = settings_under(tmp_path)
    assert found["proxy_header"] is None and found["session_secure"] is False
    assert found["plain_csrf_secure"] is False and found["https_csrf_secure"] is False
    assert found["https_hsts"] is None  # the proxy's header is not trusted unless told so


def test_behind_https_cookies_are_secure_and_hsts_can_be_turned_on(tmp_path: Path) -> None:
    found = settings_under(
        tmp_path, ROUTERPANEL_BEHIND_HTTPS="true", ROUTERPANEL_HSTS_SECONDS="31536000"
    )
    assert found["proxy_header"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert found["session_secure"] is True
    assert found["https_csrf_secure"] is True and found["plain_csrf_secure"] is True
    assert found["https_hsts"] == "max-age=31536000"
    assert found["plain_hsts"] is None  # HSTS only on a request that arrived as HTTPS


def test_behind_https_without_hsts_sends_none(tmp_path: Path) -> None:
    found = settings_under(tmp_path, ROUTERPANEL_BEHIND_HTTPS="true")
    assert found["https_hsts"] is None and found["https_csrf_secure"] is True


def test_a_bad_value_stops_the_process_naming_the_variable(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ROUTERPANEL_DATA_DIR": str(tmp_path),
        "ROUTERPANEL_BEHIND_HTTPS": "yes please",
    }
    done = subprocess.run(
        [sys.executable, "-c", "import routerpanel.settings"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "ROUTERPANEL_BEHIND_HTTPS='yes please' is not a boolean" in done.stderr


@pytest.mark.django_db
class TestHostNames:
    def test_an_unknown_host_name_is_told_what_to_change(self) -> None:
        response = Client().get("/", HTTP_HOST="studio.local:8080")
        assert response.status_code == 400
        page = response.content.decode()
        assert "This panel does not answer to “studio.local”" in page
        assert "ALLOWED_HOSTS" in page and "CSRF_TRUSTED_ORIGINS" in page

    @override_settings(ALLOWED_HOSTS=["studio.local"])
    def test_a_host_name_in_allowed_hosts_is_served(self) -> None:
        response = Client().get("/", HTTP_HOST="studio.local")
        assert response.status_code == 302 and response["Location"].startswith("/login/")

    def test_a_markup_host_name_is_shown_escaped(self) -> None:
        response = Client().get("/", HTTP_HOST="<b>x</b>")
        assert response.status_code == 400
        assert b"<b>x</b>" not in response.content


class TestChecks:
    def test_hsts_without_https_is_a_warning(self) -> None:
        with override_settings(SECURE_HSTS_SECONDS=3600, BEHIND_HTTPS=False):
            assert [w.id for w in checks.check_hsts()] == ["routerpanel.W004"]
        with override_settings(SECURE_HSTS_SECONDS=3600, BEHIND_HTTPS=True):
            assert checks.check_hsts() == []

    def test_a_cors_entry_that_is_not_an_origin_is_a_warning(self) -> None:
        with override_settings(CORS_ALLOWED_ORIGINS=["chat.example.org", "https://x.org/"]):
            [warning] = checks.check_cors_origins()
            assert warning.id == "routerpanel.W005"
            assert "chat.example.org, https://x.org/" in warning.msg
        with override_settings(CORS_ALLOWED_ORIGINS=["https://chat.example.org:8443"]):
            assert checks.check_cors_origins() == []
