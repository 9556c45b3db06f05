"""Reservations: a model booked for a time window for one user or one group (issue 17.6)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Reservation(models.Model):
    """A model booked for a time window for one user or one group (issue 17.6).

    While the window is open (``starts_at`` <= now < ``ends_at``) the router keeps the model
    loaded and pinned and serves the user's (or the group members') requests for it first
    (``reservations.tick``). ``started_audited_at`` and ``ended_audited_at`` record that the
    start and end audit rows were written, so each is written once, whatever the number of
    ticks, workers or restarts.
    """

    model = models.CharField(max_length=200, help_text="The preset's name.")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="reservations",
    )  # fmt: skip
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="reservations"
    )
    note = models.CharField(max_length=200, blank=True)
    created_by = models.CharField(max_length=150, help_text="The actor who booked it.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_audited_at = models.DateTimeField(null=True, blank=True, editable=False)
    ended_audited_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["starts_at", "model"]
        indexes = [models.Index(fields=["ends_at", "starts_at"], name="reservation_window")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="reservation_user_or_group",
            ),
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")),
                name="reservation_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} for {self.subject}"

    @property
    def subject(self) -> str:
        """``user alice`` or ``group workshop``: whom the model is booked for."""
        if self.group_id is not None and self.group is not None:
            return f"group {self.group.name}"
        return f"user {self.user.get_username() if self.user else '?'}"
