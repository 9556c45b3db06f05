"""Daphne's guard of a request's body: bounded in size and time, answered 413 or 408 inside
Twisted (``BodyGuard``, installed on each request by ``daphne_server.RouterPanelServer``).

Daphne (Twisted) reads a request's whole body before it calls the application, so the
application's own checks (``Request.read_body``) come too late for a client that declares 40 MiB
and sends nothing, or sends a chunked body that never ends: the 413 would come after the upload,
the timeout never. ``BodyGuard`` therefore acts inside Twisted, where the headers are known
before the body (``Request.gotLength``, called by ``HTTPChannel.allHeadersReceived``):

* a ``Content-Length`` over the limit is answered 413 at once, before a byte of body is read;
  a chunked body is counted as it arrives and answered 413 when it passes the limit;
* a request whose headers and body are not all in within the body timeout is answered 408.

API paths get llama.cpp's JSON error shape, the panel's paths a plain text answer. The
connection closes a few seconds after either answer; until then it reads and drops what the
client still sends, so that a client busy uploading gets to read the answer instead of a
connection reset (closing a socket with unread data resets it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import daphne.server  # noqa: F401  # first: it installs Twisted's asyncio reactor, imported below
from twisted.internet import reactor
from twisted.web import http

from models_app.api.app import is_api_path
from models_app.api.errors import encoded_error
from models_app.api.request import JSON_TYPE

LINGER = 5.0  # seconds an answered connection keeps draining the client's upload before closing
REASONS = {408: b"Request Timeout", 413: b"Content Too Large"}


class BodyGuard:
    """Bound one request's body in size and time, answering 413 or 408 itself.

    Daphne reports the request when its first line arrives, so the timer covers the headers
    as well as the body. The guard hooks the request object's own methods: ``gotLength``
    (headers known, body not yet read), its body file's ``write`` (each piece of body) and
    ``requestReceived`` (the whole request is in: stop the timer and let Daphne run the app).
    """

    def __init__(self, request: http.Request, limit: int, timeout: float) -> None:
        self.request = request
        self.limit = limit
        self.timeout = timeout
        self.answered = False
        self._timer: asyncio.TimerHandle | None = None
        self._got_length: Callable[[int | None], None] = request.gotLength
        self._received: Callable[[bytes, bytes, bytes], Any] = request.requestReceived

    def install(self) -> None:
        # Replacing the request's methods is the point (see the class doc). Twisted declares the
        # reactor's and the transport's methods on zope interfaces, whose methods have no `self`:
        # without the mypy-zope plugin, mypy takes their first argument for it (arg-type, call-arg).
        self.request.gotLength = self.got_length  # type: ignore[method-assign]
        self.request.requestReceived = self.request_received  # type: ignore[method-assign]
        # The timer is asyncio's, on the loop Twisted's reactor runs on: per request, Twisted's
        # callLater costs twice as much (its own heap, then it re-arms its asyncio timer).
        self._timer = asyncio.get_running_loop().call_later(self.timeout, self.timed_out)

    # ---- Twisted's calls ----------------------------------------------------------------------

    def got_length(self, length: int | None) -> None:
        if length is not None and length > self.limit:
            self.request.content = _Discard()
            self.answer_too_large()
            return
        self._got_length(length)
        self.request.content = _Counted(self.request.content, self.limit, self.answer_too_large)

    def request_received(self, command: bytes, path: bytes, version: bytes) -> Any:
        self._stop_timer()
        if self.answered:
            return None  # the rest of a refused body reached its end: nothing to run
        return self._received(command, path, version)

    def timed_out(self) -> None:
        self._timer = None
        if self.answered or self.request._disconnected:
            return
        seconds = f"{self.timeout:g}"
        self.answer(408, f"request body not received within {seconds} s")

    # ---- answering ----------------------------------------------------------------------------

    def answer_too_large(self) -> None:
        self.answer(413, f"request body too large (limit: {self.limit} bytes)")

    def answer(self, status: int, message: str) -> None:
        """Write the whole answer, stop reading requests, and close ``LINGER`` s later."""
        if self.answered:
            return
        self.answered = True
        self._stop_timer()
        channel = self.request.channel
        if channel is None or channel.transport is None:
            return
        # Twisted would answer "Expect: 100-continue" after gotLength returns: not any more.
        self.request.requestHeaders.removeHeader(b"expect")
        channel.transport.write(self._response(status, message))  # type: ignore[call-arg, misc]
        # What the client still sends is read and dropped.
        channel.dataReceived = _drop  # type: ignore[method-assign]
        reactor.callLater(LINGER, self._close)  # type: ignore[arg-type]  # see install()

    def _response(self, status: int, message: str) -> bytes:
        raw_path = getattr(self.request.channel, "_path", b"")  # the request line's target
        path = unquote(raw_path.split(b"?", 1)[0].decode("latin-1"))
        if is_api_path(path):
            body, content_type = encoded_error(status, message), JSON_TYPE
            extra = b"Server: llama.cpp\r\n"
        else:
            body, content_type = message.encode() + b"\n", b"text/plain; charset=utf-8"
            extra = b""
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            status,
            REASONS[status],
            content_type,
            len(body),
        )
        return head + extra + b"Connection: close\r\n\r\n" + body

    def _close(self) -> None:
        channel = self.request.channel
        if channel is not None and not self.request._disconnected:
            channel.loseConnection()  # type: ignore[no-untyped-call]  # Twisted left it untyped

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()  # a timer that fired already ignores it
        self._timer = None


def _drop(data: bytes) -> None:
    """Read and forget (the channel's ``dataReceived`` once a request is answered)."""


class _Discard:
    """The body file of a refused request: everything written is forgotten."""

    closed = False

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args: Any) -> int:
        return 0

    def read(self, *args: Any) -> bytes:
        return b""

    def close(self) -> None:
        self.closed = True


class _Counted:
    """A request's body file that calls ``too_large`` once more than ``limit`` bytes came."""

    def __init__(self, file: Any, limit: int, too_large: Callable[[], None]) -> None:
        self._file = file
        self._limit = limit
        self._too_large = too_large
        self._size = 0
        self._refused = False

    def write(self, data: bytes) -> None:
        if self._refused:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._refused = True
            self._file.close()
            self._too_large()
            return
        self._file.write(data)

    # Daphne and Twisted call these once or twice per request: plain methods, not __getattr__.
    def seek(self, *args: Any) -> int:
        return int(self._file.seek(*args))

    def read(self, *args: Any) -> bytes:
        return bytes(self._file.read(*args))

    def close(self) -> None:
        self._file.close()

    def __getattr__(self, name: str) -> Any:  # closed, and the rest: the real file's
        return getattr(self._file, name)
