"""Fields the panel's forms share: a byte size written as ``8G``, and yes / no / not set."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from routerpanel.router import presets

TRISTATE = (("", "not set (inherit)"), ("true", "yes"), ("false", "no"))


class SizeField(forms.CharField):
    """A byte size written as ``8G``, ``512M``, ``1.5GiB`` or a plain number of bytes."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", forms.TextInput(attrs={"placeholder": "e.g. 8G or 512M"}))
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, int):
            return presets.format_size(value)
        return value

    def to_python(self, value: Any) -> int | None:
        text = super().to_python(value)
        if not text:
            return None
        try:
            return presets.parse_size(text)
        except ValueError:
            raise ValidationError(
                "Write a size such as 8G, 512M or 1073741824 (bytes).", code="invalid"
            ) from None


class TriStateField(forms.TypedChoiceField):
    """Yes / no / not set: a preset that does not set a key inherits ``[*]`` or the default."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            choices=TRISTATE,
            coerce=lambda v: v == "true",
            empty_value=None,
            required=False,
            **kwargs,
        )

    def prepare_value(self, value: Any) -> Any:
        return {True: "true", False: "false"}.get(value, "")
