"""HTTP/1.1 to a child on an asyncio protocol with the ``httptools`` parser (issue 16.3).

The proxy's client needs a small part of HTTP: one request out (the head and the body in one
write), one answer back, its body as it arrives, and the connection kept for the next request.
A well-kept general client (aiohttp, before: httpx) builds URL objects, cookie jars, tracing
signals, timeout contexts and a response object graph for every request; here a request is
one ``bytes`` and an answer is a parser's callbacks. Measured in one run on one real
llama-server (bench/upstream_clients.py, 300 requests × 5 rounds): a ``/tokenize`` costs 172 µs
here, 279 µs with aiohttp, 658 µs with httpx's transport; a bare relay with no timeouts, retry or
back-pressure, 107 µs.

What it does, each with its test in tests/app/test_proxy_fastpath.py, test_api_retry.py and
test_relay.py:

* bodies framed by ``Content-Length``, chunked (de-chunked: no extensions, no trailers) or
  ended by the child closing the connection; an answer to ``HEAD`` has no body;
* ``1xx`` informational answers are skipped (the first final answer is the answer);
* a connect timeout (``Connection timed out``) and a read timeout between two reads
  (``Read timeout``); a refused connect is ``Could not establish connection``; a malformed
  answer, or one that breaks off, ``Failed to read connection`` — cpp-httplib's texts (§8.14);
* back-pressure: past ``HIGH_WATER`` unread bytes the socket stops being read, so a child
  streaming faster than the client reads is slowed down by TCP, not buffered here;
* the connection goes back to the pool only when its answer was read to its end and the child
  did not ask to close; one the child closed while idle is noticed (EOF) and never reused.

The retry-once rule (a kept-alive connection that ends before any answer byte, at once: the
child had closed it) is the pool's (upstream.py): ``Stale`` tells it such a failure from a real
one. A second answer to one request is not read into the first, and ends the connection.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

import httptools

from models_app.api.upstream_errors import (
    CONNECT_FAILED,
    CONNECT_TIMEOUT,
    READ_FAILED,
    READ_TIMEOUT,
    Stale,
    UpstreamError,
)

HIGH_WATER = 256 * 1024  # unread bytes past which the socket is no longer read
LOW_WATER = 64 * 1024  # ... and below which it is read again

# A kept-alive connection the child closed while it was idle, crossing our request, ends at
# once: its close is seen in the loop's next turns. One that ends later, without an answer
# byte, was read by a child that then failed: the request is not sent again (a second
# generation, or a dead child's "Could not establish connection" in place of its own error).
STALE_WINDOW = 0.25

HEADER_LINE = b"%s: %s\r\n"


def encode_request(
    method: str, target: str, netloc: str, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """The request as it goes out: ``Host``, the given headers, ``Content-Length`` for a body
    (or any POST, PUT, PATCH), then the body."""
    start = (method.encode(), target.encode("latin-1"), netloc.encode())
    lines = [b"%s %s HTTP/1.1\r\nhost: %s\r\n" % start]
    lines.extend(map(HEADER_LINE.__mod__, headers))  # no Python frame per header
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(b"content-length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)


class Answer:
    """A child's answer: status and headers read, the body still to come (``chunks``)."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_conn",
        "_lower",
        "_waiter",
        "complete",
        "error",
        "raw_headers",
        "sink",
        "status",
    )

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.status = 0
        self.raw_headers: tuple[tuple[bytes, bytes], ...] = ()
        self._lower: dict[str, str] = {}
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self.complete = False  # the body's end was read
        self.error: str | None = None  # the body broke off (cpp-httplib's text)
        # Takes each chunk as it is parsed, in the connection's callback; False: not now (the
        # chunk is kept for ``take``). Only while nothing is kept, so the order holds (pump.py).
        self.sink: Callable[[bytes], bool] | None = None

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        return self._lower.get(name.lower())

    def has_header(self, name: str) -> bool:
        return name.lower() in self._lower

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (what arrived together, joined); raises ``UpstreamError`` if
        the child breaks off or goes quiet for longer than the read timeout."""
        while await self.more():
            chunk = self.take()
            if chunk is not None:
                yield chunk

    def take(self) -> bytes | None:
        """What arrived and was not taken yet, as one piece (one message to the HTTP server and
        one write to the client instead of one per chunk of the child); None when nothing."""
        chunks = self._chunks
        if not chunks:
            return None
        chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered -= len(chunk)
        if self._conn.paused and self._buffered <= LOW_WATER:
            self._conn.resume()
        return chunk

    async def more(self) -> bool:
        """Wait for something to ``take``, the end or a failure (or a ``wake`` for another
        reason); False once the body ended and all of it was taken. Raises ``UpstreamError``
        when the child broke off or went quiet, once what came before was taken."""
        if not self._chunks and not self.complete and self.error is None:
            waiter = self._waiter = self._conn.loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        if self._chunks:
            return True
        if self.error is not None:
            raise UpstreamError(self.error)
        return not self.complete

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, chunk: bytes) -> None:
        if self.sink is not None and not self._chunks and self.sink(chunk):
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > HIGH_WATER and not self._conn.paused:
            self._conn.pause()
        self.wake()

    async def aclose(self) -> None:
        """Give the connection back when the body was read to its end; else close it (the
        child sees the close and stops generating, §8.15)."""
        self._conn.finished(self, whole=self.complete and not self._chunks)


class Connection(asyncio.Protocol):
    """One connection to a child; one answer at a time (see module doc)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self.loop = loop
        self.read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.answer: Answer | None = None  # the answer being read
        self.head: asyncio.Future[None] | None = None  # set when the answer's head is in
        self.got_bytes = False  # a byte of the current answer arrived
        self.closed = False  # EOF, an error or our own close: never reused
        self.keep = True  # the child did not ask to close
        self.paused = False
        self.requests = 0  # sent on this connection (more than one: it was kept alive)
        self.idle_since = 0.0
        self.on_idle: Callable[[Connection], None] | None = None  # the pool takes it back
        self._headers: list[tuple[bytes, bytes]] = []
        self._informational = False
        self._no_body = False  # an answer to HEAD
        self._until_close = False  # no length, not chunked: the body ends with the connection
        self.last_read = 0.0  # loop time of the child's last bytes (or of the request)
        self.sent_at = 0.0  # loop time the current request was written
        self._deadline: asyncio.TimerHandle | None = None  # the read timeout's one timer

    # ---- the exchange -----------------------------------------------------------------------

    async def send(self, request: bytes, method: str) -> Answer:
        """Write the request; return the answer once its head is in. Raises ``Stale`` when the
        connection ended before any answer byte, ``UpstreamError`` for anything else."""
        if self.closed or self.transport is None:
            raise Stale(READ_FAILED)
        answer = self.answer = Answer(self)
        self.head = self.loop.create_future()
        self.got_bytes = False
        self._headers = []
        self._no_body = method == "HEAD"
        self._until_close = False
        self.requests += 1
        self.last_read = self.sent_at = self.loop.time()
        if self._deadline is None:
            self._deadline = self.loop.call_at(self.last_read + self.read_timeout, self._due)
        self.transport.write(request)
        try:
            await self.head
        except asyncio.CancelledError:
            self.close()  # the client left while the child thought: the child sees the close
            raise
        return answer

    def _due(self) -> None:
        """The read timeout's timer: one per connection, moved lazily, not one per read.

        It fails the answer when the child sent nothing for ``read_timeout`` while its reader
        waited for it (the head, or more of the body); otherwise it is set again for when that
        could next be true. Reading is paused (the client is behind) or the reader is busy
        writing: the child's silence is ours, the timeout starts again. With no answer in
        progress it stops; the next request sets it again.
        """
        self._deadline = None
        answer = self.answer
        if answer is None or self.closed:
            return
        now = self.loop.time()
        waiting = (self.head is not None and not self.head.done()) or answer._waiter is not None
        if self.paused or not waiting:
            self.last_read = now
        elif now - self.last_read >= self.read_timeout:
            self._fail(READ_TIMEOUT)
            return
        self._deadline = self.loop.call_at(self.last_read + self.read_timeout, self._due)

    def finished(self, answer: Answer, whole: bool) -> None:
        """The caller is done with ``answer``: keep the connection if it can serve again."""
        if answer is not self.answer:
            return
        self.answer = None
        if not (whole and self.keep and not self.closed):
            self.close()
        self.idle_since = time.monotonic()
        if self.on_idle is not None:
            self.on_idle(self)

    def reusable(self, now: float, expiry: float) -> bool:
        return not self.closed and self.answer is None and now - self.idle_since < expiry

    def close(self) -> None:
        self.closed = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self.transport is not None:
            self.transport.close()

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # ---- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.answer is None:  # bytes nobody asked for: this connection is not to be trusted
            self.close()
            return
        self.got_bytes = True
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(READ_FAILED)

    def eof_received(self) -> bool:
        answer, head = self.answer, self.head
        if (
            answer is not None
            and head is not None
            and head.done()
            and self._until_close
            and not answer.complete
            and answer.error is None
        ):
            answer.complete = True  # the body was "until close": this is its end
            self.keep = False
            answer.wake()
        # The child closed its side: whatever was in flight has failed now, not when asyncio
        # reports the close (returning False closes the transport; connection_lost runs again
        # then and finds nothing left to do).
        self.connection_lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        answer = self.answer
        if answer is None:
            return
        if self.head is not None and not self.head.done():
            stale = not self.got_bytes and self.loop.time() - self.sent_at < STALE_WINDOW
            self.head.set_exception(Stale(READ_FAILED) if stale else UpstreamError(READ_FAILED))
        elif not answer.complete and answer.error is None:
            answer.error = READ_FAILED
            answer.wake()

    def _fail(self, text: str) -> None:
        answer = self.answer
        if self.head is not None and not self.head.done():
            self.head.set_exception(UpstreamError(text))
        elif answer is not None and not answer.complete:
            answer.error = text
            answer.wake()
        self.close()

    # ---- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.answer is not None and self.answer.complete:
            self.keep = False  # a second answer to one request: never trust this connection

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # informational: the final answer follows
            self._informational = True
            self._headers = []
            return
        answer = self.answer
        if answer is None or self.head is None or answer.complete:
            return  # a second answer to one request (keep is off): not merged into the first
        answer.status = status
        answer.raw_headers = tuple(self._headers)
        lower: dict[str, str] = {}
        for name, value in self._headers:
            lower.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        answer._lower = lower
        self.keep = self.parser.should_keep_alive()
        # Only chunked frames a body; any other transfer coding without a length ends at close
        chunked = lower.get("transfer-encoding", "").rstrip().lower().endswith("chunked")
        framed = "content-length" in lower or chunked
        self._until_close = not framed and not self._no_body and status not in (204, 304)
        if self._no_body:  # HEAD: the parser would wait for a body that never comes
            answer.complete = True
            self.keep = False
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        answer = self.answer
        if answer is not None and not self._informational and not answer.complete:
            answer._feed(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        answer = self.answer
        if answer is not None:
            answer.complete = True
            answer.wake()


async def connect(host: str, port: int, connect_timeout: float, read_timeout: float) -> Connection:
    """A new connection to ``host:port``; ``UpstreamError`` in cpp-httplib's words."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(connect_timeout):
            _, conn = await loop.create_connection(
                lambda: Connection(loop, read_timeout), host.strip("[]"), port
            )
    except TimeoutError:
        raise UpstreamError(CONNECT_TIMEOUT) from None
    except OSError:
        raise UpstreamError(CONNECT_FAILED) from None
    return conn
