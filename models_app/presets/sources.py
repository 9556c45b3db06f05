"""Where presets come from besides the panel: ``--models-dir``, ``--demo`` and preset files."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import transaction

from models_app.audit import records as audit
from models_app.models import Preset, PresetSource

DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")
_imported: dict[str, str] = {}  # --models-preset path -> digest of the text this process imported


class SourceError(ValueError):
    """A preset source cannot be read (the message is llama.cpp's where it has one)."""


@dataclass(frozen=True)
class DirModel:
    name: str
    model: str
    mmproj: str = ""
    draft: str = ""


def scan_models_dir(directory: str) -> list[DirModel]:
    """List the models of a ``--models-dir`` exactly as llama.cpp does (ROUTER_SPEC 2.3)."""
    root = Path(directory)
    if not root.is_dir():
        raise SourceError(f"error: '{directory}' does not exist or is not a directory")
    found: list[DirModel] = []
    for entry in sorted(root.iterdir()):
        if entry.is_file() and _is_model_file(entry.name):
            found.append(DirModel(entry.name.replace(".gguf", ""), str(entry)))
        elif entry.is_dir():
            model = _scan_subdir(entry)
            if model is not None:
                found.append(model)
    return found


def _is_model_file(name: str) -> bool:
    return name.endswith(".gguf") and "mmproj" not in name and not name.startswith(DRAFT_PREFIXES)


def _scan_subdir(directory: Path) -> DirModel | None:
    model = mmproj = draft = first_shard = ""
    for entry in sorted(directory.iterdir()):
        if not (entry.is_file() and entry.name.endswith(".gguf")):
            continue
        if "mmproj" in entry.name:
            mmproj = str(entry)
        elif entry.name.startswith(DRAFT_PREFIXES):
            draft = draft or str(entry)
        elif "-00001-of-" in entry.name:
            first_shard = str(entry)
        else:
            model = str(entry)
    chosen = first_shard or model
    return DirModel(directory.name, chosen, mmproj, draft) if chosen else None


@transaction.atomic
def import_models_dir(directory: str) -> list[str]:
    """Create or update a preset per model in ``directory``; return the names.

    Presets that came from this folder and whose model is gone from it are deleted, as
    llama.cpp erases entries no source names any more (ROUTER_SPEC 2.20).
    """
    names = []
    where = os.path.abspath(directory)
    for found in scan_models_dir(directory):
        preset, _ = Preset.objects.get_or_create(name=found.name)
        preset.source, preset.source_path = PresetSource.MODELS_DIR, where
        preset.model_path = found.model
        args = [pair for pair in preset.args if pair[0] not in ("mmproj", "model-draft")]
        if found.mmproj:
            args.append(["mmproj", found.mmproj])
        if found.draft:
            args.append(["model-draft", found.draft])
        preset.args = args
        preset.full_clean()
        preset.save()
        names.append(found.name)
    gone = Preset.objects.filter(source=PresetSource.MODELS_DIR, source_path=where)
    for row in gone.exclude(name__in=names):
        before = audit.preset_state(row)
        row.delete()
        audit.record_preset_change(before, None, "cli")
    return names


# Three simulated models of different sizes and load times, for trying RouterPanel without a
# GPU or a model file. They run the stdlib-only simulated llama-server.
DEMO_MODELS = (
    ("demo-small", {"sim-load-ms": "400", "sim-rss-mb": "64", "sim-token-ms": "20"}),
    ("demo-medium", {"sim-load-ms": "1500", "sim-rss-mb": "256", "sim-token-ms": "40"}),
    ("demo-large", {"sim-load-ms": "4000", "sim-rss-mb": "768", "sim-token-ms": "80"}),
)


def simserver_command() -> str:
    return f"{shlex.quote(sys.executable)} -m routerpanel.router.simserver"


@transaction.atomic
def ensure_demo_presets() -> list[str]:
    """Create (or refresh) the demo presets; return their names."""
    for name, args in DEMO_MODELS:
        preset, created = Preset.objects.get_or_create(name=name)
        if created:
            preset.source = PresetSource.DEMO
        preset.server_bin = simserver_command()
        preset.args = [[key, value] for key, value in args.items()]
        preset.memory_estimate = int(args["sim-rss-mb"]) << 20
        preset.full_clean()
        preset.save()
    return [name for name, _ in DEMO_MODELS]


# ---- --models-preset --------------------------------------------------------------------------


def import_preset_file(path: str, stdout: Any) -> None:
    """Import ``--models-preset`` at start, printing the report, and remember the text imported.

    Raises OSError for an unreadable file and CommandError for a malformed one.
    """
    from django.core.management import call_command

    data = Path(path).read_bytes()
    call_command("import_presets", path, "--as-models-preset", stdout=stdout)
    remember_preset_file(path, data)


def remember_preset_file(path: str, data: bytes) -> None:
    """Note that ``data`` (the file's text) was imported from ``path`` by this process."""
    _imported[path] = hashlib.sha256(data).hexdigest()


def reimport_preset_file(path: str) -> bool:
    """Re-import ``path`` for a reload if its text changed since this process imported it.

    An unchanged file is not imported again, so edits made in the panel since then survive
    ``GET /models?reload=1``; a changed file is applied (all or nothing) and wins for the
    presets it names, and the presets it brought that it no longer names are deleted (the
    router then stops them if they run, A14); presets made in the panel stay. Return whether
    it was imported; raise ValueError for a missing file and ``ini.IniError`` (naming the line)
    for a malformed one.
    """
    from models_app.presets.files import Origin, import_presets

    file = Path(path)
    if not file.exists():
        raise ValueError(f"preset file does not exist: {path}")
    data = file.read_bytes()
    if _imported.get(path) == hashlib.sha256(data).hexdigest():
        return False
    origin = Origin(PresetSource.MODELS_PRESET, os.path.abspath(path), owns=True)
    import_presets(data, source=path, origin=origin)
    remember_preset_file(path, data)
    return True
