"""The usage page (issue 17.2): a chart of model time per hour and model, a table of sums by
actor, model or key, and the table as CSV. Viewers see their own usage, operators and admins
everyone's. The CSV escapes text a spreadsheet would run as a formula, as the audit export does.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from models_app import usage
from models_app.roles import Role, require, role_of
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
    by = by if by in usage.GROUPS else "actor"
    days = request.GET.get("days", "7")
    days = days if days in SPANS else "7"
    since = timezone.now() - timedelta(days=SPANS[days])
    everyone = role_of(request.user) >= Role.OPERATOR
    actor = None if everyone else request.user.get_username()
    rows = usage.summary(by, since, None, actor)
    if request.GET.get("format") == "csv":
        return _csv(by, rows, days)
    context = {
        "by": by,
        "days": days,
        "spans": list(SPANS),
        "groups": list(usage.GROUPS),
        "rows": rows,
        "columns": COLUMNS,
        "everyone": everyone,
        "hourly": usage.hourly(since, None, actor),
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
