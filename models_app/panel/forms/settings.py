"""The router settings and one node's own capacity, with the checks that span the presets."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from models_app.models import NodeSettings, Preset, RouterSettings
from models_app.panel.forms.fields import SizeField
from routerpanel.router import presets


class NodeSettingsForm(forms.ModelForm):
    """One node's own capacity (several hosts); an empty field takes the router settings'."""

    memory_budget = SizeField(help_text="What this node's models may use together (8G, 96G).")

    class Meta:
        model = NodeSettings
        fields = ("node", "models_max", "memory_budget", "settle_timeout")
        widgets = {"node": forms.HiddenInput}

    def clean_settle_timeout(self) -> int | None:
        value: int | None = self.cleaned_data.get("settle_timeout")
        if value is not None and value > SettingsForm.MAX_SETTLE:
            raise ValidationError(f"At most {SettingsForm.MAX_SETTLE} seconds.")
        return value

    def is_empty(self) -> bool:
        """Every value left empty: the node takes the router settings again."""
        return all(self.cleaned_data.get(f) in (None, "") for f in self.Meta.fields[1:])


class SettingsForm(forms.ModelForm):
    memory_budget = SizeField(
        help_text="What the running models may use together (8G, 96G). Empty: no budget, "
        "only the model count limits."
    )
    memory_headroom = SizeField(
        help_text="Kept free beyond a model's estimate before it starts (memory mode)."
    )

    class Meta:
        model = RouterSettings
        fields = (
            "models_max", "memory_budget", "memory_headroom", "settle_timeout", "max_waiters",
            "max_wait", "queue_policy", "default_stop_timeout", "default_hang_timeout",
            "quarantine_after", "server_binary",
            "require_api_key", "audit_retention_days",
        )  # fmt: skip
        labels = {"require_api_key": "Require an API key for the router API"}

    MAX_SETTLE = 600

    def clean_memory_headroom(self) -> int:
        return self.cleaned_data.get("memory_headroom") or 0

    def clean_settle_timeout(self) -> int:
        value: int = self.cleaned_data["settle_timeout"]
        if value > self.MAX_SETTLE:
            raise ValidationError(f"At most {self.MAX_SETTLE} seconds.")
        return value

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        models_max = data.get("models_max")
        startup = Preset.objects.filter(enabled=True, load_on_startup=True).count()
        if models_max and startup > models_max:
            self.add_error(
                "models_max",
                f"{startup} presets load on startup; the router refuses to start with fewer "
                "slots than that (A13).",
            )
        budget, headroom = data.get("memory_budget"), data.get("memory_headroom") or 0
        if budget is not None:
            if headroom >= budget:
                self.add_error("memory_headroom", "The headroom must be smaller than the budget.")
            biggest = _largest_estimate()
            if biggest is not None and biggest[1] + headroom > budget:
                self.add_error(
                    "memory_budget",
                    f"{biggest[0]} needs {presets.format_size(biggest[1])} plus the headroom: "
                    "with this budget it could never load.",
                )
        return data


def _largest_estimate() -> tuple[str, int] | None:
    found = [
        (p.name, p.memory_estimate or p.gguf_estimate)
        for p in Preset.objects.filter(enabled=True)
        if p.memory_estimate or p.gguf_estimate
    ]
    return max(found, key=lambda item: item[1], default=None)
