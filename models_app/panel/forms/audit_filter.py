"""The audit log's filters."""

from __future__ import annotations

from typing import Any

from django import forms

from models_app.models import AuditKind


class AuditFilterForm(forms.Form):
    model = forms.CharField(required=False)
    kind = forms.ChoiceField(required=False, choices=[("", "any kind"), *AuditKind.choices])
    actor = forms.CharField(required=False, help_text="e.g. user:alice, key:bob/ci, scheduler")
    since = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    until = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            self.add_error("until", "The end is before the start.")
        return data
