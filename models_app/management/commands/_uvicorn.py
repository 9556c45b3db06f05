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
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.flow_control import FlowControl
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
    """uvicorn's httptools protocol, with three changes for the data plane:

    * ``chunk_now`` for each request in the scope's extensions (``request.CHUNK_NOW``): the
      proxy's pump writes each streamed piece with it, without an ASGI message and a coroutine
      per token. The request's task has not run yet when uvicorn's ``on_headers_complete``
      returns, so the scope has it before the application.
    * Each request's cycle is a ``HeadWithBody``: an answer's head leaves with its first piece
      of body, in one write.
    * A new connection's addresses are the ones the loop read when it accepted it (uvloop
      keeps them), not asked of the socket again: uvicorn asks for the transport's socket
      object, whose making and questions cost uvloop five ``getsockname`` and two
      ``getpeername`` system calls per connection.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """uvicorn's, without the socket object (see the class doc) and its trace log line."""
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        local = transport.get_extra_info("sockname")
        self.server = (str(local[0]), int(local[1])) if isinstance(local, tuple) else None
        peer = transport.get_extra_info("peername")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"

    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not before:
            cycle.__class__ = HeadWithBody  # before its task runs: the application sees ours
            extensions: dict[str, Any] = cycle.scope.setdefault("extensions", {})
            extensions[CHUNK_NOW] = functools.partial(chunk_now, cycle)


class HeadWithBody(RequestResponseCycle):
    """uvicorn's request cycle, whose answer's head waits for the first piece of its body.

    uvicorn writes the head when the application sends ``http.response.start`` and the body
    when it sends ``http.response.body``: two writes, two system calls and two TCP segments
    for every answer, though both messages come in the same turn of the loop (the proxy sends
    them one after the other). Here the head is kept (``head``) and goes out in one write with
    the body's first piece, or alone at the end of the turn when no body came in it (an
    application that waits between the two) or when the body writes nothing (HEAD).
    """

    head: bytes | None = None  # the head uvicorn built, not yet written

    async def send(self, message: ASGISendEvent) -> None:
        head = self.head
        if head is None:
            if self.response_started or message["type"] != "http.response.start":
                await super().send(message)
                return
            transport, self.transport = self.transport, _Kept()  # type: ignore[assignment]
            try:
                await super().send(message)  # builds the head and "writes" it here
            finally:
                kept, self.transport = self.transport, transport
            self.head = kept.data  # type: ignore[attr-defined]
            if self.head is not None:
                asyncio.get_running_loop().call_soon(self.send_head)
            return
        self.head = None
        if message["type"] == "http.response.body" and self.scope["method"] != "HEAD":
            transport = self.transport
            self.transport = _AfterHead(transport, head)  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                leading, self.transport = self.transport, transport
                if leading.head:  # type: ignore[attr-defined]  # nothing written (an error)
                    self.write_head(leading.head)  # type: ignore[attr-defined]
            return
        self.write_head(head)
        await super().send(message)

    def send_head(self) -> None:
        """The end of the turn in which the head was built: it goes out if no body took it."""
        head, self.head = self.head, None
        if head is not None:
            self.write_head(head)

    def write_head(self, head: bytes) -> None:
        if not self.disconnected:
            self.transport.write(head)


class _Kept:
    """Stands in for the transport while uvicorn writes an answer's head: keeps it."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data: bytes | None = None

    def write(self, data: bytes) -> None:
        self.data = data


class _AfterHead:
    """Stands in for the transport while uvicorn writes an answer's first piece of body: the
    head goes out in front of it, in the same write."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: asyncio.Transport, head: bytes) -> None:
        self.transport = transport
        self.head = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        self.transport.write(head + data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def chunk_now(cycle: RequestResponseCycle, body: bytes) -> bool:
    """Write ``body`` as the next piece of a chunked answer whose head went out (or waits to
    go with it, ``HeadWithBody``), as uvicorn's ``send`` would (then True); False when it must
    go as a message: before the head, after the end, not chunked, a HEAD request, a client
    gone, or a socket that takes no more (``send`` then waits for it to drain)."""
    if (
        not cycle.chunked_encoding
        or not cycle.response_started
        or cycle.response_complete
        or cycle.disconnected
        or cycle.flow.write_paused
        or cycle.scope["method"] == "HEAD"
    ):
        return False
    head = getattr(cycle, "head", None)
    if head is not None:
        cycle.head = None  # type: ignore[attr-defined]
        cycle.transport.write(head + (b"%x\r\n%b\r\n" % (len(body), body) if body else b""))
    elif body:
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
