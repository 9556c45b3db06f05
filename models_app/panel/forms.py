"""The panel's forms: presets (with key/value rows), router settings, INI import, audit filters,
API keys and users. Validation lives in the models where it can (``Preset.clean``, field
validators); these forms add what a form needs on top: sizes written as ``8G``, rows instead of
JSON, and checks that span rows or presets.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.forms import formset_factory

from models_app.accounts.roles import Role
from models_app.models import (
    PAIR_RESERVED_KEYS,
    ApiKey,
    AuditKind,
    KeyPriority,
    NodeSettings,
    Preset,
    RouterSettings,
    parse_model_patterns,
    validate_args,
    validate_env,
    validate_model_patterns,
)
from routerpanel.router import ini, options, presets

MAX_INI_BYTES = 1 << 20
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


# ---- key/value rows -------------------------------------------------------------------------


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


# ---- presets ----------------------------------------------------------------------------------


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


# ---- router settings --------------------------------------------------------------------------


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


# ---- INI import -------------------------------------------------------------------------------


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


# ---- audit log --------------------------------------------------------------------------------


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


# ---- API keys and users -----------------------------------------------------------------------


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
        from django.contrib.auth.models import Group

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
        from django.utils import timezone

        from models_app.accounts import reservations

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
        from django.contrib.auth.models import Group

        kind, _, pk = self.cleaned_data["subject"].partition(":")
        if kind == "group":
            return {"group": Group.objects.get(pk=int(pk)), "user": None}
        return {"user": get_user_model().objects.get(pk=int(pk)), "group": None}
