"""Operator actions on models — load, unload, pin, unpin, cancel — shared by the form POSTs and
the WebSocket (both check the role before calling in here).

Load and unload go to the router as the acting user (its audit rows name them). Cancel rejects
the model's queued requests (or the one named by ``request_id``) with 499. Pinning is a
preset change: the preset row is updated and audited, then the router reloads its presets — a
pin does not change the command line, so the model keeps running (A14).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from models_app.audit import records as audit
from models_app.models import Preset, RouterSettings
from models_app.panel.views import common
from models_app.panel.views.common import ACTION_WAIT, Answer
from models_app.routing.messages import CancelQueuedCall, LoadCall, UnloadCall

ACTIONS = ("load", "unload", "pin", "unpin", "cancel")


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str
    pending: bool = False


async def run(
    action: str, model: str, actor: str, user_id: int | None, request_id: str = ""
) -> Outcome:
    """Carry out ``action`` on ``model``; wait at most ACTION_WAIT for the router."""
    from asgiref.sync import sync_to_async

    if action not in ACTIONS:
        return Outcome(False, f"unknown action {action!r}")
    if action == "cancel":
        cancel: CancelQueuedCall = {"type": "router.cancel_queued", "actor": actor}
        if request_id:
            cancel["queued_request"] = request_id
        else:
            cancel["model"] = model
        answer = await common.call_router(cancel, ACTION_WAIT)
        n = len((answer.body or {}).get("cancelled") or [])
        what = f"request {request_id}" if request_id else f"{n} queued request{'s' * (n != 1)}"
        return _outcome(answer, f"{model}: cancelled {what}", f"{model}: cancelling")
    if action in ("pin", "unpin"):
        error = await sync_to_async(set_pinned)(model, action == "pin", actor, user_id)
        if error:
            return Outcome(False, error)
        answer = await common.call_router({"type": "router.reload", "actor": actor}, ACTION_WAIT)
        done = f"{model} {action}ned"
        return _outcome(answer, done, f"{done}; the router is reloading its presets")
    call: LoadCall | UnloadCall
    if action == "load":
        call = {"type": "router.load", "model": model, "actor": actor}
    else:
        call = {"type": "router.unload", "model": model, "actor": actor}
    answer = await common.call_router(call, ACTION_WAIT)
    done = f"{model}: {action} started" if action == "load" else f"{model}: unloading"
    pending = f"{model}: {action} queued; the dashboard shows its progress"
    return _outcome(answer, done, pending)


def _outcome(answer: Answer, done: str, pending: str) -> Outcome:
    if answer.pending:
        return Outcome(True, pending, pending=True)
    if answer.error:
        return Outcome(False, answer.error)
    return Outcome(True, done)


def set_pinned(name: str, pinned: bool, actor: str, user_id: int | None) -> str | None:
    """Pin or unpin the preset ``name``, with an audit row; return an error text or None."""
    with transaction.atomic():
        preset = Preset.objects.select_for_update().filter(name=name).first()
        if preset is None:
            return f"there is no preset named {name!r}"
        before = audit.preset_state(preset)
        preset.pinned = pinned or _unpinned(preset)
        preset.updated_by_id = user_id
        preset.save(update_fields=["pinned", "updated_at", "updated_by"])
        audit.record_preset_change(before, preset, actor)
    return None


def _unpinned(preset: Preset) -> bool | None:
    """Unpinning goes back to inheriting ``[*]`` (None), so the preset matches its INI again;
    only a ``[*]`` that pins every model needs an explicit False."""
    global_def = RouterSettings.load().global_def()
    return False if global_def is not None and global_def.pinned else None
