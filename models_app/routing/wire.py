"""The router protocol's one grant type and the messages both ends build (docs/architecture.md).

A ``Grant`` is the web side's handle on a lease: the engine's ``Lease`` (the one lease type, on
both sides of the wire), how long it lives unrenewed (``inf`` in process), the router boot that
granted it, and the lease's *owner*, the transport that renews and releases it. Refusals are
``RouterError`` (routerpanel.router.errors) everywhere: ``to_wire`` makes a ``router.rejected``,
``from_wire`` reads one back.

The builders below are the answers' one spelling (the router host and the link server send them;
the transports read them): ``lease_from`` is the inverse of ``granted``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from models_app.routing.messages import (
    AcceptedMessage,
    Addressed,
    EventMessage,
    EventPayload,
    EventsMessage,
    GrantedMessage,
    QueuedMessage,
    RejectedMessage,
    ResultMessage,
    Stamped,
)
from routerpanel.router.address import LOOPBACK, ChildAddress
from routerpanel.router.errors import Lease, RouterError
from routerpanel.router.receipts import NO_RECEIPT, Receipt

EXPIRY_MARGIN = 1.0  # a message expires this long before its sender stops waiting
QUIET_EXPIRY = 60.0  # renew / release / cancel: no answer awaited; stale after this
RETRY_AFTER = 5  # seconds a client is told to wait when the router is out of reach


class LeaseOwner(Protocol):
    """What keeps a granted lease: the transport (or router connection) that granted it."""

    async def renew(self, grant: Grant, idle: float | None) -> None: ...
    async def release(self, grant: Grant) -> None: ...
    def progress_of(self, grant: Grant) -> Callable[[], None] | None: ...
    async def why_ended(self, grant: Grant) -> RouterError | None: ...


@dataclass(frozen=True)
class Grant:
    """A granted request: send it to ``address``; ``release()`` when the answer ends."""

    lease: Lease
    lease_ttl: float  # inf: granted in this process, nothing to renew
    boot: str = ""
    owner: LeaseOwner | None = field(default=None, compare=False, repr=False)

    @property
    def request_id(self) -> str:
        return self.lease.request_id

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id

    @property
    def model(self) -> str:
        return self.lease.model

    @property
    def port(self) -> int:
        return self.lease.port

    @property
    def receipt(self) -> Receipt:
        return self.lease.receipt

    @property
    def address(self) -> ChildAddress:
        return self.lease.address

    @property
    def local(self) -> bool:
        return math.isinf(self.lease_ttl)

    def _owner(self) -> LeaseOwner:
        if self.owner is None:
            raise RuntimeError(f"lease {self.lease_id} has no owner to keep it")
        return self.owner

    async def renew(self, idle: float | None = None) -> None:
        """Keep a remote lease alive; ``idle``: seconds since the last byte went out."""
        await self._owner().renew(self, idle)

    async def release(self) -> None:
        await self._owner().release(self)

    def progress(self) -> Callable[[], None] | None:
        """What to call per byte of the answer when the engine runs in this process (its hang
        watchdog), bound once per request; None when renewals carry the progress."""
        return None if self.owner is None else self.owner.progress_of(self)

    async def why_ended(self) -> RouterError | None:
        """Why the router ended this lease (its child was killed as hung), or None."""
        return None if self.owner is None else await self.owner.why_ended(self)


# ---- the envelope ---------------------------------------------------------------------------


def addressed(request_id: str, reply: str, boot: str | None, wait: float) -> Addressed:
    """A message's return address and deadline fields: when it was sent, when its sender stops
    waiting, and the router boot the sender believes alive (the router drops it when any says
    "stale")."""
    sent = time.time()
    return {
        "request_id": request_id,
        "reply_channel": reply,
        "sent": sent,
        "expires": sent + wait - EXPIRY_MARGIN,
        "boot": boot,
    }


def quiet() -> Stamped:
    """The deadline fields of a message that gives something back: none waits for an answer."""
    sent = time.time()
    return {"sent": sent, "expires": sent + QUIET_EXPIRY}


def expired(message: Mapping[str, Any], now: float | None = None) -> bool:
    """Whether a message's sender has stopped waiting for it (its ``expires`` has passed)."""
    expires = message.get("expires")
    return isinstance(expires, int | float) and expires < (now or time.time())


# ---- answers ----------------------------------------------------------------------------------


def queued(request_id: str, position: int, boot: str = "") -> QueuedMessage:
    return {"type": "router.queued", "request_id": request_id, "position": position, "boot": boot}


def granted(request_id: str, lease: Lease, ttl: float, boot: str = "") -> GrantedMessage:
    """A lease's answer, with its receipt; the child's key goes along only when it has one."""
    receipt = lease.receipt
    message: GrantedMessage = {
        "type": "router.granted",
        "request_id": request_id,
        "lease_id": lease.lease_id,
        "model": lease.model,
        "port": lease.port,
        "lease_ttl": ttl,
        "boot": boot,
        "queue_ms": receipt.queued * 1000,
        "load_ms": receipt.load * 1000,
        "evicted": list(receipt.evicted),
        "caused_load": receipt.caused_load,
        "host": lease.host,
    }
    if lease.key is not None:
        message["key"] = lease.key
    return message


def lease_from(answer: GrantedMessage) -> Lease:
    """The lease a ``router.granted`` carries (the inverse of ``granted``)."""
    return Lease(
        answer["lease_id"],
        answer["request_id"],
        answer["model"],
        int(answer["port"]),
        math.inf,  # the router's clock, not ours: renewals keep it
        receipt=receipt_from(answer),
        host=str(answer.get("host") or LOOPBACK),
        key=answer.get("key") or None,
    )


def receipt_from(answer: GrantedMessage) -> Receipt:
    """The receipt a granted message carries (none from a router that sends none)."""
    try:
        return Receipt(
            float(answer.get("queue_ms", 0.0)) / 1000,
            float(answer.get("load_ms", 0.0)) / 1000,
            tuple(str(m) for m in answer.get("evicted", ())),
            bool(answer.get("caused_load", False)),
        )
    except (TypeError, ValueError):
        return NO_RECEIPT


def rejected(request_id: str, error: RouterError, boot: str = "") -> RejectedMessage:
    status, body, retry_after = error.to_wire()
    return {
        "type": "router.rejected",
        "request_id": request_id,
        "status": status,
        "error": body,
        "retry_after": retry_after,
        "boot": boot,
    }


def refusal(answer: RejectedMessage) -> RouterError:
    """The error a ``router.rejected`` carries (the inverse of ``rejected``)."""
    return RouterError.from_wire(answer["status"], answer["error"], answer.get("retry_after"))


def accepted(request_id: str, boot: str = "") -> AcceptedMessage:
    return {"type": "router.accepted", "request_id": request_id, "boot": boot}


def result(
    request_id: str, body: Mapping[str, Any], status: int = 200, boot: str = ""
) -> ResultMessage:
    return {
        "type": "router.result",
        "request_id": request_id,
        "ok": status < 400,
        "status": status,
        "body": body,
        "boot": boot,
    }


def failed(request_id: str, error: RouterError, boot: str = "") -> ResultMessage:
    """A call's refusal: its error in the body, with the Retry-After it suggests."""
    body: dict[str, Any] = error.body()
    if error.retry_after is not None:
        body["retry_after"] = error.retry_after
    return result(request_id, body, error.status, boot)


def event(payload: EventPayload) -> EventMessage:
    return {"type": "router.event", "event": payload}


def events_message(payloads: list[EventPayload]) -> EventMessage | EventsMessage:
    """One group message for ``payloads`` (in order): ``router.event`` for one."""
    if len(payloads) == 1:
        return event(payloads[0])
    return {"type": "router.events", "events": payloads}


def unpack_events(message: Mapping[str, Any]) -> list[EventPayload]:
    """The events a group message carries, in order ([] for any other message)."""
    kind = message.get("type")
    if kind == "router.event":
        return [message["event"]]
    if kind == "router.events":
        return list(message["events"])
    return []
