"""The router's answers to calls (``router.load``, ``router.snapshot``, …), one function per type.

The same for a web side in this process (``InProcess.call``) and one over the channel layer
(``Desk.router_call``); a refusal is a ``RouterError``. ``answer`` lets no type through
unanswered (mypy checks it against messages.Call).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, assert_never

from asgiref.sync import sync_to_async
from django.conf import settings

from models_app import disk
from models_app.presets import specs
from models_app.routing.messages import (
    AnswerBody,
    Call,
    CancelledAnswer,
    CancelQueuedCall,
    LeaseAnswer,
    LeaseCall,
    LogsAnswer,
    LogsCall,
    MetricsAnswer,
    ReloadAnswer,
    ReloadCall,
    SettingsCall,
    SuccessAnswer,
)
from models_app.routing.metrics import Family

if TYPE_CHECKING:
    from collections import Counter

    from models_app.audit.writer import AuditWriter
    from models_app.routing.metrics import RouterMetrics
    from routerpanel.router.engine import Engine

TRANSPORTS = ("socket", "channel")


class CallHost(Protocol):
    """What a call needs of the router host (routing/host.py)."""

    boot: str
    overrides: specs.Overrides
    before_reload: Callable[[], Awaitable[None]] | None
    audit: AuditWriter
    metrics: RouterMetrics
    acquires: Counter[str]

    @property
    def running_engine(self) -> Engine: ...


async def answer(host: CallHost, call: Call) -> AnswerBody:
    """Answer one call; raise RouterError when the answer is no."""
    engine = host.running_engine
    if call["type"] == "router.load":
        await engine.load(call["model"], actor=call["actor"])
        return {"success": True}
    if call["type"] == "router.unload":
        await engine.unload(call["model"], actor=call["actor"])
        return {"success": True}
    if call["type"] == "router.cancel_queued":
        return await _cancel_queued(engine, call)
    if call["type"] == "router.reload":
        return await _reload(host, call)
    if call["type"] == "router.settings":
        return await _settings(host, call)
    if call["type"] == "router.reservations":
        return await engine.set_reservations(call["reservations"], actor=call["actor"])
    if call["type"] == "router.snapshot":
        return engine.snapshot() | {"boot": host.boot}
    if call["type"] == "router.ready":  # GET /ready: cheap, no snapshot
        return engine.status() | {"boot": host.boot, "problems": problems(host)}
    if call["type"] == "router.memory":
        return {"memory": engine.memory_history()}
    if call["type"] == "router.metrics":
        return _metrics(host)
    if call["type"] == "router.logs":
        return _logs(engine, call)
    if call["type"] == "router.lease":
        return _lease(engine, call)
    assert_never(call)  # mypy: every Call is answered (the desk lets no other type in)


async def _cancel_queued(engine: Engine, call: CancelQueuedCall) -> CancelledAnswer:
    ids = await engine.cancel_queued(
        model=call.get("model"), request_id=call.get("queued_request"), actor=call["actor"]
    )
    return {"success": True, "cancelled": ids}


async def _reload(host: CallHost, call: ReloadCall) -> ReloadAnswer:
    if host.before_reload is not None and call.get("sources"):
        await host.before_reload()
    _, presets = await sync_to_async(specs.load_specs)(host.overrides)
    return await host.running_engine.reload(presets, actor=call["actor"])


async def _settings(host: CallHost, call: SettingsCall) -> SuccessAnswer:
    config, _ = await sync_to_async(specs.load_specs)(host.overrides)
    await host.running_engine.update_settings(config, actor=call["actor"])
    return {"success": True}


def problems(host: CallHost) -> list[str]:
    """What keeps the router from writing its files (a full disk): it goes on serving."""
    found = list(host.running_engine.problems())
    if host.audit.journal.problem:
        held = host.audit.journal.backlogged
        found.append(f"{host.audit.journal.problem} ({held} rows wait in memory)")
    if low := disk.low_space(settings.DATA_DIR, settings.ROUTERPANEL["DISK_WARN_MB"]):
        found.append(low)
    return found


def _metrics(host: CallHost) -> MetricsAnswer:
    families = host.metrics.families(host.running_engine.snapshot())
    by = [("", {"transport": kind}, float(host.acquires[kind])) for kind in TRANSPORTS]
    text = "Acquires this router answered, by the way they came (socket: the router link)."
    families.append(Family("acquires_total", "counter", text, by).as_json())
    return {"metrics": families}


def _logs(engine: Engine, call: LogsCall) -> LogsAnswer:
    return {"logs": engine.logs(call["model"])}


def _lease(engine: Engine, call: LeaseCall) -> LeaseAnswer:
    """Why did the router end this lease (its child was killed as hung)? None: it did not."""
    error = engine.why_ended(call["lease_id"])
    if error is None:
        return {"error": None}
    return {"error": error.error, "retry_after": error.retry_after}
