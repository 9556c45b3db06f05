"""Background jobs (DESIGN §2, STYLE 15): thin Celery tasks that take ids and call functions.

Embedded mode runs them inline (eager); team mode sends them to ``celery -A routerpanel worker``
over Redis, and ``celery -A routerpanel beat`` (django-celery-beat's DatabaseScheduler) fires the
periodic ones: ``CELERY_BEAT_SCHEDULE`` in settings, plus scheduled preloads that admins add as
periodic tasks in the admin. Tests call the functions directly.

- ``inspect_preset(preset_id)``: read the preset's GGUF and store its facts and memory estimate;
  queued by ``preset_saved`` after each save that can change them.
- ``apply_retention()``: ``audit.purge_expired`` and ``usage.purge_expired`` (daily).
- ``roll_up_memory()``: fold the router's memory ring into ``MemoryRollup`` rows (every minute).
- ``preload(name)``: ask the router to load a model, as the actor ``schedule``.
- ``reservations_tick()``: hand the router the reservations open now and audit their starts
  and ends (reservations.py; every ``RESERVATIONS_TICK_SECONDS``, and after a booking changes).
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import async_to_sync
from celery import shared_task
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from models_app.accounts import reservations, usage
from models_app.audit import records as audit
from models_app.models import Preset, RouterSettings
from models_app.routing import metrics, nodes
from models_app.routing.client import RouterClient
from routerpanel.router import gguf, options
from routerpanel.router.errors import RouterError

log = logging.getLogger(__name__)

PRELOAD_ACTOR = "schedule"
KV_CACHE = "f16"  # the estimate's KV cache type (llama-server's default)
FACT_FIELDS = (
    "architecture", "name", "parameter_count", "quantisation", "file_type",
    "dominant_tensor_type", "layers", "heads", "kv_heads", "embedding_length",
    "feed_forward_length", "context_length", "vocab_size", "file_size",
)  # fmt: skip


# ---- GGUF inspection --------------------------------------------------------------------------


def option_value(pairs: list[list[str]], canonical: str) -> str | None:
    """Return the value of a llama-server option in any spelling (``c``, ``ctx-size``, env)."""
    for key, value in pairs:
        found = options.lookup(key)
        if found is not None and found[0].key == canonical:
            return value
    return None


def context_size(preset: Preset, global_args: list[list[str]]) -> tuple[int, int]:
    """The preset's ``ctx-size`` and ``parallel`` (its own, else ``[*]``'s); 0 ctx = trained."""

    def pick(name: str, default: int) -> int:
        value = option_value(preset.args, name) or option_value(global_args, name)
        try:
            return int(value) if value is not None else default
        except ValueError:
            return default

    return max(0, pick("ctx-size", 0)), max(1, pick("parallel", 1))


def inspect_file(path: str, n_ctx: int, n_parallel: int = 1) -> tuple[dict[str, Any], int | None]:
    """Return (facts, estimated bytes) for a GGUF; an unreadable file gives ``{"error": ...}``.

    ``n_ctx`` 0 means the trained context, as in llama-server. ``facts["inputs"]`` records what
    the facts were computed from, so an unchanged preset is not read again.
    """
    now = datetime.now(tz=UTC).isoformat(timespec="seconds")
    inputs = _inputs(path, n_ctx, n_parallel)
    try:
        facts = gguf.inspect(path)
        estimate = gguf.estimate_memory(facts, n_ctx, n_parallel=n_parallel)
    except gguf.GgufError as exc:
        return {"error": str(exc), "inputs": inputs, "inspected_at": now}, None
    except Exception as exc:  # never let a strange file crash a save (issue 5)
        log.exception("inspecting %s failed", path)
        error = f"{path}: could not be inspected: {exc}"
        return {"error": error, "inputs": inputs, "inspected_at": now}, None
    data: dict[str, Any] = {name: getattr(facts, name) for name in FACT_FIELDS}
    data |= {
        "path": str(facts.path),
        "inputs": inputs,
        "estimate": {
            "n_ctx": estimate.n_ctx,
            "n_parallel": n_parallel,
            "kv_cache_type": KV_CACHE,
            "weights": estimate.weights,
            "kv_cache": estimate.kv_cache,
            "overhead": estimate.overhead,
            "total": estimate.total,
            "overhead_is": "compute buffers of one micro-batch + output logits + 32 MiB runtime",
        },
        "inspected_at": now,
    }
    return data, estimate.total


def inspect_preset(preset_id: int) -> dict[str, Any] | None:
    """Inspect a preset's model file and store the facts and estimate; skip an unchanged file."""
    preset = Preset.objects.filter(pk=preset_id).first()
    if preset is None:
        return None
    if not preset.model_path:
        Preset.objects.filter(pk=preset_id).update(gguf_facts={}, gguf_estimate=None)
        return {}
    stored = RouterSettings.objects.filter(pk=1).values_list("global_args", flat=True).first()
    n_ctx, n_parallel = context_size(preset, stored or [])
    if _unchanged(preset, n_ctx, n_parallel):
        unchanged: dict[str, Any] = preset.gguf_facts
        return unchanged
    facts, estimate = inspect_file(preset.model_path, n_ctx, n_parallel)
    # update(), not save(): no post_save, so no new inspection and no audit row for our own write
    Preset.objects.filter(pk=preset_id).update(gguf_facts=facts, gguf_estimate=estimate)
    return facts


def _unchanged(preset: Preset, n_ctx: int, n_parallel: int) -> bool:
    facts = preset.gguf_facts or {}
    inputs = _inputs(preset.model_path, n_ctx, n_parallel)
    return "error" not in facts and facts.get("inputs") == inputs


def _inputs(path: str, n_ctx: int, n_parallel: int) -> dict[str, Any]:
    size: int | None
    mtime: float | None
    try:
        stat = os.stat(path)
        size, mtime = stat.st_size, stat.st_mtime
    except OSError:
        size = mtime = None
    return {"path": path, "size": size, "mtime": mtime, "ctx_size": n_ctx, "parallel": n_parallel}


def inspect_presets(ids: list[int] | None = None) -> int:
    """Inspect these presets, or every one (the ``[*]`` context size may have changed); return
    how many. One query reads them all; a preset with no model file whose facts are already
    empty is not written again (ten thousand presets: most of them)."""
    found = Preset.objects.all() if ids is None else Preset.objects.filter(pk__in=ids)
    rows = found.values_list("pk", "model_path", "gguf_facts", "gguf_estimate")
    empty = [
        pk for pk, path, facts, estimate in rows if not path and not facts and estimate is None
    ]
    done = set(empty)
    for pk, _path, _facts, _estimate in rows:
        if pk not in done:
            inspect_preset(pk)
    return len(rows)


class _Saved(threading.local):
    """The presets saved in this thread's open transaction, inspected together at its commit."""

    def __init__(self) -> None:
        self.ids: set[int] = set()


_saved = _Saved()


@receiver(post_save, sender=Preset, dispatch_uid="models_app.tasks.preset_saved")
def preset_saved(sender: Any, instance: Preset, **kwargs: Any) -> None:
    """Queue an inspection once the save commits (admin, panel, import, --models-dir): one task
    for all the presets a transaction saved (an import of ten thousand: one, not ten thousand)."""
    fields = kwargs.get("update_fields")
    if fields is not None and not {"model_path", "args"} & set(fields):
        return
    _saved.ids.add(instance.pk)
    transaction.on_commit(_inspect_saved)  # the first to run takes them all; a rollback's
    # ids are taken by the next commit's (inspecting a preset that is not there does nothing)


def _inspect_saved() -> None:
    ids, _saved.ids = sorted(_saved.ids), set()
    if not ids:
        return
    if len(ids) == 1:
        inspect_preset_task.delay(ids[0])
    else:
        inspect_presets_task.delay(ids)


@receiver(post_save, sender=RouterSettings, dispatch_uid="models_app.tasks.settings_saved")
def settings_saved(sender: Any, instance: RouterSettings, **kwargs: Any) -> None:
    """``[*]`` may set ctx-size for every preset: re-check them (unchanged ones are not read)."""
    fields = kwargs.get("update_fields")
    if kwargs.get("created") and not instance.global_args:
        return  # the row's first save (RouterSettings.load()): nothing to re-check
    if fields is None or "global_args" in fields:
        inspect_presets_task.delay_on_commit()


# ---- the other jobs ---------------------------------------------------------------------------


def apply_retention() -> int:
    """Delete expired audit rows (the count returned) and usage rows, on the same setting."""
    purged = audit.purge_expired()
    usage.purge_expired()
    return purged


def roll_up_memory(client: RouterClient | None = None) -> int:
    """Fold the router's one-hour memory ring into per-minute rollups; 0 if it does not answer.
    Several hosts: each live node's ring, into rows of its own."""
    client = client or RouterClient()
    live = async_to_sync(nodes.live_names)() if getattr(client, "node", None) is None else []
    targets = [(client.on_node(node), node) for node in live] or [(client, "")]
    written = 0
    for target, node in targets:
        try:
            answer = async_to_sync(target.memory)()
        except RouterError as exc:
            log.warning("memory rollup skipped%s: %s", f" for node {node}" if node else "", exc)
            continue
        written += metrics.roll_up(answer.get("memory") or [], node=node)
    return written


def preload(name: str, client: RouterClient | None = None) -> dict[str, Any]:
    """Ask the router to load ``name`` through its queue (rule A9), as the actor ``schedule``."""
    client = client or RouterClient()
    try:
        return dict(async_to_sync(client.load)(name, actor=PRELOAD_ACTOR))
    except RouterError as exc:
        if "already running" in exc.message:
            return {"success": True, "already_running": True}
        raise


# ---- the tasks (thin) -------------------------------------------------------------------------


@shared_task
def inspect_preset_task(preset_id: int) -> None:
    inspect_preset(preset_id)


@shared_task
def inspect_presets_task(ids: list[int] | None = None) -> int:
    return inspect_presets(ids)


@shared_task
def retention_task() -> int:
    return apply_retention()


@shared_task
def memory_rollup_task() -> int:
    return roll_up_memory()


@shared_task
def preload_model(name: str) -> dict[str, Any]:
    return preload(name)


@shared_task
def reservations_tick() -> dict[str, Any]:
    return reservations.tick()
