"""The audit log: filters (model, kind, actor, time range), paging, CSV/JSON export, detail.

The CSV export escapes text that a spreadsheet would run as a formula (``security.csv_cell``);
the JSON export is data, not a sheet, and carries the values as stored.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from models_app.accounts.roles import Role, require
from models_app.audit import labels as audit_labels
from models_app.models import AuditEvent, AuditKind, Preset
from models_app.panel.forms import AuditFilterForm
from models_app.security import csv_cell

PAGE_SIZE = 50
EXPORT_FIELDS = (
    "id", "time", "kind", "model", "from_state", "to_state", "actor", "reason", "trigger_model",
    "trigger_request", "queue_depth", "memory_before", "memory_after", "idle_seconds",
    "stop_seconds", "settle_seconds", "load_seconds", "force_killed", "exit_code", "router_id",
    "seq", "node", "details",
)  # fmt: skip


def filtered(form: AuditFilterForm) -> QuerySet[AuditEvent]:
    rows = AuditEvent.objects.all()
    if not form.is_valid():
        return rows.none()
    data = form.cleaned_data
    if data["model"]:
        rows = rows.filter(model=data["model"].strip())
    if data["kind"]:
        rows = rows.filter(kind=data["kind"])
    if data["actor"]:
        rows = rows.filter(actor__icontains=data["actor"].strip())
    if data["since"]:
        rows = rows.filter(time__gte=data["since"])
    if data["until"]:
        rows = rows.filter(time__lte=data["until"])
    return rows


@require_GET
@require(Role.VIEWER)
def audit_list(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET or None)
    rows = filtered(form) if request.GET else AuditEvent.objects.all()
    export = request.GET.get("format")
    if export == "csv":
        return _csv(rows)
    if export == "json":
        return _json(rows)
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    query.pop("format", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "models": known_models(),
        "invalid": bool(request.GET) and not form.is_valid(),
    }
    return render(request, "panel/audit/list.html", context)


def known_models() -> list[str]:
    """The models the picker offers: every preset and every model the log names."""
    audited = AuditEvent.objects.exclude(model="").values_list("model", flat=True).distinct()
    return sorted(set(audited) | set(Preset.objects.values_list("name", flat=True)))


def _export_row(row: AuditEvent) -> dict[str, Any]:
    out = {name: getattr(row, name) for name in EXPORT_FIELDS}
    out["time"] = row.time.isoformat()
    return out


def _filename(ext: str) -> str:
    return f"audit-{timezone.now():%Y%m%d-%H%M%S}.{ext}"


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv(rows: QuerySet[AuditEvent]) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())

    def lines() -> Iterator[str]:
        yield writer.writerow(EXPORT_FIELDS)
        for row in rows.iterator(chunk_size=500):
            values = _export_row(row)
            values["details"] = json.dumps(values["details"], sort_keys=True)
            # A cell a client chose (X-Request-Id, a model name) must not run as a formula.
            yield writer.writerow(["" if v is None else csv_cell(v) for v in values.values()])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{_filename("csv")}"'
    return response


def _json(rows: QuerySet[AuditEvent]) -> StreamingHttpResponse:
    def chunks() -> Iterator[str]:
        yield "["
        for n, row in enumerate(rows.iterator(chunk_size=500)):
            yield ("," if n else "") + "\n" + json.dumps(_export_row(row), sort_keys=True)
        yield "\n]\n"

    response = StreamingHttpResponse(chunks(), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{_filename("json")}"'
    return response


@require_GET
@require(Role.VIEWER)
def audit_detail(request: HttpRequest, pk: int) -> HttpResponse:
    row = get_object_or_404(AuditEvent, pk=pk)
    fields = [
        (f.verbose_name, getattr(row, f.name), f.name)
        for f in AuditEvent._meta.get_fields()
        if f.concrete and f.name not in ("id", "details")
    ]
    related = AuditEvent.objects.none()
    if row.kind == AuditKind.EVICTION and row.trigger_model:
        related = AuditEvent.objects.filter(
            model__in=[row.model, row.trigger_model],
            time__gte=row.time - timedelta(minutes=2),
            time__lte=row.time + timedelta(minutes=5),
        ).exclude(pk=row.pk)[:20]
    changes = audit_labels.changes(row.kind, row.details)
    context = {
        "row": row,
        "fields": fields,
        "changes": changes,  # a preset or settings change: a before/after table, not JSON
        "details": ""
        if changes or not row.details
        else json.dumps(row.details, indent=2, sort_keys=True),
        "related": related,
    }
    return render(request, "panel/audit/detail.html", context)
