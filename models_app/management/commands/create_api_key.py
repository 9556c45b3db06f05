"""``manage.py create_api_key USER NAME``: issue an API key and print it, once."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from models_app.models import ApiKey


class Command(BaseCommand):
    help = (
        "Create an API key for USER named NAME and print it. Only its hash is stored: "
        "the key cannot be shown again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("user", help="the username who owns the key")
        parser.add_argument("name", help="what the key is for, e.g. laptop (unique per user)")

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
            key, secret = ApiKey.objects.issue(owner, name)
        except IntegrityError:
            raise CommandError(
                f"{owner.get_username()} already has an active key named {name!r}"
            ) from None
        self.stdout.write(secret)
        self.stderr.write(
            f"Created API key {key.name!r} ({key.prefix}…) for {owner.get_username()}; "
            "it acts as " + key.actor + ". Copy it now: it will not be shown again."
        )
