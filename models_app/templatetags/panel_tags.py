"""Template filters for the panel: bytes, durations, wall-clock times and model states."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from models_app.audit import labels as audit_labels
from models_app.panel.views.common import human_bytes, human_seconds

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


SOURCES = {"preset": "set here", "[*]": "from [*]", "default": "default (Settings)"}


@register.filter
def effective(pair: tuple[Any, str], unit: str = "s") -> SafeString:
    """``specs.effective``'s (value, source) as "12 s, from [*]": what the router uses and why.

    ``unit`` is "s" for seconds (0 or none: "off"), "yes" for a flag.
    """
    value, source = pair
    if unit == "yes":
        shown = "yes" if value else "no"
    else:
        shown = "off" if not value else f"{float(value):g} s"
    return format_html('{} <small class="muted">{}</small>', shown, SOURCES[source])


@register.filter
def audit_reason(row: Any) -> str:
    """An audit row's reason with field names in the panel's words."""
    return audit_labels.reason(row.kind, row.reason)
