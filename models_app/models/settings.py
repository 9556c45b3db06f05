"""The router's settings (one row) and the counter the database raises on every change to the
configuration (presets, router settings, node settings)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from models_app import runtime
from models_app.models.validators import validate_pairs, validate_server_bin
from models_app.presets import server_options
from routerpanel.router import ini, options, presets

# Seconds a queued request waits at most unless the settings or serve --max-wait say otherwise:
# every request has an end (issue 44.2).
DEFAULT_MAX_WAIT = 600


class ConfigChange(models.Model):
    """A counter the database itself raises on every change to presets, router settings and node
    settings, whoever makes it: the panel, ``import_presets``, the Django admin, another web
    process, a script, a plain SQL ``UPDATE`` (triggers, migration 0021). Every router reads it
    twice a second (``config_watch.py``) and reloads when it moved: the database is the one
    source of truth, and no router polls whole tables. One row, id 1, made by the first change.
    """

    version = models.BigIntegerField(default=0)


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
        default=DEFAULT_MAX_WAIT,
        validators=[MinValueValidator(1)],
        help_text="Seconds a request may wait in the queue; then it is answered 503 with "
        "Retry-After. Every request has an end (serve --max-wait overrides it).",
    )
    queue_policy = models.CharField(
        "queue policy",
        max_length=8,
        choices=[("fifo", "fifo: arrival order"), ("fair", "fair: fair share")],
        default="fifo",
        help_text="fifo serves models in the order they were asked for (llama.cpp's order). "
        "fair serves higher priority keys first, then whoever used the machine least in the "
        "last 15 minutes; an entry waiting half of max wait (at most 2 minutes) goes first.",
    )
    default_stop_timeout = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(0)], help_text="Seconds, when a preset sets none."
    )
    default_hang_timeout = models.FloatField(
        "default hang timeout",
        default=60,
        validators=[MinValueValidator(0)],
        help_text="Seconds a busy model may go without sending a byte before the watchdog "
        "probes it, when its preset sets none. 0: no watchdog.",
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
    audit_retention_days = models.PositiveIntegerField(
        "keep audit rows (days)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="A daily job deletes audit rows older than this (and audits that it did); "
        "empty: keep them forever.",
    )
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
        row: RouterSettings
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
            stored = self.global_def()
            program = presets.program_of("", stored, self.default_program())
            self._global_def(server_options.options_for(program))
        except ValueError as exc:
            raise ValidationError({"global_args": str(exc)}) from None

    def default_program(self) -> str:
        """The command for presets that name none: ``serve --server-bin``, else the setting."""
        return runtime.current().server_bin or self.server_binary

    def program_for(self, server_bin: str) -> str:
        """The command that runs a preset whose own server-bin is ``server_bin``."""
        return presets.program_of(server_bin, self.global_def(), self.default_program())

    def global_def(self) -> presets.PresetDef | None:
        """The ``[*]`` section as a definition; raises ``ValueError`` for a malformed value.

        Its option names were checked when they were stored (``clean``, or the import) against
        the program they were meant for, so they are not checked again here.
        """
        return self._global_def(options.Unreadable("[*]", "checked when stored"))

    def _global_def(self, catalogue: options.Catalogue) -> presets.PresetDef | None:
        try:
            pairs = validate_pairs(self.global_args)
        except ValidationError as exc:
            raise ValueError(" ".join(exc.messages)) from None
        if not pairs:
            return None
        section = ini.Section(ini.GLOBAL_SECTION, ini.GLOBAL_SECTION)
        for key, value in pairs:
            section.set(key, value)
        return presets.section_to_def(section, "[*]", None, catalogue)

    def set_global_def(self, preset: presets.PresetDef | None) -> None:
        if preset is None:
            self.global_args = []
            return
        section = presets.def_to_section(preset)
        self.global_args = [[k, v] for k, v in section.pairs()]
