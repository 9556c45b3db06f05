"""``manage.py import_presets FILE [--replace] [--dry-run]``: load a llama.cpp preset INI."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_app.models import PresetSource
from models_app.presets.files import Origin, import_presets
from routerpanel.router.ini import IniError


class Command(BaseCommand):
    help = (
        "Import presets from a llama.cpp --models-preset INI file. All or nothing: "
        "a bad line anywhere changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the INI file ('-' reads standard input)")
        parser.add_argument(
            "--replace", action="store_true", help="delete presets the file does not name"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="report what would change, change nothing"
        )
        # serve/runrouter --models-preset: the file owns its presets (sources.import_preset_file).
        parser.add_argument("--as-models-preset", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["file"]
        data = self._read(path)
        where = "" if path == "-" else os.path.abspath(path)
        if options["as_models_preset"]:
            origin = Origin(PresetSource.MODELS_PRESET, where, owns=True)
        else:
            origin = Origin(PresetSource.IMPORT, where)
        try:
            report = import_presets(
                data,
                source=path,
                replace=options["replace"],
                dry_run=options["dry_run"],
                origin=origin,
            )
        except IniError as exc:
            raise CommandError(f"{exc}\nNothing was imported.") from None
        for warning in report.warnings:
            self.stderr.write(f"warning: {path}: {warning}")
        for label, names in (
            ("created", report.created),
            ("updated", report.updated),
            ("deleted", report.deleted),
        ):
            for name in names:
                self.stdout.write(f"  {label}: {name}")
        self.stdout.write(self.style.SUCCESS(report.summary()))

    def _read(self, path: str) -> bytes:
        import sys

        if path == "-":
            return sys.stdin.buffer.read()
        file = Path(path)
        if not file.exists():
            raise CommandError(f"preset file does not exist: {path}")
        try:
            return file.read_bytes()
        except OSError as exc:
            raise CommandError(f"failed to open preset file: {path}: {exc.strerror}") from None
