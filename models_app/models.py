"""RouterPanel's stored state: presets (the model definitions), the one-row router settings and
the users' API keys.

Presets keep their llama-server options as ordered ``[key, value]`` pairs, exactly as a section of
llama.cpp's preset INI holds them, so that import → export → import changes nothing. Keys the
router itself owns (model path, aliases, stop-timeout, …) have fields of their own.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import re
import secrets
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from models_app import runtime
from models_app.panel.wording import counted
from models_app.presets import server_options
from routerpanel.router import ini, options, presets

if TYPE_CHECKING:
    from enum import StrEnum

    class TextChoices(StrEnum):
        """What Django's ``models.TextChoices`` is at run time, told to mypy (Django has no
        types here): a str enum whose members are ``VALUE = "value", "label"``."""

        choices: ClassVar[list[tuple[str, str]]]

        @property
        def label(self) -> str: ...

else:
    TextChoices = models.TextChoices

PAIR_RESERVED_KEYS = frozenset(presets.LLAMA_ROUTER_KEYS + presets.ROUTERPANEL_KEYS)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Seconds a queued request waits at most unless the settings or serve --max-wait say otherwise:
# every request has an end (issue 44.2).
DEFAULT_MAX_WAIT = 600


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


def validate_args(value: Any, catalogue: options.Catalogue | None = None) -> list[str]:
    """Check preset args against what the preset's program accepts (default: b11434).

    Raise ValidationError for a key that program does not accept; return warnings for keys
    accepted unchecked (its options could not be read) or ignored (router flags, §11.15).
    """
    known = catalogue or options.builtin()
    warnings: list[ini.IniWarning] = []
    for key, val in validate_pairs(value):
        if key in PAIR_RESERVED_KEYS or key.startswith(presets.ENV_PREFIX):
            raise ValidationError(
                f"{key} has its own field; set it there instead of in the options.",
                code="own_field",
            )
        try:
            found = presets.check_option(key, "", known, 0, warnings)
        except ValueError:
            raise ValidationError(_unknown_option(key, known), code="unknown_option") from None
        if found is not None and found.key in ("alias", "model"):
            raise ValidationError(
                f"{key} has its own field ({found.key}); set it there.", code="own_field"
            )
        problem = options.value_problem(found, val) if found is not None else None
        if found is not None and problem:
            raise ValidationError(f"{key} = {val!r}: {found.key} {problem}.", code="bad_value")
    return [w.message for w in warnings]


def _unknown_option(key: str, catalogue: options.Catalogue) -> str:
    program = "llama-server"
    if isinstance(catalogue, options.OptionTable) and catalogue is not options.builtin():
        program = catalogue.origin
    example = "such as ctx-size, n-gpu-layers or temp" if "llama" in program else "from its --help"
    return f"{program} has no option '{key}'. Use an option name without dashes, {example}."


def validate_env(value: Any) -> None:
    for key, _ in validate_pairs(value, what="variable"):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValidationError(
                f"{key}: environment variable names use letters, digits and '_'.", code="invalid"
            )


def validate_nodes(value: str) -> None:
    try:
        presets.parse_nodes(value)
    except ValueError as exc:
        message = str(exc).partition(": ")[2] or str(exc)
        raise ValidationError(message[0].upper() + message[1:] + ".", code="invalid") from None


def validate_server_bin(value: str) -> None:
    try:
        presets.check_server_bin(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="invalid") from None


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
        for field_name, check in (("env", validate_env), ("aliases", _validate_aliases)):
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


def _validate_aliases(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValidationError("Aliases are a list of names.", code="invalid")
    for alias in value:
        if not alias.strip() or "," in alias or (ini.check_value(alias) is not None):
            raise ValidationError(f"Alias {alias!r} is empty or contains ',', ';' or '#'.")


class ConfigChange(models.Model):
    """A counter the database itself raises on every change to presets, router settings and node
    settings, whoever makes it: the panel, ``import_presets``, the Django admin, another web
    process, a script, a plain SQL ``UPDATE`` (triggers, migration 0021). Every router reads it
    twice a second (``config_watch.py``) and reloads when it moved: the database is the one
    source of truth, and no router polls whole tables. One row, id 1, made by the first change.
    """

    version = models.BigIntegerField(default=0)


class NodeSettings(models.Model):
    """Several hosts (issue 18): one node's own capacity, over the router settings' values.

    Empty fields take the router settings' value; ``runrouter --models-max`` on the node wins
    over both.
    """

    node = models.CharField(max_length=64, unique=True, help_text="the node's name (--node)")
    models_max = models.PositiveIntegerField(
        "max running models", null=True, blank=True,
        help_text="At most this many children on this node; empty: the router settings'.",
    )  # fmt: skip
    memory_budget = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Bytes this node's models may use; empty: the default."
    )
    settle_timeout = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds to wait for memory after an unload here."
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["node"]

    def __str__(self) -> str:
        return str(self.node)

    def clean(self) -> None:
        from models_app.routing import topology

        try:
            topology.check_name(self.node)
        except ValueError as exc:
            raise ValidationError({"node": str(exc)}) from None


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
        return runtime.OPTIONS.server_bin or self.server_binary

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


def hash_api_key(key: str) -> str:
    """Return the stored form of an API key: its SHA-256, hex.

    Keys are 256-bit random tokens, so a plain (unsalted, fast) digest cannot be brute-forced
    and stays valid when SECRET_KEY rotates or another web process checks it.
    """
    return hashlib.sha256(key.encode()).hexdigest()


class KeyPriority(TextChoices):
    """A key's priority class: stored now, read by the fair-share queue policy (issue 17.5)."""

    LOW = "low", "low"
    NORMAL = "normal", "normal"
    HIGH = "high", "high"


def parse_model_patterns(text: str) -> tuple[str, ...]:
    """Split ``"qwen*, llama-3*"`` into patterns; empty (or only commas) means every model."""
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def validate_model_patterns(text: str) -> None:
    for pattern in parse_model_patterns(text):
        if _CONTROL.search(pattern) or any(c.isspace() for c in pattern):
            raise ValidationError(f"Model pattern {pattern!r} contains a space or a control.")


def patterns_allow(patterns: tuple[str, ...], names: Any) -> bool:
    """Whether any of ``names`` (a model's name and aliases) matches any pattern; no patterns:
    yes. Case-sensitive, as model ids are (``fnmatchcase``: ``*``, ``?``, ``[seq]``)."""
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in patterns)


class ApiKeyQuerySet(models.QuerySet["ApiKey"]):
    def active(self) -> ApiKeyQuerySet:
        active: ApiKeyQuerySet = self.filter(revoked_at__isnull=True)
        return active

    def issue(
        self,
        owner: Any,
        name: str,
        *,
        model_patterns: str = "",
        max_concurrent: int | None = None,
        priority: str = KeyPriority.NORMAL,
        queue_comments: bool = False,
    ) -> tuple[ApiKey, str]:
        """Create a key for ``owner``; return it with the secret, which is never stored."""
        key = ApiKey(
            owner=owner,
            name=name,
            model_patterns=", ".join(parse_model_patterns(model_patterns)),
            max_concurrent=max_concurrent or None,
            priority=priority,
            queue_comments=queue_comments,
        )
        key.full_clean(exclude=["owner", "name", "prefix", "hash"])
        secret = key.set_new_secret()
        key.save(force_insert=True)
        return key, secret


class ApiKey(models.Model):
    """A user's API key. Only its hash is stored; the key itself is shown once, at creation.

    Requests made with it act as ``key:<owner>/<name>`` in the router's events and audit log.
    Revoking keeps the row (and the attribution of past events); a revoked key stops working at
    once in this process and within the key cache's TTL in other web processes.
    """

    PREFIX_LENGTH = 10
    TOKEN_PREFIX = "rp-"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100, help_text="What the key is for, e.g. laptop or ci.")
    prefix = models.CharField(
        max_length=16, editable=False, help_text="The key's first characters, to recognise it."
    )
    hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Scope (issue 17.1): which models, how many requests at once, which priority class.
    model_patterns = models.CharField(
        "models",
        max_length=1000,
        blank=True,
        validators=[validate_model_patterns],
        help_text="Comma-separated patterns such as qwen*, matched against a model's name and "
        "aliases. Empty: every model.",
    )
    max_concurrent = models.PositiveIntegerField(
        "max concurrent requests",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Requests this key may have in flight (queued or answering). Empty: no limit.",
    )
    priority = models.CharField(
        max_length=8,
        choices=KeyPriority.choices,
        default=KeyPriority.NORMAL,
        help_text="Priority class for the fair-share queue policy.",
    )
    # Issue 17.7: streamed requests waiting for their model get SSE comment lines.
    queue_comments = models.BooleanField(
        "queue position in streams",
        default=False,
        help_text="While a streamed chat waits for its model, send the queue position and the "
        "load's progress as SSE comment lines (OpenAI clients ignore them).",
    )

    # Typed as its queryset: the manager as_manager() makes has the queryset's methods.
    objects: ClassVar[ApiKeyQuerySet] = ApiKeyQuerySet.as_manager()

    class Meta:
        verbose_name = "API key"
        ordering = ["owner_id", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "name"],
                condition=models.Q(revoked_at__isnull=True),
                name="api_key_unique_active_name",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def generate(cls) -> str:
        return cls.TOKEN_PREFIX + secrets.token_urlsafe(32)

    def set_new_secret(self) -> str:
        """Give this (unsaved) key a fresh secret; return it so the caller can show it once."""
        secret = self.generate()
        self.prefix = secret[: self.PREFIX_LENGTH]
        self.hash = hash_api_key(secret)
        return secret

    @property
    def actor(self) -> str:
        return f"key:{self.owner.get_username()}/{self.name}"

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def patterns(self) -> tuple[str, ...]:
        return parse_model_patterns(self.model_patterns)

    def scope_text(self) -> str:
        """``"models qwen*, llama-3*; at most 2 at once; priority high"``: what the key may do
        (``"; queue comments"`` after it when the key asks for them)."""
        models_text = ", ".join(self.patterns) or "all"
        limit = f"at most {self.max_concurrent} at once" if self.max_concurrent else "no limit"
        comments = "; queue comments" if self.queue_comments else ""
        return f"models {models_text}; {limit}; priority {self.priority}{comments}"

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])


class Quota(models.Model):
    """A user's limits, or one of their keys' (issue 17.4). No row: no limit. A user's quota
    counts every request made with any of their keys; a key's only that key's."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quotas"
    )
    key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.CASCADE, related_name="quotas",
        help_text="Empty: the quota is the user's, over all of their keys.",
    )  # fmt: skip
    tokens_per_day = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Prompt + completion tokens per UTC day. Empty: no limit.",
    )  # fmt: skip
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Requests in any 60 s. Empty: no limit.",
    )  # fmt: skip

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user"], condition=models.Q(key__isnull=True), name="quota_one_per_user"
            ),
            models.UniqueConstraint(fields=["key"], name="quota_one_per_key"),
        ]

    def __str__(self) -> str:
        return self.subject

    @property
    def subject(self) -> str:
        """``user alice`` or ``API key alice/laptop``: whom the quota binds, in the words of the
        429 that enforces it (``api.quotas.Limit.subject``)."""
        if self.key is None:
            return f"user {self.user.get_username()}"
        return f"API key {self.user.get_username()}/{self.key.name}"

    def limits_text(self) -> str:
        parts = []
        if self.tokens_per_day:
            parts.append(f"{counted(self.tokens_per_day, 'token')} per day")
        if self.requests_per_minute:
            parts.append(f"{counted(self.requests_per_minute, 'request')} per minute")
        return ", ".join(parts) or "no limit"


class AuditKind(TextChoices):
    LOAD_REQUESTED = "load_requested", "load requested"
    LOADING = "loading", "loading"
    READY = "ready", "ready"
    LOAD_FAILED = "load_failed", "load failed"
    LOAD_REFUSED = "load_refused", "load refused (cannot start)"
    EVICTION = "eviction", "eviction"
    UNLOAD = "unload", "unload (manual)"
    TTL = "ttl", "unload (idle TTL)"
    RELOAD = "reload", "unload (reload)"
    SHUTDOWN = "shutdown", "unload (shutdown)"
    EXITED = "exited", "exited"
    CRASH = "crash", "crash"
    FORCE_KILL = "force_kill", "force-kill"
    STUCK = "stuck", "stuck"
    QUARANTINE = "quarantine", "quarantine"
    LEASE_EXPIRED = "lease_expired", "lease expired"
    QUEUE_CANCELLED = "queue_cancelled", "queued request cancelled"
    LEFTOVER_KILLED = "leftover_killed", "leftover child killed"
    PRESET_CREATED = "preset_created", "preset created"
    PRESET_CHANGED = "preset_changed", "preset changed"
    PRESET_DELETED = "preset_deleted", "preset deleted"
    SETTINGS_CHANGED = "settings_changed", "settings changed"
    AUTH_FAILED = "auth_failed", "API login failed"
    KEY_SCOPE = "key_scope", "API key used outside its models"
    KEY_BUSY = "key_busy", "API key over its concurrency"
    KEY_CREATED = "key_created", "API key created"
    KEY_RESCOPED = "key_rescoped", "API key scope changed"
    KEY_REVOKED = "key_revoked", "API key revoked"
    QUOTA_EXCEEDED = "quota_exceeded", "quota exceeded"
    QUOTA_CHANGED = "quota_changed", "quota changed"
    RETENTION = "retention", "audit rows deleted (retention)"
    HUNG = "hung", "hung child killed"
    CRASH_BACKOFF = "crash_backoff", "crash-loop back-off"
    MESSAGE_EXPIRED = "message_expired", "expired message dropped"
    OUTAGE = "outage", "service outage"
    LOGIN_FAILED = "login_failed", "panel login failed"
    LOGIN_LOCKED = "login_locked", "panel login locked out"
    LOGIN_UNLOCKED = "login_unlocked", "panel login unlocked"
    RESERVATION_STARTED = "reservation_started", "reservation started"
    RESERVATION_ENDED = "reservation_ended", "reservation ended"
    NODE_LOST = "node_lost", "node lost"
    NODE_JOINED = "node_joined", "node joined"


class Reservation(models.Model):
    """A model booked for a time window for one user or one group (issue 17.6).

    While the window is open (``starts_at`` <= now < ``ends_at``) the router keeps the model
    loaded and pinned and serves the user's (or the group members') requests for it first
    (``reservations.tick``). ``started_audited_at`` and ``ended_audited_at`` record that the
    start and end audit rows were written, so each is written once, whatever the number of
    ticks, workers or restarts.
    """

    model = models.CharField(max_length=200, help_text="The preset's name.")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="reservations",
    )  # fmt: skip
    group = models.ForeignKey(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="reservations"
    )
    note = models.CharField(max_length=200, blank=True)
    created_by = models.CharField(max_length=150, help_text="The actor who booked it.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_audited_at = models.DateTimeField(null=True, blank=True, editable=False)
    ended_audited_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["starts_at", "model"]
        indexes = [models.Index(fields=["ends_at", "starts_at"], name="reservation_window")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=False, group__isnull=True)
                | models.Q(user__isnull=True, group__isnull=False),
                name="reservation_user_or_group",
            ),
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")),
                name="reservation_ends_after_start",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.model} for {self.subject}"

    @property
    def subject(self) -> str:
        """``user alice`` or ``group workshop``: whom the model is booked for."""
        if self.group_id is not None and self.group is not None:
            return f"group {self.group.name}"
        return f"user {self.user.get_username() if self.user else '?'}"


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def record(self, kind: str, **fields: Any) -> AuditEvent:
        """Append one row: the only way rows are written (STYLE 12)."""
        row: AuditEvent = self.create(kind=kind, **fields)
        return row

    def record_many(self, rows: list[AuditEvent]) -> int:
        """Append a batch; rows already stored (same router boot and seq) are skipped, so a
        batch retried after an outage lands exactly once."""
        created = self.bulk_create(rows, ignore_conflicts=True)
        return len(created)

    def purge_older_than(self, cutoff: Any, *, actor: str = "retention") -> int:
        """Delete rows older than ``cutoff`` — the only deletion path — and audit that it ran."""
        deleted: int
        deleted, _ = self.filter(time__lt=cutoff).delete()
        self.record(
            AuditKind.RETENTION,
            actor=actor,
            reason=f"deleted {deleted} rows older than {cutoff:%Y-%m-%d %H:%M}",
            details={"deleted": deleted, "cutoff": cutoff.isoformat()},
        )
        return deleted


class AuditEvent(models.Model):
    """One lifecycle decision or change, kept so a team can answer "who evicted my model, and why".

    Append-only: rows are written through ``AuditEvent.objects.record()`` (or ``record_many`` by
    the router's batch writer), never edited, and deleted only by the retention job. Router
    events carry the router's boot id and event ``seq``, unique together, so a batch that is
    written again after a database outage is stored exactly once.
    """

    time = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=32, choices=AuditKind.choices, db_index=True)
    model = models.CharField(max_length=200, blank=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    actor = models.CharField(
        max_length=200,
        blank=True,
        db_index=True,
        help_text="user:<name>, key:<owner>/<name>, anonymous or scheduler",
    )
    reason = models.CharField(max_length=500, blank=True)
    trigger_model = models.CharField(max_length=200, blank=True)
    trigger_request = models.CharField(max_length=200, blank=True)
    queue_depth = models.IntegerField(null=True, blank=True)
    memory_before = models.BigIntegerField(null=True, blank=True)
    memory_after = models.BigIntegerField(null=True, blank=True)
    idle_seconds = models.FloatField(null=True, blank=True)
    stop_seconds = models.FloatField(null=True, blank=True)
    settle_seconds = models.FloatField(null=True, blank=True)
    load_seconds = models.FloatField(null=True, blank=True)
    force_killed = models.BooleanField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    router_id = models.CharField(max_length=64, blank=True)
    seq = models.BigIntegerField(null=True, blank=True)
    node = models.CharField(
        max_length=64, blank=True, db_index=True, help_text="the router node (several hosts)"
    )

    objects: ClassVar[AuditEventQuerySet] = AuditEventQuerySet.as_manager()  # as ApiKey.objects

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["model", "-time"]), models.Index(fields=["kind", "-time"])]
        constraints = [
            models.UniqueConstraint(
                fields=["router_id", "seq"],
                condition=models.Q(seq__isnull=False),
                name="audit_event_once_per_router_seq",
            )
        ]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.kind} {self.model}".strip()

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None and not kwargs.get("force_insert"):
            raise ValidationError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ValidationError("audit events are deleted only by the retention job")


class MemoryRollupQuerySet(models.QuerySet["MemoryRollup"]):
    def purge_older_than(self, cutoff: Any) -> int:
        deleted: int
        deleted, _ = self.filter(minute__lt=cutoff).delete()
        return deleted


class MemoryRollup(models.Model):
    """Memory per minute (min/avg/max) for the system and each model, for the history chart.

    The router keeps the last hour of one-second samples; a job folds complete minutes of that
    ring into these rows every minute (written again only by a fold over more samples, so a job
    that runs twice changes nothing) and deletes rows older than ``KEEP_DAYS``. ``scope`` is
    ``system`` (``model`` empty) or ``model`` (``model`` is the preset name); ``used_*`` is the
    system's used memory or the model's process-tree RSS; ``available_*`` and ``swap_used_*``
    are set for the system only.
    """

    SYSTEM = "system"
    MODEL = "model"
    KEEP_DAYS = 30

    minute = models.DateTimeField(help_text="Start of the minute (UTC).")
    scope = models.CharField(max_length=8, choices=[(SYSTEM, "system"), (MODEL, "model")])
    model = models.CharField(max_length=200, blank=True)
    samples = models.PositiveIntegerField()
    used_min = models.BigIntegerField()
    used_avg = models.BigIntegerField()
    used_max = models.BigIntegerField()
    available_min = models.BigIntegerField(null=True, blank=True)
    available_avg = models.BigIntegerField(null=True, blank=True)
    available_max = models.BigIntegerField(null=True, blank=True)
    swap_used_min = models.BigIntegerField(null=True, blank=True)
    swap_used_avg = models.BigIntegerField(null=True, blank=True)
    swap_used_max = models.BigIntegerField(null=True, blank=True)
    node = models.CharField(
        max_length=64, blank=True, default="", help_text="the node's machine (several hosts)"
    )

    objects: ClassVar[MemoryRollupQuerySet] = MemoryRollupQuerySet.as_manager()  # as ApiKey's

    class Meta:
        ordering = ["minute", "scope", "model"]
        indexes = [models.Index(fields=["scope", "model", "minute"])]
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "scope", "model", "node"], name="memory_rollup_once_per_minute"
            )
        ]

    def __str__(self) -> str:
        return f"{self.minute:%Y-%m-%d %H:%M} {self.model or self.scope}"


# ---- usage (issue 17.2): written only by usage.write_batch, deleted only by retention ----


class UsageRecord(models.Model):
    """One proxied request: who, which model, what it waited through and what it produced."""

    time = models.DateTimeField(db_index=True, help_text="When the request arrived (UTC).")
    actor = models.CharField(max_length=200, help_text="The user (or static key, anonymous).")
    key = models.CharField(max_length=200, blank=True, help_text="owner/name of the key, if any")
    model = models.CharField(max_length=200)
    path = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=160, blank=True)
    status = models.PositiveSmallIntegerField(default=0)
    queue_ms = models.FloatField(default=0.0, help_text="Waiting for the model (queue + load).")
    load_ms = models.FloatField(default=0.0, help_text="The load it waited for; 0: loaded.")
    caused_load = models.BooleanField(default=False, help_text="Its entry started that load.")
    evicted = models.CharField(max_length=500, blank=True, help_text="Evicted for that load.")
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.FloatField(default=0.0, help_text="Holding the model (grant to end).")

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["actor", "time"]), models.Index(fields=["model", "time"])]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor} {self.model}"


class UsageHour(models.Model):
    """The sums of one actor's requests to one model in one hour (kept like the rows)."""

    hour = models.DateTimeField(help_text="Start of the hour (UTC).")
    actor = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200)
    requests = models.PositiveIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    queue_seconds = models.FloatField(default=0.0)
    loads_caused = models.PositiveIntegerField(default=0)
    load_seconds_caused = models.FloatField(default=0.0)
    model_seconds = models.FloatField(default=0.0)

    class Meta:
        ordering = ["hour", "actor", "key", "model"]
        indexes = [models.Index(fields=["actor", "hour"])]
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "actor", "key", "model"], name="usage_hour_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 {self.actor} {self.model}"


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
