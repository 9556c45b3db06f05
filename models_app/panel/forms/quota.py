"""A user's or a key's quota."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model

from models_app.models import ApiKey


class QuotaForm(forms.Form):
    """Set (or, with both limits empty, remove) a user's or a key's quota (issue 17.4)."""

    subject = forms.ChoiceField(
        label="For",
        help_text="A user's quota counts all of their keys; a key's only that key.",
    )
    tokens_per_day = forms.IntegerField(
        label="Tokens per day",
        required=False,
        min_value=1,
        help_text="Prompt + completion tokens per UTC day. Empty: no limit.",
    )
    requests_per_minute = forms.IntegerField(
        label="Requests per minute",
        required=False,
        min_value=1,
        help_text="Requests in any 60 s. Empty: no limit. Both empty: remove the quota.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        users = get_user_model().objects.filter(is_active=True).order_by("username")
        keys = ApiKey.objects.active().select_related("owner").order_by("owner__username", "name")
        self.fields["subject"].choices = [
            ("Users", [(f"user:{u.pk}", f"user {u.get_username()}") for u in users]),
            ("API keys", [(f"key:{k.pk}", f"key {k.owner.get_username()}/{k.name}") for k in keys]),
        ]

    def target(self) -> tuple[Any, ApiKey | None]:
        """The user and key (None: the user's own quota) the valid form names."""
        kind, _, pk = self.cleaned_data["subject"].partition(":")
        if kind == "key":
            key = ApiKey.objects.select_related("owner").get(pk=int(pk))
            return key.owner, key
        return get_user_model().objects.get(pk=int(pk)), None
