"""Memory history: per-minute rollups of the router's one-second samples, for the chart."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models


class MemoryRollupQuerySet(models.QuerySet["MemoryRollup"]):
    def purge_older_than(self, cutoff: Any) -> int:
        deleted: int
        deleted, _ = self.filter(minute__lt=cutoff).delete()
        return deleted


class MemoryRollup(models.Model):
    """Memory per minute (min/avg/max) for the system and each model, for the history chart.

    The router keeps the last hour of one-second samples; a job folds complete minutes of that
    ring into these rows every minute (written again only by a fold over more samples, so a job
    that runs twice changes nothing) and deletes rows older than ``KEEP_DAYS``. ``scope`` is
    ``system`` (``model`` empty) or ``model`` (``model`` is the preset name); ``used_*`` is the
    system's used memory or the model's process-tree RSS; ``available_*`` and ``swap_used_*``
    are set for the system only.
    """

    SYSTEM = "system"
    MODEL = "model"
    KEEP_DAYS = 30

    minute = models.DateTimeField(help_text="Start of the minute (UTC).")
    scope = models.CharField(max_length=8, choices=[(SYSTEM, "system"), (MODEL, "model")])
    model = models.CharField(max_length=200, blank=True)
    samples = models.PositiveIntegerField()
    used_min = models.BigIntegerField()
    used_avg = models.BigIntegerField()
    used_max = models.BigIntegerField()
    available_min = models.BigIntegerField(null=True, blank=True)
    available_avg = models.BigIntegerField(null=True, blank=True)
    available_max = models.BigIntegerField(null=True, blank=True)
    swap_used_min = models.BigIntegerField(null=True, blank=True)
    swap_used_avg = models.BigIntegerField(null=True, blank=True)
    swap_used_max = models.BigIntegerField(null=True, blank=True)
    node = models.CharField(
        max_length=64, blank=True, default="", help_text="the node's machine (several hosts)"
    )

    objects: ClassVar[MemoryRollupQuerySet] = MemoryRollupQuerySet.as_manager()  # as ApiKey's

    class Meta:
        ordering = ["minute", "scope", "model"]
        indexes = [models.Index(fields=["scope", "model", "minute"])]
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "scope", "model", "node"], name="memory_rollup_once_per_minute"
            )
        ]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.model or self.scope}"
