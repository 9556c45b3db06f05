"""Daphne's server for ``serve``: no POST form parsing, and bodies bounded in size and time.

Imported only when ``serve`` runs: importing ``daphne.server`` installs Twisted's asyncio reactor
(Daphne's doing). Our changes to Twisted and Daphne are made by ``install()``, which ``serve``
calls before it builds the server; importing this module changes nothing.

``RouterPanelServer`` puts its parts in place: each request's ``BodyGuard`` (``daphne_guard``:
413 and 408 inside Twisted, before the application), the listening port's ``accept`` and each
connection's tuning (``daphne_connection``), and how an answer's bytes leave (``daphne_writes``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import daphne.http_protocol
from daphne.server import Server
from twisted.internet import asyncioreactor, defer, tcp
from twisted.python import deprecate
from twisted.python import log as twisted_log
from twisted.python.failure import Failure
from twisted.web import http
from twisted.web.http import Request as TwistedRequest

from models_app.api.config import ApiConfig
from models_app.api.request import CHUNK_NOW, body_timeout
from models_app.servers.daphne_connection import accept, idle_timer_from_the_start, tune_channel
from models_app.servers.daphne_guard import BodyGuard
from models_app.servers.daphne_writes import chunk_now, send_now

ASGI_VERSION = {"version": "3.0"}


class RouterPanelServer(Server):
    """Daphne's ``Server``, guarding each request's body (``daphne_guard.BodyGuard``).

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
    """Make this process's Twisted and Daphne serve as ``serve`` wants them to: Daphne reaches
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
