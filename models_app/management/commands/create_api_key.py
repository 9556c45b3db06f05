"""``manage.py create_api_key USER NAME [--models PATTERNS] [--max-concurrent N]
[--priority CLASS] [--queue-comments]``: issue an API key, optionally scoped, and print it,
once."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError, transaction

from models_app.audit.records import record_key_change
from models_app.models import ApiKey, AuditKind, KeyPriority

CLI_ACTOR = "cli:create_api_key"  # who the audit log says made a key from the shell


def positive(text: str) -> int:
    """``--max-concurrent``: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(text)
    return value


positive.__name__ = "whole number of at least 1"  # argparse names the type in its error


class Command(BaseCommand):
    help = (
        "Create an API key for USER named NAME and print it. Only its hash is stored: "
        "the key cannot be shown again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="the username who owns the key")
        parser.add_argument("name", help="what the key is for, e.g. laptop (unique per user)")
        parser.add_argument(
            "--models",
            default="",
            metavar="PATTERNS",
            help="models the key may use: comma-separated patterns such as 'qwen*,llama-3*', "
            "matched against each model's name and aliases (default: every model)",
        )
        parser.add_argument(
            "--max-concurrent",
            type=positive,
            default=None,
            metavar="N",
            help="requests the key may have in flight at once (default: no limit)",
        )
        parser.add_argument(
            "--priority",
            choices=KeyPriority.values,  # type: ignore[attr-defined]
            default=KeyPriority.NORMAL.value,
            help="priority class for the fair-share queue policy (default: normal)",
        )
        parser.add_argument(
            "--queue-comments",
            action="store_true",
            help="while a streamed request waits for its model, send the queue position and "
            "the load's progress as SSE comment lines (docs/teams.md: Queue position)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        try:
            owner = users.objects.get_by_natural_key(options["user"])
        except users.DoesNotExist:
            raise CommandError(f"no user named {options['user']!r}") from None
        name = options["name"].strip()
        if not name:
            raise CommandError("the key needs a name")
        try:
            with transaction.atomic():  # the key and its audit row, or neither
                key, secret = ApiKey.objects.issue(
                    owner,
                    name,
                    model_patterns=options["models"],
                    max_concurrent=options["max_concurrent"],
                    priority=options["priority"],
                    queue_comments=options["queue_comments"],
                )
                record_key_change(AuditKind.KEY_CREATED, key, CLI_ACTOR)
        except IntegrityError:
            raise CommandError(
                f"{owner.get_username()} already has an active key named {name!r}"
            ) from None
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        self.stdout.write(secret)
        self.stderr.write(
            f"Created API key {key.name!r} ({key.prefix}…) for {owner.get_username()}; "
            f"it acts as {key.actor} ({key.scope_text()}). "
            "Copy it now: it will not be shown again."
        )
