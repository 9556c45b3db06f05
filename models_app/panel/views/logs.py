"""A model's log: the page (the ring as it is now, then tailed live) and its download.

Each line shows one timestamp: the child's own when the line starts with a time of day (the
simulator and llama-server with --log-timestamps print one), else the time the router read it.
static/panel/logs.js renders live lines the same way: ``CLOCK`` and ``LEVELS`` are mirrored there.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from models_app.accounts.roles import Role, require
from models_app.models import Preset
from models_app.panel.views import common

CLOCK = re.compile(r"^(\d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?)\s+")
# The first that matches names the line's level; llama.cpp's prefixes are "E ", "W ", "D ".
LEVELS = (
    ("error", re.compile(r"\b(?:ERROR|FATAL|CRITICAL|PANIC)\b|\b[Ee]rror:|^E ")),
    ("warn", re.compile(r"\bWARN(?:ING)?\b|\b[Ww]arning:|^W ")),
    ("debug", re.compile(r"\bDEBUG\b|^D ")),
)


def shown(line: dict[str, Any]) -> dict[str, Any]:
    """A ring line as the page shows it: one clock, the rest of the text, its level."""
    text = str(line.get("text", ""))
    match = CLOCK.match(text)
    if match:
        clock, text = match.group(1), text[match.end() :]
    else:
        clock = _local(line.get("time")).strftime("%H:%M:%S.%f")[:12]
    level = next((name for name, pattern in LEVELS if pattern.search(text)), "info")
    return {"stream": line.get("stream", ""), "clock": clock, "text": text, "level": level}


def _local(epoch: Any) -> dt.datetime:
    return dt.datetime.fromtimestamp(float(epoch or 0), tz=timezone.get_current_timezone())


def _utc(epoch: Any) -> str:
    return (
        dt.datetime.fromtimestamp(float(epoch or 0), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[
            :-3
        ]
        + "Z"
    )


def _ring(model: str) -> tuple[list[dict[str, Any]], str | None]:
    answer = common.ask_router({"type": "router.logs", "model": model}, common.PAGE_TIMEOUT + 1)
    lines: Any = (answer.body or {}).get("logs")
    return (lines if isinstance(lines, list) else []), answer.error


@require_GET
@require(Role.VIEWER)
def model_logs(request: HttpRequest, model: str) -> HttpResponse:
    """The model's log ring as it is now; the page then tails it live over the WebSocket."""
    lines, router_error = _ring(model)
    context = {
        "model": model,
        "lines": [shown(line) for line in lines],
        "router_error": router_error,
        "preset": Preset.objects.filter(name=model).first(),
        "models": Preset.objects.values_list("name", flat=True),
    }
    return render(request, "panel/logs.html", context)


@require_GET
@require(Role.VIEWER)
def model_logs_text(request: HttpRequest, model: str) -> HttpResponse:
    """The ring as a text file: each line as the child printed it, after the time the router
    read it (ISO 8601, UTC) and its stream. 503 when the router does not answer."""
    lines, router_error = _ring(model)
    if router_error:
        return HttpResponse(f"Router unavailable: {router_error}\n", status=503,
                            content_type="text/plain; charset=utf-8")  # fmt: skip
    body = "".join(f"{_utc(line.get('time'))} {line.get('stream', '')} {line.get('text', '')}\n"
                   for line in lines)  # fmt: skip
    response = HttpResponse(body, content_type="text/plain; charset=utf-8")
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", model)
    response["Content-Disposition"] = f'attachment; filename="{name}.log"'
    return response
