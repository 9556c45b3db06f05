"""The router's listener on the channel layer: channel ``router`` (or a node's ``router.NODE``).

``RouterConsumer`` only forwards each message to the desk of the host running in this process
(desk.py), which answers it; with no host (stopping, not started) a message that wants an answer
is refused 503 at once. ``run_worker`` consumes the channel until cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from channels.consumer import AsyncConsumer
from channels.layers import BaseChannelLayer

from models_app.routing import topology, wire
from models_app.routing.messages import RejectedMessage, ResultMessage
from routerpanel.router.errors import RouterError, unavailable

if TYPE_CHECKING:
    from models_app.routing.desk import Desk


class RouterHost(Protocol):
    """What the listener needs of the router host (host.py): its desk."""

    desk: Desk


log = logging.getLogger(__name__)

_host: RouterHost | None = None


def attach(host: RouterHost) -> None:
    """``host`` answers the channel's messages from now on."""
    global _host
    _host = host


def detach(host: RouterHost) -> bool:
    """``host`` stops answering (it is stopping); whether it was the one attached."""
    global _host
    if _host is not host:
        return False
    _host = None
    return True


def current_host() -> RouterHost | None:
    return _host


class RouterConsumer(AsyncConsumer):  # type: ignore[misc]  # Channels has no types
    """The consumer of channel ``router``: forwards each message to the running host."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        host = current_host()
        if host is not None and host.desk.stale(message):
            host.desk.drop_expired(message)  # its sender has answered its client: never run it
            return
        handler = host.desk.handler(message["type"]) if host else None
        if handler is None:
            await self._refuse(message, host)
            return
        try:
            handler(message)
        except RouterError as exc:
            log.info("router refused %s: %s", message["type"], exc.message)
        except Exception:
            log.exception("router message %s failed", message["type"])

    async def _refuse(self, message: Mapping[str, Any], host: RouterHost | None) -> None:
        reply = message.get("reply_channel")
        if not reply:
            return
        text = "router unavailable" if host is None else f"unknown message {message['type']}"
        error = unavailable(text, wire.RETRY_AFTER)
        out: RejectedMessage | ResultMessage
        if message["type"] == "router.acquire":
            out = wire.rejected(message["request_id"], error)
        else:
            out = wire.failed(message.get("request_id", ""), error)
        await self.channel_layer.send(reply, out)


async def run_worker(layer: BaseChannelLayer, channel: str = topology.UNNAMED_CHANNEL) -> None:
    """Consume ``channel`` (``router``, or a node's ``router.NODE``) until cancelled (DESIGN §2).

    A channel-layer error (Redis restarted, a dropped connection) must not end the router and
    orphan the queue: the listener is started again after a short pause, and the engine with
    its children keeps running meanwhile.
    """
    from channels.routing import ChannelNameRouter
    from channels.worker import Worker

    app = ChannelNameRouter({channel: RouterConsumer.as_asgi()})
    while True:
        try:
            await Worker(app, [channel], layer).arun()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the router's channel listener failed; starting it again in 1 s")
            await asyncio.sleep(1)
