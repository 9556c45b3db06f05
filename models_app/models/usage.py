"""Usage (issue 17.2): one row per proxied request and the hourly sums. Written only by
``usage.write_batch``, deleted only by retention."""

from __future__ import annotations

from django.db import models


class UsageRecord(models.Model):
    """One proxied request: who, which model, what it waited through and what it produced."""

    time = models.DateTimeField(db_index=True, help_text="When the request arrived (UTC).")
    actor = models.CharField(max_length=200, help_text="The user (or static key, anonymous).")
    key = models.CharField(max_length=200, blank=True, help_text="owner/name of the key, if any")
    model = models.CharField(max_length=200)
    path = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=160, blank=True)
    status = models.PositiveSmallIntegerField(default=0)
    queue_ms = models.FloatField(default=0.0, help_text="Waiting for the model (queue + load).")
    load_ms = models.FloatField(default=0.0, help_text="The load it waited for; 0: loaded.")
    caused_load = models.BooleanField(default=False, help_text="Its entry started that load.")
    evicted = models.CharField(max_length=500, blank=True, help_text="Evicted for that load.")
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.FloatField(default=0.0, help_text="Holding the model (grant to end).")

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["actor", "time"]), models.Index(fields=["model", "time"])]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor} {self.model}"


class UsageHour(models.Model):
    """The sums of one actor's requests to one model in one hour (kept like the rows)."""

    hour = models.DateTimeField(help_text="Start of the hour (UTC).")
    actor = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200)
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    queue_seconds = models.FloatField(default=0.0)
    loads_caused = models.PositiveIntegerField(default=0)
    load_seconds_caused = models.FloatField(default=0.0)
    model_seconds = models.FloatField(default=0.0)

    class Meta:
        ordering = ["hour", "actor", "key", "model"]
        indexes = [models.Index(fields=["actor", "hour"])]
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "actor", "key", "model"], name="usage_hour_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 {self.actor} {self.model}"
