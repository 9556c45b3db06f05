"""The users' API keys (stored as hashes), their scope (model patterns, concurrency, priority)
and the quotas on a user or a key."""

from __future__ import annotations

import fnmatch
import hashlib
import secrets
from typing import Any, ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from models_app.models.base import CONTROL_CHARS, TextChoices
from models_app.panel.wording import counted


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
        if CONTROL_CHARS.search(pattern) or any(c.isspace() for c in pattern):
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
