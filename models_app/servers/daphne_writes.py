"""How an answer's bytes leave a Daphne connection under ``serve``: at the end of the loop's
turn rather than a turn later (``write_soon``, ``send_now``), and a streamed piece as one
chunk written at once (``chunk_now``, the scope's ``request.CHUNK_NOW``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import daphne.server  # noqa: F401  # first: it installs Twisted's asyncio reactor, imported below
from twisted.internet import reactor, tcp


def chunk_now(request: Any, body: bytes) -> bool:
    """Write ``body`` as the next piece of ``request``'s streamed answer when its head went out
    chunked and it is not finished (then True); False: it must go as an ASGI message (the first
    piece, which Twisted writes with the head, or an answer framed otherwise)."""
    if not request.chunked or request.finished:
        return False
    write_chunk(request, body)
    return True


def write_chunk(request: Any, body: bytes) -> None:
    """Write ``body`` to a chunked response whose head went out, as one piece.

    What Daphne and Twisted do for each streamed token comes to the same bytes: Daphne checks
    the message again and looks ``Request.write`` up through Twisted's deprecation proxy of
    ``twisted.web.http`` (a proxy object and an attribute walk per call), and Twisted frames the
    chunk as four strings, handed on one by one through the channel and the transport. Here the
    frame is one string, written to the transport once. A request whose client left writes
    nothing, as Twisted's own ``write`` does.
    """
    if request._disconnected or not body:
        return
    request.sentLength += len(body)
    transport = request.channel.transport
    frame = b"%x\r\n%b\r\n" % (len(body), body)
    writer = getattr(transport.startWriting, "__self__", None)
    if type(writer) is _SoonWriter:
        writer.send(frame)
    else:
        transport.write(frame)


def write_soon(transport: Any) -> None:
    """Send what a TCP connection was given at the end of this turn of the loop, not the next.

    Twisted buffers each write and asks the reactor to watch the socket for writability: on
    asyncio, an ``add_writer`` (a system call), a turn of the loop to learn what is always true
    of an idle socket (it can take bytes), the send, and a ``remove_writer`` (another system
    call), for every piece of every answer — per streamed token, a quarter of what the server
    spent. Here the connection's ``startWriting`` schedules one flush with ``call_soon`` instead:
    writes of the same turn still leave in one send, and only what the socket would not take
    makes Twisted watch it as before. Once per connection; a connection that is not a plain
    TCP or Unix socket (TLS wraps its own) is left as it is.
    """
    if not isinstance(transport, tcp.Server) or "startWriting" in vars(transport):
        return
    _SoonWriter(transport).install()


def send_now(transport: Any) -> None:
    """Send what a connection under ``write_soon`` holds now, not at the end of the turn.

    For the end of an answer: nothing else of it can come in this turn, so waiting for the
    turn's end only costs the loop one more turn (and the client the time it takes).
    """
    writer = getattr(transport.startWriting, "__self__", None)
    if type(writer) is _SoonWriter and writer.pending:
        writer.flush_now()


class _SoonWriter:
    """One connection's writes, flushed at the end of the loop's turn (see ``write_soon``)."""

    __slots__ = ("due", "loop", "pending", "transport", "watch")

    def __init__(self, transport: tcp.Server) -> None:
        self.transport = transport
        # Twisted's own startWriting: the reactor watches the socket.
        self.watch: Callable[[], None] = transport.startWriting
        self.loop = asyncio.get_running_loop()
        self.pending = False
        self.due: asyncio.Handle | None = None

    def install(self) -> None:
        self.transport.startWriting = self.start_writing  # type: ignore[method-assign]

    def start_writing(self) -> None:
        """The transport has something to send (or to close after sending)."""
        if self.pending or self.transport in reactor._writers:
            return  # a flush is due, or the reactor already waits to write the rest
        self.pending = True
        self.due = self.loop.call_soon(self.flush)

    def flush_now(self) -> None:
        """The flush that is due, at once (``send_now``)."""
        if self.due is not None:
            self.due.cancel()
        self.flush()

    def send(self, data: bytes) -> None:
        """Send ``data`` now when nothing is waiting to go before it; what the socket does not
        take (or all of it, when something waits) goes Twisted's way, after what waits.

        A streamed token is the only write of its turn, so the flush at the end of the turn
        would send it alone anyway: sent here, it skips the flush and Twisted's buffers."""
        transport = self.transport
        if (
            not self.pending
            and transport.connected
            and not transport.disconnecting
            and not transport._writeDisconnected
            and not transport.TLS
            and not transport._tempDataBuffer
            and len(transport.dataBuffer) == transport.offset
            and transport not in reactor._writers
        ):
            try:
                sent = transport.socket.send(data)
            except OSError:  # full, or broken: Twisted's write finds out and acts on it
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        transport.write(data)  # type: ignore[no-untyped-call]

    def flush(self) -> None:
        """Send what can be sent now, as the reactor would once told the socket is writable."""
        self.pending, self.due = False, None
        transport = self.transport
        if not transport.connected or transport.fileno() == -1:
            return
        try:
            why = transport.doWrite()  # type: ignore[no-untyped-call]
        except Exception as error:  # the reactor's own rule for a failing doWrite
            why = error
        if why:
            reactor._disconnectSelectable(transport, why, False)
        elif transport.dataBuffer or transport._tempDataBuffer:
            self.watch()  # the socket's buffer is full: wait for it as Twisted does
