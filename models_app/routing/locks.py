"""One router per data dir, and one per installation: locks that know their owner.

A router owns a data dir (the children's state file, the audit journal, the SQLite database in
embedded mode), so a second router on it is refused by a file lock there — the kernel releases
it when its process dies, so a restart after ``kill -9`` takes it at once. In team mode the web
processes reach the router through the installation's Redis (its key prefix), so a second
router there — on any host — is refused by a Redis key with a 15 s expiry that the owner
refreshes. Both name their owner (host, pid, boot id, since). A Redis key whose owner is on
this host and no longer alive (``kill -9``) is taken over at once instead of waiting for the
expiry. A refresh that fails because Redis is away is retried; when Redis returns without the
key (it restarted) the owner sets it again; if another router took it meanwhile, this one has
lost the installation and must stop.

Tests and several installations on one machine never meet: the file is in the data dir, the key
under the installation's prefix (``ROUTERPANEL_REDIS_PREFIX``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil
from django.conf import settings

from models_app.routing import topology

log = logging.getLogger(__name__)

LOCK_TTL = 15  # seconds the Redis key lives without a refresh
REFRESH_EVERY = LOCK_TTL / 3
FILE_NAME = "router.lock"
# Set the key to ARGV[2] only while it still holds ARGV[1] (the owner we saw, or ours).
_SWAP = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('set', KEYS[1], ARGV[2], 'EX', tonumber(ARGV[3]))
  return 1
end
return 0
"""
_DELETE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
# Refresh our key; set it again if Redis lost it; 0 if somebody else holds it.
_REFRESH = """
local value = redis.call('get', KEYS[1])
if value == ARGV[1] or value == false then
  redis.call('set', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
  return 1
end
return 0
"""


class LockHeld(Exception):
    """Another router owns the data dir or the installation; the message says which."""


class LockLost(Exception):
    """Another router took the installation while Redis was away: this one must stop."""


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    boot: str
    since: float  # wall clock
    created: float  # the process's create time (tells a reused pid apart)
    data_dir: str = ""
    node: str = ""

    @classmethod
    def me(cls, boot: str, node: str = "") -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, boot, time.time(), _create_time(pid),
                   str(settings.DATA_DIR), node)  # fmt: skip

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Owner | None:
        try:
            data = json.loads(raw) if raw else None
            return cls(**data) if isinstance(data, dict) else None
        except (TypeError, ValueError):
            return None

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def alive(self) -> bool:
        """Whether the owner still runs — known only on its own host (True elsewhere)."""
        if self.host != socket.gethostname():
            return True
        try:
            proc = psutil.Process(self.pid)
            return (
                proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - self.created) < 1
            )
        except psutil.NoSuchProcess:
            return False

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        where = f" for data dir {self.data_dir}" if self.data_dir else ""
        node = f"node {self.node}: " if self.node else ""
        return f"{node}pid {self.pid} on host {self.host}{where} (boot {self.boot}, since {since})"


def _create_time(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return 0.0


class RouterLock:
    """Hold this router's locks (see module doc). ``redis_url`` empty: the file lock only."""

    def __init__(
        self, boot: str, *, data_dir: Path | None = None, redis_url: str = "", node: str = ""
    ) -> None:
        self.owner = Owner.me(boot, node)
        self.path = (data_dir or settings.DATA_DIR) / FILE_NAME
        self.redis_url = redis_url
        self.key = topology.lock_key(node)  # one router per node name; "" the unnamed router
        self._file: TextIO | None = None
        self.took_over: Owner | None = None  # a dead owner this lock replaced

    # ---- taking ----------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take both locks or raise ``LockHeld`` naming the owner (nothing is left held)."""
        self._take_file()
        try:
            if self.redis_url:
                self._take_key()
        except BaseException:
            self.release()
            raise

    def _take_file(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = Owner.parse(handle.read())
            handle.close()
            who = owner.describe() if owner else "another process"
            raise LockHeld(
                f"another router is already running on this data dir: {who}; stop it first, "
                "or give this one its own --data-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(self.owner.dumps())
        handle.flush()
        self._file = handle

    def _take_key(self) -> None:
        client = self._redis()
        try:
            if client.set(self.key, self.owner.dumps(), nx=True, ex=LOCK_TTL):
                return
            raw = client.get(self.key)
            owner = Owner.parse(raw)
            if owner is not None and not owner.alive():  # kill -9 on this host: take over
                if client.eval(_SWAP, 1, self.key, raw, self.owner.dumps(), LOCK_TTL):
                    self.took_over = owner
                    log.warning("router lock: replaced a dead owner (%s)", owner.describe())
                    return
                owner = Owner.parse(client.get(self.key))
        except Exception as exc:
            if isinstance(exc, LockHeld):
                raise
            raise LockHeld(f"Redis at REDIS_URL is unreachable ({exc}): cannot tell whether "
                           "another router runs for this installation") from None  # fmt: skip
        finally:
            client.close()
        who = owner.describe() if owner else "another router"
        raise LockHeld(
            f"another router is already running for this installation: {who}; one router per "
            f"installation (Redis prefix {settings.ROUTERPANEL_REDIS_PREFIX!r})"
        )

    # ---- keeping ---------------------------------------------------------------------------

    async def keep(self) -> None:
        """Refresh the Redis key until cancelled; raise ``LockLost`` if another router took it.

        Redis being away is not losing it: the refresh is retried, and when Redis returns
        without the key (it restarted) the key is set again.
        """
        if not self.redis_url:
            await asyncio.Event().wait()
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(self.redis_url, socket_timeout=2, socket_connect_timeout=2)
        failing = False
        try:
            while True:
                await asyncio.sleep(REFRESH_EVERY if not failing else 1.0)
                try:
                    kept = await client.eval(_REFRESH, 1, self.key, self.owner.dumps(), LOCK_TTL)
                except Exception as exc:
                    if not failing:
                        log.warning("router lock: Redis unreachable (%s); keeping on", exc)
                    failing = True
                    continue
                if failing:
                    log.warning("router lock: Redis is back; the lock is ours again")
                failing = False
                if not kept:
                    holder = Owner.parse(await client.get(self.key))
                    who = holder.describe() if holder else "another router"
                    raise LockLost(f"another router took this installation: {who}")
        finally:
            await client.aclose()

    def release(self) -> None:
        if self.redis_url and self._file is not None:
            with contextlib.suppress(Exception):
                client = self._redis()
                client.eval(_DELETE, 1, self.key, self.owner.dumps())  # only if still ours
                client.close()
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=5)
