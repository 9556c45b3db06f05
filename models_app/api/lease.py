"""Hold a router lease while a response streams: renew it every ttl/3, release it at the end.

The router expires a lease that is not renewed (DESIGN §5), so a web process that dies cannot
pin a model forever. Renewal is a timer, not a task per request: a response shorter than ttl/3
costs nothing beyond the release.
"""

from __future__ import annotations

import asyncio

from models_app.bridge import Grant, RouterClient

MIN_INTERVAL = 0.05


class LeaseKeeper:
    """Renew ``grant``'s lease until ``release()``; one per proxied request."""

    def __init__(self, router: RouterClient, grant: Grant) -> None:
        self._router = router
        self.lease_id = grant.lease_id
        self.interval = max(grant.lease_ttl / 3, MIN_INTERVAL)
        self._loop = asyncio.get_running_loop()
        self._renewing: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(self.interval, self._renew)
        self.renewals = 0

    def _renew(self) -> None:
        self.renewals += 1
        task = asyncio.ensure_future(self._router.renew(self.lease_id))
        self._renewing.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._renewing.discard)
        self._timer = self._loop.call_later(self.interval, self._renew)

    async def release(self) -> None:
        """Stop renewing and give the lease back (the model may now be evicted)."""
        if self._timer is None:
            return
        self._timer.cancel()
        self._timer = None
        await self._router.release(self.lease_id)
