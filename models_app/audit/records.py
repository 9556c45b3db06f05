"""Write audit rows for changes made through the panel, the admin or the API (DESIGN §6).

Router events (loads, evictions, exits, …) are written by the router side's batch writer; this
module covers what the web side changes. Every function appends rows through
``AuditEvent.objects.record`` — the one write path (STYLE 12).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.forms.models import model_to_dict
from django.utils import timezone

from models_app.models import ApiKey, AuditEvent, AuditKind, Preset, RouterSettings

PRESET_FIELDS = (
    "name", "aliases", "model_path", "args", "env", "stop_timeout", "load_on_startup", "pinned",
    "ttl", "load_timeout", "hang_timeout", "memory_estimate", "server_bin", "enabled", "nodes",
)  # fmt: skip
SETTINGS_FIELDS = (
    "models_max", "memory_budget", "memory_headroom", "settle_timeout", "max_waiters", "max_wait",
    "queue_policy", "default_stop_timeout", "default_hang_timeout", "quarantine_after",
    "server_binary", "require_api_key", "global_args", "audit_retention_days",
)  # fmt: skip


def preset_state(preset: Preset | None) -> dict[str, Any] | None:
    """The audited fields of a preset, to pass as ``before`` to ``record_preset_change``."""
    return None if preset is None else _fields(preset, PRESET_FIELDS)


def settings_state(row: RouterSettings) -> dict[str, Any]:
    return _fields(row, SETTINGS_FIELDS)


def _fields(row: Preset | RouterSettings, fields: tuple[str, ...]) -> dict[str, Any]:
    state: dict[str, Any] = model_to_dict(row, fields=fields)
    return state


def diff(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, list[Any]]:
    """Field-level diff: ``{field: [old, new]}`` for every field that changed."""
    before, after = before or {}, after or {}
    keys = sorted(set(before) | set(after))
    return {k: [before.get(k), after.get(k)] for k in keys if before.get(k) != after.get(k)}


def record_preset_change(
    before: dict[str, Any] | None, after: Preset | None, actor: str
) -> AuditEvent | None:
    """Audit a preset created (``before`` None), changed, or deleted (``after`` None)."""
    row = preset_change(before, after, actor)
    return None if row is None else AuditEvent.objects.record(**_fields_of(row))


def record_presets_created(presets: list[Preset], actor: str) -> int:
    """Audit many presets created at once (an import): one write for all of their rows."""
    rows = [row for p in presets if (row := preset_change(None, p, actor)) is not None]
    return AuditEvent.objects.record_many(rows)


def preset_change(
    before: dict[str, Any] | None, after: Preset | None, actor: str
) -> AuditEvent | None:
    """The audit row of a preset's change, not yet written; None when nothing changed."""
    new = preset_state(after)
    changes = diff(before, new)
    if not changes:
        return None
    if before is None:
        kind = AuditKind.PRESET_CREATED
    elif after is None:
        kind = AuditKind.PRESET_DELETED
    else:
        kind = AuditKind.PRESET_CHANGED
    name = (new or before or {}).get("name", "")
    return AuditEvent(kind=kind, model=name, actor=actor, reason=", ".join(changes),
                      details={"changes": changes})  # fmt: skip


def _fields_of(row: AuditEvent) -> dict[str, Any]:
    fields = ("kind", "model", "actor", "reason", "details")
    return {name: getattr(row, name) for name in fields}


def record_settings_change(
    before: dict[str, Any], after: RouterSettings, actor: str
) -> AuditEvent | None:
    changes = diff(before, settings_state(after))
    if not changes:
        return None
    return AuditEvent.objects.record(
        AuditKind.SETTINGS_CHANGED,
        actor=actor,
        reason=", ".join(changes),
        details={"changes": changes},
    )


def actor_of(user: Any) -> str:
    """The actor string of a panel user (API requests use ``key:<owner>/<name>``)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return "anonymous"
    return f"user:{user.get_username()}"


def purge_expired(now: Any = None) -> int:
    """Delete audit rows older than the retention setting; none while it is empty (forever).

    The only deletion path: ``purge_older_than`` records a ``retention`` row saying how many
    rows went.
    """
    days = RouterSettings.load().audit_retention_days
    if not days:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    return AuditEvent.objects.purge_older_than(cutoff)


def key_state(key: ApiKey) -> dict[str, Any]:
    """What the audit log keeps of a key: never its secret or hash, only the prefix people see."""
    return {
        "owner": key.owner.get_username(),
        "name": key.name,
        "prefix": key.prefix,
        "models": key.model_patterns or "all",
        "max_concurrent": key.max_concurrent,
        "priority": key.priority,
        "queue_comments": key.queue_comments,
    }


def record_key_change(
    kind: str, key: ApiKey, actor: str, before: dict[str, Any] | None = None
) -> AuditEvent | None:
    """Audit a key created, rescoped (``before``: its state before) or revoked; a rescope that
    changed nothing writes no row."""
    state = key_state(key)
    if kind == AuditKind.KEY_RESCOPED:
        changes = diff(before, state)
        if not changes:
            return None
        details: dict[str, Any] = {"key": key.actor, "changes": changes}
        reason = f"{key.actor}: " + ", ".join(changes)
    else:
        details = {"key": key.actor} | state
        reason = f"{key.actor} ({key.scope_text()})"
    return AuditEvent.objects.record(kind, actor=actor, reason=reason[:500], details=details)


def record_auth_failures(count: int, details: dict[str, Any]) -> AuditEvent:
    """Audit failed API logins: one row for ``count`` failures (rate-limited by the caller)."""
    clients = details.get("clients") or {}
    where = ", ".join(list(clients)[:3]) or "unknown client"
    reason = (
        "1 request with a missing or invalid API key"
        if count == 1
        else (f"{count} requests with a missing or invalid API key")
    )
    return AuditEvent.objects.record(
        AuditKind.AUTH_FAILED,
        actor="anonymous",
        reason=f"{reason} (from {where})"[:500],
        details={"count": count} | details,
    )


KEY_REFUSAL_REASONS = {
    AuditKind.KEY_SCOPE: "outside the key's models",
    AuditKind.KEY_BUSY: "over the key's concurrent-request limit",
    AuditKind.QUOTA_EXCEEDED: "over a quota",
}


def record_key_refusals(kind: str, count: int, details: dict[str, Any]) -> AuditEvent:
    """Audit requests a scoped key was refused (403 scope, 429 concurrency): one row for
    ``count`` refusals, rate-limited by the caller. The actor and model are the most frequent
    ones of the window; ``details`` has them all."""
    actor = next(iter(details.get("keys") or {}), "anonymous")
    model = next(iter(details.get("models") or {}), "")
    what = "1 request" if count == 1 else f"{count} requests"
    return AuditEvent.objects.record(
        kind,
        actor=actor,
        model=model[:200],
        reason=f"{what} {KEY_REFUSAL_REASONS[AuditKind(kind)]}"[:500],
        details={"count": count} | details,
    )
