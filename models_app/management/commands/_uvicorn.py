"""uvicorn for ``serve --http uvicorn``: the same ASGI application on uvloop and httptools.

Daphne stays the default (Channels' own server). uvicorn is the measured alternative for the data
plane (bench/proxy.py): its per-request path is shorter, and it adds nothing a router should not:
no ``Server`` or ``Date`` header of its own, no proxy-header rewriting, no access log, no
lifespan. WebSockets (the dashboard) go through the ``websockets`` package (sans-I/O).

The socket is bound here, before uvicorn starts, so a busy port is the same one-line error as
under Daphne instead of uvicorn's log line and ``sys.exit``. Bodies: under uvicorn the
application receives a request's body as it arrives, so its own checks (413 on the declared
length, 408 on a slow body) act on the API paths without Daphne's ``BodyGuard``; Django's panel
pages read their (small) bodies through Django's limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from models_app.api.request import CHUNK_NOW


class UvicornServer:
    """Serve ``application`` on ``host:port`` with uvicorn; ``run`` returns when it stopped."""

    def __init__(
        self, application: Any, host: str, port: int, stopping: Callable[[], Awaitable[Any]],
    ) -> None:  # fmt: skip
        """``stopping``: the application's way of stopping (serve.Stopping), started when the
        server starts to stop and awaited before ``run`` returns; idempotent."""
        self.host, self.port = host, port
        config = uvicorn.Config(
            application,
            loop="uvloop",
            http=ChunkNowProtocol,
            ws="websockets-sansio",
            lifespan="off",
            server_header=False,
            date_header=False,
            proxy_headers=False,
            access_log=False,
            log_level="warning",
        )
        self._server = _Server(config)
        self._server.stopping = self.stopping = stopping
        self.listen_failure: OSError | None = None
        self.on_listening: Callable[[], None] = lambda: None

    def bind(self) -> socket.socket | None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            self.listen_failure = exc
            return None
        sock.set_inheritable(True)
        return sock

    def stop(self) -> None:
        """Make the server stop (as on SIGTERM): it finishes open responses, then returns."""
        self._server.should_exit = True

    def run(self, *, on_start: Callable[[], None] = lambda: None) -> None:
        """Bind, call ``on_start`` in the loop, serve until stopped and ``stopping`` is done."""
        import uvloop

        sock = self.bind()
        if sock is None:
            return

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self.stop)
            on_start()
            serving = asyncio.ensure_future(self._server.serve(sockets=[sock]))
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.01)
            if self._server.started:
                self.on_listening()
            try:
                await serving
            finally:
                await self.stopping()  # started by the shutdown, or here if serving failed

        uvloop.run(main())


class ChunkNowProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with ``chunk_now`` for each request in the scope's
    extensions (``request.CHUNK_NOW``): the proxy's pump writes each streamed piece with it,
    without an ASGI message and a coroutine per token. The request's task has not run yet when
    uvicorn's ``on_headers_complete`` returns, so the scope has it before the application."""

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        if self.cycle is not None and self.cycle is not before:
            extensions: dict[str, Any] = self.cycle.scope.setdefault("extensions", {})
            extensions[CHUNK_NOW] = functools.partial(chunk_now, self.cycle)


def chunk_now(cycle: RequestResponseCycle, body: bytes) -> bool:
    """Write ``body`` as the next piece of a chunked answer whose head went out, as uvicorn's
    ``send`` would (then True); False when it must go as a message: before the head, after the
    end, not chunked, a HEAD request, a client gone, or a socket that takes no more (``send``
    then waits for it to drain)."""
    if (
        not cycle.chunked_encoding
        or not cycle.response_started
        or cycle.response_complete
        or cycle.disconnected
        or cycle.flow.write_paused
        or cycle.scope["method"] == "HEAD"
    ):
        return False
    if body:
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
    return True


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handling: uvicorn re-raises a caught SIGTERM once it
    has stopped, which would end the process before the router stopped its children. ``run``
    handles the signals instead (they stop the server; the router stops after it)."""

    stopping: Callable[[], Awaitable[Any]]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn stops listening, then waits for every open response to end, without a
        deadline. ``stopping`` (started first, running meanwhile) gives them their grace and
        then ends them: event streams at once, proxied answers when the router stops."""
        stopping = self.stopping()
        await super().shutdown(sockets)
        await stopping
