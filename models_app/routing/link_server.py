"""The router link, router side: listen, authenticate TCP peers, answer each connection's
acquires, and end what a closed connection held (docs/architecture.md, "The router link").

The router drops an acquire whose sender gave up (``LinkHost.stale``). When a connection closes
it cancels the connection's waiting acquires and ends the leases granted over it at once
(``lease.expired``, why ``disconnected``), without waiting for the lease TTL. An acquire the
engine decides on arrival is answered while its line is handled; only one that waits gets a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import socket
import stat
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from models_app.routing.link import (
    AUTH,
    CONNECT_TIMEOUT,
    DISCONNECTED,
    HELLO,
    PROTOCOL,
    READY,
    Address,
    LineProtocol,
    encode,
    link_key,
    proof,
)

if TYPE_CHECKING:
    from collections import Counter

    from models_app.routing.messages import AcquireAnswer, AcquireMessage, RenewMessage
    from routerpanel.router.engine import Engine
    from routerpanel.router.errors import Lease

log = logging.getLogger(__name__)


class LinkHost(Protocol):
    """What the link's router end asks of the router's desk (desk.Desk): the link knows this
    much of it, and imports nothing of the host."""

    @property
    def boot(self) -> str: ...
    @property
    def engine(self) -> Engine | None: ...
    @property
    def acquires(self) -> Counter[str]:  # by transport, for the metrics
        ...

    def stale(self, message: Mapping[str, Any]) -> bool: ...
    def drop_expired(self, message: Mapping[str, Any]) -> None: ...
    def begin_acquire(self, message: AcquireMessage) -> asyncio.Future[Lease]: ...
    def answer(
        self,
        request_id: str,
        future: asyncio.Future[Lease],
        on_grant: Callable[[str, str], None] | None = None,
    ) -> AcquireAnswer: ...
    async def acquire(
        self,
        message: AcquireMessage,
        answer_with: Callable[[AcquireAnswer], Awaitable[None]],
        on_grant: Callable[[str, str], None] | None = None,
        started: asyncio.Future[Lease] | None = None,
    ) -> None: ...
    def router_renew(self, message: RenewMessage) -> None: ...
    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]: ...


class LinkServer:
    """The router's listeners (a Unix socket; TCP too when ``tcp`` is given); every connection
    is a ``_Peer``."""

    def __init__(
        self, host: LinkHost, address: Address, tcp: Address | None = None,
        key: bytes | None = None,
    ) -> None:  # fmt: skip
        self.host = host
        self.address = address
        self.tcp = tcp  # where to listen for other hosts (port 0: any free port)
        self.tcp_link = ""  # the TCP address advertised once listening ("" when not)
        self._key = key
        self.peers: set[_Peer] = set()  # the connections that may send messages
        self.connections: set[_PeerProtocol] = set()  # every open one, proven or not
        self.refused = 0  # TCP connections that failed to prove the key (tests, logs)
        self._server: asyncio.AbstractServer | None = None
        self._tcp_server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        """Listen; return the Unix address to advertise ("" when it cannot: channels only).
        The TCP address, if any, is ``tcp_link`` afterwards."""
        if self.tcp is not None:
            await self._start_tcp(self.tcp)
        if self.address.kind != "unix":
            return ""
        path = Path(self.address.path)
        loop = asyncio.get_running_loop()
        try:
            _remove_stale(path)  # the router's lock says no other router owns this data dir
            old = os.umask(0o177)  # created 0600: no moment where another user could connect
            try:
                self._server = await loop.create_unix_server(
                    lambda: _PeerProtocol(self, authenticate=False), path=str(path)
                )
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
        except OSError as exc:
            log.warning("router link: cannot listen on %s (%s); channels only", path, exc)
            return ""
        return str(self.address)

    async def _start_tcp(self, tcp: Address) -> None:
        if self._key is None:
            self._key = link_key()
        loop = asyncio.get_running_loop()
        try:
            self._tcp_server = await loop.create_server(
                lambda: _PeerProtocol(self, authenticate=True), tcp.host, tcp.port
            )
        except OSError as exc:
            log.warning("router link: cannot listen on %s (%s); not over TCP", tcp, exc)
            return
        port = self._tcp_server.sockets[0].getsockname()[1]
        self.tcp_link = str(Address("tcp", host=tcp.host, port=port))

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def stop(self) -> None:
        servers = [s for s in (self._server, self._tcp_server) if s is not None]
        self._server = self._tcp_server = None
        if not servers:
            return
        for server in servers:
            server.close()
        for connection in list(self.connections):
            connection.transport.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                for server in servers:
                    await server.wait_closed()
        if self.address.kind == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.address.path)


class _PeerProtocol(LineProtocol):
    """The router's end of one connection: the hello, the proof of the key (TCP), then each
    message handed to the ``_Peer`` in the order it came (module doc)."""

    def __init__(self, server: LinkServer, authenticate: bool) -> None:
        super().__init__()
        self.server = server
        self.nonce = secrets.token_hex(16) if authenticate else ""  # "" once proven
        self._deadline: asyncio.TimerHandle | None = None
        self.peer: _Peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        server = self.server
        server.connections.add(self)
        self.peer = _Peer(server.host, self.transport)
        hello = {"type": HELLO, "boot": server.host.boot, "protocol": PROTOCOL}
        if self.nonce:  # TCP: the first line must prove the key, within CONNECT_TIMEOUT
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.peer.send(hello | {"nonce": self.nonce})
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(CONNECT_TIMEOUT, self._refuse)
        else:
            server.peers.add(self.peer)
            self.peer.send(hello)

    def received(self, message: dict[str, Any]) -> None:
        if self.nonce:
            self._authenticate(message)
            return
        try:
            self.peer.handle(message)  # one at a time, in order (see module doc)
        except Exception:  # a malformed message must not end the others' connection
            log.exception("router link: message %s failed", message.get("type"))

    def _authenticate(self, message: dict[str, Any]) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        key = self.server._key
        given = message.get("proof")
        if (
            key is None
            or message["type"] != AUTH
            or not isinstance(given, str)
            or not hmac.compare_digest(given, proof(key, self.nonce))
        ):
            self._refuse()
            return
        self.nonce = ""
        self.server.peers.add(self.peer)
        self.peer.send({"type": READY})

    def _refuse(self) -> None:
        if self.transport.is_closing():
            return
        self.server.refused += 1
        log.warning(
            "router link: refused a TCP connection from %s (no proof of the key: another "
            "SECRET_KEY, or not a web process)",
            self.transport.get_extra_info("peername"),
        )
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if exc is not None:
            log.info("router link: a connection ended: %s", exc)
        self.server.connections.discard(self)
        self.server.peers.discard(self.peer)
        self.peer.closed()


def _remove_stale(path: Path) -> None:
    """Remove what a killed router left at ``path`` (a socket only: never another file)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket")
    path.unlink()


class _Peer:
    """One web process's connection, router side: its waiting acquires and granted leases."""

    def __init__(self, host: LinkHost, transport: asyncio.Transport) -> None:
        self.host = host
        self.transport = transport
        self.acquires: dict[str, asyncio.Task[Any]] = {}
        self.leases: dict[str, str] = {}  # lease id -> request id, granted over this connection
        self.open = True

    def send(self, message: Mapping[str, Any]) -> None:
        if self.open and not self.transport.is_closing():
            self.transport.write(encode(message))

    async def answer(self, message: AcquireAnswer) -> None:
        self.send(message)

    def handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        host = self.host
        engine = host.engine
        if engine is None:
            return
        if kind == "router.acquire":
            request_id = str(message.get("request_id") or "")
            if not request_id or host.stale(message):
                host.drop_expired(message)  # its sender has answered its client: never run it
                return
            host.acquires["socket"] += 1
            acquire = cast("AcquireMessage", message)
            started = host.begin_acquire(acquire)
            if started.done():  # granted or refused at once: answered without a task
                self.send(host.answer(request_id, started, self._granted))
            else:
                self.acquires[request_id] = host.spawn(self._acquire(acquire, started))
        elif kind == "router.renew":
            host.router_renew(cast(Any, message))
        elif kind == "router.release":
            self.leases.pop(str(message.get("lease_id")), None)
            engine.release(str(message.get("lease_id")))
        elif kind == "router.cancel":
            request_id = str(message.get("request_id"))
            if (task := self.acquires.pop(request_id, None)) is not None:
                task.cancel()
            for lease_id in [k for k, v in self.leases.items() if v == request_id]:
                del self.leases[lease_id]
            engine.cancel(request_id)
        else:
            log.info("router link: unknown message %s", kind)

    async def _acquire(self, message: AcquireMessage, started: asyncio.Future[Lease]) -> None:
        request_id = message["request_id"]
        try:
            await self.host.acquire(message, self.answer, self._granted, started)
        finally:
            if self.acquires.get(request_id) is asyncio.current_task():
                del self.acquires[request_id]

    def _granted(self, lease_id: str, request_id: str) -> None:
        if self.open:
            self.leases[lease_id] = request_id
        elif self.host.engine is not None:  # the connection closed while it was granted
            self.host.engine.drop(lease_id, why=DISCONNECTED)

    def closed(self) -> None:
        """The web process is gone: its waiters leave, its leases end now."""
        self.open = False
        for task in list(self.acquires.values()):
            task.cancel()  # the engine's acquire leaves the queue, or gives a grant back
        self.acquires.clear()
        engine = self.host.engine
        if engine is not None:
            for lease_id in self.leases:
                with contextlib.suppress(Exception):  # the engine may be shutting down
                    engine.drop(lease_id, why=DISCONNECTED)
        self.leases.clear()
