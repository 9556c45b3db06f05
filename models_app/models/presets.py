"""Presets: the model definitions, one section of llama.cpp's preset INI each, plus our own
keys; where each came from; and which program a preset runs, with what that program accepts.

Presets keep their llama-server options as ordered ``[key, value]`` pairs, exactly as a section of
llama.cpp's preset INI holds them, so that import → export → import changes nothing. Keys the
router itself owns (model path, aliases, stop-timeout, …) have fields of their own.
"""

from __future__ import annotations

import contextlib

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from models_app.models.base import TextChoices
from models_app.models.settings import RouterSettings
from models_app.models.validators import (
    validate_aliases,
    validate_args,
    validate_env,
    validate_model_id,
    validate_nodes,
    validate_server_bin,
)
from models_app.presets import server_options
from routerpanel.router import ini, options, presets


class PresetSource(TextChoices):
    """Where a preset came from; a reload removes presets whose source no longer names them."""

    PANEL = "panel", "made in the panel"
    IMPORT = "import", "imported from a preset file"
    MODELS_PRESET = "models_preset", "the --models-preset file"
    MODELS_DIR = "models_dir", "the --models-dir folder"
    DEMO = "demo", "the simulated demo models"


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
    hang_timeout = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Seconds a busy model may go without sending a byte before the watchdog "
        "checks it and, if it made no progress, kills it. 0: off. Empty: the [*] value, else "
        "the router default.",
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
        "run through one. Options are checked against what its --help lists.",
    )
    enabled = models.BooleanField(default=True)
    nodes = models.CharField(
        max_length=1000,
        blank=True,
        validators=[validate_nodes],
        help_text="The nodes this model may run on, by their runrouter --node names, separated "
        "by commas (studio-1, studio-2). Empty: any node.",
    )
    source = models.CharField(
        max_length=20,
        choices=PresetSource.choices,
        default=PresetSource.PANEL,
        editable=False,
        help_text="Where the preset came from. A preset from the --models-preset file or the "
        "--models-dir folder goes when a reload no longer finds it there.",
    )
    source_path = models.CharField(
        max_length=1000,
        blank=True,
        editable=False,
        help_text="The file or folder it came from (absolute), for sources that have one.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, editable=False
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return str(self.name)

    def clean(self) -> None:
        errors: dict[str, list[ValidationError]] = {}
        self.option_warnings: list[str] = []
        try:
            self.option_warnings = validate_args(self.args, catalogue_for(self.server_bin))
        except ValidationError as exc:
            errors.setdefault("args", []).append(exc)
        for field_name, check in (("env", validate_env), ("aliases", validate_aliases)):
            try:
                check(getattr(self, field_name))
            except ValidationError as exc:
                errors.setdefault(field_name, []).append(exc)
        if self.model_path and (problem := ini.check_value(self.model_path)):
            errors.setdefault("model_path", []).append(ValidationError(problem))
        # One spelling: sorted, no spaces (a bad value is the field validator's error).
        with contextlib.suppress(ValueError):
            self.nodes = presets.format_nodes(presets.parse_nodes(self.nodes))
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
            hang_timeout=self.hang_timeout,
            memory=self.memory_estimate,
            server_bin=self.server_bin,
            enabled=self.enabled,
            nodes=self.node_list,
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
        self.hang_timeout = preset.hang_timeout
        self.memory_estimate = preset.memory
        self.server_bin = preset.server_bin
        self.enabled = preset.enabled
        self.nodes = presets.format_nodes(preset.nodes)

    @property
    def node_list(self) -> tuple[str, ...]:
        """The nodes it may run on, sorted; empty: any node."""
        return tuple(sorted({n.strip() for n in (self.nodes or "").split(",") if n.strip()}))


# ---- which program a preset runs, and what it accepts --------------------------------------------


def default_program() -> str:
    """The command for presets that name none (the stored settings)."""
    return RouterSettings.load().default_program()


def program_for(server_bin: str) -> str:
    """The command that runs a preset whose own server-bin is ``server_bin``; read from the
    settings once per ``server_options.settings_held`` block (an import of thousands)."""
    return server_options.remembered(
        f"program {server_bin}", lambda: RouterSettings.load().program_for(server_bin)
    )


def catalogue_for(server_bin: str) -> options.Catalogue:
    """What a preset whose own server-bin is ``server_bin`` may set (its program's --help)."""
    return server_options.options_for(program_for(server_bin))
