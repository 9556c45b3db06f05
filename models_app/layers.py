"""The Redis channel layer, made to outlive Redis (team mode).

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
answers 503 (the bridge).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)

RECONNECTED = {"type": "layer.reconnected"}
POOL_SIZE = 200  # connections per Redis host and process
POOL_WAIT = 20.0  # seconds a command may wait for a free connection before it fails
FIRST_RETRY = 0.1
MAX_RETRY = 2.0


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
