"""A streamed answer's body goes to the client from the relay's own callback (issue 16.5).

Relayed the plain way, every streamed token costs a round of the event loop: the connection's
callback parses the chunk and wakes the request's task (a future set, a task step scheduled),
the task resumes, hands the chunk to the HTTP server and parks again on a new future. At 16
streams that is most of the router's Python time per token.

Both servers' ``send`` for a body message does its work at once and returns without ever
suspending (Daphne always; uvicorn unless the client's socket is full and it waits for it to
drain). So the pump runs the server's ``send`` right in the callback that parsed the chunk
(``start_now``): no task wakes. If a ``send`` does suspend (a client that reads slowly), it is
finished in a task, and until it is, chunks are kept by the answer and the child's socket stops
being read once too much is kept (relay.py's back-pressure); the request's task then sends them
in order before it takes the sink back. The task itself only waits for the end, a failure, or
a suspended send.

Under ``serve`` both servers also offer ``chunk_now`` in the scope (``request.CHUNK_NOW``;
servers/daphne_writes.py, servers/uvicorn_server.py): a plain call that writes a piece at once,
as ``send`` would, or says False where ``send`` would do otherwise. The pump tries it first,
which saves the message and the coroutine per token; a piece it refuses goes through ``send``
as above.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator
from typing import Any

from models_app.api.lease import LeaseKeeper
from models_app.api.relay import Answer
from models_app.api.request import CHUNK_NOW, Request
from models_app.api.upstream_errors import UpstreamError


def start_now(awaitable: Awaitable[None]) -> asyncio.Future[None] | None:
    """Run ``awaitable`` here up to its first suspension: None when it finished (its
    exception, if any, is raised here); else a task that finishes it, as a task would have."""
    steps = awaitable.__await__()
    try:
        yielded = steps.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_finish(steps, yielded))


async def _finish(steps: Generator[Any, None, None], yielded: Any) -> None:
    """Step on from where ``start_now`` left off, the way ``asyncio.Task`` does: wait for the
    future it yielded (a bare yield: one round of the loop), then resume it; a cancellation
    cancels that future, so the awaitable sees it where it waits."""
    try:
        while True:
            if yielded is None:
                await asyncio.sleep(0)
            else:
                yielded._asyncio_future_blocking = False
                try:
                    await asyncio.wait((yielded,))
                except asyncio.CancelledError:
                    yielded.cancel()
            yielded = steps.send(None)
    except StopIteration:
        return


class Pump:
    """Relay ``response``'s body to ``request`` (the head already went out); ``run`` returns
    the last chunk, kept back to go out with the end of the response when the child gave a
    Content-Length and this chunk completes it (one message for the last part, not two)."""

    __slots__ = ("busy", "direct", "expected", "failed", "last", "meter", "progress",
                 "received", "response", "send")  # fmt: skip

    def __init__(
        self, request: Request, response: Answer, lease: LeaseKeeper, meter: Any,
        expected: int | None,
    ) -> None:  # fmt: skip
        self.send = request.sender
        # The server's own way to write a piece at once (under ``serve``, either server).
        self.direct = (request.scope.get("extensions") or {}).get(CHUNK_NOW)
        self.response = response
        self.progress = lease.progress  # per chunk: the child is not hung
        self.meter = meter
        self.expected = expected
        self.received = 0
        self.last = b""
        self.busy: asyncio.Future[None] | None = None  # a send that suspended, finishing
        self.failed: BaseException | None = None  # what a send raised in the callback

    async def run(self) -> bytes:
        """Until the body's end; raises ``UpstreamError`` when the child breaks off (what it
        sent before went out first), or what the HTTP server's ``send`` raised."""
        response = self.response
        response.sink = self.offer
        try:
            while True:
                await self._settle()
                chunk = response.take()
                if chunk is not None:
                    self._forward(chunk)
                    continue
                try:
                    more = await response.more()
                except UpstreamError:
                    response.sink = None
                    await self._settle()
                    raise
                if not more and self.busy is None:
                    return self.last
        finally:
            response.sink = None
            if self.busy is not None and not self.busy.done():
                self.busy.cancel()

    def offer(self, chunk: bytes) -> bool:
        """The answer's sink: forward ``chunk`` now, or False while a send is unfinished."""
        if self.busy is not None or self.failed is not None:
            return False
        self._forward(chunk)
        return True

    def _forward(self, chunk: bytes) -> None:
        self.received += len(chunk)
        self.meter.chunk(chunk)
        self.progress()
        if self.received == self.expected:
            self.last = chunk
            return
        try:
            if self.direct is not None and self.direct(chunk):
                return  # written: no message, no coroutine
            message = {"type": "http.response.body", "body": chunk, "more_body": True}
            self.busy = start_now(self.send(message))
        except Exception as exc:  # the task raises it (run)
            self.failed = exc
            self.response.wake()

    async def _settle(self) -> None:
        if self.busy is not None:
            await self.busy
            self.busy = None
        if self.failed is not None:
            raise self.failed
