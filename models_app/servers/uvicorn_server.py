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
import operator
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import uvicorn
from uvicorn._types import ASGI3Application, ASGISendEvent, HTTPResponseStartEvent
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from models_app.api.errors import dumps
from models_app.api.request import CHUNK_NOW, body_timeout

_NAME, _VALUE = operator.itemgetter(0), operator.itemgetter(1)  # of a header pair


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
        ChunkNowProtocol.head_timeout = body_timeout()
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
      per token. It is put there when the request's task is made, before the application.
    * Each request's cycle is a ``HeadWithBody``: an answer's head leaves with its first piece
      of body, in one write, and is built with two header checks, not two per header.
    * A new connection's addresses are the ones the loop read when it accepted it (uvloop
      keeps them), not asked of the socket again: uvicorn asks for the transport's socket
      object, whose making and questions cost uvloop five ``getsockname`` and two
      ``getpeername`` system calls per connection.

    And one guard uvicorn lacks: a request's headers must be in within ``head_timeout``
    (``ROUTERPANEL_BODY_TIMEOUT``, as Daphne's guard) from the connection or from the request's
    first byte, else it is answered 408 and closed: a slow client (slowloris) cannot hold a
    connection open for ever. The body's own deadline is the application's (request.py).
    """

    head_timeout = 30.0  # seconds; set from the settings by UvicornServer
    _head_timer: asyncio.TimerHandle | None = None

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
        self._arm_head_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a later request on a kept connection
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self.head_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        message = f"request headers not received within {self.head_timeout:g} s"
        body = dumps({"error": {"code": 408, "message": message, "type": "invalid_request_error"}})
        head = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        self.transport.write(head + body)
        self.transport.close()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """Each request's cycle is ours before its task is made (``run_asgi`` is ours too)."""
        cycle.__class__ = HeadWithBody
        extensions: dict[str, Any] = cycle.scope.setdefault("extensions", {})
        extensions[CHUNK_NOW] = functools.partial(chunk_now, cast(HeadWithBody, cycle))
        super()._start_asgi_task(cycle, app)


class HeadWithBody(RequestResponseCycle):
    """uvicorn's request cycle with its own ``send``: an answer's head waits for the first
    piece of its body and leaves in the same write.

    uvicorn writes the head when the application sends ``http.response.start`` and the body
    when it sends ``http.response.body``: two writes, two system calls and two TCP segments
    for every answer, though both messages come in the same turn of the loop (the proxy sends
    them one after the other). Here the head is kept (``head``) and goes out in one write with
    the body's first piece, or alone at the end of the turn when no body came in it (an
    application that waits between the two), or with a body that writes nothing (HEAD).

    Otherwise ``send`` does what uvicorn's (0.54) does, message for message, with the same
    errors; only the header checks differ in cost: a name or a value with a character HTTP does
    not allow is found by one search over all names and one over all values (the characters
    are searched one by one, so the joined bytes hold one exactly when some header does), not
    two searches per header.
    """

    head: bytes | None = None  # the head built, not yet written

    async def send(self, message: ASGISendEvent) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{kind}'."
                )
            self.head = self.build_head(message)  # type: ignore[arg-type]
            asyncio.get_running_loop().call_soon(self.send_head)
            return
        if self.response_complete:
            raise RuntimeError(
                f"Unexpected ASGI message '{kind}' sent, after response already completed."
            )
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        body: bytes = message.get("body", b"")  # type: ignore[assignment]
        more_body = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            data = b""
        elif self.chunked_encoding:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more_body:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self.expected_content_length:
                self.send_head()  # the head the application sent still goes out
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            data = body
        head, self.head = self.head, None
        if head is not None:
            data = head + data
        if data:
            self.transport.write(data)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    async def run_asgi(self, app: ASGI3Application) -> None:
        """uvicorn's, with a head that still waits written when the application ends: uvicorn
        closes the connection at once when an application fails after its head or returns
        without finishing its answer, and the client gets that head first, as from uvicorn."""
        await super().run_asgi(functools.partial(self.app_then_head, app))

    async def app_then_head(
        self, app: ASGI3Application, scope: Any, receive: Any, send: Any
    ) -> None:
        try:
            await app(scope, receive, send)
        finally:
            self.send_head()

    def build_head(self, message: HTTPResponseStartEvent) -> bytes:
        """The status line and headers for ``message``, as uvicorn writes them; sets the
        answer's framing (length or chunked) and whether the connection stays open."""
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        headers = self.default_headers + list(message.get("headers", []))
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status_code,
            )
        if HEADER_RE.search(b"".join(map(_NAME, headers))):  # map: no Python frame per header
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"".join(map(_VALUE, headers))):
            raise RuntimeError("Invalid HTTP header value.")
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                self.keep_alive = False
                has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status_code not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def send_head(self) -> None:
        """The end of the turn in which the head was built: it goes out if no body took it."""
        head, self.head = self.head, None
        if head is not None and not self.disconnected:
            self.transport.write(head)


def chunk_now(cycle: HeadWithBody, body: bytes) -> bool:
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
    piece = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
    head, cycle.head = cycle.head, None
    if head is not None:
        piece = head + piece
    if piece:
        cycle.transport.write(piece)
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
