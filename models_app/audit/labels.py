"""Human words for the audit log: the labels of the fields a preset or settings change names
(``global_args`` is "[*] options", ``models_max`` "Max running models"), and a change's values as
text for a before/after table instead of nested JSON."""

from __future__ import annotations

from typing import Any

from models_app.panel.views.common import human_bytes

CHANGE_KINDS = frozenset({"preset_created", "preset_changed", "preset_deleted", "settings_changed"})
LABELS = {
    # preset fields
    "name": "Model id", "aliases": "Aliases", "model_path": "Model file", "args": "Options",
    "env": "Environment", "stop_timeout": "Stop-timeout", "load_on_startup": "Load on startup",
    "pinned": "Pinned", "ttl": "Idle TTL", "load_timeout": "Load timeout",
    "hang_timeout": "Hang timeout", "memory_estimate": "Memory estimate",
    "server_bin": "Server binary", "enabled": "Enabled", "nodes": "Nodes",
    # settings fields
    "models_max": "Max running models", "memory_budget": "Memory budget",
    "memory_headroom": "Memory headroom", "settle_timeout": "Settle timeout",
    "max_waiters": "Max waiters per model", "max_wait": "Max wait",
    "default_stop_timeout": "Default stop-timeout", "default_hang_timeout": "Default hang timeout",
    "quarantine_after": "Quarantine after", "server_binary": "Server binary",
    "require_api_key": "API key required", "global_args": "[*] options",
    "audit_retention_days": "Audit retention (days)",
}  # fmt: skip


def label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " ").capitalize())


def reason(kind: str, text: str) -> str:
    """A change row's reason ("global_args, models_max") in the panel's words."""
    if kind not in CHANGE_KINDS or not text:
        return text
    return ", ".join(label(part.strip()) for part in text.split(","))


BYTES = frozenset({"memory_estimate", "memory_budget", "memory_headroom"})


def value(v: Any, name: str = "") -> str:
    """One side of a change as text: pairs as ``key = value`` lines, lists by commas."""
    if name == "nodes" and v == "":
        return "any node"
    if v is None or v == "" or v == []:
        return "—"
    if name in BYTES and isinstance(v, int):
        return human_bytes(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list) and all(isinstance(p, list | tuple) and len(p) == 2 for p in v):
        return "\n".join(f"{k} = {val}" for k, val in v)
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    return str(v)


def changes(kind: str, details: Any) -> list[dict[str, str]]:
    """A change row's fields as (label, before, after), or [] for other rows."""
    if kind not in CHANGE_KINDS or not isinstance(details, dict):
        return []
    found = details.get("changes")
    if not isinstance(found, dict):
        return []
    rows = []
    for name, pair in found.items():
        before, after = pair if isinstance(pair, list | tuple) and len(pair) == 2 else (None, pair)
        rows.append(
            {"field": label(name), "before": value(before, name), "after": value(after, name)}
        )
    return rows
