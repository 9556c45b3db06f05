"""``GET /usage`` (issue 17.2): usage sums per actor, model or key, as JSON.

``?by=actor|model|key`` (default actor), ``?since=`` and ``?until=`` (ISO 8601 date or time,
UTC unless it says otherwise, or Unix seconds; default: the last 24 hours). A personal key
answers with its owner's view: viewers see only their own rows, operators and admins everyone's.
Static ``--api-key`` keys, and an open router (no key required, none sent), see everyone's, as
they may load and unload. Bad parameters: 400 in llama.cpp's error shape.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError

from models_app.accounts import usage, usage_report
from models_app.api.errors import ApiError
from models_app.db import own_connection

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from models_app.api.context import ApiContext
    from models_app.api.request import Request

DEFAULT_SPAN = timedelta(hours=24)


def parse_time(name: str, value: str | None) -> datetime | None:
    """An ISO 8601 date/time (naive = UTC) or Unix seconds; None when absent; 400 if bad."""
    if value is None or value == "":
        return None
    try:
        if value.replace(".", "", 1).isdigit():
            return datetime.fromtimestamp(float(value), UTC)
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError):
        raise ApiError(400, f"invalid '{name}': {value!r} (ISO 8601 or Unix seconds)") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def own_rows_only(actor: str) -> str | None:
    """Whose rows the caller may see: None for everyone's, else the user's own name."""
    from django.contrib.auth import get_user_model

    from models_app.accounts.roles import Role, role_of

    who, key = usage.split_actor(actor)
    if not key or who == actor:  # anonymous on an open router, or a static key
        return None
    user = get_user_model().objects.filter(username=who).first()
    return None if role_of(user) >= Role.OPERATOR else who


async def usage_summary(api: ApiContext, request: Request) -> None:
    by = request.query("by") or "actor"
    if by not in usage_report.GROUPS:
        raise ApiError(400, f"invalid 'by': {by!r} (one of actor, model, key)")
    since = parse_time("since", request.query("since"))
    until = parse_time("until", request.query("until"))
    if since is None:
        since = (until or datetime.now(UTC)) - DEFAULT_SPAN
    if until is not None and until <= since:
        raise ApiError(400, "'until' must be after 'since'")
    try:
        data = await sync_to_async(_summary, thread_sensitive=False)(
            request.actor, by, since, until
        )
    except DatabaseError as exc:
        log.warning("GET /usage: the database cannot be read: %s", exc)
        raise ApiError(
            503, "usage is not available: the database cannot be read", "unavailable_error"
        ) from None
    await request.respond_json(
        {"by": by, "since": since.isoformat(), "until": until and until.isoformat(), "data": data}
    )


@own_connection
def _summary(actor: str, by: str, since: datetime, until: datetime | None) -> list[dict[str, Any]]:
    return usage_report.summary(by, since, until, own_rows_only(actor))
