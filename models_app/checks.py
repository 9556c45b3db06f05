"""System checks for settings that parse but are wrong (STYLE 11). Ids are stable: never reuse one.

routerpanel.E001  DATABASE_URL names an engine other than PostgreSQL or SQLite
routerpanel.E002  REDIS_URL is not a redis://, rediss:// or unix:// URL
routerpanel.E003  the data directory is not writable
routerpanel.W001  the default server binary is not on PATH
routerpanel.W002  DEBUG is on while the panel listens beyond loopback
routerpanel.W003  SECRET_KEY is shorter than 32 characters
routerpanel.W004  ROUTERPANEL_HSTS_SECONDS is set but ROUTERPANEL_BEHIND_HTTPS is not
routerpanel.W005  a CORS_ALLOWED_ORIGINS entry is not an origin (scheme://host[:port])
"""

from __future__ import annotations

import os
import shlex
import shutil
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Warning, register

SUPPORTED_ENGINES = ("django.db.backends.postgresql", "django.db.backends.sqlite3")
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}


@register()
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    engine = settings.DATABASES["default"]["ENGINE"]
    if engine not in SUPPORTED_ENGINES:
        return [
            Error(
                f"DATABASE_URL selects {engine}; RouterPanel supports PostgreSQL and SQLite.",
                hint="Use postgres://user@host:5432/db, or unset DATABASE_URL for SQLite.",
                id="routerpanel.E001",
            )
        ]
    return []


@register()
def check_redis_url(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    url = settings.REDIS_URL
    if url and urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        return [
            Error(
                f"REDIS_URL={url!r} is not a redis://, rediss:// or unix:// URL.",
                hint="For example redis://127.0.0.1:6379/0; unset it for embedded mode.",
                id="routerpanel.E002",
            )
        ]
    return []


@register()
def check_data_dir(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    if not os.access(settings.DATA_DIR, os.W_OK):
        return [
            Error(
                f"The data directory {settings.DATA_DIR} is not writable.",
                hint="Set ROUTERPANEL_DATA_DIR (or serve --data-dir) to a writable directory.",
                id="routerpanel.E003",
            )
        ]
    return []


@register()
def check_server_bin(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    """W001 when the default server binary is missing and a stored preset would run it.

    Presets with a server-bin of their own, or under a ``[*]`` that names one, never run the
    default, so a missing ``llama-server`` matters only to the others. Before the database
    exists (first start) there is nothing to run yet, and ``serve`` says what it will do.
    """
    users, command = _presets_running_the_default()
    if not users:
        return []
    try:
        program = shlex.split(command)[0]
    except (ValueError, IndexError):
        program = command
    if shutil.which(program) is None:
        shown = ", ".join(users[:3]) + (f" and {len(users) - 3} more" if len(users) > 3 else "")
        return [
            Warning(
                f"The server binary {program!r} is not on PATH; presets {shown} run it.",
                hint="Set ROUTERPANEL_SERVER_BIN, pass serve --server-bin, or give those presets "
                "a server-bin (in [*] for all of them).",
                id="routerpanel.W001",
            )
        ]
    return []


def _presets_running_the_default() -> tuple[list[str], str]:
    """Return the enabled presets the default binary runs, and that binary's command.

    Read-only (a check must not write), and ([], "") while the database has no tables yet.
    """
    from django.db import DatabaseError, connection

    from models_app import runtime
    from models_app.models import Preset, RouterSettings

    try:
        if Preset._meta.db_table not in connection.introspection.table_names():
            return [], ""
        row = RouterSettings.objects.filter(pk=1).first()
        command = runtime.current().server_bin or (
            row.server_binary if row is not None else settings.ROUTERPANEL["SERVER_BIN"]
        )
        global_def = row.global_def() if row is not None else None
        if global_def is not None and global_def.server_bin:
            return [], command
        rows = Preset.objects.filter(enabled=True, server_bin="").order_by("name")
        return list(rows.values_list("name", flat=True)), command
    except (DatabaseError, ValueError):
        return [], ""


@register()
def check_debug_exposure(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if settings.DEBUG and set(settings.ALLOWED_HOSTS) - LOOPBACK_HOSTS:
        return [
            Warning(
                "DEBUG is on and ALLOWED_HOSTS reaches beyond loopback: tracebacks will leak.",
                hint="Set DEBUG=false for a team deployment.",
                id="routerpanel.W002",
            )
        ]
    return []


@register()
def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if len(settings.SECRET_KEY) < 32:
        return [
            Warning(
                "SECRET_KEY is shorter than 32 characters.",
                hint="Unset SECRET_KEY to use a generated one, or set a long random value.",
                id="routerpanel.W003",
            )
        ]
    return []


@register()
def check_hsts(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    if settings.SECURE_HSTS_SECONDS and not settings.BEHIND_HTTPS:
        return [
            Warning(
                "ROUTERPANEL_HSTS_SECONDS is set, but no request counts as HTTPS, so no "
                "Strict-Transport-Security header is ever sent.",
                hint="Set ROUTERPANEL_BEHIND_HTTPS=true behind an HTTPS proxy, or unset it.",
                id="routerpanel.W004",
            )
        ]
    return []


@register()
def check_cors_origins(app_configs: Any = None, **kwargs: Any) -> list[Warning]:
    bad = [origin for origin in settings.CORS_ALLOWED_ORIGINS if not _is_origin(origin)]
    if bad:
        return [
            Warning(
                f"CORS_ALLOWED_ORIGINS has entries that are not origins: {', '.join(bad)}.",
                hint="Write each as scheme://host[:port], e.g. https://chat.example.org.",
                id="routerpanel.W005",
            )
        ]
    return []


def _is_origin(text: str) -> bool:
    """scheme://host[:port] and nothing more: what browsers send in ``Origin`` (no slash)."""
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.path
