"""Daphne's connections under ``serve``: how a listening port accepts (``accept``), and what
is done once per connection instead of per request (``tune_channel``: the idle timer, the
addresses, the writes of ``daphne_writes.write_soon``). ``daphne_server.RouterPanelServer``
puts them in place when a port listens and when a connection's first request arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from twisted.internet import error, tcp
from twisted.web import http

from models_app.servers.daphne_writes import write_soon

log = logging.getLogger(__name__)


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
