"""A scripted stand-in for the router worker: answers the router protocol on a channel layer.

The real worker hosts the engine; these tests are about the HTTP side, so ``FakeRouter`` only
plays the protocol of ``models_app.routing`` (the messages of ``routing.messages``): it
grants, queues then grants, rejects or stays silent per model, answers the calls (snapshot, load,
unload, reload, …) from a small table, records every message it receives (so a test can wait for
``router.cancel`` or ``router.release``), and emits events to the events group.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from channels.layers import BaseChannelLayer

from models_app.routing import topology, wire
from routerpanel.router.errors import Lease, RouterError, error_body
from routerpanel.router.receipts import NO_RECEIPT, Receipt
from tests.support.waits import settled

LEASE_TTL = 30.0


@dataclass
class Grant:
    """Answer at once with a lease on ``port`` (rule A1), with ``receipt`` (issue 17.3); a
    protected child's ``key`` goes along (issue 18)."""

    port: int
    receipt: Receipt = NO_RECEIPT
    key: str | None = None


@dataclass
class QueueThenGrant:
    """Answer ``router.queued``, then grant once ``release`` is set (A2)."""

    port: int
    release: asyncio.Event = field(default_factory=asyncio.Event)
    position: int = 1


@dataclass
class Reject:
    status: int
    message: str
    error_type: str = "server_error"
    retry_after: float | None = None


@dataclass
class Silent:
    """Never answer (the router is down or wedged)."""


Behaviour = Grant | QueueThenGrant | Reject | Silent


@dataclass
class FakeModel:
    name: str
    status: str = "unloaded"  # llama.cpp's value
    state: str | None = None  # engine state; defaults to status
    aliases: list[str] = field(default_factory=list)
    port: int | None = None
    args: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    exit_code: int | None = None
    pid: int | None = None
    memory: int | None = None
    pinned: bool = False
    queue_position: int | None = None
    queue_waiters: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "state": self.state or self.status,
            "status": self.status,
            "failed": self.failed,
            "stopping": False,
            "pid": self.pid,
            "port": self.port,
            "in_flight": 0,
            "last_used": None,
            "loaded_at": None,
            "queue_position": self.queue_position,
            "queue_waiters": self.queue_waiters,
            "memory": self.memory,
            "pinned": self.pinned,
            "stop_timeout": 10,
            "exit_code": self.exit_code,
            "last_exit": None,
            "args": list(self.args),
            "info": dict(self.info),
            "progress": None,
        }


class FakeRouter:
    """Serve ``topology.UNNAMED_CHANNEL`` on ``layer`` until ``stop()``."""

    def __init__(self, layer: BaseChannelLayer) -> None:
        self.layer = layer
        self.models: dict[str, FakeModel] = {}
        self.behaviour: dict[str, Behaviour] = {}
        self.models_max = 4
        self.received: list[dict[str, Any]] = []
        self.leases: dict[str, str] = {}  # lease id -> model
        self.ended: dict[str, Any] = {}  # lease id -> the error the router ended it with
        self.queued: dict[str, list[str]] = {}  # model or request id -> cancelled ids
        self.lease_ttl = LEASE_TTL
        self.reload_result: dict[str, Any] | Reject = {
            "added": [],
            "removed": [],
            "changed": [],
            "restarted": [],
        }
        self.on_reload: Callable[[], None] | None = None
        self.on_message: Callable[[dict[str, Any]], None] | None = None
        self._arrived = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)

    # ---- scripting --------------------------------------------------------------------------

    def add(self, name: str, behaviour: Behaviour | None = None, **fields: Any) -> FakeModel:
        model = self.models[name] = FakeModel(name, **fields)
        if behaviour is not None:
            self.behaviour[name] = behaviour
        return model

    def resolve(self, name: str) -> FakeModel | None:
        if name in self.models:
            return self.models[name]
        return next((m for m in self.models.values() if name in m.aliases), None)

    async def emit(self, kind: str, data: dict[str, Any]) -> None:
        payload = {"seq": next(self._seq), "type": kind, "time": 0.0, "data": data}
        await self.layer.group_send(topology.EVENTS_GROUP, wire.event(payload))

    async def wait_for(
        self, kind: str, where: Callable[[dict[str, Any]], bool] = lambda m: True, timeout=20.0
    ) -> dict[str, Any]:
        """Return the first received message of type ``kind`` matching ``where``."""

        def found() -> dict[str, Any] | None:
            return next((m for m in self.received if m["type"] == kind and where(m)), None)

        async with asyncio.timeout(timeout), self._arrived:
            await self._arrived.wait_for(lambda: found() is not None)
        message = found()
        assert message is not None
        return message

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m["type"] == kind]

    # ---- running ----------------------------------------------------------------------------

    async def start(self) -> FakeRouter:
        self._task = asyncio.ensure_future(self._run())
        await asyncio.sleep(0)
        return self

    async def stop(self) -> None:
        for task in (self._task, *self._pending):
            if task is not None:
                task.cancel()
        for task in (self._task, *self._pending):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await settled(task)

    async def _run(self) -> None:
        while True:
            message = await self.layer.receive(topology.UNNAMED_CHANNEL)
            async with self._arrived:
                self.received.append(message)
                self._arrived.notify_all()
            if self.on_message is not None:
                self.on_message(message)
            handler = getattr(self, message["type"].replace(".", "_"))
            task = asyncio.ensure_future(handler(message))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _reply(self, message: dict[str, Any], answer: Any) -> None:
        await self.layer.send(message["reply_channel"], dict(answer))

    # ---- handlers, one per message type -------------------------------------------------------

    async def router_acquire(self, message: dict[str, Any]) -> None:
        request_id = message["request_id"]
        model = self.resolve(message["model"])
        behaviour = self.behaviour.get(model.name) if model else None
        if model is None:
            behaviour = Reject(
                400, f"model '{message['model']}' not found", "invalid_request_error"
            )
        elif not message["autoload"] and model.status not in ("loaded", "sleeping"):
            behaviour = Reject(400, "model is not loaded", "invalid_request_error")
        if isinstance(behaviour, Silent):
            return
        if isinstance(behaviour, Reject):
            error = RouterError(
                behaviour.status, behaviour.error_type, behaviour.message, behaviour.retry_after
            )
            answer = wire.rejected(request_id, error)
            await self._reply(message, answer)
            return
        assert model is not None
        port = model.port or 1
        receipt, key = NO_RECEIPT, None
        if isinstance(behaviour, QueueThenGrant):
            await self._reply(message, wire.queued(request_id, behaviour.position))
            await behaviour.release.wait()
            port = behaviour.port
        elif isinstance(behaviour, Grant):
            port, receipt, key = behaviour.port, behaviour.receipt, behaviour.key
        lease_id = f"lease-{next(self._ids)}"
        self.leases[lease_id] = model.name
        lease = Lease(lease_id, request_id, model.name, port, 0.0, receipt=receipt, key=key)
        granted = wire.granted(request_id, lease, self.lease_ttl)
        await self._reply(message, granted)

    async def router_renew(self, message: dict[str, Any]) -> None:
        pass

    async def router_waiting(self, message: dict[str, Any]) -> None:
        pass

    async def router_release(self, message: dict[str, Any]) -> None:
        self.leases.pop(message["lease_id"], None)

    async def router_cancel(self, message: dict[str, Any]) -> None:
        pass

    async def router_snapshot(self, message: dict[str, Any]) -> None:
        body = {
            "seq": 0,
            "models": [m.snapshot() for m in self.models.values()],
            "queue": [],
            "memory": None,
            "config": {"models_max": self.models_max, "autoload": True, "lease_ttl": LEASE_TTL},
        }
        await self._reply(message, wire.result(message["request_id"], body))

    async def router_ready(self, message: dict[str, Any]) -> None:
        running = sum(1 for m in self.models.values() if m.status in ("loading", "loaded"))
        body = {"models": len(self.models), "running": running, "queued": 0, "boot": ""}
        await self._reply(message, wire.result(message["request_id"], body))

    async def router_memory(self, message: dict[str, Any]) -> None:
        await self._reply(message, wire.result(message["request_id"], {"memory": []}))

    async def router_metrics(self, message: dict[str, Any]) -> None:
        await self._reply(message, wire.result(message["request_id"], {"metrics": []}))

    async def router_logs(self, message: dict[str, Any]) -> None:
        await self._reply(message, wire.result(message["request_id"], {"logs": []}))

    async def router_load(self, message: dict[str, Any]) -> None:
        model = self.resolve(message["model"])
        if model is None:
            await self._error(message, 404, "model is not found", "not_found_error")
        elif model.status in ("loading", "loaded", "sleeping"):
            await self._error(message, 400, "model is already running", "invalid_request_error")
        else:
            model.status = "loading"
            await self._reply(message, wire.result(message["request_id"], {"success": True}))

    async def router_unload(self, message: dict[str, Any]) -> None:
        model = self.resolve(message["model"])
        if model is None:
            await self._error(message, 400, "model is not found", "invalid_request_error")
        elif model.status not in ("loading", "loaded", "sleeping"):
            await self._error(message, 400, "model is not running", "invalid_request_error")
        else:
            await self._reply(message, wire.result(message["request_id"], {"success": True}))

    async def router_cancel_queued(self, message: dict[str, Any]) -> None:
        target = message.get("model") or message.get("queued_request")
        if target not in self.queued:
            await self._error(message, 404, f"no queued request for {target}", "not_found_error")
        else:
            body = {"success": True, "cancelled": self.queued.pop(target)}
            await self._reply(message, wire.result(message["request_id"], body))

    async def router_reload(self, message: dict[str, Any]) -> None:
        if self.on_reload is not None:
            self.on_reload()
        outcome = self.reload_result
        if isinstance(outcome, Reject):
            await self._error(message, outcome.status, outcome.message, outcome.error_type)
        else:
            await self._reply(message, wire.result(message["request_id"], outcome))

    async def router_lease(self, message: dict[str, Any]) -> None:
        error = self.ended.get(message.get("lease_id", ""))
        body = {"error": None} if error is None else {"error": error, "retry_after": 1}
        await self._reply(message, wire.result(message["request_id"], body))

    async def router_reservations(self, message: dict[str, Any]) -> None:
        known = sorted(m for m in message["reservations"] if self.resolve(m) is not None)
        unknown = sorted(m for m in message["reservations"] if self.resolve(m) is None)
        body = {"reserved": known, "loading": [], "unknown": unknown}
        await self._reply(message, wire.result(message["request_id"], body))

    async def router_settings(self, message: dict[str, Any]) -> None:
        await self._reply(message, wire.result(message["request_id"], {}))

    async def _error(self, message: dict[str, Any], status: int, text: str, kind: str) -> None:
        body = {"error": error_body(status, text, kind)}
        await self._reply(message, wire.result(message["request_id"], body, status))


MIB = 1 << 20


def ring(start: float, seconds: int, *, used: int, rss: int) -> list[dict[str, Any]]:
    """A memory ring like memory_history(): one sample a second; used and rss grow by 1 MiB."""
    samples = []
    for n in range(seconds):
        system = {
            "total": 64 << 30,
            "available": (64 << 30) - used - n * MIB,
            "used": used + n * MIB,
            "swap_total": 0,
            "swap_used": 5 * MIB,
            "wired": None,
        }
        children = {"m": {"pid": 10, "rss": rss + n * MIB}} if n % 2 == 0 else {}
        samples.append({"time": start + n, "system": system, "children": children})
    return samples


class MemoryRouter(FakeRouter):
    """The fake router, answering ``router.memory`` with its ring like the real one."""

    history: list[dict[str, Any]] = []

    async def router_memory(self, message: dict[str, Any]) -> None:
        body = {"memory": self.history}
        await self._reply(message, wire.result(message["request_id"], body))
