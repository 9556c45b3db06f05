"""``manage.py export_presets [-o FILE] [--llama-compatible]``: write the presets as an INI."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_app.presets.files import export_presets, skipped_by_llama_export
from routerpanel.router.ini import IniError


class Command(BaseCommand):
    help = "Export the presets as a llama.cpp --models-preset INI file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-o", "--output", help="write to this file instead of standard output")
        parser.add_argument(
            "--llama-compatible",
            action="store_true",
            help="leave out RouterPanel's own keys so that llama-server accepts the file",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        compatible = options["llama_compatible"]
        try:
            text = export_presets(llama_compatible=compatible)
        except IniError as exc:
            raise CommandError(str(exc)) from None
        if compatible:
            for name in skipped_by_llama_export():
                self.stderr.write(f"left out {name}: own server binary or disabled")
        output = options["output"]
        if not output or output == "-":
            self.stdout.write(text, ending="")
            return
        _write_atomically(Path(output), text)
        self.stderr.write(f"wrote {output}")


def _write_atomically(path: Path, text: str) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror}") from None
