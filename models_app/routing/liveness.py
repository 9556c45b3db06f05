"""Know whether the router lives: its heartbeat in Redis, written by it and read by web processes.

Team mode only (DESIGN §10, "deadlines everywhere"). The router writes one key every
``BEAT_EVERY`` seconds — its boot id, pid, host and the time — with a ``BEAT_TTL`` expiry, so the
key vanishes on its own when the router dies without a word (kill -9, a lost host). Each web
process reads the key once a second (``RouterWatch``) and knows within ``DEAD_AFTER`` seconds
that the router is gone or was replaced by a new boot: requests waiting for an answer from the
old one are answered 503 at once instead of waiting forever, and new requests fail fast.

Embedded mode has no heartbeat: the router lives in the same process (``RouterWatch`` is not
used there). Without Redis the watch reports ``unknown`` and the transports fall back to their
per-message deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from models_app.routing import topology

log = logging.getLogger(__name__)

BEAT_EVERY = 1.0  # seconds between two heartbeats
BEAT_TTL = 10.0  # the key expires this long after the last beat
DEAD_AFTER = 6.0  # a web process calls the router dead after this long without a fresh beat
POLL_EVERY = 1.0
POKE_GAP = 0.05  # a poked beat waits this long, so that a burst of changes makes one beat


def heartbeat_key(node: str = "") -> str:
    """The beat's key: the unnamed router's, or node ``node``'s (nodes.py)."""
    return topology.heartbeat_key(node)


def redis_client(url: str | None = None, timeout: float = 2.0) -> Any:
    """An asyncio Redis client with short timeouts: a dead Redis must not stall a beat."""
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(
        url or settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
    )


@dataclass(frozen=True)
class Beat:
    boot: str
    pid: int
    host: str
    time: float  # wall clock of the beat
    started: float
    link: str = ""  # where web processes connect (routing/link.py): "unix:PATH"; "": channels only
    node: str = ""  # the node's name (nodes.py); "" the unnamed router
    advertise: str = ""  # the address its children listen on, for web processes to reach them
    status: dict[str, Any] | None = None  # capacity, memory and models, for placement
    tcp: str = ""  # the data path for web processes on other hosts: "tcp:HOST:PORT" (link.py)

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Beat | None:
        try:
            data = json.loads(raw) if raw else None
            if not isinstance(data, dict):
                return None
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            return cls(**known)  # a newer router's extra fields are not an error
        except (TypeError, ValueError):
            return None


class Heartbeat:
    """The router's side: write a beat every second until stopped; survive Redis outages."""

    def __init__(
        self,
        boot: str,
        *,
        every: float = BEAT_EVERY,
        ttl: float = BEAT_TTL,
        on_back: Callable[[float], None] | None = None,
        link: str = "",
        node: str = "",
        advertise: str = "",
        status: Callable[[], dict[str, Any]] | None = None,
        tcp: str = "",
    ) -> None:
        self.boot = boot
        self.node, self.advertise = topology.check_name(node), advertise
        self.status = status  # what the beat tells about the node (placement reads it)
        self.link = link  # the address the router's data path listens on, advertised
        self.tcp = tcp  # and its TCP address, for web processes on other hosts
        self.on_back = on_back  # called with the outage's length when Redis returns
        self.every, self.ttl = every, ttl
        self.started = time.time()
        self.failures = 0  # consecutive failed writes (Redis away)
        self.outage_since: float | None = None
        self.last_ok: float | None = None  # monotonic time of the last beat Redis took
        self.resumed_at = 0.0  # wall clock: the end of the last lapse (see ``stale_before``)
        self._poked: asyncio.Event | None = None  # a beat is due now (``poke``)

    def value(self) -> str:
        host = socket.gethostname()
        status = self.status() if self.status is not None else None
        beat = Beat(self.boot, os.getpid(), host, time.time(), self.started, self.link,
                    self.node, self.advertise, status, self.tcp)  # fmt: skip
        return json.dumps(beat.__dict__)

    async def run(self) -> None:
        client = redis_client(timeout=min(2.0, self.every * 2))
        self._poked = asyncio.Event()
        try:
            while True:
                await self.beat(client)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.every):
                        await self._poked.wait()
                        await asyncio.sleep(POKE_GAP)  # a burst of changes: one beat
                self._poked.clear()
        finally:
            await client.aclose()

    def poke(self) -> None:
        """Beat soon, not in up to a second: what the beat tells changed (a node's models,
        which placement reads). Call on the beating loop."""
        if self._poked is not None:
            self._poked.set()

    async def beat(self, client: Any) -> bool:
        try:
            await client.set(heartbeat_key(self.node), self.value(), px=int(self.ttl * 1000))
            if self.node:  # known from now on, and shown as lost once it stops beating
                await client.hset(topology.members_key(), self.node, str(time.time()))
        except Exception as exc:  # Redis away: keep serving, keep trying
            if self.failures == 0:
                self.outage_since = time.monotonic()
                log.warning("router heartbeat: Redis unreachable (%s); retrying", exc)
            self.failures += 1
            return False
        if self.lapsed(DEAD_AFTER):  # web processes saw us dead: what they sent until now is
            self.resumed_at = time.time()  # answered already (``stale_before``)
        self.last_ok = time.monotonic()
        if self.failures:
            down = time.monotonic() - (self.outage_since or time.monotonic())
            log.warning("router heartbeat: Redis is back after %.1f s", down)
            if self.on_back is not None:
                self.on_back(round(down, 3))
        self.failures, self.outage_since = 0, None
        return True

    def stale_before(self) -> float:
        """Messages sent before this wall-clock time were given up on by their senders: they
        were sent before, or during, a lapse of the heartbeat (``lapsed`` now, or earlier)."""
        return time.time() if self.lapsed(DEAD_AFTER) else self.resumed_at

    def lapsed(self, after: float) -> bool:
        """Whether no beat has reached Redis for ``after`` seconds (a frozen loop, Redis away):
        web processes then call this router dead. Measured now, not by the beating task, which
        may not have run yet after a freeze."""
        return self.last_ok is not None and time.monotonic() - self.last_ok > after

    async def clear(self) -> None:
        """Remove our beat at a clean stop, so web processes know at once."""
        client = redis_client()
        try:
            beat = Beat.parse(await client.get(heartbeat_key(self.node)))
            if beat is not None and beat.boot == self.boot:
                await client.delete(heartbeat_key(self.node))
        except Exception:
            log.debug("could not clear the heartbeat", exc_info=True)
        finally:
            await client.aclose()


class RouterWatch:
    """A web process's view of the router's heartbeat (see module doc). One per event loop."""

    def __init__(
        self, node: str = "", *, poll: float = POLL_EVERY, dead_after: float = DEAD_AFTER
    ) -> None:
        self.node = topology.check_name(node)  # whose beat: the unnamed router's or a node's
        self.poll, self.dead_after = poll, dead_after
        self.beat: Beat | None = None
        self.seen_at: float | None = None  # monotonic time of the last fresh beat
        self.started_at = time.monotonic()
        self.changed = asyncio.Event()  # set (and replaced) whenever the view changes
        self.polled = asyncio.Event()  # set once the first poll is done (the beat is known)
        self._was_alive = True
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def ensure_running(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop = loop
            self._task = loop.create_task(self._run(), name="router watch")

    @property
    def boot(self) -> str | None:
        return self.beat.boot if self.beat is not None and self.alive() else None

    def alive(self) -> bool:
        """A fresh beat was seen recently; True too until the first poll could tell."""
        now = time.monotonic()
        if self.seen_at is None:
            return now - self.started_at < self.dead_after
        return now - self.seen_at < self.dead_after

    def silent_for(self) -> float:
        reference = self.seen_at if self.seen_at is not None else self.started_at
        return time.monotonic() - reference

    async def gone(self, boot: str | None) -> str:
        """Return (a reason) once the router of ``boot`` is dead or replaced; never otherwise.

        ``boot`` None waits for the router to be dead.
        """
        self.ensure_running()
        while True:
            reason = self.lost(boot)
            if reason is not None:
                return reason
            changed = self.changed
            await changed.wait()

    def lost(self, boot: str | None) -> str | None:
        who = f"node {self.node}" if self.node else "the router"
        if not self.alive():
            return f"no heartbeat from {who} for {self.silent_for():.0f} s"
        if boot is not None and self.beat is not None and self.beat.boot != boot:
            return f"{who} restarted"
        return None

    async def _run(self) -> None:
        client = redis_client(timeout=max(0.5, self.poll))
        try:
            while True:
                await self._poll_once(client)
                await asyncio.sleep(self.poll)
        finally:
            await client.aclose()

    async def _poll_once(self, client: Any) -> None:
        try:
            beat = Beat.parse(await client.get(heartbeat_key(self.node)))
        except Exception:
            beat = None  # Redis away: the router is out of reach for us too
        old_boot = self.beat.boot if self.beat is not None else None
        if beat is not None and (self.beat is None or beat != self.beat):
            # When the beat was written, on our clock: a dead router's last beat stays in Redis
            # until its key expires, and must not look fresh meanwhile.
            age = max(0.0, time.time() - beat.time)
            self.beat, self.seen_at = beat, time.monotonic() - age
        alive = self.alive()
        new_boot = self.beat.boot if self.beat is not None else None
        if alive != self._was_alive or new_boot != old_boot:
            self._notify()
        self._was_alive = alive
        self.polled.set()

    async def first_poll(self, timeout: float) -> None:
        """Return once the beat was read once (at most ``timeout``): what the router advertises
        is known from the first request of a web process on."""
        if not self.polled.is_set():
            self.ensure_running()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.polled.wait()

    def _notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


_watches: dict[tuple[int, str], RouterWatch] = {}


def watch(node: str = "") -> RouterWatch:
    """This loop's watch of ``node``'s router ("" the unnamed one), started on first use."""
    loop = asyncio.get_running_loop()
    found = _watches.get((id(loop), node))
    if found is None or found._loop not in (None, loop):
        found = _watches[(id(loop), node)] = RouterWatch(node)
    found.ensure_running()
    return found
