"""The dashboard: model cards, the queue, the memory chart and the latest audit events.

The page is complete without JavaScript (a snapshot taken while rendering, forms that POST the
actions); with it, ``static/panel/live.js`` keeps it current over the WebSocket.
"""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from models_app.accounts import reservations
from models_app.accounts.roles import Role, require
from models_app.audit import records as audit
from models_app.models import AuditEvent, Preset
from models_app.panel import dashboard_view, queue_reasons
from models_app.panel.views import actions, common, memory
from models_app.routing import topology

FEED_ROWS = 12


@require_GET
@require(Role.VIEWER)
def dashboard(request: HttpRequest) -> HttpResponse:
    view = dashboard_view.View.of(request.GET)
    snap, router_error = common.snapshot()
    if snap is None:  # the router away: the presets the database has, as the router would list
        snap = {"models": _stored_models(), "queue": []}
    snap = dashboard_view.select(snap, view)
    presets = {p.name: p for p in Preset.objects.filter(name__in=dashboard_view.shown_names(snap))}
    cards = model_cards(snap, presets)
    queue = queue_rows(snap)
    waits = {q["model"]: q for q in queue}
    reserved = reservations.dashboard_notes()  # "reserved for group workshop until 16:00"
    for c in cards:
        c["reserved"] = reserved.get(c["name"])
        # the card says what its queue entry says (no "queued #2" while it loads)
        q = waits.get(c["name"])
        c["queue_reason"] = q["reason"] if q else None
        c["queue_waiting"] = bool(q and not q.get("starting") and not q.get("restart"))
    context = {
        "cards": cards,
        "queue": queue,
        "router_error": router_error,
        "config": (snap or {}).get("config") or {},
        "system": (snap or {}).get("memory"),
        "nodes": (snap or {}).get("nodes") or [],  # several hosts (issue 18)
        "feed": AuditEvent.objects.all()[:FEED_ROWS],
        "counts": snap["counts"],
        "view": snap["view"],
        "pager": _pager(view, snap["view"]),
        "ws_query": view.query(),
        "preset_ids": {name: p.pk for name, p in presets.items()},
        "now": time.time(),
    }
    return render(request, "panel/dashboard.html", context)


def model_cards(snap: dict[str, Any], presets: dict[str, Preset]) -> list[dict[str, Any]]:
    """One card per model shown: the router's view when it answered, else the database's."""
    cards = []
    for row in snap.get("models", []):
        preset = presets.get(row["name"])
        cards.append(_flags(row | _preset_facts(preset)))
        since = row.get("state_since")
        cards[-1]["in_state"] = max(0.0, time.time() - since) if since else None
    return cards


def _stored_models() -> list[dict[str, Any]]:
    rows = Preset.objects.filter(enabled=True).values_list("name", "aliases", "pinned")
    return [{"name": name, "aliases": aliases or [], "state": "unknown", "pinned": bool(pinned)}
            for name, aliases, pinned in rows]  # fmt: skip


def _pager(view: dashboard_view.View, shown: dict[str, Any]) -> dict[str, Any]:
    """Links to the previous and next page of idle models (None at either end)."""
    page, pages = shown["page"], shown["pages"]
    first = (page - 1) * shown["per_page"] + 1
    return {
        "previous": "?" + view.query(page - 1) if page > 1 else None,
        "next": "?" + view.query(page + 1) if page < pages else None,
        "first": first,
        "page": page,
        "pages": pages,
    }


DOWN = frozenset({"unloaded", "failed", "quarantined", "unknown"})
RUNNING = frozenset({"loading", "loaded", "sleeping"})


def _flags(card: dict[str, Any]) -> dict[str, Any]:
    """Which buttons apply: Load to a model that is down, Unload to one running, not stopping."""
    state = card.get("state")
    card["down"] = state in DOWN
    card["running"] = state in RUNNING and not card.get("stopping")
    return card


def _preset_facts(preset: Preset | None) -> dict[str, Any]:
    if preset is None:
        return {"preset_id": None, "estimate": None}
    return {"preset_id": preset.pk, "estimate": preset.memory_estimate or preset.gguf_estimate}


QUEUE_SHOWN = 5  # requests listed under each queue entry (the router sends 5); the rest counted


def queue_rows(snap: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Queue entries with how long they waited, and their oldest requests (each cancellable)."""
    now = time.time()
    loads = {m["name"]: m.get("load_seconds") for m in (snap or {}).get("models") or []}
    why = queue_reasons.reasons(snap)
    rows = []
    for row in (snap or {}).get("queue") or []:
        requests = [
            r | {"waiting": max(0.0, now - (r.get("since") or now))}
            for r in (row.get("requests") or [])[:QUEUE_SHOWN]
        ]
        more = max(0, int(row.get("waiters") or 0) - len(requests))
        waiting = max(0.0, now - (row.get("since") or now))
        eta = loads.get(row.get("model"))
        reason = why.get(row.get("model") or "")
        rows.append(
            row
            | {"waiting": waiting, "shown": requests, "more": more, "eta": eta, "reason": reason}
        )
    return rows


@require_POST
@require(Role.OPERATOR)
def model_action(request: HttpRequest) -> HttpResponse:
    """Load, unload, pin, unpin or cancel queued requests from a form (the no-JavaScript path)."""
    action, model = request.POST.get("action", ""), request.POST.get("model", "")
    request_id = request.POST.get("request_id", "")
    if action not in actions.ACTIONS or not model:
        messages.error(request, "Choose a model and an action.")
    else:
        actor = audit.actor_of(request.user)
        run = async_to_sync(actions.run)
        outcome = run(action, model, actor, request.user.pk, request_id)
        if not outcome.ok:
            messages.error(request, f"{model}: {outcome.message}")
        elif outcome.pending:
            messages.info(request, outcome.message)
        else:
            messages.success(request, outcome.message)
    return redirect(_next(request, "panel:dashboard"))


def _next(request: HttpRequest, default: str) -> str:
    target: str = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}):
        return target
    from django.urls import reverse

    url: str = reverse(default)
    return url


@require_GET
@require(Role.VIEWER)
def memory_history(request: HttpRequest) -> JsonResponse:
    """``?range=1h`` (the router's ring, as columns), ``24h`` or ``7d`` (the rollups);
    ``&node=NAME``: that node's ring (several hosts)."""
    range_name = request.GET.get("range", "1h")
    node = request.GET.get("node") or None
    if node is not None:
        try:
            topology.check_name(node)
        except ValueError as exc:
            return JsonResponse({"available": False, "reason": str(exc)}, status=400)
    if range_name == "1h":
        answer = common.ask_router({"type": "router.memory"}, common.PAGE_TIMEOUT + 1, node)
        samples = (answer.body or {}).get("memory")
        if not isinstance(samples, list):
            return JsonResponse({"available": False, "reason": answer.error or "no samples"})
        return JsonResponse({"available": True, "columns": memory.columns(samples)})
    return JsonResponse(memory.rollups(range_name, node or ""))
