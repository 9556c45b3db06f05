"""Panel roles: viewer, operator, admin (DESIGN §5 "Auth", issue 6).

A role is a Django group of the same name; each role includes the ones below it. Superusers are
admins. A signed-in user in none of the groups has no role and sees only a "no access" page:
new accounts get nothing until an admin gives them a role (least privilege).

* viewer — reads every page, the live dashboard and the logs, exports presets and the audit log,
  manages their own API keys;
* operator — also loads, unloads and pins models from the dashboard;
* admin — also edits presets, settings, users and everyone's API keys.

The groups are created idempotently after every ``migrate`` (``post_migrate``, connected in
``ModelsAppConfig.ready``): there is no data migration to keep in step.

Every view, form POST and WebSocket message checks the role here: buttons are hidden by role
too, but that is only a convenience.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from functools import wraps
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class Role(IntEnum):
    """Ordered: a higher role can do everything a lower one can."""

    NONE = 0
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()


GROUPS = {"viewer": Role.VIEWER, "operator": Role.OPERATOR, "admin": Role.ADMIN}


def ensure_groups(**_: Any) -> None:
    """Create the role groups if they are missing (a ``post_migrate`` receiver; idempotent)."""
    for name in GROUPS:
        Group.objects.get_or_create(name=name)


def role_of(user: AbstractBaseUser | AnonymousUser | None) -> Role:
    """Return the user's highest role; anonymous and inactive users have none.

    The result is cached on the user object for the request (one query per request).
    """
    if user is None or not user.is_authenticated or not getattr(user, "is_active", False):
        return Role.NONE
    cached = getattr(user, "_panel_role", None)
    if cached is not None:
        return Role(cached)
    if getattr(user, "is_superuser", False):
        role = Role.ADMIN
    else:
        names = user.groups.values_list("name", flat=True)
        role = max((GROUPS[n] for n in names if n in GROUPS), default=Role.NONE)
    user._panel_role = int(role)
    return role


def can(user: Any, role: Role) -> bool:
    return role_of(user) >= role


def set_role(user: Any, role: Role) -> None:
    """Put ``user`` in exactly the group of ``role`` (``Role.NONE``: in none of them)."""
    ensure_groups()
    user.groups.remove(*Group.objects.filter(name__in=GROUPS))
    if role is not Role.NONE:
        user.groups.add(Group.objects.get(name=role.label))
    user.__dict__.pop("_panel_role", None)


def forbidden(request: HttpRequest, needed: Role) -> HttpResponse:
    context = {"needed": needed.label, "role": role_of(request.user).label}
    return render(request, "panel/forbidden.html", context, status=403)


ViewFunc = Callable[..., Any]


def require(role: Role) -> Callable[[ViewFunc], ViewFunc]:
    """Decorate a view: the sign-in page for anonymous users, 403 for users below ``role``."""

    def decorate(view: ViewFunc) -> ViewFunc:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if role_of(request.user) < role:
                return forbidden(request, role)
            return view(request, *args, **kwargs)

        return wrapper

    return decorate
