"""First-run set-up shared by ``serve`` and ``runrouter``: migrations and the first admin.

Several processes may start at once on a fresh database (team mode: two ``serve --no-router``
and a ``runrouter`` under one compose file). Migrating and creating the admin run under one
lock, so the second process waits and then finds the work done: a PostgreSQL advisory lock (it
spans hosts and dies with its session), or a file lock in the data dir for SQLite.
"""

from __future__ import annotations

import contextlib
import fcntl
import secrets
from collections.abc import Iterator

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

ADMIN_USERNAME = "admin"
LOCK_ID = 0x526F7574  # "Rout": the advisory lock key of RouterPanel's first-run set-up


@contextlib.contextmanager
def first_run_lock() -> Iterator[None]:
    """Hold the set-up lock: other processes setting up the same database wait for it."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [LOCK_ID])
            try:
                yield
            finally:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [LOCK_ID])
        return
    path = settings.DATA_DIR / "setup.lock"
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def migrate(verbosity: int = 0) -> None:
    with first_run_lock():
        call_command("migrate", interactive=False, verbosity=verbosity)


def ensure_admin() -> str | None:
    """Create user ``admin`` if no superuser exists; return a generated password to print once.

    The password comes from ROUTERPANEL_ADMIN_PASSWORD when set; otherwise one is generated and
    returned so that the caller can show it exactly once. Returns None when nothing was created
    or the password came from the environment — or when a twin process created it first.
    """
    with first_run_lock():
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            return None
        given = settings.ROUTERPANEL["ADMIN_PASSWORD"]
        password = given or secrets.token_urlsafe(12)
        try:
            with transaction.atomic():
                users.objects.create_superuser(ADMIN_USERNAME, email="", password=password)
        except IntegrityError:  # a twin on another host without the lock (should not happen)
            return None
        return None if given else password
