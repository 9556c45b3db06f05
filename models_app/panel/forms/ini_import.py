"""A llama.cpp preset file to import, uploaded or pasted."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

MAX_INI_BYTES = 1 << 20


class ImportForm(forms.Form):
    file = forms.FileField(required=False, help_text="A llama.cpp preset file (.ini).")
    text = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}),
        help_text="…or paste its text.",
    )
    replace = forms.BooleanField(
        required=False, help_text="Delete the presets this file does not name."
    )

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        upload = data.get("file")
        if upload is not None:
            if upload.size > MAX_INI_BYTES:
                raise ValidationError("The file is larger than 1 MiB.")
            raw = upload.read()
            try:
                data["text"] = raw.decode("utf-8-sig")
            except UnicodeDecodeError:
                raise ValidationError("The file is not UTF-8 text.") from None
        if not (data.get("text") or "").strip():
            raise ValidationError("Choose a file or paste its text.")
        return data
