"""The sign-in pages around django-axes: the lockout page, and the 400 for an unknown host name."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.http.request import split_domain_port
from django.shortcuts import render
from django.utils import timezone

from models_app.accounts import signin

LOCKED_STATUS = 429  # Too Many Requests: the client may try again later (axes' default too)


def locked_out(
    request: HttpRequest, original_response: Any = None, credentials: Any = None
) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the panel's lockout page (429), saying why and for how long.

    Axes calls this with ``(request, credentials)`` from its async middleware path and with
    ``(request, response, credentials)`` from the sync one, so the user name is read from the
    request's form, never from the arguments.
    """
    username = request.POST.get("username", "") if request.method == "POST" else ""
    address = getattr(request, "axes_ip_address", None) or request.META.get("REMOTE_ADDR", "")
    mine = [
        lock
        for lock in signin.lockouts()
        if (lock.kind == "user" and lock.value == username)
        or (lock.kind == "address" and lock.value == address)
    ]
    context = {
        "username": username,
        "by_user": any(lock.kind == "user" for lock in mine),
        "by_address": any(lock.kind == "address" for lock in mine),
        "until": max((lock.until for lock in mine), default=None),
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": max(1, round(settings.AXES_COOLOFF_TIME.total_seconds() / 60)),
    }
    response = render(request, "panel/locked_out.html", context, status=LOCKED_STATUS)
    if context["until"] is not None:
        seconds = (context["until"] - timezone.now()).total_seconds()
        response["Retry-After"] = str(max(1, round(seconds)))
    return response


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``handler400``: a host name the panel does not answer to says so, and what to change."""
    if isinstance(exception, DisallowedHost):
        given = request.META.get("HTTP_HOST", "")[:200]
        host = split_domain_port(given)[0] or given  # ALLOWED_HOSTS lists names, not ports
        return render(request, "panel/unknown_host.html", {"host": host}, status=400)
    return HttpResponseBadRequest("Bad Request (400)", content_type="text/plain")
