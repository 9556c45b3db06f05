"""The audit log: its kinds of row and the append-only rows themselves."""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from models_app.models.base import TextChoices


class AuditKind(TextChoices):
    LOAD_REQUESTED = "load_requested", "load requested"
    LOADING = "loading", "loading"
    READY = "ready", "ready"
    LOAD_FAILED = "load_failed", "load failed"
    LOAD_REFUSED = "load_refused", "load refused (cannot start)"
    EVICTION = "eviction", "eviction"
    UNLOAD = "unload", "unload (manual)"
    TTL = "ttl", "unload (idle TTL)"
    RELOAD = "reload", "unload (reload)"
    SHUTDOWN = "shutdown", "unload (shutdown)"
    EXITED = "exited", "exited"
    CRASH = "crash", "crash"
    FORCE_KILL = "force_kill", "force-kill"
    STUCK = "stuck", "stuck"
    QUARANTINE = "quarantine", "quarantine"
    LEASE_EXPIRED = "lease_expired", "lease expired"
    QUEUE_CANCELLED = "queue_cancelled", "queued request cancelled"
    LEFTOVER_KILLED = "leftover_killed", "leftover child killed"
    PRESET_CREATED = "preset_created", "preset created"
    PRESET_CHANGED = "preset_changed", "preset changed"
    PRESET_DELETED = "preset_deleted", "preset deleted"
    SETTINGS_CHANGED = "settings_changed", "settings changed"
    AUTH_FAILED = "auth_failed", "API login failed"
    KEY_SCOPE = "key_scope", "API key used outside its models"
    KEY_BUSY = "key_busy", "API key over its concurrency"
    KEY_CREATED = "key_created", "API key created"
    KEY_RESCOPED = "key_rescoped", "API key scope changed"
    KEY_REVOKED = "key_revoked", "API key revoked"
    QUOTA_EXCEEDED = "quota_exceeded", "quota exceeded"
    QUOTA_CHANGED = "quota_changed", "quota changed"
    RETENTION = "retention", "audit rows deleted (retention)"
    HUNG = "hung", "hung child killed"
    CRASH_BACKOFF = "crash_backoff", "crash-loop back-off"
    MESSAGE_EXPIRED = "message_expired", "expired message dropped"
    OUTAGE = "outage", "service outage"
    LOGIN_FAILED = "login_failed", "panel login failed"
    LOGIN_LOCKED = "login_locked", "panel login locked out"
    LOGIN_UNLOCKED = "login_unlocked", "panel login unlocked"
    RESERVATION_STARTED = "reservation_started", "reservation started"
    RESERVATION_ENDED = "reservation_ended", "reservation ended"
    NODE_LOST = "node_lost", "node lost"
    NODE_JOINED = "node_joined", "node joined"


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def record(self, kind: str, **fields: Any) -> AuditEvent:
        """Append one row: the only way rows are written (STYLE 12)."""
        row: AuditEvent = self.create(kind=kind, **fields)
        return row

    def record_many(self, rows: list[AuditEvent]) -> int:
        """Append a batch; rows already stored (same router boot and seq) are skipped, so a
        batch retried after an outage lands exactly once."""
        created = self.bulk_create(rows, ignore_conflicts=True)
        return len(created)

    def purge_older_than(self, cutoff: Any, *, actor: str = "retention") -> int:
        """Delete rows older than ``cutoff`` — the only deletion path — and audit that it ran."""
        deleted: int
        deleted, _ = self.filter(time__lt=cutoff).delete()
        self.record(
            AuditKind.RETENTION,
            actor=actor,
            reason=f"deleted {deleted} rows older than {cutoff:%Y-%m-%d %H:%M}",
            details={"deleted": deleted, "cutoff": cutoff.isoformat()},
        )
        return deleted


class AuditEvent(models.Model):
    """One lifecycle decision or change, kept so a team can answer "who evicted my model, and why".

    Append-only: rows are written through ``AuditEvent.objects.record()`` (or ``record_many`` by
    the router's batch writer), never edited, and deleted only by the retention job. Router
    events carry the router's boot id and event ``seq``, unique together, so a batch that is
    written again after a database outage is stored exactly once.
    """

    time = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=32, choices=AuditKind.choices, db_index=True)
    model = models.CharField(max_length=200, blank=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    actor = models.CharField(
        max_length=200,
        blank=True,
        db_index=True,
        help_text="user:<name>, key:<owner>/<name>, anonymous or scheduler",
    )
    reason = models.CharField(max_length=500, blank=True)
    trigger_model = models.CharField(max_length=200, blank=True)
    trigger_request = models.CharField(max_length=200, blank=True)
    queue_depth = models.IntegerField(null=True, blank=True)
    memory_before = models.BigIntegerField(null=True, blank=True)
    memory_after = models.BigIntegerField(null=True, blank=True)
    idle_seconds = models.FloatField(null=True, blank=True)
    stop_seconds = models.FloatField(null=True, blank=True)
    settle_seconds = models.FloatField(null=True, blank=True)
    load_seconds = models.FloatField(null=True, blank=True)
    force_killed = models.BooleanField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    router_id = models.CharField(max_length=64, blank=True)
    seq = models.BigIntegerField(null=True, blank=True)
    node = models.CharField(
        max_length=64, blank=True, db_index=True, help_text="the router node (several hosts)"
    )

    objects: ClassVar[AuditEventQuerySet] = AuditEventQuerySet.as_manager()  # as ApiKey.objects

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["model", "-time"]), models.Index(fields=["kind", "-time"])]
        constraints = [
            models.UniqueConstraint(
                fields=["router_id", "seq"],
                condition=models.Q(seq__isnull=False),
                name="audit_event_once_per_router_seq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.kind} {self.model}".strip()

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValidationError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ValidationError("audit events are deleted only by the retention job")
