"""Daphne's server for ``serve``: no POST form parsing, and bodies bounded in size and time.

Imported only when ``serve`` runs: importing ``daphne.server`` installs Twisted's asyncio reactor
(Daphne's doing). Our changes to Twisted and Daphne are made by ``install()``, which ``serve``
calls before it builds the server; importing this module changes nothing.

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
import collections
import contextlib
import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import daphne.http_protocol
from daphne.server import Server
from twisted.internet import asyncioreactor, defer, error, reactor, tcp
from twisted.python import deprecate
from twisted.python import log as twisted_log
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.http import Request as TwistedRequest

from models_app.api.app import is_api_path
from models_app.api.config import ApiConfig
from models_app.api.errors import encoded_error
from models_app.api.request import CHUNK_NOW, JSON_TYPE, body_timeout

log = logging.getLogger(__name__)

LINGER = 5.0  # seconds an answered connection keeps draining the client's upload before closing
ASGI_VERSION = {"version": "3.0"}
REASONS = {408: b"Request Timeout", 413: b"Content Too Large"}


class RouterPanelServer(Server):
    """Daphne's ``Server``, guarding each request's body (see the module doc).

    It also turns off Twisted's POST form parsing: for each POST with a body, Twisted parses
    the Content-Type with the ``email`` package (about 75 µs) and a multipart or URL-encoded
    body into ``request.args`` — which Daphne never reads: it hands ASGI the raw body. Daphne
    builds its ``WebRequest`` itself, without Twisted's ``parsePOSTFormSubmission`` argument,
    but it reports each new request here before any byte of its body has been read, so the
    flag the argument would set is set here instead, and the guard is installed.
    """

    def __init__(
        self, *args: Any, stopping: Callable[[], Awaitable[Any]] | None = None, **kwargs: Any
    ) -> None:
        """``stopping``: the application's way of stopping (serve.Stopping), run when the
        reactor stops, before Daphne cancels what still runs; None: nothing first."""
        super().__init__(*args, **kwargs)
        self.body_limit = ApiConfig().max_body_bytes
        self.body_timeout = body_timeout()
        self.stopping = stopping
        self.ports: list[Any] = []

    def kill_all_applications(self) -> defer.Deferred[Any]:
        """Daphne cancels every running request as soon as the reactor is told to stop (a
        stream is cut mid-chunk). Here the listening sockets close first, then ``stopping``
        gives the requests under way their grace and ends the rest with a reason; Daphne's
        cancel is left only what that did not end."""

        async def stop() -> None:
            for port in self.ports:
                port.stopListening()
            if self.stopping is not None:
                await self.stopping()
            await defer.Deferred.asFuture(
                super(RouterPanelServer, self).kill_all_applications(), asyncio.get_running_loop()
            )

        return defer.Deferred.fromFuture(asyncio.ensure_future(stop()))

    async def handle_reply(self, protocol: Any, message: dict[str, Any]) -> None:
        """The application's ``send``. A piece of a streamed body, once the head went out, is
        written here as one chunk (see ``chunk_now``); anything else goes Daphne's way, and the
        end of an answer is sent at once (``send_now``). Daphne drops a WebSocket close's
        reason: one with a reason is sent here (``close_with_reason``)."""
        if message["type"] == "websocket.close" and message.get("reason"):
            close_with_reason(protocol, message, self.connections)
        elif message["type"] != "http.response.body":
            await super().handle_reply(protocol, message)
        elif message.get("more_body"):
            if not chunk_now(protocol, message.get("body", b"")):
                await super().handle_reply(protocol, message)
        else:  # the answer's last piece: it leaves now, not at the end of the loop's turn
            channel = getattr(protocol, "channel", None)  # Twisted drops it when finished
            await super().handle_reply(protocol, message)
            if channel is not None:
                send_now(channel.transport)

    def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
        """Daphne's, for an HTTP request with ``chunk_now`` in the scope's extensions
        (``request.CHUNK_NOW``: the proxy's pump writes each streamed piece with it, without an
        ASGI message and a coroutine per token) and a ``_RequestInbox`` for its input instead of
        an ``asyncio.Queue`` (a sixth of what this call cost). WebSockets go Daphne's way."""
        if not isinstance(protocol, TwistedRequest):
            return super().create_application(protocol, scope)
        connection = self.connections.get(protocol)
        if connection is None:  # the client left before its request was complete
            return None
        assert "application_instance" not in connection
        scope.setdefault("asgi", ASGI_VERSION)
        extensions = scope.setdefault("extensions", {})
        extensions[CHUNK_NOW] = functools.partial(chunk_now, protocol)
        inbox = _RequestInbox()
        instance = self.application(
            scope=scope, receive=inbox.get, send=functools.partial(self.handle_reply, protocol)
        )
        connection["application_instance"] = asyncio.ensure_future(instance)
        return inbox

    def protocol_connected(self, protocol: Any) -> None:
        if isinstance(protocol, TwistedRequest):
            protocol._parsePOSTFormSubmission = False
            BodyGuard(protocol, self.body_limit, self.body_timeout).install()
            if protocol.channel is not None:
                tune_channel(protocol)
        super().protocol_connected(protocol)

    # ``serve`` prints its URL once every endpoint listens, and reports a failed listen itself
    # (one line and a non-zero exit) instead of Daphne's CRITICAL log line and a clean exit.
    on_listening: Callable[[], None] | None = None
    listen_failure: BaseException | None = None

    def listen_success(self, port: Any) -> None:
        quiet_access_log(self.http_factory)  # the factory has started: before any request
        idle_timer_from_the_start(self.http_factory)
        if isinstance(port, tcp.Port):
            port.doRead = functools.partial(accept, port)  # type: ignore[method-assign]
        self.ports.append(port)
        super().listen_success(port)
        if len(self.listening_addresses) == len(self.endpoints) and self.on_listening:
            self.on_listening()

    def listen_error(self, failure: Failure) -> None:
        self.listen_failure = failure.value
        self.stop()


class _RequestInbox:
    """One HTTP request's input to its application: ``asyncio.Queue``'s ``put_nowait`` and
    ``get``, without what a request never uses (a bound, ``join``, a lock-like event).

    Daphne puts the body and, at the end, ``http.disconnect`` with ``put_nowait``; the
    application takes them with ``get``. Several getters wait in turn, in the order they came;
    a getter cancelled after it was woken hands the wake-up on, as ``asyncio.Queue`` does.
    """

    __slots__ = ("getters", "items")

    def __init__(self) -> None:
        self.items: collections.deque[dict[str, Any]] = collections.deque()
        self.getters: collections.deque[asyncio.Future[None]] = collections.deque()

    def put_nowait(self, item: dict[str, Any]) -> None:
        self.items.append(item)
        self._wake()

    async def get(self) -> dict[str, Any]:
        while not self.items:
            getter = asyncio.get_running_loop().create_future()
            self.getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                with contextlib.suppress(ValueError):
                    self.getters.remove(getter)
                if self.items:  # woken, then cancelled: the next getter takes the item
                    self._wake()
                raise
        return self.items.popleft()

    def _wake(self) -> None:
        while self.getters:
            getter = self.getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return


def close_with_reason(protocol: Any, message: dict[str, Any], connections: Any) -> None:
    """Close an open WebSocket with the code and the reason the application gave (the
    dashboard's "too many tabs"); Daphne's own close sends the code alone."""
    if protocol not in connections or connections[protocol].get("disconnected"):
        return
    if getattr(protocol, "state", None) != protocol.STATE_OPEN:
        protocol.handle_reply(message)  # not open yet: Daphne refuses the handshake
        return
    protocol.sendClose(code=message.get("code") or 1000, reason=message["reason"])


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


def _unwrap_daphne_http() -> None:
    """Let Daphne reach ``twisted.web.http`` itself, not through Twisted's deprecation proxy.

    Twisted wraps the module in a ``_ModuleProxy`` that warns on deprecated names; Daphne calls
    ``http.Request.write``, ``http.Request.finish`` and others through it, several times per
    request, and each lookup runs the proxy's Python ``__getattribute__`` (3 % of the server's
    time per ``/tokenize`` in a profile). Daphne uses none of the deprecated names.
    """
    proxy = daphne.http_protocol.http
    if isinstance(proxy, deprecate._ModuleProxy):
        daphne.http_protocol.http = object.__getattribute__(proxy, "_module")


def _call_without_log_context(
    selectable: Any, function: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """What Twisted's asyncio reactor calls when a socket it watches is ready (in place of
    ``twisted.python.log.callWithLogger``): ``function`` in a ``try``, its failure logged.

    Twisted's own also pushes a log context with the socket's ``logPrefix`` as the "system"
    of any legacy log line written meanwhile, about 2 µs per call (a dict copied, a context
    pushed and popped, through Twisted's thread-local tracker): on every request (its read)
    and every new connection (the accept). Nothing in ``serve`` writes such lines; a failure
    is still logged, with the prefix.
    """
    try:
        return function(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException:
        twisted_log.err(system=_log_prefix(selectable))  # type: ignore[no-untyped-call]
        return None


def _log_prefix(selectable: Any) -> str:
    try:
        return str(selectable.logPrefix())
    except Exception:
        return "(buggy logPrefix method)"


def install() -> None:
    """Make this process's Twisted and Daphne serve as the module doc says: Daphne reaches
    ``twisted.web.http`` directly, and the reactor dispatches a ready socket without a log
    context. Called once by ``serve`` before the server is built; calling it again is harmless."""
    _unwrap_daphne_http()
    asyncioreactor.callWithLogger = _call_without_log_context  # type: ignore[attr-defined,assignment]


def quiet_access_log(factory: http.HTTPFactory) -> None:
    """Stop Twisted's HTTP factory from writing an access line per request.

    Twisted formats a combined-log line for every request (date, escaped client, path,
    referrer and user agent) and hands it to Twisted's log, which Daphne at verbosity 0 sends
    nowhere: about 6 % of the server's CPU per ``/tokenize`` went into lines nobody reads.
    Daphne's own access log (``--access-log``, its ``action_logger``) is separate; ``serve`` keeps
    none. Called once the factory has started (``startFactory`` sets the log file).
    """
    factory.log = _no_access_line  # type: ignore[method-assign]


def _no_access_line(request: http.Request) -> None:
    """Write nothing (``HTTPFactory.log`` once ``quiet_access_log`` ran)."""


def tune_channel(request: Any) -> None:
    """Once per connection, at its first request: take Twisted's per-request work that gives
    the same answer for the whole connection off each following request.

    * Its writes go out at the end of the loop's turn (``write_soon``).
    * Its idle timeout is an asyncio timer (``_IdleTimer``), not one in Twisted's own timer
      heap, which re-arms the asyncio timer under it at each change.
    * Its addresses are the ones its first request read: Twisted's ``Request`` asks the
      channel for both on every request (a ``getsockname`` system call and an address object
      each time). A plain TCP connection says it is not TLS without Daphne's zope interface
      lookup per request.
    """
    channel = request.channel
    if "getHost" in vars(channel):
        return
    transport = channel.transport
    write_soon(transport)
    if "resetTimeout" not in vars(channel):  # a connection its factory did not build
        _IdleTimer(channel).install()
    host, peer = request.host, request.client  # what Twisted's Request just asked the channel
    channel.getHost = lambda: host
    channel.getPeer = lambda: peer
    if isinstance(transport, tcp.Server) and not transport.TLS:
        channel.isSecure = _plain


def _plain() -> bool:
    """``isSecure`` of a plain TCP connection (``tune_channel``)."""
    return False


_twisted_accept: Any = tcp.Port.doRead  # what knows every accept error (see ``accept``)


def accept(port: Any) -> None:
    """A listening port's ``doRead``: accept the connections waiting, as Twisted's would.

    Twisted's ``Port.doRead`` wraps each accept in a buffering logger and a generator, and sets
    close-on-exec on every socket it accepts (two ``fcntl`` calls), which Python's ``accept``
    has already done (PEP 446: a socket it makes is not inheritable). Here the common case goes
    straight: accept, build the protocol and its transport, make the connection, with Twisted's
    adaptive count of accepts per wake-up (a burst is taken in few turns). What is not a plain
    "nothing more to accept" — too many open files (Twisted frees its reserved descriptor and
    sheds what waits), a connection aborted before its accept, a firewall's EPERM — is left to
    Twisted's own ``doRead``, which knows each of them.

    Each new connection is read at once, in the same turn of the loop, instead of one turn
    later: a client sends its request right after its connect, so it is usually waiting.
    """
    accepted = 0
    try:
        for _ in range(port.numberAccepts):
            try:
                skt, addr = port.socket.accept()
            except BlockingIOError:
                break
            except OSError:
                _twisted_accept(port)
                return
            accepted += 1
            if len(addr) == 4:  # IPv6: the scope id in the host, as Twisted gives it
                host = socket.getnameinfo(addr, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
                addr = (host[0], *addr[1:])
            protocol = port.factory.buildProtocol(port._buildAddr(addr))
            if protocol is None:
                skt.close()
                continue
            session = port.sessionno
            port.sessionno = session + 1
            transport = port.transport(skt, protocol, addr, port, session, port.reactor)
            protocol.makeConnection(transport)
            # A client sends its request right after its connect: it is most often here
            # already. Read it now, as the reactor would once the loop came round (nothing
            # there: one recv that says so).
            if transport.connected and not transport.disconnecting:
                port.reactor._readOrWrite(transport, True)
    except Exception:  # one connection's failure must not stop the listening port
        log.exception("accepting a connection failed")
    if accepted == port.numberAccepts:
        port.numberAccepts += 20
    else:
        port.numberAccepts = max(1, accepted)


def idle_timer_from_the_start(factory: http.HTTPFactory) -> None:
    """Give each connection the factory builds its ``_IdleTimer`` before it is made, so that
    Twisted's own timer is never armed (``connectionMade`` starts the idle timeout). Once per
    factory; a connection is built for every accepted socket, before any request."""
    if "buildProtocol" in vars(factory):
        return
    build = factory.buildProtocol

    def build_protocol(address: Any) -> Any:
        protocol = build(address)
        channel = getattr(protocol, "_channel", None)  # HTTP/1.1 behind Twisted's generic one
        if channel is not None:
            _IdleTimer(channel).install()
        return protocol

    factory.buildProtocol = build_protocol  # type: ignore[assignment]


class _IdleTimer:
    """A connection's idle timeout: Twisted's ``TimeoutMixin`` contract on an asyncio timer.

    Twisted stops the idle timeout when a request starts (``setTimeout(None)``), starts it
    again when the answer is done, and moves it on each read (``resetTimeout``), all in its own
    timer heap, which re-arms its asyncio timer each time. Here the timer is asyncio's own, and
    a read only moves ``deadline``: the timer, when it fires, times the connection out or sleeps
    on to the moved deadline. ``setTimeout(None)`` cancels it; a lost connection calls that.
    """

    __slots__ = ("channel", "deadline", "handle", "loop")

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.loop = asyncio.get_running_loop()
        self.deadline = 0.0
        self.handle: asyncio.TimerHandle | None = None

    def install(self) -> None:
        channel = self.channel
        armed = channel._TimeoutMixin__timeoutCall
        if armed is not None:  # Twisted's own timer, set when the connection was made
            with contextlib.suppress(error.AlreadyCalled, error.AlreadyCancelled):
                armed.cancel()
            channel._TimeoutMixin__timeoutCall = None
            self.set_timeout(channel.timeOut)
        channel.setTimeout = self.set_timeout
        channel.resetTimeout = self.reset

    def set_timeout(self, period: float | None) -> float | None:
        """``TimeoutMixin.setTimeout``: the new period (None: no timeout); returns the old."""
        channel = self.channel
        previous: float | None = channel.timeOut
        channel.timeOut = period
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if period is not None:
            self.deadline = self.loop.time() + period
            self.handle = self.loop.call_at(self.deadline, self.fire)
        return previous

    def reset(self) -> None:
        """``TimeoutMixin.resetTimeout``: the period starts again now, if there is one."""
        if self.handle is not None and self.channel.timeOut is not None:
            self.deadline = self.loop.time() + self.channel.timeOut

    def fire(self) -> None:
        if self.loop.time() < self.deadline:  # moved since: sleep on to it
            self.handle = self.loop.call_at(self.deadline, self.fire)
            return
        self.handle = None
        self.channel.timeoutConnection()


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
