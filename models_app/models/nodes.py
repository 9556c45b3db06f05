"""One node's own capacity, when the router runs on several hosts (issue 18)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from models_app.routing import topology


class NodeSettings(models.Model):
    """Several hosts (issue 18): one node's own capacity, over the router settings' values.

    Empty fields take the router settings' value; ``runrouter --models-max`` on the node wins
    over both.
    """

    node = models.CharField(max_length=64, unique=True, help_text="the node's name (--node)")
    models_max = models.PositiveIntegerField(
        "max running models", null=True, blank=True,
        help_text="At most this many children on this node; empty: the router settings'.",
    )  # fmt: skip
    memory_budget = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes this node's models may use; empty: the default."
    )
    settle_timeout = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds to wait for memory after an unload here."
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["node"]

    def __str__(self) -> str:
        return str(self.node)

    def clean(self) -> None:
        try:
            topology.check_name(self.node)
        except ValueError as exc:
            raise ValidationError({"node": str(exc)}) from None
