"""RouterPanel's stored state: presets (the model definitions) and the one-row router settings.

Presets keep their llama-server options as ordered ``[key, value]`` pairs, exactly as a section of
llama.cpp's preset INI holds them, so that import → export → import changes nothing. Keys the
router itself owns (model path, aliases, stop-timeout, …) have fields of their own.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from routerpanel.router import ini, options, presets

PAIR_RESERVED_KEYS = frozenset(presets.LLAMA_ROUTER_KEYS + presets.ROUTERPANEL_KEYS)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def validate_model_id(name: str) -> None:
    """Accept the ids llama.cpp accepts as preset names, in their canonical spelling."""
    problem = ini.check_section_name(name)
    if problem:
        raise ValidationError(problem[0].upper() + problem[1:] + ".", code="invalid")
    if name == ini.GLOBAL_SECTION:
        raise ValidationError("'*' is the global section, not a model id.", code="reserved")
    if _CONTROL.search(name):
        raise ValidationError("A model id cannot contain control characters.", code="invalid")
    canonical = ini.canonical_name(name)
    if canonical != name:
        raise ValidationError(
            "llama.cpp spells the tag after ':' in upper case: use '%(canonical)s'.",
            code="canonical",
            params={"canonical": canonical},
        )


def validate_pairs(value: Any, *, what: str = "option") -> list[tuple[str, str]]:
    """Check a list of ``[key, value]`` pairs: writable in the INI dialect, keys unique."""
    if not isinstance(value, list):
        raise ValidationError(f"Expected a list of [{what}, value] pairs.", code="invalid")
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for item in value:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise ValidationError(f"Each {what} must be a [key, value] pair.", code="invalid")
        key, val = item
        if not isinstance(key, str) or not isinstance(val, str):
            raise ValidationError(f"{what.capitalize()} keys and values are text.", code="invalid")
        problem = ini.check_key(key) or ini.check_value(val)
        if problem:
            raise ValidationError(f"{key}: {problem}.", code="invalid")
        if key in seen:
            raise ValidationError(f"{key} is given twice.", code="duplicate")
        seen.add(key)
        pairs.append((key, val))
    return pairs


def validate_args(value: Any, *, passthrough: bool = False) -> None:
    """Check preset args: known llama-server options unless another server binary runs them."""
    for key, _ in validate_pairs(value):
        if key in PAIR_RESERVED_KEYS or key.startswith(presets.ENV_PREFIX):
            raise ValidationError(
                f"{key} has its own field; set it there instead of in the options.",
                code="own_field",
            )
        found = options.lookup(key)
        if found is not None and found[0].key in ("alias", "model"):
            raise ValidationError(
                f"{key} has its own field ({found[0].key}); set it there.", code="own_field"
            )
        if found is None and not passthrough:
            raise ValidationError(
                f"llama-server has no option '{key}'. Use an option name without dashes, "
                "such as ctx-size, n-gpu-layers or temp.",
                code="unknown_option",
            )


def validate_env(value: Any) -> None:
    for key, _ in validate_pairs(value, what="variable"):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValidationError(
                f"{key}: environment variable names use letters, digits and '_'.", code="invalid"
            )


def validate_server_bin(value: str) -> None:
    try:
        presets.check_server_bin(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="invalid") from None


class Preset(models.Model):
    """One model the router can run: a section of llama.cpp's preset INI, plus our own keys."""

    name = models.CharField(
        "model id",
        max_length=200,
        unique=True,
        validators=[validate_model_id],
        help_text='The id clients send as "model", e.g. org/name-GGUF:Q4_K_M.',
    )
    aliases = models.JSONField(default=list, blank=True, help_text="Other names clients may use.")
    model_path = models.CharField(
        "model file", max_length=1000, blank=True, help_text="Path to the GGUF file (-m)."
    )
    args = models.JSONField(
        "options",
        default=list,
        blank=True,
        help_text='llama-server options as ordered [key, value] pairs, e.g. ["ctx-size", "8192"].',
    )
    env = models.JSONField(
        "environment", default=list, blank=True, help_text="Extra environment for the child."
    )
    stop_timeout = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Seconds between the exit request and SIGKILL of the process group. "
        "Empty: the [*] value, else the default (10).",
    )
    load_on_startup = models.BooleanField(null=True, blank=True)
    pinned = models.BooleanField(
        null=True, blank=True, help_text="A pinned model is never evicted to make room."
    )
    ttl = models.PositiveIntegerField(
        "idle TTL", null=True, blank=True, help_text="Unload after this many idle seconds."
    )
    load_timeout = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds a load may take before it is killed and failed."
    )
    memory_estimate = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Bytes this model needs, if you know better than the GGUF estimate.",
    )
    gguf_facts = models.JSONField(default=dict, blank=True, editable=False)
    gguf_estimate = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    server_bin = models.CharField(
        "server binary",
        max_length=1000,
        blank=True,
        validators=[validate_server_bin],
        help_text="Command to run instead of llama-server, split like a shell would but never "
        "run through one. Its options are passed through as --key value.",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, editable=False
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        errors: dict[str, list[ValidationError]] = {}
        for field_name, check in (
            ("args", lambda v: validate_args(v, passthrough=bool(self.server_bin))),
            ("env", validate_env),
            ("aliases", _validate_aliases),
        ):
            try:
                check(getattr(self, field_name))
            except ValidationError as exc:
                errors.setdefault(field_name, []).append(exc)
        if self.model_path and (problem := ini.check_value(self.model_path)):
            errors.setdefault("model_path", []).append(ValidationError(problem))
        if errors:
            raise ValidationError(errors)

    def to_def(self) -> presets.PresetDef:
        return presets.PresetDef(
            name=self.name,
            aliases=tuple(self.aliases),
            model_path=self.model_path,
            args=tuple((k, v) for k, v in self.args),
            env=tuple((k, v) for k, v in self.env),
            stop_timeout=self.stop_timeout,
            load_on_startup=self.load_on_startup,
            pinned=self.pinned,
            ttl=self.ttl,
            load_timeout=self.load_timeout,
            memory=self.memory_estimate,
            server_bin=self.server_bin,
            enabled=self.enabled,
        )

    def apply_def(self, preset: presets.PresetDef) -> None:
        self.name = preset.name
        self.aliases = list(preset.aliases)
        self.model_path = preset.model_path
        self.args = [[k, v] for k, v in preset.args]
        self.env = [[k, v] for k, v in preset.env]
        self.stop_timeout = preset.stop_timeout
        self.load_on_startup = preset.load_on_startup
        self.pinned = preset.pinned
        self.ttl = preset.ttl
        self.load_timeout = preset.load_timeout
        self.memory_estimate = preset.memory
        self.server_bin = preset.server_bin
        self.enabled = preset.enabled


def _validate_aliases(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValidationError("Aliases are a list of names.", code="invalid")
    for alias in value:
        if not alias.strip() or "," in alias or (ini.check_value(alias) is not None):
            raise ValidationError(f"Alias {alias!r} is empty or contains ',', ';' or '#'.")


class RouterSettings(models.Model):
    """The router's settings: one row, created on first use (``RouterSettings.load()``)."""

    models_max = models.PositiveIntegerField(
        "max running models",
        default=4,
        help_text="At most this many child servers run at once; 0 means no limit.",
    )
    memory_budget = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Bytes the running models may use together; empty: no budget.",
    )
    memory_headroom = models.PositiveBigIntegerField(
        default=0, help_text="Bytes kept free beyond a model's estimate before it is started."
    )
    settle_timeout = models.PositiveIntegerField(
        default=10, help_text="Seconds to wait for memory to come back after an unload."
    )
    max_waiters = models.PositiveIntegerField(
        null=True, blank=True, help_text="Requests that may wait for one model; empty: no limit."
    )
    max_wait = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds a request may wait in the queue; empty: no limit."
    )
    default_stop_timeout = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(0)], help_text="Seconds, when a preset sets none."
    )
    quarantine_after = models.PositiveIntegerField(
        default=3,
        validators=[MinValueValidator(1)],
        help_text="Consecutive failed loads before a preset is quarantined.",
    )
    server_binary = models.CharField(
        max_length=1000,
        default="llama-server",
        validators=[validate_server_bin],
        help_text="The llama-server command for presets that do not name their own.",
    )
    require_api_key = models.BooleanField(default=False)
    global_args = models.JSONField(
        "global options ([*])",
        default=list,
        blank=True,
        help_text="The [*] section: options applied to every preset, as [key, value] pairs.",
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, editable=False
    )

    class Meta:
        verbose_name = "router settings"
        verbose_name_plural = "router settings"

    def __str__(self) -> str:
        return "Router settings"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.pk = 1  # one row, always
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ValidationError("The router settings row cannot be deleted.")

    @classmethod
    def load(cls) -> RouterSettings:
        row, _ = cls.objects.get_or_create(
            pk=1,
            defaults={
                "models_max": settings.ROUTERPANEL["MODELS_MAX"],
                "default_stop_timeout": settings.ROUTERPANEL["DEFAULT_STOP_TIMEOUT"],
                "server_binary": settings.ROUTERPANEL["SERVER_BIN"],
            },
        )
        return row

    def clean(self) -> None:
        try:
            self.global_def()
        except ValueError as exc:
            raise ValidationError({"global_args": str(exc)}) from None

    def global_def(self) -> presets.PresetDef | None:
        """The ``[*]`` section as a definition; raises ``ValueError`` naming a bad key."""
        try:
            pairs = validate_pairs(self.global_args)
        except ValidationError as exc:
            raise ValueError(" ".join(exc.messages)) from None
        if not pairs:
            return None
        section = ini.Section(ini.GLOBAL_SECTION, ini.GLOBAL_SECTION)
        for key, value in pairs:
            section.set(key, value)
        return presets.section_to_def(section, "[*]")

    def set_global_def(self, preset: presets.PresetDef | None) -> None:
        if preset is None:
            self.global_args = []
            return
        section = presets.def_to_section(preset)
        self.global_args = [[k, v] for k, v in section.pairs()]
