"""Preset pages: list, detail, create / edit / clone / delete, INI import and export.

Viewers read and export; admins change. Every change is audited (``audit.record_preset_change``)
and then the router reloads its presets: a running model whose command line changed restarts —
at once when idle, after its in-flight requests otherwise (A14) — and the page says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.contrib import messages
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from models_app.accounts.roles import Role, require
from models_app.audit import labels as audit_labels
from models_app.audit import records as audit
from models_app.models import AuditEvent, AuditKind, Preset, RouterSettings, catalogue_for
from models_app.panel import edits
from models_app.panel.forms import ImportForm, PresetForm, option_names, pair_formset
from models_app.panel.views import common
from models_app.presets import files as presets_io
from models_app.presets import specs
from models_app.routing.messages import ReloadCall
from routerpanel.router import ini

PER_PAGE = 100  # presets on a page of the list
SKIPPED_NAMED = 10  # presets the llama.cpp export leaves out, named (the rest counted)
PRESET_KINDS = (AuditKind.PRESET_CREATED, AuditKind.PRESET_CHANGED, AuditKind.PRESET_DELETED)
# The audited fields the form edits under other names.
STATE_LABELS = {"aliases": "Aliases", "memory_estimate": "Memory estimate", "args": "Options",
                "env": "Environment"}  # fmt: skip


@require_GET
@require(Role.VIEWER)
def preset_list(request: HttpRequest) -> HttpResponse:
    """A page of presets (``?q=`` searches names and aliases, ``?page=``), with their state."""
    q = request.GET.get("q", "").strip()[:200]
    found = Preset.objects.select_related("updated_by").order_by("name")
    if q:
        found = found.filter(Q(name__icontains=q) | Q(aliases__icontains=q))
    page = Paginator(found, PER_PAGE).get_page(request.GET.get("page"))
    snap, router_error = common.snapshot()
    states = {m["name"]: m for m in (snap or {}).get("models", [])}
    settings_row = RouterSettings.load()
    rows = [
        {
            "preset": p,
            "live": states.get(p.name),
            "estimate": p.memory_estimate or p.gguf_estimate,
            "effective": specs.effective(p, settings_row),
        }
        for p in page
    ]
    skipped = presets_io.skipped_by_llama_export()
    context = {
        "rows": rows, "page": page, "q": q, "total": Preset.objects.count(),
        "router_error": router_error, "llama_skipped": skipped[:SKIPPED_NAMED],
        "llama_skipped_more": max(0, len(skipped) - SKIPPED_NAMED),
    }  # fmt: skip
    return render(request, "panel/presets/list.html", context)


@require_GET
@require(Role.VIEWER)
def preset_detail(request: HttpRequest, pk: int) -> HttpResponse:
    preset = get_object_or_404(Preset, pk=pk)
    context = {
        "preset": preset,
        "command": _command(preset),
        "live": _live(preset.name),
        "history": AuditEvent.objects.filter(model=preset.name, kind__in=PRESET_KINDS)[:10],
        "estimate": preset.memory_estimate or preset.gguf_estimate,
        "effective": specs.effective(preset, RouterSettings.load()),
    }
    return render(request, "panel/presets/detail.html", context)


@require_http_methods(["GET", "POST"])
@require(Role.ADMIN)
def preset_create(request: HttpRequest) -> HttpResponse:
    return _edit(request, Preset(), None)


@require_http_methods(["GET", "POST"])
@require(Role.ADMIN)
def preset_edit(request: HttpRequest, pk: int) -> HttpResponse:
    preset = get_object_or_404(Preset, pk=pk)
    return _edit(request, preset, audit.preset_state(preset))


@require_http_methods(["GET", "POST"])
@require(Role.ADMIN)
def preset_clone(request: HttpRequest, pk: int) -> HttpResponse:
    source = get_object_or_404(Preset, pk=pk)
    copy = Preset()
    copy.apply_def(dataclasses.replace(source.to_def(), name=_free_name(source.name)))
    copy.gguf_facts, copy.gguf_estimate = source.gguf_facts, source.gguf_estimate
    return _edit(request, copy, None, cloned_from=source)


def _free_name(name: str) -> str:
    base, _, tag = name.partition(":")
    for n in range(2, 100):
        candidate = f"{base}-copy{'' if n == 2 else n}" + (f":{tag}" if tag else "")
        if not Preset.objects.filter(name=candidate).exists():
            return candidate
    return f"{base}-copy"


def _edit(
    request: HttpRequest,
    preset: Preset,
    before: dict[str, Any] | None,
    cloned_from: Preset | None = None,
) -> HttpResponse:
    data = request.POST if request.method == "POST" else None
    server_bin = str((data or {}).get("server_bin", preset.server_bin)).strip()
    form = PresetForm(data, instance=preset)
    if before is not None:
        edits.add_seen(form, before)
    catalogue = catalogue_for(server_bin)
    args = pair_formset("args", preset.args, data, catalogue=catalogue)
    env = pair_formset("env", preset.env, data)
    if data is not None:
        rows_ok = args.is_valid() & env.is_valid()  # both, so both show their errors
        if rows_ok:
            preset.args, preset.env = args.pairs(), env.pairs()
        if form.is_valid() and rows_ok and not form.pair_errors:
            try:
                return _save(request, form, before)
            except edits.Stale as stale:
                edits.refused(form, stale)
    context = {
        "form": form,
        "args": args,
        "env": env,
        "preset": preset,
        "creating": before is None,
        "cloned_from": cloned_from,
        "live": _live(preset.name) if before is not None else None,
        "option_names": option_names(),
        "estimate": preset.memory_estimate or preset.gguf_estimate,
        "error_links": common.error_links(form, args, env) if data is not None else [],
    }
    return render(request, "panel/presets/edit.html", context)


def _save(request: HttpRequest, form: PresetForm, before: dict[str, Any] | None) -> HttpResponse:
    """Save a valid form; ``edits.Stale`` (nothing written) if the preset changed meanwhile."""
    actor = audit.actor_of(request.user)
    with transaction.atomic():
        if before is not None:
            before = _still_as_opened(form)
        preset = form.save(commit=False)
        preset.updated_by = request.user
        preset.save()  # tasks.preset_saved reads the GGUF facts and estimate after the commit
        audit.record_preset_change(before, preset, actor)
    answer = common.ask_router({"type": "router.reload", "actor": actor}, common.ACTION_WAIT)
    verb = "Created" if before is None else "Saved"
    _report_reload(request, f"{verb} {preset.name}.", answer, preset.name)
    for warning in [*form.value_warnings, *getattr(preset, "option_warnings", [])]:
        messages.warning(request, f"{preset.name}: {warning}.")
    return redirect("panel:preset_detail", pk=preset.pk)


def _still_as_opened(form: PresetForm) -> dict[str, Any] | None:
    """The preset as stored now (locked until the save commits), if it is as the form saw it."""
    preset = form.instance
    stored = Preset.objects.select_for_update().filter(pk=preset.pk).first()
    current = audit.preset_state(stored)
    names = {preset.name} | ({stored.name} if stored else set())
    edits.check(
        edits.seen(form), current, audit.preset_state(preset) or {},
        what=stored.name if stored else preset.name,
        changed=Q(kind__in=PRESET_KINDS, model__in=names),
        labels=edits.labels_of(form) | STATE_LABELS,
    )  # fmt: skip
    return current


def _report_reload(request: HttpRequest, done: str, answer: common.Answer, name: str) -> None:
    if answer.error:
        later = "it reads the presets again when it restarts or reloads"
        messages.warning(
            request, f"{done} The router did not take it yet ({answer.error}); {later}."
        )
    elif answer.pending:
        messages.info(request, f"{done} The router is reloading its presets.")
    elif name in (answer.body or {}).get("restarted", []):
        restart = "it restarts now (after its in-flight requests finish) to apply the change"
        messages.warning(request, f"{done} {name} is running with the old command line: {restart}.")
    else:
        messages.success(request, done)


def _command(preset: Preset) -> str | None:
    try:
        spec = specs.preset_specs([preset], RouterSettings.load())
    except ValueError:
        return None
    return specs.quote_argv(spec[0].argv) if spec else None


def _live(name: str) -> dict[str, Any] | None:
    snap, _ = common.snapshot()
    return next((m for m in (snap or {}).get("models", []) if m["name"] == name), None)


@require_http_methods(["GET", "POST"])
@require(Role.ADMIN)
def preset_delete(request: HttpRequest, pk: int) -> HttpResponse:
    preset = get_object_or_404(Preset, pk=pk)
    if request.method == "GET":
        context = {"preset": preset, "live": _live(preset.name)}
        return render(request, "panel/presets/delete.html", context)
    actor, name = audit.actor_of(request.user), preset.name
    with transaction.atomic():
        before = audit.preset_state(preset)
        preset.delete()
        audit.record_preset_change(before, None, actor)
    answer = common.ask_router({"type": "router.reload", "actor": actor}, common.ACTION_WAIT)
    _report_reload(request, f"Deleted {name}.", answer, "")
    return redirect("panel:preset_list")


# ---- INI import and export ----------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@require(Role.ADMIN)
def preset_import(request: HttpRequest) -> HttpResponse:
    """Preview (a dry run: created / updated / unchanged) first; apply the same text next."""
    form = ImportForm(request.POST or None, request.FILES or None)
    context: dict[str, Any] = {"form": form}
    if request.method == "POST" and form.is_valid():
        text, replace = form.cleaned_data["text"], form.cleaned_data["replace"]
        apply = "apply" in request.POST
        context["text"], context["replace"] = text, replace
        try:
            report = _import(request, text, replace=replace, apply=apply)
        except ini.IniError as exc:
            context["errors"] = getattr(exc, "errors", [exc])
            context["warnings"] = [str(w) for w in exc.warnings]  # shown beside the errors
            context["lines"] = _numbered(text, {e.line for e in context["errors"]})
            return render(request, "panel/presets/import.html", context)
        if apply:
            reload: ReloadCall = {"type": "router.reload", "actor": audit.actor_of(request.user)}
            answer = common.ask_router(reload, common.ACTION_WAIT)
            _report_reload(request, f"Imported: {report.summary()}.", answer, "")
            return redirect("panel:preset_list")
        context["report"] = report
        context.update(import_effects(report))
    if request.method == "POST" and "text" in context:  # an uploaded file stays for the next try
        context["form"] = ImportForm(
            initial={"text": context["text"], "replace": context["replace"]}
        )
    return render(request, "panel/presets/import.html", context)


def import_effects(report: Any) -> dict[str, Any]:
    """What the preview shows beyond created / updated: each field's before and after, and
    which running models the import would restart or delete (said in red)."""
    snap, _ = common.snapshot()
    running = {
        m["name"]
        for m in (snap or {}).get("models") or []
        if m.get("state") in ("loading", "loaded", "sleeping")
    }
    changes = [
        {"name": name, "rows": audit_labels.changes("preset_changed", {"changes": fields})}
        for name, fields in report.changes.items()
    ]
    restarted = sorted(n for n in report.updated if n in running)
    if report.global_changed:
        restarted = sorted(running - set(report.deleted))  # every model inherits [*]
    return {
        "changes": changes,
        "restarted": restarted,
        "deleted_running": sorted(n for n in report.deleted if n in running),
    }


def _import(
    request: HttpRequest, text: str, *, replace: bool, apply: bool
) -> presets_io.ImportReport:
    """Dry run for the preview; for real (audited by ``import_presets``, as the user) to apply."""
    return presets_io.import_presets(
        text, source="upload", replace=replace, dry_run=not apply, user=request.user
    )


def _numbered(text: str, bad: set[int]) -> list[dict[str, Any]]:
    """The lines around each bad line (three before, two after; the first eight when no error
    names a line), with a gap row (``"n": None``) where lines are left out."""
    lines = text.splitlines()
    shown = sorted(
        {n for b in bad if b for n in range(max(1, b - 3), min(len(lines), b + 2) + 1)}
        or range(1, min(len(lines), 8) + 1)
    )
    rows: list[dict[str, Any]] = []
    for n in shown:
        if rows and rows[-1]["n"] != n - 1:
            rows.append({"n": None, "text": "…", "bad": False})
        rows.append({"n": n, "text": lines[n - 1], "bad": n in bad})
    return rows


@require_GET
@require(Role.VIEWER)
def preset_export(request: HttpRequest) -> HttpResponse:
    """``?llama=1``: only what ``llama-server --models-preset`` accepts."""
    llama = request.GET.get("llama") == "1"
    text = presets_io.export_presets(llama_compatible=llama)
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    filename = "presets-llama.ini" if llama else "presets.ini"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response
