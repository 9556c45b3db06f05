"""A preset's own fields; its options and environment come from two row formsets (pairs.py)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator

from models_app.models import Preset
from models_app.panel.forms.fields import SizeField, TriStateField
from routerpanel.router import ini, presets


class PresetForm(forms.ModelForm):
    """A preset's own fields; its options and environment come from two row formsets."""

    aliases_text = forms.CharField(
        label="Aliases",
        required=False,
        help_text="Other names clients may use, separated by commas.",
    )
    memory = SizeField(
        label="Memory estimate",
        help_text="What this model needs, if you know better than the GGUF estimate (8G, 512M).",
    )
    load_on_startup = TriStateField(label="Load on startup")
    pinned = TriStateField(help_text="A pinned model is never evicted to make room.")

    class Meta:
        model = Preset
        fields = (
            "name", "model_path", "enabled", "nodes", "stop_timeout", "load_on_startup", "pinned",
            "ttl", "load_timeout", "hang_timeout", "server_bin",
        )  # fmt: skip
        widgets = {
            "name": forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
            "nodes": forms.TextInput(
                attrs={"placeholder": "any node", "autocomplete": "off", "spellcheck": "false"}
            ),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk or self.initial.get("aliases"):
            aliases = self.initial.get("aliases", self.instance.aliases)
            self.fields["aliases_text"].initial = ", ".join(aliases)
        self.fields["memory"].initial = self.initial.get(
            "memory_estimate", self.instance.memory_estimate
        )
        self.pair_errors: dict[str, list[str]] = {}
        self.value_warnings: list[str] = []  # said after the save (a negative stop-timeout)
        stop_timeout = self.fields["stop_timeout"]
        stop_timeout.validators = [v for v in stop_timeout.validators
                                   if not isinstance(v, MinValueValidator)]  # fmt: skip
        stop_timeout.min_value = None
        stop_timeout.widget.attrs.pop("min", None)

    def clean_stop_timeout(self) -> int | None:
        """A negative stop-timeout means 0 (kill at once), with a warning: the INI's rule
        (llama.cpp's ``stoi``), one rule for the form and the file (issue 49.9)."""
        value: int | None = self.cleaned_data.get("stop_timeout")
        if value is None or value >= 0:
            return value
        warnings: list[ini.IniWarning] = []
        number = presets.parse_stop_timeout(str(value), 0, warnings)
        self.value_warnings += [w.message for w in warnings]
        return number

    def clean_aliases_text(self) -> list[str]:
        text = self.cleaned_data.get("aliases_text", "")
        return list(presets.split_list(text))

    def _post_clean(self) -> None:
        self.instance.aliases = self.cleaned_data.get("aliases_text", self.instance.aliases)
        self.instance.memory_estimate = self.cleaned_data.get("memory")
        super()._post_clean()

    def _update_errors(self, errors: ValidationError) -> None:
        """Model errors on ``args``/``env``/``aliases`` belong to their rows or text field."""
        if hasattr(errors, "error_dict"):
            for field in ("args", "env"):
                for error in errors.error_dict.pop(field, []):
                    self.pair_errors.setdefault(field, []).extend(error.messages)
            if "aliases" in errors.error_dict:
                errors.error_dict["aliases_text"] = errors.error_dict.pop("aliases")
            if not errors.error_dict:
                return
        super()._update_errors(errors)
