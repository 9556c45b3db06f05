"""Usage, read back (issue 17.2): the sums ``GET /usage`` and the panel's usage page show
(``summary``), and the panel's chart per hour and model (``hourly``). What is summed is
written by usage.py.

The API's modules import before Django's apps are loaded (``api/usage_route.py`` imports this
one), so each function imports the models it reads when it runs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from models_app.accounts.usage import hour_of

GROUPS = {"actor": "actor", "model": "model", "key": "key"}


def summary(
    by: str, since: datetime | None, until: datetime | None, actor: str | None = None
) -> list[dict[str, Any]]:
    """``/usage``'s rows: sums per ``by`` (actor, model or key) of the requests that arrived
    in [since, until), only ``actor``'s when given; busiest first."""
    from django.db.models import Count, F, Q, Sum
    from django.db.models.functions import Coalesce

    from models_app.models import UsageRecord

    rows = UsageRecord.objects.all()
    if since is not None:
        rows = rows.filter(time__gte=since)
    if until is not None:
        rows = rows.filter(time__lt=until)
    if actor is not None:
        rows = rows.filter(actor=actor)
    if by == "key":
        rows = rows.exclude(key="")
    column = GROUPS[by]
    sums = (
        rows.values(column)
        .annotate(
            requests=Count("id"),
            prompt_tokens=Coalesce(Sum("prompt_tokens"), 0),
            completion_tokens=Coalesce(Sum("completion_tokens"), 0),
            queue_ms=Coalesce(Sum("queue_ms"), 0.0),
            loads_caused=Count("id", filter=Q(caused_load=True)),
            load_ms_caused=Coalesce(Sum("load_ms", filter=Q(caused_load=True)), 0.0),
            model_ms=Coalesce(Sum("duration_ms"), 0.0),
        )
        .order_by(F("model_ms").desc(), column)
    )
    return [
        {
            by: row[column],
            "requests": row["requests"],
            "prompt_tokens": row["prompt_tokens"],
            "completion_tokens": row["completion_tokens"],
            "queue_seconds": round(row["queue_ms"] / 1000, 3),
            "loads_caused": row["loads_caused"],
            "load_seconds_caused": round(row["load_ms_caused"] / 1000, 3),
            "model_seconds": round(row["model_ms"] / 1000, 3),
        }
        for row in sums
    ]


def hourly(
    since: datetime, until: datetime | None = None, actor: str | None = None
) -> list[dict[str, Any]]:
    """Per hour and model: requests, tokens and model-seconds (the panel's chart)."""
    from django.db.models import Sum

    from models_app.models import UsageHour

    rows = UsageHour.objects.filter(hour__gte=hour_of(since))
    if until is not None:
        rows = rows.filter(hour__lt=until)
    if actor is not None:
        rows = rows.filter(actor=actor)
    sums = (
        rows.values("hour", "model")
        .annotate(
            requests=Sum("requests"),
            tokens=Sum("completion_tokens"),
            model_seconds=Sum("model_seconds"),
        )
        .order_by("hour", "model")
    )
    return [
        {
            "hour": row["hour"].isoformat(),
            "model": row["model"],
            "requests": row["requests"],
            "completion_tokens": row["tokens"],
            "model_seconds": round(row["model_seconds"], 3),
        }
        for row in sums
    ]
