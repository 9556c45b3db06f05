"""Hold a router lease while a response streams: report progress, renew, release at the end.

An in-process lease (embedded mode) never expires and needs no renewal; each chunk that goes out
is reported straight to the engine's hang watchdog (``Grant.progress``). A lease from a
router in another process (team mode) expires if not renewed (DESIGN §5), so a web process that
dies cannot pin a model forever: a timer renews it every ttl/3 and each renewal says how long
ago the last byte went out, which is all the watchdog there needs. Renewal is a timer, not a
task per request: a response shorter than ttl/3 costs nothing beyond the release.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from models_app.routing.wire import Grant

MIN_INTERVAL = 0.05


class LeaseKeeper:
    """Keep ``grant``'s lease until ``release()``; one per proxied request."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.lease_id = grant.lease_id
        self._loop = asyncio.get_running_loop()
        self._renewing: set[asyncio.Task[None]] = set()
        self.last_byte = self._loop.time()
        self.renewals = 0
        self.interval = max(grant.lease_ttl / 3, MIN_INTERVAL)
        self._timer: asyncio.TimerHandle | None = None
        self._open = True
        # Called per chunk: a byte of the answer went out, the child is not hung.
        report = grant.progress()
        self.progress: Callable[[], None] = self._sent if report is None else report
        if not grant.local:
            self._timer = self._loop.call_later(self.interval, self._renew)

    def _sent(self) -> None:
        """A byte of a remote lease's answer went out: the next renewal says when."""
        self.last_byte = self._loop.time()

    def _renew(self) -> None:
        self.renewals += 1
        idle = self._loop.time() - self.last_byte
        task = asyncio.ensure_future(self.grant.renew(idle))
        self._renewing.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._renewing.discard)
        self._timer = self._loop.call_later(self.interval, self._renew)

    async def release(self) -> None:
        """Stop renewing and give the lease back (the model may now be evicted)."""
        if not self._open:
            return
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.grant.release()
