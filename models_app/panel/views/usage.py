"""The usage page (issue 17.2): a chart of model time per hour and model, a table of sums by
actor, model or key, and the table as CSV. Viewers see their own usage, operators and admins
everyone's. The CSV escapes text a spreadsheet would run as a formula, as the audit export does.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from models_app.accounts import usage_report
from models_app.accounts.roles import Role, require, role_of
from models_app.api.quotas import Limit, tokens_today_in_database
from models_app.audit import records as audit
from models_app.models import AuditEvent, AuditKind, Quota
from models_app.panel import edits
from models_app.panel.forms import QuotaForm
from models_app.security import csv_cell

SPANS = {"1": 1, "7": 7, "30": 30}  # days
COLUMNS = (
    "requests", "prompt_tokens", "completion_tokens", "queue_seconds", "loads_caused",
    "load_seconds_caused", "model_seconds",
)  # fmt: skip


@require_GET
@require(Role.VIEWER)
def usage_page(request: HttpRequest) -> HttpResponse:
    by = request.GET.get("by", "actor")
    by = by if by in usage_report.GROUPS else "actor"
    days = request.GET.get("days", "7")
    days = days if days in SPANS else "7"
    now = timezone.now()
    since = now - timedelta(days=SPANS[days])
    everyone = role_of(request.user) >= Role.OPERATOR
    actor = None if everyone else request.user.get_username()
    rows = usage_report.summary(by, since, None, actor)
    if request.GET.get("format") == "csv":
        return _csv(by, rows, days)
    context = {
        "by": by,
        "days": days,
        "spans": list(SPANS),
        "groups": list(usage_report.GROUPS),
        "rows": rows,
        "columns": COLUMNS,
        "everyone": everyone,
        "hourly": usage_report.hourly(since, None, actor),
        "window": [since.timestamp(), now.timestamp()],  # what the chart's time axis spans
        "quotas": quota_rows(request.user, everyone),
        "quota_form": _quota_form() if role_of(request.user) >= Role.ADMIN else None,
    }
    return render(request, "panel/usage.html", context)


def _csv(by: str, rows: list[dict[str, object]], days: str) -> HttpResponse:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([by, *COLUMNS])
    for row in rows:
        writer.writerow([csv_cell(str(row[by])), *(row[c] for c in COLUMNS)])
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    name = f"routerpanel-usage-by-{by}-{days}d-{stamp}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


# ---- quotas (issue 17.4) -----------------------------------------------------------------------


def quota_rows(user: Any, everyone: bool) -> list[dict[str, Any]]:
    """The quotas a page shows (everyone's, or those binding ``user``), with today's tokens."""
    rows = Quota.objects.select_related("user", "key").order_by("user__username", "key__name")
    if not everyone:
        rows = rows.filter(user=user)
    quotas = [q for q in rows if q.key is None or q.key.revoked_at is None]
    limits = [_limit(q) for q in quotas]
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    used = tokens_today_in_database(limits, today) if limits else {}
    return [
        {"quota": q, "limit": limit, "tokens_today": used.get(limit.ident, 0)}
        for q, limit in zip(quotas, limits, strict=True)
    ]


def _limit(quota: Quota) -> Limit:
    owner = quota.user.get_username()
    if quota.key is None:
        return Limit("user", owner, quota.tokens_per_day, quota.requests_per_minute)
    label = f"{owner}/{quota.key.name}"
    return Limit("key", label, quota.tokens_per_day, quota.requests_per_minute)


@require_POST
@require(Role.ADMIN)
def quota_set(request: HttpRequest) -> HttpResponse:
    """Set a quota, or remove it when both limits are empty; audited either way. Refused,
    nothing written, if that quota changed after the page was opened."""
    form = QuotaForm(request.POST)
    edits.add_seen_each(form, {})
    if not form.is_valid():
        messages.error(request, "Quota not saved: " + _errors_text(form))
        return redirect("panel:usage")
    user, key = form.target()
    tokens = form.cleaned_data["tokens_per_day"]
    rate = form.cleaned_data["requests_per_minute"]
    subject = Quota(user=user, key=key).subject
    with transaction.atomic():
        # The user's row is the lock: one change to their quotas at a time, created ones too.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        quota = Quota.objects.filter(user=user, key=key).first()
        before = _state(quota)
        opened = edits.seen(form, form.cleaned_data["subject"], _state(None))
        try:
            edits.check(
                opened, before, {"tokens_per_day": tokens, "requests_per_minute": rate},
                what=f"The quota of {subject}", labels=edits.labels_of(form),
                changed=Q(kind=AuditKind.QUOTA_CHANGED, details__subject=subject),
            )  # fmt: skip
        except edits.Stale as stale:
            messages.error(request, edits.said(stale))
            return redirect("panel:usage")
        if tokens is None and rate is None:
            if quota is not None:
                quota.delete()
            quota = None
        else:
            quota = quota or Quota(user=user, key=key)
            quota.tokens_per_day, quota.requests_per_minute = tokens, rate
            quota.save()
        changes = audit.diff(before, _state(quota))
        if changes:
            AuditEvent.objects.record(
                AuditKind.QUOTA_CHANGED,
                actor=audit.actor_of(request.user),
                reason=f"{subject}: " + ", ".join(changes),
                details={"subject": subject, "changes": changes},
            )
    shown = quota.limits_text() if quota is not None else "no quota"
    messages.success(request, f"Quota of {subject}: {shown}.")
    return redirect("panel:usage")


def _quota_form() -> QuotaForm:
    """The form, with the version of every quota as the page shows it."""
    form = QuotaForm()
    quotas = Quota.objects.all()
    edits.add_seen_each(form, {(f"key:{q.key_id}" if q.key_id else f"user:{q.user_id}"): _state(q)
                               for q in quotas})  # fmt: skip
    return form


def _state(quota: Quota | None) -> dict[str, Any]:
    if quota is None:
        return {"tokens_per_day": None, "requests_per_minute": None}
    return {
        "tokens_per_day": quota.tokens_per_day,
        "requests_per_minute": quota.requests_per_minute,
    }


def _errors_text(form: QuotaForm) -> str:
    return "; ".join(f"{form.fields[name].label}: {' '.join(errs)}" if name in form.fields
                     else " ".join(errs) for name, errs in form.errors.items())  # fmt: skip
