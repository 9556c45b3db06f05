"""The channel protocol between the web side and the router worker (DESIGN §5, STYLE 13).

This is the ONLY module that knows channel and group names and message shapes. The web side
(HTTP views, SSE, WebSocket consumers) uses ``RouterClient``; the router worker (worker.py)
handles the ``router.*`` messages, one handler per type, named after it (``router_acquire``).

Every request that expects an answer carries ``reply_channel`` (a fresh channel of the caller)
and a ``request_id``. An acquire is answered at once with ``router.queued``, ``router.granted``
or ``router.rejected``; a queued one later gets ``router.granted`` or ``router.rejected``. If the
first answer does not come within ``ROUTER_TIMEOUT`` the router is not running: 503
``router unavailable``. A granted lease is renewed while the response streams and released
when it ends; if the web process dies, the lease expires in the router.

Messages (web → router, channel ``router``)::

    router.acquire  {request_id, model, reply_channel, actor, autoload}
    router.renew    {lease_id}
    router.release  {lease_id}
    router.cancel   {request_id}
    router.load     {request_id, model, reply_channel, actor}
    router.unload   {request_id, model, reply_channel, actor}
    router.cancel_queued {request_id, reply_channel, actor, model | queued_request}
    router.reload   {request_id, reply_channel, actor, sources}  (sources: re-read INI/dir)
    router.snapshot {request_id, reply_channel}
    router.settings {request_id, reply_channel, actor}

Answers (router → reply channel)::

    router.queued   {request_id, position}
    router.granted  {request_id, lease_id, model, port, lease_ttl}
    router.rejected {request_id, status, error: {code, message, type}, retry_after}
    router.accepted {request_id}                      (a call is under way; result follows)
    router.result   {request_id, ok, status, body}

Events (router → group ``router.events``)::

    router.event    {event: {seq, type, time, data}}
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from channels.layers import BaseChannelLayer, get_channel_layer

ROUTER_CHANNEL = "router"
EVENTS_GROUP = "router.events"
ROUTER_TIMEOUT = 5.0  # seconds for the router's first answer before "router unavailable"
CALL_TIMEOUT = 900.0  # seconds a call may run once accepted (a reload waits for stops)


class ErrorBody(TypedDict):
    code: int
    message: str
    type: str


class AcquireMessage(TypedDict):
    type: Literal["router.acquire"]
    request_id: str
    model: str
    reply_channel: str
    actor: str
    autoload: bool


class LeaseMessage(TypedDict):
    type: Literal["router.renew", "router.release"]
    lease_id: str


class CancelMessage(TypedDict):
    type: Literal["router.cancel"]
    request_id: str


class CallMessage(TypedDict, total=False):
    type: str  # router.load / unload / cancel_queued / reload / snapshot / settings
    request_id: str
    reply_channel: str
    model: str
    actor: str
    sources: bool  # router.reload: re-import --models-preset / --models-dir first
    what: str  # router.snapshot: "snapshot" (default), "memory", "logs" or "metrics"


class QueuedMessage(TypedDict):
    type: Literal["router.queued"]
    request_id: str
    position: int


class GrantedMessage(TypedDict):
    type: Literal["router.granted"]
    request_id: str
    lease_id: str
    model: str
    port: int
    lease_ttl: float


class RejectedMessage(TypedDict):
    type: Literal["router.rejected"]
    request_id: str
    status: int
    error: ErrorBody
    retry_after: float | None


class ResultMessage(TypedDict):
    type: Literal["router.result"]
    request_id: str
    ok: bool
    status: int
    body: dict[str, Any]


class EventMessage(TypedDict):
    type: Literal["router.event"]
    event: dict[str, Any]


def error_body(status: int, message: str, error_type: str) -> ErrorBody:
    return {"code": status, "message": message, "type": error_type}


class RouterRejected(Exception):
    """The router answered no: ``status`` and ``body`` are the HTTP answer to give."""

    def __init__(self, status: int, error: ErrorBody, retry_after: float | None = None) -> None:
        super().__init__(error["message"])
        self.status = status
        self.error = error
        self.retry_after = retry_after

    @property
    def body(self) -> dict[str, Any]:
        return {"error": dict(self.error)}


def router_unavailable() -> RouterRejected:
    return RouterRejected(503, error_body(503, "router unavailable", "unavailable_error"), 5)


@dataclass(frozen=True)
class Grant:
    request_id: str
    lease_id: str
    model: str
    port: int
    lease_ttl: float


class RouterClient:
    """Talk to the router worker over the channel layer (web side). One per process is fine."""

    def __init__(self, layer: BaseChannelLayer | None = None, timeout: float = ROUTER_TIMEOUT):
        self._layer = layer
        self.timeout = timeout

    @property
    def layer(self) -> BaseChannelLayer:
        if self._layer is None:
            self._layer = get_channel_layer()
            if self._layer is None:
                raise RuntimeError("no channel layer configured (CHANNEL_LAYERS)")
        return self._layer

    async def acquire(
        self, model: str, *, actor: str = "", autoload: bool = True, request_id: str | None = None
    ) -> Grant:
        """Wait for a lease on ``model``; raise ``RouterRejected``. Cancelling leaves the queue."""
        request_id = request_id or uuid.uuid4().hex
        reply = await self.layer.new_channel()
        message: AcquireMessage = {
            "type": "router.acquire",
            "request_id": request_id,
            "model": model,
            "reply_channel": reply,
            "actor": actor,
            "autoload": autoload,
        }
        await self.layer.send(ROUTER_CHANNEL, message)
        try:
            answer = await self._first_answer(reply)
            while answer["type"] == "router.queued":
                answer = await self.layer.receive(reply)
        except asyncio.CancelledError:
            await self._send_quietly({"type": "router.cancel", "request_id": request_id})
            raise
        return self._grant_or_raise(answer)

    async def _first_answer(self, reply: str) -> dict[str, Any]:
        try:  # not wait_for: on Python 3.11 that makes a task per call (every acquire)
            async with asyncio.timeout(self.timeout):
                return await self.layer.receive(reply)
        except TimeoutError:
            raise router_unavailable() from None

    @staticmethod
    def _grant_or_raise(answer: dict[str, Any]) -> Grant:
        if answer["type"] == "router.granted":
            return Grant(
                answer["request_id"],
                answer["lease_id"],
                answer["model"],
                int(answer["port"]),
                float(answer["lease_ttl"]),
            )
        raise RouterRejected(answer["status"], answer["error"], answer.get("retry_after"))

    async def renew(self, lease_id: str) -> None:
        await self._send_quietly({"type": "router.renew", "lease_id": lease_id})

    async def release(self, lease_id: str) -> None:
        await self._send_quietly({"type": "router.release", "lease_id": lease_id})

    async def call(self, kind: str, **payload: Any) -> dict[str, Any]:
        """Ask the router something (``load``, ``unload``, ``reload``, ``snapshot``, ``settings``).

        Returns the answer's body; raises ``RouterRejected`` when it says no and
        ``router unavailable`` when it does not answer in time.
        """
        request_id = uuid.uuid4().hex
        reply = await self.layer.new_channel()
        message: CallMessage = {
            "type": f"router.{kind}",
            "request_id": request_id,
            "reply_channel": reply,
            **payload,  # type: ignore[typeddict-item]
        }
        await self.layer.send(ROUTER_CHANNEL, message)
        answer = await self._first_answer(reply)
        if answer["type"] == "router.accepted":
            try:
                answer = await asyncio.wait_for(self.layer.receive(reply), CALL_TIMEOUT)
            except TimeoutError:
                raise router_unavailable() from None
        body: dict[str, Any] = answer["body"]
        if not answer["ok"]:
            raise RouterRejected(answer["status"], body["error"], body.get("retry_after"))
        return body

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Yield router events (``{seq, type, time, data}``) until the caller stops iterating."""
        channel = await self.layer.new_channel()
        await self.layer.group_add(EVENTS_GROUP, channel)
        try:
            while True:
                message = await self.layer.receive(channel)
                yield message["event"]
        finally:
            await self.layer.group_discard(EVENTS_GROUP, channel)

    async def _send_quietly(self, message: dict[str, Any]) -> None:
        try:
            await self.layer.send(ROUTER_CHANNEL, message)
        except Exception:  # a full or unreachable layer must not turn a release into a 500
            import logging

            logging.getLogger(__name__).warning("could not send %s", message["type"], exc_info=True)


# Router side helpers: building answers (used by worker.py only).


def queued(request_id: str, position: int) -> QueuedMessage:
    return {"type": "router.queued", "request_id": request_id, "position": position}


def granted(request_id: str, lease_id: str, model: str, port: int, ttl: float) -> GrantedMessage:
    return {
        "type": "router.granted",
        "request_id": request_id,
        "lease_id": lease_id,
        "model": model,
        "port": port,
        "lease_ttl": ttl,
    }


def rejected(
    request_id: str, status: int, error: ErrorBody, retry_after: float | None = None
) -> RejectedMessage:
    return {
        "type": "router.rejected",
        "request_id": request_id,
        "status": status,
        "error": error,
        "retry_after": retry_after,
    }


def accepted(request_id: str) -> dict[str, str]:
    return {"type": "router.accepted", "request_id": request_id}


def result(request_id: str, body: dict[str, Any], status: int = 200) -> ResultMessage:
    return {
        "type": "router.result",
        "request_id": request_id,
        "ok": status < 400,
        "status": status,
        "body": body,
    }


def event(payload: dict[str, Any]) -> EventMessage:
    return {"type": "router.event", "event": payload}
