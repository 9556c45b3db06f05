"""Settings, API keys and users."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from models_app import runtime
from models_app.accounts import signin
from models_app.accounts.roles import Role, forbidden, require, role_of, set_role
from models_app.audit import records as audit
from models_app.models import ApiKey, AuditEvent, AuditKind, NodeSettings, RouterSettings
from models_app.panel import edits
from models_app.panel.forms import (
    ApiKeyForm,
    KeyScopeForm,
    NewUserForm,
    NodeSettingsForm,
    RoleForm,
    SettingsForm,
)
from models_app.panel.views import common

# ---- settings ---------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@require(Role.VIEWER)
def settings_page(request: HttpRequest) -> HttpResponse:
    """Everyone with a role reads the settings; only admins get (and may post) the form."""
    row = RouterSettings.load()
    is_admin = role_of(request.user) >= Role.ADMIN
    if request.method == "POST" and not is_admin:
        return forbidden(request, Role.ADMIN)
    form = SettingsForm(request.POST or None, instance=row) if is_admin else None
    if form is not None:
        edits.add_seen(form, audit.settings_state(row))
    if form is not None and request.method == "POST" and form.is_valid():
        try:
            return _save_settings(request, form)
        except edits.Stale as stale:
            edits.refused(form, stale)
    snap, router_error = common.snapshot()
    context = {
        "form": form,
        "row": row,
        "values": _readable(row),
        "running": (snap or {}).get("config"),
        "router_error": router_error,
        "nodes": _node_rows(row, (snap or {}).get("nodes") or [], is_admin),
        "error_links": common.error_links(form, whole=("settings-form", "Settings"))
        if form is not None and form.is_bound
        else [],
        "api_open": api_open(),
    }
    return render(request, "panel/settings.html", context)


def _node_rows(row: RouterSettings, seen: list[dict[str, Any]], editable: bool) -> list[Any]:
    """Several hosts: each node known (live, lost, or with settings of its own) with what it
    runs with and, for admins, a form for its own values."""
    own = {n.node: n for n in NodeSettings.objects.all()}
    states = {n["node"]: n for n in seen}
    out = []
    for name in sorted(set(own) | set(states)):
        mine = own.get(name)
        form = NodeSettingsForm(instance=mine or NodeSettings(node=name), prefix=f"node-{name}")
        edits.add_seen(form, _node_state(mine))
        effective = mine.models_max if mine and mine.models_max is not None else row.models_max
        state = states.get(name, {})
        out.append({"node": name, "state": state.get("state", "never seen"), "own": mine,
                    "effective_max": effective, "running_max": state.get("models_max"),
                    "form": form if editable else None})  # fmt: skip
    return out


@require_POST
@require(Role.ADMIN)
def node_settings(request: HttpRequest, node: str) -> HttpResponse:
    """Save one node's own capacity (empty values: back to the router settings); the node's
    router applies it at once."""
    actor = audit.actor_of(request.user)
    with transaction.atomic():
        mine = NodeSettings.objects.select_for_update().filter(node=node).first()
        before = _node_state(mine)
        form = NodeSettingsForm(
            request.POST, instance=mine or NodeSettings(node=node), prefix=f"node-{node}"
        )
        edits.add_seen(form, before)
        if not form.is_valid():
            problems = "; ".join(f"{f}: {' '.join(e)}" for f, e in form.errors.items())
            messages.error(request, f"Node {node}: {problems}")
            return redirect("panel:settings")
        try:
            edits.check(
                edits.seen(form), before, _node_state(form.instance),
                what=f"Node {node}'s settings", plural=True, labels=edits.labels_of(form),
                changed=Q(kind=AuditKind.SETTINGS_CHANGED, node=node),
            )  # fmt: skip
        except edits.Stale as stale:
            messages.error(request, edits.said(stale))
            return redirect("panel:settings")
        if form.is_empty():
            if mine is not None:
                mine.delete()
            after = _node_state(None)
        else:
            saved = form.save(commit=False)
            saved.node, saved.updated_by = node, request.user
            saved.save()
            after = _node_state(saved)
        changes = audit.diff(before, after)
        if changes:
            AuditEvent.objects.record(
                AuditKind.SETTINGS_CHANGED, actor=actor, node=node,
                reason=f"node {node}: " + ", ".join(changes), details={"changes": changes},
            )  # fmt: skip
    if not changes:
        messages.info(request, "Nothing changed.")
        return redirect("panel:settings")
    call: Any = {"type": "router.settings", "actor": actor}
    answer = common.ask_router(call, common.ACTION_WAIT, node=node)
    common.report(
        request, answer, f"Saved the settings of node {node}; its router applies them now.",
        f"Saved the settings of node {node}; its router is applying them.",
    )  # fmt: skip
    return redirect("panel:settings")


def _node_state(row: NodeSettings | None) -> dict[str, Any]:
    fields = ("models_max", "memory_budget", "settle_timeout")
    return {f: getattr(row, f) if row is not None else None for f in fields}


def _save_settings(request: HttpRequest, form: SettingsForm) -> HttpResponse:
    actor = audit.actor_of(request.user)
    with transaction.atomic():
        before = audit.settings_state(RouterSettings.objects.select_for_update().get(pk=1))
        edits.check(
            edits.seen(form), before, audit.settings_state(form.instance),
            what="The router settings", changed=Q(kind=AuditKind.SETTINGS_CHANGED, node=""),
            plural=True,
        )  # fmt: skip
        row = form.save(commit=False)
        row.updated_by = request.user
        row.save()
        changed = audit.record_settings_change(before, row, actor)
    if changed is None:
        messages.info(request, "Nothing changed.")
        return redirect("panel:settings")
    answer = common.ask_router({"type": "router.settings", "actor": actor}, common.ACTION_WAIT)
    # the words the form shows, in its order (issue 49.7)
    names = [str(form[name].label) for name in form.fields if name in changed.details["changes"]]
    common.report(
        request,
        answer,
        f"Saved: {', '.join(names)}. The router applies them now.",
        f"Saved: {', '.join(names)}. The router is applying them.",
    )
    return redirect("panel:settings")


def api_open() -> bool:
    """Whether the router API serves requests without a key (no ``--api-key``, the switch off)."""
    return not runtime.current().api_keys and not RouterSettings.load().require_api_key


def _readable(row: RouterSettings) -> list[tuple[str, str]]:
    def size(value: int | None) -> str:
        return "none" if not value else common.human_bytes(value)

    def seconds(value: int | None) -> str:
        return "no limit" if not value else f"{value} s"

    return [
        ("Max running models", "no limit" if row.models_max == 0 else str(row.models_max)),
        ("Memory budget", size(row.memory_budget)),
        ("Memory headroom", size(row.memory_headroom)),
        ("Settle timeout", f"{row.settle_timeout} s"),
        ("Max waiters per model", "no limit" if not row.max_waiters else str(row.max_waiters)),
        ("Max wait in the queue", seconds(row.max_wait)),
        ("Queue policy", row.queue_policy),
        ("Default stop-timeout", f"{row.default_stop_timeout} s"),
        ("Quarantine after", f"{row.quarantine_after} failed loads"),
        ("Server binary", row.server_binary),
        ("API key required", "yes" if row.require_api_key else "no"),
        ("Keep audit rows", _days(row.audit_retention_days)),
    ]


def _days(value: int | None) -> str:
    return "forever" if not value else f"{value} days"


# ---- API keys ---------------------------------------------------------------------------------


NEW_KEY = "panel.new_api_key"  # session: the key just created, until the page showing it


@require_http_methods(["GET", "POST"])
@require(Role.VIEWER)
def api_keys(request: HttpRequest) -> HttpResponse:
    """Your keys (admins: everyone's); a new key is shown once.

    POST-redirect-GET: a valid form issues the key, keeps its secret in the session and
    redirects; the next GET takes it out of the session and shows it, so reloading neither
    issues a second key nor shows the secret again.
    """
    is_admin = role_of(request.user) >= Role.ADMIN
    form = ApiKeyForm(request.POST or None, user=request.user, is_admin=is_admin)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        with transaction.atomic():  # the key and its audit row, or neither
            key, secret = ApiKey.objects.issue(
                data["owner"],
                data["name"],
                model_patterns=data["models"],
                max_concurrent=data["max_concurrent"],
                priority=data["priority"],
                queue_comments=data["queue_comments"],
            )
            audit.record_key_change(AuditKind.KEY_CREATED, key, audit.actor_of(request.user))
        request.session[NEW_KEY] = {"id": key.pk, "secret": secret}
        return redirect("panel:api_keys")
    keys = ApiKey.objects.select_related("owner").order_by("-created_at")
    if not is_admin:
        keys = keys.filter(owner=request.user)
    created = _new_key(request) if request.method == "GET" else None
    context = {"form": form, "keys": keys, "created": created, "is_admin": is_admin,
               "api_open": api_open()}  # fmt: skip
    response = render(request, "panel/keys.html", context)
    response["Cache-Control"] = "no-store"  # the page may hold a secret
    return response


def _new_key(request: HttpRequest) -> tuple[ApiKey, str] | None:
    """Take the key created just now out of the session (it is shown on one page only)."""
    shown = request.session.pop(NEW_KEY, None)
    if not isinstance(shown, dict):
        return None
    key = ApiKey.objects.select_related("owner").filter(pk=shown.get("id")).first()
    return None if key is None else (key, str(shown.get("secret", "")))


@require_http_methods(["GET", "POST"])
@require(Role.VIEWER)
def api_key_scope(request: HttpRequest, pk: int) -> HttpResponse:
    """Change what an active key may do (its owner or an admin); the secret stays the same."""
    key = get_object_or_404(ApiKey.objects.select_related("owner").active(), pk=pk)
    is_admin = role_of(request.user) >= Role.ADMIN
    if key.owner_id != request.user.pk and not is_admin:
        return forbidden(request, Role.ADMIN)
    initial = {
        "models": key.model_patterns,
        "max_concurrent": key.max_concurrent,
        "priority": key.priority,
        "queue_comments": key.queue_comments,
    }
    form = KeyScopeForm(request.POST or None, initial=initial, is_admin=is_admin, keep=key.priority)
    if request.method == "POST" and form.is_valid():
        before = audit.key_state(key)
        key.model_patterns = form.cleaned_data["models"]
        key.max_concurrent = form.cleaned_data["max_concurrent"]
        key.priority = form.cleaned_data["priority"]
        key.queue_comments = form.cleaned_data["queue_comments"]
        with transaction.atomic():
            fields = ["model_patterns", "max_concurrent", "priority", "queue_comments"]
            key.save(update_fields=fields)
            actor = audit.actor_of(request.user)
            audit.record_key_change(AuditKind.KEY_RESCOPED, key, actor, before)
        messages.success(request, f"Saved {key.name}: {key.scope_text()}.")
        return redirect("panel:api_keys")
    return render(request, "panel/key_scope.html", {"key": key, "form": form})


@require_http_methods(["GET", "POST"])
@require(Role.VIEWER)
def api_key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    """GET asks to confirm (a page, so it works without JavaScript); POST revokes."""
    key = get_object_or_404(ApiKey.objects.select_related("owner"), pk=pk)
    if key.owner_id != request.user.pk and role_of(request.user) < Role.ADMIN:
        return forbidden(request, Role.ADMIN)
    if request.method == "GET":
        return render(request, "panel/key_revoke.html", {"key": key})
    if not key.revoked:
        with transaction.atomic():
            key.revoke()
            audit.record_key_change(AuditKind.KEY_REVOKED, key, audit.actor_of(request.user))
    messages.success(request, f"Revoked {key}.")
    return redirect("panel:api_keys")


# ---- users ------------------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@require(Role.ADMIN)
def users(request: HttpRequest) -> HttpResponse:
    form = NewUserForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        user = get_user_model().objects.create_user(data["username"], password=data["password"])
        set_role(user, Role[data["role"].upper()])
        messages.success(request, f"Created {user} ({data['role']}).")
        return redirect("panel:users")
    rows = [
        {"user": u, "role": role_of(u).label, "form": RoleForm(initial={"role": role_of(u).label})}
        for u in get_user_model().objects.order_by("username").prefetch_related("groups")
    ]
    context = {
        "form": form,
        "rows": rows,
        "lockouts": signin.lockouts(),
        "failure_limit": settings.AXES_FAILURE_LIMIT,
    }
    return render(request, "panel/users.html", context)


@require_POST
@require(Role.ADMIN)
def user_unlock(request: HttpRequest) -> HttpResponse:
    """Clear a sign-in lockout of a user name or a client address (audited)."""
    kind, value = request.POST.get("kind", ""), request.POST.get("value", "").strip()
    if kind not in ("user", "address") or not value:
        messages.error(request, "Say which user name or address to unlock.")
        return redirect("panel:users")
    signin.unlock(kind, value, audit.actor_of(request.user))
    label = "user name" if kind == "user" else "address"
    messages.success(request, f"Unlocked sign-in for the {label} {value}.")
    return redirect("panel:users")


@require_POST
@require(Role.ADMIN)
def user_role(request: HttpRequest, pk: int) -> HttpResponse:
    user = get_object_or_404(get_user_model(), pk=pk)
    form = RoleForm(request.POST)
    if user.pk == request.user.pk:
        messages.error(request, "You cannot change your own role (ask another admin).")
    elif user.is_superuser:
        messages.error(request, f"{user} is a superuser and always an admin.")
    elif form.is_valid():
        set_role(user, Role[form.cleaned_data["role"].upper()])
        messages.success(request, f"{user} is now: {form.cleaned_data['role']}.")
    return redirect("panel:users")
