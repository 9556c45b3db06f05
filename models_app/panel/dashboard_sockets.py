"""Dashboard sockets: at most so many per user, and what this process's sockets hold.

**The cap.** Each user may have ``ROUTERPANEL_MAX_SOCKETS_PER_USER`` dashboard sockets open
(every panel tab holds one; 0: no cap). One more is accepted and closed at once with
``CLOSE_TOO_MANY`` and a reason the page shows instead of reconnecting ("too many dashboard tabs
open for alice (8): close one"). The sockets already open keep working: the newest is refused.

**Where the count lives.** Embedded mode (no ``REDIS_URL``) is one process: ``serve``'s event
loop owns every socket of the installation, so a count in this process is exact. In team mode
any number of ``serve --no-router`` processes may hold one user's tabs (docs/team-deployment.md),
so the count is kept in Redis: one sorted set per user whose members are the sockets' channel
names, each scored with a deadline the socket pushes forward every ``RENEW`` seconds. A socket
of a process that died without closing it stops counting ``LEASE`` seconds after its last
renewal, so a crash never leaks places. Admission is one Lua script on Redis's clock (drop the
expired, count, add), so two tabs opening at once on two processes cannot both take the last
place. Redis away: the socket is let in (the cap guards the server's memory; the page without
Redis shows the outage anyway) and the warning is logged.

**What a socket holds**, for ``GET /metrics`` (``families``): the open sockets of this process
and their tasks, and what the channel layer keeps for this process — channels with messages
waiting, those messages, the members of the events group. After every tab closes all of them
come back to where they were, which the leak test checks.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

CLOSE_TOO_MANY = 4429  # 4000-4999: the application's own close codes (RFC 6455 §7.4.2)
LEASE = 60.0  # seconds a socket counts in Redis after its last renewal
RENEW = 20.0  # seconds between two renewals
REASON_BYTES = 123  # a close frame's reason is at most 123 bytes of UTF-8 (RFC 6455 §5.5)

# KEYS[1]: the user's set; ARGV: channel, cap, lease in ms. Returns 1 (admitted) or 0.
ADMIT = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
local cap = tonumber(ARGV[2])
if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""


def cap() -> int:
    value: int = settings.ROUTERPANEL["MAX_SOCKETS_PER_USER"]
    return value


def too_many(username: str, limit: int) -> str:
    """The close reason, cut to fit a close frame whatever the user's name."""
    name = username
    while True:
        reason = f"too many dashboard tabs open for {name} ({limit}): close one"
        if len(reason.encode()) <= REASON_BYTES:
            return reason
        name = name[:-2] + "…"


@dataclass
class Open:
    """The sockets this process holds: user id -> channel names, and each socket's tasks."""

    by_user: dict[Any, set[str]] = field(default_factory=dict)
    tasks: dict[str, set[asyncio.Task[Any]]] = field(default_factory=dict)
    refused: int = 0

    def add(self, user: Any, channel: str, tasks: set[asyncio.Task[Any]]) -> None:
        self.by_user.setdefault(user, set()).add(channel)
        self.tasks[channel] = tasks

    def remove(self, user: Any, channel: str) -> bool:
        mine = self.by_user.get(user)
        if mine is None or channel not in mine:
            return False
        mine.discard(channel)
        if not mine:
            del self.by_user[user]
        self.tasks.pop(channel, None)
        return True

    def count(self, user: Any) -> int:
        return len(self.by_user.get(user, ()))


OPEN = Open()


def _redis_layer(layer: Any) -> bool:
    return hasattr(layer, "connection") and bool(getattr(settings, "REDIS_URL", None))


def _key(user: Any) -> str:
    return f"{settings.ROUTERPANEL_REDIS_PREFIX}:dashboard:sockets:{user}"


async def admit(layer: Any, user: Any, channel: str) -> bool:
    """Take a place for ``channel`` among ``user``'s sockets; False when they are all taken."""
    limit = cap()
    if _redis_layer(layer):
        try:
            redis = layer.connection(layer.consistent_hash(_key(user)))
            taken = await redis.eval(ADMIT, 1, _key(user), channel, limit, int(LEASE * 1000))
        except Exception as exc:
            log.warning("dashboard: could not count %s's sockets in Redis (%s); let in", user, exc)
            return True
        return bool(taken)
    return limit <= 0 or OPEN.count(user) < limit


async def renew(layer: Any, user: Any, channel: str) -> None:
    """Keep ``channel`` counted in Redis while it is open (team mode; nothing to do otherwise)."""
    if not _redis_layer(layer):
        return
    while True:
        await asyncio.sleep(RENEW)
        try:
            redis = layer.connection(layer.consistent_hash(_key(user)))
            await redis.eval(ADMIT, 1, _key(user), channel, 0, int(LEASE * 1000))
        except Exception as exc:  # Redis away: the place lapses at worst; the next try renews
            log.warning("dashboard: could not renew a socket's place in Redis: %s", exc)


async def release(layer: Any, user: Any, channel: str) -> None:
    if _redis_layer(layer):
        try:
            redis = layer.connection(layer.consistent_hash(_key(user)))
            await redis.zrem(_key(user), channel)
        except Exception as exc:  # it lapses after LEASE seconds
            log.warning("dashboard: could not give back a socket's place in Redis: %s", exc)


async def families(layer: Any) -> list[dict[str, Any]]:
    """Gauges of what this process's dashboard sockets hold (``metrics.render``'s input)."""
    from models_app.routing import layers, topology

    held = layers.held(layer)
    members = await layers.group_size(layer, topology.EVENTS_GROUP)
    gauges = [
        ("dashboard_sockets", "Dashboard sockets open in this web process.",
         sum(len(c) for c in OPEN.by_user.values())),
        ("dashboard_socket_tasks", "Tasks the open dashboard sockets of this process run.",
         sum(len(t) for t in OPEN.tasks.values())),
        ("channel_layer_channels", "Channels of this process the channel layer keeps a queue "
         "for (each open socket's, the router's).", held.channels),
        ("channel_layer_messages", "Messages waiting in the channel layer for this process's "
         "channels.", held.messages),
        ("channel_layer_events_group", "Channels in the router's events group.", members),
    ]  # fmt: skip
    out: list[dict[str, Any]] = [
        {"name": name, "type": "gauge", "help": text, "samples": [("", {}, float(value))]}
        for name, text, value in gauges
    ]
    refused: list[tuple[str, dict[str, str], float]] = [("", {}, float(OPEN.refused))]
    out.append({"name": "dashboard_sockets_refused_total", "type": "counter",
                "help": "Dashboard sockets closed because their user had too many open.",
                "samples": refused})  # fmt: skip
    return out
