"""API keys: what a key may do, and a new key with its name and owner."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model

from models_app.models import KeyPriority, parse_model_patterns, validate_model_patterns


class KeyScopeForm(forms.Form):
    """What a key may do (issue 17.1): its models, concurrent requests and priority class; and
    whether its streams get the queue position as comments (issue 17.7)."""

    models = forms.CharField(
        label="Models",
        required=False,
        max_length=1000,
        validators=[validate_model_patterns],
        widget=forms.TextInput(attrs={"placeholder": "qwen*, llama-3*"}),
        help_text="Comma-separated patterns (* and ? wildcards), matched against each model's "
        "name and aliases. Empty: every model.",
    )
    max_concurrent = forms.IntegerField(
        label="Max concurrent requests",
        required=False,
        min_value=1,
        help_text="Requests this key may have in flight at once, queued ones included. "
        "Empty: no limit.",
    )
    priority = forms.ChoiceField(
        choices=KeyPriority.choices,
        initial=KeyPriority.NORMAL,
        help_text="Priority class for the fair-share queue policy.",
    )
    queue_comments = forms.BooleanField(
        label="Queue position in streams",
        required=False,
        help_text="While a streamed chat waits for its model, send lines such as "
        "': queued 2 of 3, loading qwen-7b 40%' as SSE comments (OpenAI clients ignore them).",
    )

    def __init__(self, *args: Any, is_admin: bool, keep: str = "", **kwargs: Any) -> None:
        """``keep``: a priority the key already has, which a non-admin may keep."""
        super().__init__(*args, **kwargs)
        if not is_admin:
            # Fair share: a user may lower their own key's priority, not raise it above others'.
            priority = self.fields["priority"]
            priority.choices = [
                c for c in KeyPriority.choices if c[0] != KeyPriority.HIGH or c[0] == keep
            ]
            priority.help_text += " High is given by admins."

    def clean_models(self) -> str:
        return ", ".join(parse_model_patterns(self.cleaned_data.get("models") or ""))


class ApiKeyForm(KeyScopeForm):
    name = forms.CharField(max_length=100, help_text="What the key is for, e.g. laptop or ci.")
    owner = forms.ModelChoiceField(queryset=get_user_model().objects.none(), required=False)

    def __init__(self, *args: Any, user: Any, is_admin: bool, **kwargs: Any) -> None:
        super().__init__(*args, is_admin=is_admin, **kwargs)
        self.user = user
        if is_admin:
            self.fields["owner"].queryset = get_user_model().objects.order_by("username")
            self.fields["owner"].help_text = "Admins may issue keys for others; empty: you."
        else:
            del self.fields["owner"]

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        owner = data.get("owner") or self.user
        data["owner"] = owner
        name = data.get("name")
        if name and owner.api_keys.active().filter(name=name).exists():
            self.add_error("name", f"{owner} already has an active key named {name!r}.")
        return data
