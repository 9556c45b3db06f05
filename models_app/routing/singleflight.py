"""One call at a time of an awaited read or connect, shared by every caller that arrives meanwhile.

The node directory's read (nodes.known) and a router link's connect (link_client.Link.connect)
are both asked for by many requests at once; each should run once, and a request that is
cancelled while it waits (its client left) must not cancel the work the others wait for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """``run(start)`` starts ``start()`` unless a call is running, and awaits the running one.

    Every caller gets the call's result or its exception. A caller that is cancelled stops
    waiting; the call goes on for the rest (it is shielded). Once it has ended, the next
    ``run`` starts a new one.
    """

    def __init__(self) -> None:
        self._call: asyncio.Future[T] | None = None

    @property
    def running(self) -> bool:
        return self._call is not None

    async def run(self, start: Callable[[], Awaitable[T]]) -> T:
        if self._call is None:
            self._call = asyncio.ensure_future(start())
        call = self._call
        try:
            return await asyncio.shield(call)
        finally:
            if call.done() and self._call is call:
                self._call = None
