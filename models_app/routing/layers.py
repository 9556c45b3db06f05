"""The channel layers: Redis made to outlive Redis (team mode), and what a closed socket leaves.

channels_redis raises out of ``receive()`` when Redis goes away, and every consumer waiting in
it dies with it: each dashboard socket closes with 1011, and a Redis restart also forgets every
group membership, so sockets that survive hear nothing afterwards. ``ResilientRedisLayer``
waits instead (with back-off), then joins the channel's groups again, and hands the receiver one
``{"type": "layer.reconnected"}`` message: messages may have been lost while Redis was away, so
a dashboard takes a fresh snapshot. Its connection pools block when full, for a while,
instead of failing at once: redis-py's default pool refuses its 101st concurrent command with
"Too many connections", which a burst of requests reaches in milliseconds (each one sends and
receives through the layer). A send that meets a connection Redis dropped when it
restarted is tried once more on a fresh one; if Redis is really away it raises, and its caller
answers 503 (routing/layer.py).

**A closed socket leaves nothing behind** (issue 45.6). A consumer reads its channel one message
at a time; when its socket closes, what was still waiting for it stays in the layer. Channels'
in-memory layer keeps such a queue until one of its messages is older than the layer's expiry
*and* something sends to a group (up to 100 copies of events per closed tab, for a minute or for
ever on an idle router: 200 tabs closed during swaps left 7,800 messages), and a group send
that read the group just before a member left still makes it a new queue. channels_redis puts
a message that arrives for a channel no longer received into a buffer nobody empties. A consumer
calls ``forget(layer, channel)`` when it ends: the in-memory layer (``InMemoryLayer``) drops the
channel's queue and memberships, and delivers a group message only to the channels in the
group at that moment; the Redis layer drops the channel's buffer and, for ``FORGET_FOR``
seconds, whatever still arrives for it. ``held`` and ``group_size`` report what is kept, for
``GET /metrics`` (dashboard_sockets.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)

RECONNECTED = {"type": "layer.reconnected"}
POOL_SIZE = 200  # connections per Redis host and process
POOL_WAIT = 20.0  # seconds a command may wait for a free connection before it fails
FIRST_RETRY = 0.1
MAX_RETRY = 2.0
FORGET_FOR = 120.0  # seconds a forgotten channel's late messages are dropped (Redis layer)


def outage(exc: BaseException) -> bool:
    """Whether ``exc`` means "Redis is unreachable" (as opposed to a bug or a cancel)."""
    import redis.exceptions

    return isinstance(exc, OSError | TimeoutError | redis.exceptions.RedisError)


class ResilientRedisLayer(RedisChannelLayer):  # type: ignore[misc]
    """channels_redis's core layer whose ``receive`` survives Redis outages (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._memberships: defaultdict[str, set[str]] = defaultdict(set)
        self.outages = 0
        self._forgotten: dict[str, float] = {}  # channel -> when forgotten (monotonic)

    def create_pool(self, index: int) -> Any:
        """A blocking pool: a burst waits for a free connection instead of failing at once."""
        import redis.asyncio as aioredis

        host = dict(self.hosts[index])
        if "address" not in host:
            return super().create_pool(index)  # sentinels: channels_redis's own pool
        address = host.pop("address")
        host.setdefault("max_connections", POOL_SIZE)
        host.setdefault("timeout", POOL_WAIT)
        return aioredis.BlockingConnectionPool.from_url(address, **host)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        try:
            await super().send(channel, message)
        except Exception as exc:
            if not outage(exc):
                raise
            await super().send(channel, message)  # a pooled connection from before a restart

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        try:
            await super().group_send(group, message)
        except Exception as exc:
            if not outage(exc):
                raise
            await super().group_send(group, message)

    async def group_add(self, group: str, channel: str) -> None:
        self._memberships[channel].add(group)
        await super().group_add(group, channel)

    async def group_discard(self, group: str, channel: str) -> None:
        self._memberships[channel].discard(group)
        if not self._memberships[channel]:
            del self._memberships[channel]
        await super().group_discard(group, channel)

    async def receive(self, channel: str) -> dict[str, Any]:
        try:
            message: dict[str, Any] = await super().receive(channel)
            return message
        except Exception as exc:
            if not outage(exc):
                raise
            self.outages += 1
            log.warning("channel layer: Redis unreachable (%s); waiting for it", exc)
        await self._wait_for_redis(channel)
        await self._rejoin(channel)
        if "!" in channel:  # a consumer's own channel: tell it that messages may be lost
            return dict(RECONNECTED)
        return await self.receive(channel)

    async def _wait_for_redis(self, channel: str) -> None:
        delay = FIRST_RETRY
        index = self.consistent_hash(channel)
        while True:
            await asyncio.sleep(delay)
            try:
                await self.connection(index).ping()
                log.warning("channel layer: Redis is back")
                return
            except Exception as exc:
                if not outage(exc):
                    raise
            delay = min(delay * 2, MAX_RETRY)

    async def _rejoin(self, channel: str) -> None:
        """Join this channel's groups again: a restarted Redis has forgotten them."""
        for group in list(self._memberships.get(channel, ())):
            try:
                await super().group_add(group, channel)
            except Exception as exc:
                log.warning("channel layer: could not rejoin %s: %s", group, exc)

    def forget(self, channel: str) -> None:
        """``channel``'s consumer has ended: drop what waits for it, and what comes later."""
        now = time.monotonic()
        for name, since in list(self._forgotten.items()):
            if now - since > FORGET_FOR:
                del self._forgotten[name]
        self._forgotten[channel] = now
        self._memberships.pop(channel, None)
        self.receive_buffer.pop(channel, None)

    async def receive_single(self, channel: str) -> tuple[Any, dict[str, Any]]:
        """The next message for a channel still received; those for forgotten ones are dropped
        here, before channels_redis buffers them for a reader that will never come."""
        while True:
            target, message = await super().receive_single(channel)
            if isinstance(target, list):
                target = [name for name in target if name not in self._forgotten]
                if target:
                    return target, message
            elif target not in self._forgotten:
                return target, message


class InMemoryLayer(InMemoryChannelLayer):  # type: ignore[misc]
    """Channels' in-memory layer (embedded mode) that forgets a closed consumer's channel."""

    def forget(self, channel: str) -> None:
        self.channels.pop(channel, None)
        self._remove_from_groups(channel)
        for group in [name for name, members in self.groups.items() if not members]:
            del self.groups[group]

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        """Deliver to the group's members of this moment, at once: Channels' own makes a task
        per member, which runs after a member may have left and gives it a new queue."""
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, ())):
            with contextlib.suppress(ChannelFull):  # a slow reader misses it, then resyncs
                await self.send(channel, message)


def forget(layer: Any, channel: str) -> None:
    """Drop what ``layer`` keeps for ``channel``, whose consumer has ended (module doc)."""
    if hasattr(layer, "forget"):
        layer.forget(channel)


@dataclass(frozen=True)
class Held:
    channels: int  # this process's channels with messages waiting
    messages: int


def held(layer: Any) -> Held:
    """What ``layer`` keeps in this process for channels that have not read it yet."""
    queues = getattr(layer, "channels", None)
    if queues is None:
        queues = getattr(layer, "receive_buffer", {})
    queues = dict(queues)
    return Held(len(queues), sum(queue.qsize() for queue in queues.values()))


async def group_size(layer: Any, group: str) -> int:
    """How many channels ``group`` has (every process's, on Redis); -1 when it cannot be read."""
    groups = getattr(layer, "groups", None)
    if isinstance(groups, dict):
        return len(groups.get(group, ()))
    try:
        key = layer._group_key(group)
        size: int = await layer.connection(layer.consistent_hash(group)).zcard(key)
        return size
    except Exception:
        return -1
