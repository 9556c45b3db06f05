"""The router settings form as the browser posts it, for the panel's settings tests."""

from __future__ import annotations

from typing import Any

from models_app.audit import records as audit
from models_app.models import RouterSettings
from models_app.panel import edits


def body(**fields: Any) -> dict[str, Any]:
    """The settings form as it is opened now, with ``fields`` changed."""
    row = RouterSettings.load()
    values = {
        "models_max": row.models_max, "memory_budget": "", "memory_headroom": "",
        "settle_timeout": row.settle_timeout, "max_waiters": "", "max_wait": row.max_wait,
        "queue_policy": row.queue_policy,
        "default_stop_timeout": row.default_stop_timeout,
        "default_hang_timeout": row.default_hang_timeout,
        "quarantine_after": row.quarantine_after, "server_binary": row.server_binary,
        "audit_retention_days": "",
        "seen_version": edits.fingerprint(audit.settings_state(row)),
    }  # fmt: skip
    return values | fields
