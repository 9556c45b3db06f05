"""Check ``serve``'s inputs before anything changes, and word the errors a user sees.

``serve`` migrates, imports sources, creates the first admin (printing its one-time password)
and then listens. Each check here runs first and changes nothing, so a typo in a flag never
leaves a created admin or half the sources behind: the port (one line naming it and how to pick
another), the ``--models-preset`` file (parsed and checked like the import will, naming the
line) and the ``--models-dir`` folder.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError
from django.db import DatabaseError

from models_app import runtime
from models_app.presets import server_options, sources
from routerpanel.router import ini, presets

OTHER_PORT_HINT = "make run PORT=9000 (or manage.py serve --port 9000)"


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def listen_error(host: str, port: int, exc: BaseException) -> str:
    """One line saying why ``host:port`` cannot be listened on (Twisted wraps the OSError)."""
    cause = getattr(exc, "socketError", None) or exc
    code = cause.errno if isinstance(cause, OSError) else None
    if code == errno.EADDRINUSE:
        return (
            f"Port {port} on {host} is already in use: stop what listens there, or choose "
            f"another port: {OTHER_PORT_HINT}."
        )
    reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
    return f"Cannot listen on {url_host(host)}:{port}: {reason}."


def check_listen_address(host: str, port: int) -> None:
    """Raise CommandError unless ``host:port`` can be bound right now (then free it again).

    Binds with SO_REUSEADDR, as Twisted does, so a port in TIME_WAIT is not taken for busy.
    ``serve`` checks the real listen too: another process may take the port in between.
    """
    if not 0 <= port <= 65535:
        raise CommandError(f"--port {port} is not a port number (0 to 65535).")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise CommandError(f"Cannot listen on {host}:{port}: {exc.strerror}.") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise CommandError(listen_error(host, port, exc)) from None


def check_sources(models_preset: str | None, models_dir: str | None) -> None:
    """Raise CommandError (naming the file and line) if a source cannot be imported."""
    if models_preset:
        _check_preset_file(models_preset)
    if models_dir:
        try:
            sources.scan_models_dir(models_dir)
        except sources.SourceError as exc:
            raise CommandError(str(exc).removeprefix("error: ")) from None


def _check_preset_file(path: str) -> None:
    file = Path(path)
    failed = "failed to initialize router models"
    if not file.is_file():
        raise CommandError(f"{failed}: preset file does not exist: {path}")
    try:
        data = file.read_bytes()
    except OSError as exc:
        problem = f"failed to open preset file: {path}: {exc.strerror}"
        raise CommandError(f"{failed}: {problem}") from None
    try:
        presets.parse_presets(
            data,
            path,
            default_bin=_default_program(),
            options_for=server_options.options_for,
        )
    except ini.IniError as exc:
        raise CommandError(f"{failed}: {exc}") from None


def _default_program() -> str:
    """The default server command, read without creating or migrating anything."""
    if server_bin := runtime.current().server_bin:
        return server_bin
    from models_app.models import RouterSettings

    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3") and not Path(database["NAME"]).exists():
        return str(settings.ROUTERPANEL["SERVER_BIN"])  # the first start; a query would create it
    try:
        stored = RouterSettings.objects.filter(pk=1).values_list("server_binary", flat=True)
        return str(stored.first() or settings.ROUTERPANEL["SERVER_BIN"])
    except DatabaseError:  # no database yet: the first start
        return str(settings.ROUTERPANEL["SERVER_BIN"])
