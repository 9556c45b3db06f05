"""First-run set-up shared by ``serve`` and ``runrouter``: migrations and the first admin."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

ADMIN_USERNAME = "admin"


def migrate(verbosity: int = 0) -> None:
    call_command("migrate", interactive=False, verbosity=verbosity)


def ensure_admin() -> str | None:
    """Create user ``admin`` if no superuser exists; return a generated password to print once.

    The password comes from ROUTERPANEL_ADMIN_PASSWORD when set; otherwise one is generated and
    returned so that the caller can show it exactly once. Returns None when nothing was created
    or the password came from the environment.
    """
    users = get_user_model()
    if users.objects.filter(is_superuser=True).exists():
        return None
    given = settings.ROUTERPANEL["ADMIN_PASSWORD"]
    password = given or secrets.token_urlsafe(12)
    users.objects.create_superuser(ADMIN_USERNAME, email="", password=password)
    return None if given else password
