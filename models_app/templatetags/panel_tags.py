"""Template filters for the panel: bytes, durations, wall-clock times and model states."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django import template
from django.utils import timezone

from models_app.views.common import human_bytes, human_seconds

register = template.Library()

# A shape as well as a colour for each state, so the state reads without colour (issue 6).
STATE_ICONS = {
    "loaded": "●",
    "loading": "◐",
    "sleeping": "☾",
    "unloaded": "○",
    "failed": "✕",
    "quarantined": "⊘",
    "stuck": "⚠",
    "unknown": "?",
}


@register.filter
def bytes_(value: Any) -> str:
    return human_bytes(value)


@register.filter
def seconds(value: Any) -> str:
    return human_seconds(value)


@register.filter
def epoch(value: Any) -> dt.datetime | None:
    """A wall-clock timestamp (seconds) as an aware datetime."""
    if value in (None, ""):
        return None
    return dt.datetime.fromtimestamp(float(value), tz=timezone.get_current_timezone())


@register.filter
def ago(value: Any) -> str:
    """How long ago a wall-clock timestamp was: '12 s ago'."""
    if value in (None, ""):
        return "never"
    return f"{human_seconds(max(0.0, time.time() - float(value)))} ago"


@register.filter
def state_icon(state: Any) -> str:
    return STATE_ICONS.get(str(state), "?")


@register.filter
def get(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None
