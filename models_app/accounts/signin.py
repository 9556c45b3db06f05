"""Panel sign-ins: the audit of failures and lockouts, the current lockouts, and unlocking.

Throttling itself is django-axes (settings ``AXES_*``): it counts failures per user name and per
client address in its own tables and refuses sign-ins past ``AXES_FAILURE_LIMIT`` until the
lockout time has passed. This module adds what the team needs around it:

* ``SignInAudit`` writes ``login_failed`` and ``login_locked`` audit rows, rate-limited like the
  API's 401s (``models_app.api.auth.LoginFailures``): per kind, the first event after a quiet
  spell is a row at once, the ones that follow within ``window`` seconds are counted and written
  as one row when the window ends — so a password-guessing flood costs a row a minute. Rows
  name the user names tried only when such a user exists (a password typed into the user name
  field is not published to every viewer of the audit log) and the client addresses.
* ``lockouts()`` lists the user names and addresses locked out now, for the Users page;
  ``unlock()`` clears one and audits who did it (``login_unlocked``).

The receiver of Django's ``user_login_failed`` runs after axes' own (``axes`` comes before
``models_app`` in ``INSTALLED_APPS``), so ``request.axes_locked_out`` already says whether this
attempt was refused by, or started, a lockout.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_login_failed
from django.db.models import Max, Sum
from django.utils import timezone

from models_app.db import drop_stale_connections
from models_app.models import AuditEvent, AuditKind

log = logging.getLogger(__name__)

UNKNOWN_USER = "(no such user)"
MAX_DISTINCT = 20  # user names, clients or paths kept per row; the rest count as "other"
WINDOW = 60.0  # seconds

Writer = Callable[[str, int, dict[str, Any]], None]
TimerStarter = Callable[[float, Callable[[], None]], None]

NOUNS = {
    AuditKind.LOGIN_FAILED: ("failed panel sign-in", "failed panel sign-ins"),
    AuditKind.LOGIN_LOCKED: (
        "panel sign-in locked out",
        "panel sign-ins refused while locked out",
    ),
}


def record_rows(kind: str, count: int, details: dict[str, Any]) -> None:
    """Write one audit row for ``count`` sign-in events of ``kind``."""
    singular, plural = NOUNS[AuditKind(kind)]
    users = ", ".join(details["usernames"]) or UNKNOWN_USER
    clients = ", ".join(details["clients"]) or "an unknown client"
    reason = f"{count} {singular if count == 1 else plural}: {users} from {clients}"
    AuditEvent.objects.record(
        kind, actor="anonymous", reason=reason[:500], details={"count": count} | details
    )


def _start_daemon_timer(seconds: float, callback: Callable[[], None]) -> None:
    timer = threading.Timer(seconds, callback)
    timer.daemon = True
    timer.start()


@dataclass
class _Window:
    """What happened since the last row of one kind."""

    open: bool = False
    count: int = 0
    usernames: Counter[str] = field(default_factory=Counter)
    clients: Counter[str] = field(default_factory=Counter)
    paths: Counter[str] = field(default_factory=Counter)

    def add(self, username: str, client: str, path: str) -> None:
        self.count += 1
        for counter, value in ((self.usernames, username), (self.clients, client),
                               (self.paths, path)):  # fmt: skip
            if value in counter or len(counter) < MAX_DISTINCT:
                counter[value] += 1
            else:
                counter["other"] += 1

    def take(self, window_seconds: float) -> tuple[int, dict[str, Any]]:
        """Return the count and details so far, and start counting afresh."""
        details = {
            "window_seconds": window_seconds,
            "usernames": dict(self.usernames.most_common()),
            "clients": dict(self.clients.most_common()),
            "paths": dict(self.paths.most_common()),
        }
        count, self.count = self.count, 0
        self.usernames, self.clients, self.paths = Counter(), Counter(), Counter()
        return count, details


class SignInAudit:
    """Turn sign-in failures into at most about one audit row per kind and window (see module)."""

    def __init__(
        self,
        writer: Writer = record_rows,
        *,
        window: float = WINDOW,
        start_timer: TimerStarter = _start_daemon_timer,
    ) -> None:
        self._writer = writer
        self.window = window
        self._start_timer = start_timer
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}

    def note(self, kind: str, username: str, client: str, path: str) -> None:
        """Count one event; the first after a quiet spell is written at once (in this thread)."""
        with self._lock:
            window = self._windows.setdefault(kind, _Window())
            window.add(username, client, path)
            first = not window.open
            window.open = True
            if first:
                count, details = window.take(self.window)
        if first:
            self._write(kind, count, details)
            self._start_timer(self.window, lambda: self._window_ended(kind))

    def _window_ended(self, kind: str) -> None:
        """At the end of a window: write what it counted, or close it if it counted nothing."""
        with self._lock:
            window = self._windows[kind]
            if window.count == 0:
                window.open = False
                return
            count, details = window.take(self.window)
        self._write(kind, count, details, thread=True)
        self._start_timer(self.window, lambda: self._window_ended(kind))

    def _write(self, kind: str, count: int, details: dict[str, Any], thread: bool = False) -> None:
        if thread:
            drop_stale_connections()  # a timer thread: its own, possibly stale, connection
        try:
            self._writer(kind, count, details)
        except Exception:  # the database may be down: a lost row must not break signing in
            log.warning("could not audit %d %s events", count, kind, exc_info=True)
        finally:
            if thread:
                drop_stale_connections()


AUDIT = SignInAudit()


def known_username(name: Any) -> str:
    """The user name if such a user exists, else a placeholder (never echo a typed secret)."""
    if not isinstance(name, str) or not name:
        return UNKNOWN_USER
    exists = get_user_model().objects.filter(username=name).exists()
    return name[:150] if exists else UNKNOWN_USER


def on_login_failed(
    sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any
) -> None:
    """``user_login_failed`` receiver: one event, locked-out or merely failed."""
    if request is None:  # a sign-in outside a request (the shell): nothing to throttle
        return
    locked = bool(getattr(request, "axes_locked_out", False))
    kind = AuditKind.LOGIN_LOCKED if locked else AuditKind.LOGIN_FAILED
    client = getattr(request, "axes_ip_address", None) or request.META.get("REMOTE_ADDR", "")
    AUDIT.note(kind, known_username(credentials.get("username")), str(client), request.path)


def connect_signals() -> None:
    user_login_failed.connect(on_login_failed, dispatch_uid="models_app.accounts.signin")


# ---- lockouts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lockout:
    """A user name or client address whose sign-ins are refused now."""

    kind: str  # "user" or "address"
    value: str
    failures: int
    until: datetime


def lockouts(now: datetime | None = None) -> list[Lockout]:
    """The user names and addresses locked out at ``now``, by how axes counts them."""
    from axes.models import AccessAttempt

    now = now or timezone.now()
    cool_off = settings.AXES_COOLOFF_TIME
    recent = AccessAttempt.objects.filter(attempt_time__gte=now - cool_off)
    found: list[Lockout] = []
    for kind, column in (("user", "username"), ("address", "ip_address")):
        if column not in settings.AXES_LOCKOUT_PARAMETERS:
            continue
        rows = recent.values(column).annotate(
            failures=Sum("failures_since_start"), last=Max("attempt_time")
        )
        for row in rows.order_by(column):
            if row[column] and row["failures"] >= settings.AXES_FAILURE_LIMIT:
                found.append(Lockout(kind, row[column], row["failures"], row["last"] + cool_off))
    return found


def unlock(kind: str, value: str, actor: str) -> int:
    """Clear a lockout (and the failures behind it); audit it; return the attempts removed."""
    from axes.utils import reset

    removed: int
    if kind == "user":
        removed = reset(username=value)
        what = f"user name {value}"
    elif kind == "address":
        removed = reset(ip=value)
        what = f"address {value}"
    else:
        raise ValueError(f"unknown lockout kind {kind!r}")
    AuditEvent.objects.record(
        AuditKind.LOGIN_UNLOCKED,
        actor=actor,
        reason=f"unlocked panel sign-in for {what}"[:500],
        details={"kind": kind, "value": value, "attempts_removed": removed},
    )
    return removed
