"""Import and export llama.cpp preset INI files to and from the database, all or nothing.

Used by the ``import_presets`` / ``export_presets`` commands, by ``serve --models-preset`` and by
the preset pages. An import parses and checks the whole file first, then applies every change in
one transaction: a bad line anywhere leaves the database exactly as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import router, transaction
from django.db.models.signals import post_save

from models_app.audit import records as audit
from models_app.models import Preset, PresetSource, RouterSettings, default_program
from models_app.presets import server_options
from routerpanel.router import ini, presets


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    global_changed: bool = False
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False
    # what changes, field by field: {preset name or "[*]": {field: [before, after]}}
    changes: dict[str, dict[str, list[object]]] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted or self.global_changed)

    def summary(self) -> str:
        verb = "would be" if self.dry_run else ""
        parts = [
            f"{len(self.created)} created",
            f"{len(self.updated)} updated",
            f"{len(self.unchanged)} unchanged",
        ]
        if self.deleted:
            parts.append(f"{len(self.deleted)} deleted")
        if self.global_changed:
            parts.append("[*] updated")
        text = ", ".join(parts)
        return f"{text} ({verb} applied: dry run)" if self.dry_run else text


class _DryRun(Exception):
    """Raised inside the transaction to roll a dry run back."""


@dataclass(frozen=True)
class Origin:
    """Where the presets of an import come from (``Preset.source`` and ``source_path``).

    ``owns`` makes the file the presets' owner: every preset it names takes this origin, and
    presets of this origin that it no longer names are deleted (the ``--models-preset`` file
    on a reload, as llama.cpp erases entries gone from every source, ROUTER_SPEC 2.20).
    Otherwise only the presets it creates take the origin.
    """

    source: str = PresetSource.IMPORT
    path: str = ""
    owns: bool = False


def import_presets(
    text: str | bytes,
    *,
    source: str = "<preset>",
    replace: bool = False,
    dry_run: bool = False,
    user: object | None = None,
    actor: str | None = None,
    origin: Origin = Origin(),
) -> ImportReport:
    """Apply a preset file; raise ``ini.IniError`` (naming the line; ``ini.IniErrors`` with
    every bad line when there are several) and change nothing on error.

    ``replace`` deletes presets the file does not name. The ``[*]`` section replaces the stored
    global options when the file has one (and clears them under ``replace``). Every change is
    audited in the same transaction as ``actor`` (default: the user, else ``cli``).
    ``origin`` records where the presets came from (see ``Origin``).
    """
    with server_options.settings_held():
        parsed = presets.parse_presets(
            text,
            source,
            default_bin=default_program(),
            options_for=server_options.options_for,
        )
    report = ImportReport(warnings=[str(w) for w in parsed.warnings], dry_run=dry_run)
    actor = actor or (audit.actor_of(user) if user is not None else "cli")
    try:
        with _warned(parsed.warnings), transaction.atomic():
            # [*] first: each preset's options are checked against the program [*] names
            # (server-bin); then the settings are read once for all the presets.
            _apply_global(parsed, report, replace=replace, actor=actor)
            with server_options.settings_held():
                _apply(parsed, report, replace=replace, user=user, source=source, actor=actor)
            _claim(parsed, report, origin, actor)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    return report


def _apply(
    parsed: presets.ParsedPresets,
    report: ImportReport,
    *,
    replace: bool,
    user: object | None,
    source: str,
    actor: str,
) -> None:
    existing = {p.name: p for p in Preset.objects.select_for_update()}
    errors: list[ini.IniError] = []  # every preset the database refuses, reported at once
    created: list[Preset] = []  # written together after the loop (ten thousand: one insert)
    for definition in parsed.presets:
        # One rule for every field (issue 49.9): the file is the whole preset it names, so
        # what it leaves out (aliases, stop-timeout, pinned...) is cleared, not kept.
        row = existing.get(definition.name)
        if row is not None and row.to_def() == definition:
            report.unchanged.append(definition.name)
            continue
        before = audit.preset_state(row)
        if row is None:
            row = Preset()
            report.created.append(definition.name)
        else:
            report.updated.append(definition.name)
        row.apply_def(definition)
        if user is not None:
            row.updated_by = user
        try:
            _full_clean(row, source, parsed.lines.get(definition.name, 0))
        except ini.IniError as exc:
            errors.append(exc)
            continue
        if before is None:
            created.append(row)
            continue
        row.save()
        report.changes[definition.name] = audit.diff(before, audit.preset_state(row))
        audit.record_preset_change(before, row, actor)
    ini.raise_all(errors)  # inside the transaction: nothing of the file is kept
    _create(created, actor)
    if replace:
        named = {d.name for d in parsed.presets}
        for name, row in existing.items():
            if name not in named:
                before = audit.preset_state(row)
                row.delete()
                audit.record_preset_change(before, None, actor)
                report.deleted.append(name)
    _check_stored_aliases(source)


@contextlib.contextmanager
def _warned(warnings: list[ini.IniWarning]) -> Iterator[None]:
    """An error the database finds goes with what the file warned of, as the parser's do."""
    try:
        yield
    except ini.IniError as exc:
        exc.warnings = exc.warnings or list(warnings)
        raise


def _create(rows: list[Preset], actor: str) -> None:
    """Insert the new presets in batches, audit them, and send each one's ``post_save`` as a
    save would (the GGUF inspection after the commit listens to it)."""
    Preset.objects.bulk_create(rows, batch_size=500)
    audit.record_presets_created(rows, actor)
    for row in rows:
        post_save.send(sender=Preset, instance=row, created=True, update_fields=None, raw=False,
                       using=router.db_for_write(Preset))  # fmt: skip


def _claim(parsed: presets.ParsedPresets, report: ImportReport, origin: Origin, actor: str) -> None:
    """Record the origin of the presets the file names; delete those of it that it dropped."""
    named = [d.name for d in parsed.presets]
    claimed = named if origin.owns else report.created
    Preset.objects.filter(name__in=claimed).update(source=origin.source, source_path=origin.path)
    if not origin.owns:
        return
    gone = Preset.objects.filter(source=origin.source, source_path=origin.path).exclude(
        name__in=named
    )
    for row in gone:
        name, before = row.name, audit.preset_state(row)
        row.delete()
        audit.record_preset_change(before, None, actor)
        report.deleted.append(name)


def _apply_global(
    parsed: presets.ParsedPresets, report: ImportReport, *, replace: bool, actor: str
) -> None:
    settings_row = RouterSettings.load()
    if parsed.global_def is not None or replace:
        before_settings = audit.settings_state(settings_row)
        settings_row.set_global_def(parsed.global_def)
        if settings_row.global_args != before_settings["global_args"]:
            report.global_changed = True
            report.changes["[*]"] = {
                "global_args": [before_settings["global_args"], settings_row.global_args]
            }
            settings_row.save()
            audit.record_settings_change(before_settings, settings_row, actor)


def _full_clean(row: Preset, source: str, line: int) -> None:
    try:
        # Names are unique already: each new one is neither stored (``existing``) nor twice in
        # the file (the parser refuses that), so no query per preset asks the database again.
        row.full_clean(validate_unique=False)
    except ValidationError as exc:
        details = "; ".join(
            f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items()
        )
        raise ini.IniError(f"preset '{row.name}': {details}", line, source) from None


def _check_stored_aliases(source: str) -> None:
    """Names and aliases must stay unique across the stored presets, not only within the file."""
    presets.check_aliases([p.to_def() for p in Preset.objects.all()], source)


def export_header(*, llama_compatible: bool = False) -> str:
    """The comment an export starts with: the same for every export of the same presets (no
    time, no user), so a preset file kept in version control changes only when they do."""
    header = "RouterPanel presets (llama.cpp --models-preset format)"
    if llama_compatible:
        header += "\nllama.cpp-compatible: RouterPanel's own keys are left out"
    return header


def export_presets(*, llama_compatible: bool = False, header: str | None = None) -> str:
    """Render every stored preset (and ``[*]``) as a preset file (deterministic: same presets,
    same bytes)."""
    if header is None:
        header = export_header(llama_compatible=llama_compatible)
    settings_row = RouterSettings.load()
    definitions = [p.to_def() for p in Preset.objects.order_by("name")]
    return presets.render_presets(
        settings_row.global_def(), definitions, llama_compatible=llama_compatible, header=header
    )


def skipped_by_llama_export() -> list[str]:
    """Presets a llama.cpp-compatible export leaves out (own server binary, or disabled)."""
    left_out = Preset.objects.exclude(server_bin="", enabled=True).order_by("name")
    return list(left_out.values_list("name", flat=True))
