"""Users: a new one with a role, and a user's role."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError

from models_app.accounts.roles import Role

ROLE_CHOICES = [(r.label, r.label) for r in (Role.VIEWER, Role.OPERATOR, Role.ADMIN)]


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=[("none", "no access"), *ROLE_CHOICES])


class NewUserForm(forms.Form):
    username = forms.CharField(max_length=150)
    password = forms.CharField(
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}), strip=False
    )
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial="viewer")

    def clean_username(self) -> str:
        name: str = self.cleaned_data["username"]
        users = get_user_model()
        if users.objects.filter(username=name).exists():
            raise ValidationError("That user name is taken.")
        return name

    def clean(self) -> dict[str, Any]:
        data: dict[str, Any] = super().clean()
        if data.get("password"):
            user = get_user_model()(username=data.get("username", ""))
            try:
                password_validation.validate_password(data["password"], user)
            except ValidationError as exc:
                self.add_error("password", exc)
        return data
