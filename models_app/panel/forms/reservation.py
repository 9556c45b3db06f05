"""A model booked for a time window, for a user or a group."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from models_app.accounts import reservations
from models_app.models import Preset


class ReservationForm(forms.Form):
    """Book a model for a time window for a user or a group (issue 17.6). Times are read in
    the panel's display time zone; overlapping bookings of one model are refused."""

    DATETIME = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")
    asked_start: Any = None  # the window's start once cleaned, even when refused (clean)

    model = forms.ChoiceField(
        label="Model",
        error_messages={"invalid_choice": "Unknown model %(value)s: it is not a preset."},
    )
    starts_at = forms.DateTimeField(label="Starts", widget=DATETIME)
    ends_at = forms.DateTimeField(label="Ends", widget=DATETIME)
    subject = forms.ChoiceField(
        label="For",
        help_text="A group's members are served first while the model is reserved.",
    )
    note = forms.CharField(label="Note", required=False, max_length=200)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = Preset.objects.order_by("name").values_list("name", flat=True)
        self.fields["model"].choices = [(name, name) for name in names]
        users = get_user_model().objects.filter(is_active=True).order_by("username")
        groups = Group.objects.order_by("name")
        self.fields["subject"].choices = [
            ("", "— a user or a group —"),
            ("Groups", [(f"group:{g.pk}", f"group {g.name}") for g in groups]),
            ("Users", [(f"user:{u.pk}", f"user {u.get_username()}") for u in users]),
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end, model = data.get("starts_at"), data.get("ends_at"), data.get("model")
        self.asked_start = start  # kept: an error on the field drops it from cleaned_data
        if start is None or end is None:
            return data
        if end <= start:
            self.add_error("ends_at", "The window must end after it starts.")
        elif end <= timezone.now():
            self.add_error("ends_at", "This window is already over: book a time to come.")
        elif model:
            taken = reservations.overlapping(model, start, end)
            if taken is not None:
                text = f"{model} is already booked {reservations.window_text(taken)} "
                self.add_error("starts_at", text + f"for {taken.subject}.")
        return data

    def target(self) -> dict[str, Any]:
        """The ``user`` or ``group`` the valid form names, as Reservation fields."""
        kind, _, pk = self.cleaned_data["subject"].partition(":")
        if kind == "group":
            return {"group": Group.objects.get(pk=int(pk)), "user": None}
        return {"user": get_user_model().objects.get(pk=int(pk)), "group": None}
