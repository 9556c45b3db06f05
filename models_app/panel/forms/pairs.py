"""A preset's ``key = value`` rows (its options and its environment), each row checked by the
model's validators, and the option names the rows accept."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms import formset_factory

from models_app.models import PAIR_RESERVED_KEYS, validate_args, validate_env
from routerpanel.router import options


class PairRowForm(forms.Form):
    """One ``key = value`` row; a row with both blank is ignored."""

    key = forms.CharField(required=False, max_length=200)
    value = forms.CharField(required=False, max_length=4000)

    check: Any = None  # set by the formset: validates one [key, value] pair

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        key, value = data.get("key", "").strip(), data.get("value", "").strip()
        data["key"], data["value"] = key, value
        if not key and value:
            self.add_error("key", "Give this value a name.")
        elif key and self.check is not None:
            try:
                self.check([[key, value]])
            except ValidationError as exc:
                self.add_error("value" if exc.code == "bad_value" else "key", exc)
        return data


class BasePairFormSet(forms.BaseFormSet):
    check: Any = None

    def _construct_form(self, i: int, **kwargs: Any) -> forms.Form:
        form = super()._construct_form(i, **kwargs)
        form.check = self.check
        return form

    def clean(self) -> None:
        seen: set[str | None] = set()
        for form in self.forms:
            key: str | None = getattr(form, "cleaned_data", {}).get("key")
            if key and key in seen:
                form.add_error("key", f"{key} is given twice.")
            seen.add(key)

    def pairs(self) -> list[list[str]]:
        return [
            [f.cleaned_data["key"], f.cleaned_data["value"]]
            for f in self.forms
            if f.cleaned_data.get("key")
        ]


PairFormSet = formset_factory(PairRowForm, formset=BasePairFormSet, extra=2)


def pair_formset(
    prefix: str,
    pairs: list[list[str]],
    data: Any = None,
    *,
    catalogue: options.Catalogue | None = None,
) -> BasePairFormSet:
    """Rows of ``key = value``; option rows are checked against ``catalogue`` (the options of
    the program that runs the preset; default b11434's)."""
    formset: BasePairFormSet = PairFormSet(
        data=data, prefix=prefix, initial=[{"key": k, "value": v} for k, v in pairs]
    )
    if prefix == "args":
        formset.check = lambda pair: validate_args(pair, catalogue)
    else:
        formset.check = validate_env
    return formset


def option_names() -> list[str]:
    """Every llama-server option name the args rows accept, for the browser's suggestions."""
    names = {opt.key for opt in options.all_options() if opt.key not in ("model", "alias")}
    return sorted(names - PAIR_RESERVED_KEYS)
