"""Team mode's data path: one persistent connection per web process to its router (issue 16.2).

Acquire, renew, release and cancel go over one socket between a web process and ``runrouter``
instead of the Redis channel layer (a channels_redis send+receive costs ~1.6 ms, a round trip
on a kept socket ~0.1 ms). The channel layer stays for events, the dashboard, discovery and the
calls (load, unload, snapshot…); a router that advertises no address, or one out of reach, is
used over the channel layer as before.

**Addresses.** ``unix:PATH`` (the router's data dir, mode 0600, replaced when stale, removed on
exit), and ``tcp:HOST:PORT`` for web processes on other hosts (several nodes, issue 18): a node
whose children listen on an address other machines reach (``--advertise``, not loopback), or
one given ``--link-port``, listens there too. The router advertises both in its heartbeat
(liveness.py, ``link`` and ``tcp``) beside its boot id; a web process uses the Unix socket when
the heartbeat comes from its own host, else the TCP address (``ROUTERPANEL_ROUTER_LINK_VIA=tcp``:
always TCP, for a container without the router's data volume).

**Authentication (TCP).** Anyone on the network can open a TCP connection, so there the router's
hello carries a random ``nonce`` and the first line the web process sends must be
``{"type": "link.auth", "proof"}``: HMAC-SHA256 of the nonce under a key derived from the
installation's ``SECRET_KEY`` (every node and web process shares it; it never travels). A wrong
or missing proof closes the connection before any message is handled; a right one is answered
``link.ready``. The web process treats a refusal as a failed connect: it backs off and the
channel layer serves meanwhile. A Unix socket needs none of this: its file mode admits only the
router's user.

**Framing.** One JSON object per line (UTF-8, ``\\n``), at most ``LINE_LIMIT`` bytes, written
and read with ``orjson`` (a message each way per acquire and one per release, on both ends: the
standard library's ``json`` made a team-mode request 35–48 µs slower in a paired run). The router
speaks first: ``{"type": "link.hello", "boot", "protocol"}``. Then the web side sends the
router protocol's messages (routing/messages.py) without a reply channel — ``router.acquire`` (with
``request_id``, ``sent``, ``expires``, ``boot``), ``router.renew``, ``router.release``,
``router.cancel`` — and the router answers an acquire with the same ``router.queued`` /
``router.granted`` / ``router.rejected`` payloads as on the channel layer, each naming its
``request_id``: many requests share the connection, multiplexed by id.

**Order.** Each end hands a message on as its bytes arrive (``data_received``, no reader task),
one at a time: the router hands a connection's lines to the engine in the order they came, so
an acquire and the cancel or release that follows it are never reordered. An acquire the
engine decides on arrival (a grant on a loaded model with nobody queued, or a rejection) is
answered while its line is handled; only one that has to wait gets a task.

**Deadlines and loss.** The router drops an acquire whose sender gave up (``LinkHost.stale``:
expired, another boot, sent while its heartbeat lapsed). When a connection closes, the router
cancels its waiting acquires and ends the leases granted over it at once (``lease.expired``,
why ``disconnected``), without waiting for the lease TTL. On the web side every request still
waiting on a connection that closes is answered 503 ``router unavailable`` at once; the router's
heartbeat watch answers them too when the router is frozen or replaced (the connection stays).
A connection that cannot be made is retried with back-off; meanwhile the channel path serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import socket
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import orjson

from models_app.singleflight import SingleFlight

if TYPE_CHECKING:
    from collections import Counter

    from models_app.liveness import RouterWatch
    from models_app.routing.messages import AcquireAnswer, AcquireMessage, RenewMessage
    from routerpanel.router.engine import Engine
    from routerpanel.router.errors import Lease

log = logging.getLogger(__name__)


class LinkHost(Protocol):
    """What the link's router end asks of the router host (worker.RouterHost): the link knows
    this much of it, and imports nothing of the worker."""

    boot: str
    engine: Engine | None
    acquires: Counter[str]  # by transport, for the metrics

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


PROTOCOL = 1
HELLO = "link.hello"
AUTH = "link.auth"
READY = "link.ready"
LINE_LIMIT = 1 << 20  # bytes in one line (a message); a longer one closes the connection
SOCKET_NAME = "router.sock"
UNIX_PATH_MAX = 100  # sun_path is 104 (macOS) or 108 (Linux) bytes, the final NUL included
CONNECT_TIMEOUT = 2.0  # seconds to connect and hear the router's hello
FIRST_BACKOFF = 0.1  # seconds before trying again after a failed connect; doubles up to
MAX_BACKOFF = 2.0
FIRST_POLL_WAIT = 2.0  # seconds a web process's first request waits to learn the address
DISCONNECTED = "disconnected"  # the engine's ``why`` for a lease whose connection closed


@dataclass(frozen=True)
class Address:
    """Where a router listens: ``unix:PATH`` or ``tcp:HOST:PORT``."""

    kind: str
    path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, text: str) -> Address | None:
        kind, _, rest = text.partition(":")
        if kind == "unix" and rest:
            return cls("unix", path=rest)
        if kind == "tcp":
            host, _, port = rest.rpartition(":")
            if host and port.isdigit():
                return cls("tcp", host=host.strip("[]"), port=int(port))
        return None

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"


def link_key(secret: str | None = None) -> bytes:
    """The key a TCP connection proves it knows: derived from ``SECRET_KEY`` (module doc)."""
    if secret is None:
        from django.conf import settings

        secret = settings.SECRET_KEY
    return hmac.new(secret.encode(), b"routerpanel router link", hashlib.sha256).digest()


def proof(key: bytes, nonce: str) -> str:
    return hmac.new(key, nonce.encode(), hashlib.sha256).hexdigest()


def socket_path(data_dir: Path) -> Path:
    """The router's socket: in its data dir, or (a path too long for a socket) in the temp dir
    under a name derived from the data dir, so it is still one per data dir."""
    path = Path(data_dir).resolve() / SOCKET_NAME
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"routerpanel-{digest}.sock"


def encode(message: Mapping[str, Any]) -> bytes:
    """One line. Raises TypeError for what JSON cannot say. The messages carry finite numbers
    only (times, ttls, ports, milliseconds): ``orjson`` writes an inf or a nan as null."""
    return orjson.dumps(message) + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """A message, or None for a line that is not a JSON object (or not UTF-8)."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) and isinstance(message.get("type"), str) else None


class Lines:
    """A stream's bytes, cut into its messages (framing in the module doc)."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""  # the start of a line whose end has not come yet

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """The messages ``data`` completes. A line that is not a message is skipped; one longer
        than LINE_LIMIT raises ValueError (the connection is not to be trusted). A partial last
        line at the end of the stream is no message."""
        if self._rest:
            data = self._rest + data
        *lines, self._rest = data.split(b"\n")
        if len(self._rest) > LINE_LIMIT:
            raise ValueError("message longer than the line limit")
        messages = []
        for line in lines:
            if len(line) > LINE_LIMIT:
                raise ValueError("message longer than the line limit")
            message = decode(line)
            if message is None:
                log.warning("router link: skipped a line that is not a message: %.80r", line)
            else:
                messages.append(message)
        return messages


class _LineProtocol(asyncio.Protocol):
    """One end of a link: each message is handed on in ``data_received``, as it arrives.

    No reader task: asyncio's streams wake a task per read, one loop turn more per message on
    each end than handing the message on from the protocol.
    """

    transport: asyncio.Transport

    def __init__(self) -> None:
        self._lines = Lines()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._lines.feed(data)
        except ValueError as exc:
            log.info("router link: closing a connection: %s", exc)
            self.failed(f"the connection to the router failed: {exc}")
            self.transport.abort()
            return
        for message in messages:
            if self.transport.is_closing():
                return  # closed by an earlier message (a refused proof): read nothing more
            self.received(message)

    def received(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def failed(self, why: str) -> None:
        """The connection is about to close for ``why`` (a message over the limit)."""


# ---- router side ----------------------------------------------------------------------------


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


class _PeerProtocol(_LineProtocol):
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


# ---- web side -------------------------------------------------------------------------------


class Connection:
    """A web process's connection to its router, shared by every request of its event loop."""

    def __init__(self, protocol: _ClientProtocol, boot: str) -> None:
        self.transport = protocol.transport
        self.boot = boot
        self.pending: dict[str, asyncio.Queue[dict[str, Any] | str]] = {}
        self.closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._watcher: asyncio.Task[None] | None = None
        protocol.connection = self
        if protocol.lost is not None:  # closed during the handshake's last turn
            self.close(protocol.lost)

    @property
    def open(self) -> bool:
        return not self.closed.done()

    def watch(self, watch: RouterWatch) -> None:
        """Answer this connection's waiters 503 when the heartbeat says its router is gone."""
        if self.open:
            self._watcher = asyncio.ensure_future(self._until_gone(watch))

    def send(self, message: Mapping[str, Any]) -> bool:
        """Write a message; False when the connection is closed."""
        if not self.open:
            return False
        self.transport.write(encode(message))
        return True

    def expect(self, request_id: str) -> asyncio.Queue[dict[str, Any] | str]:
        """The queue the answers to ``request_id`` arrive on (a str: the link failed, why)."""
        queue: asyncio.Queue[dict[str, Any] | str] = asyncio.Queue()
        if not self.open:
            queue.put_nowait(self.closed.result())
        self.pending[request_id] = queue
        return queue

    def forget(self, request_id: str) -> None:
        self.pending.pop(request_id, None)

    def received(self, message: dict[str, Any]) -> None:
        queue = self.pending.get(str(message.get("request_id")))
        if queue is not None:
            queue.put_nowait(message)

    def close(self, why: str = "the connection to the router closed") -> None:
        if self.closed.done():
            return
        self.closed.set_result(why)
        self.transport.close()
        self._fail_pending(why)
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()

    def _fail_pending(self, why: str) -> None:
        for queue in self.pending.values():
            queue.put_nowait(why)

    async def _until_gone(self, watch: RouterWatch) -> None:
        while self.open:
            why = await watch.gone(self.boot)
            self._fail_pending(why)  # a frozen router: its senders' waits end now
            if watch.beat is not None and watch.beat.boot != self.boot:
                self.close(why)  # replaced: this connection has nothing more to say
                return
            changed = watch.changed
            await changed.wait()


class _ClientProtocol(_LineProtocol):
    """The web process's end: the handshake's messages wait in ``early``; after it, each
    answer goes straight to the queue of the request it names (``Connection.received``)."""

    def __init__(self) -> None:
        super().__init__()
        self.early: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.connection: Connection | None = None
        self.lost: str | None = None  # why it closed
        self._why = "the connection to the router closed"

    def received(self, message: dict[str, Any]) -> None:
        if self.connection is not None:
            self.connection.received(message)
        else:
            self.early.put_nowait(message)

    def failed(self, why: str) -> None:
        self._why = why

    def connection_lost(self, exc: Exception | None) -> None:
        why = self._why if exc is None else f"the connection to the router failed: {exc}"
        self.lost = why
        if self.connection is not None:
            self.connection.close(why)
        else:
            self.early.put_nowait(None)

    async def next(self) -> dict[str, Any] | None:
        """The next message of the handshake; None once closed."""
        if self.lost is not None and self.early.empty():
            return None
        return await self.early.get()


class Link:
    """Connect lazily to one address and keep the connection; retry with back-off."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.connection: Connection | None = None
        self._connecting: SingleFlight[Connection | None] = SingleFlight()
        self._retry_at = 0.0
        self._backoff = FIRST_BACKOFF

    async def connect(self, watch: RouterWatch) -> Connection | None:
        """The open connection, made now if need be; None while connecting fails (back-off)."""
        conn = self.connection
        if conn is not None and conn.open:
            return conn
        if not self._connecting.running and time.monotonic() < self._retry_at:
            return None
        return await self._connecting.run(lambda: self._connect(watch))

    async def _connect(self, watch: RouterWatch) -> Connection | None:
        protocol = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                protocol = await _open(self.address)
                hello = await protocol.next()
                if hello is None or hello.get("type") != HELLO:
                    raise ConnectionError(f"no hello from the router: {hello!r}")
                if "nonce" in hello:  # TCP: prove the key (module doc)
                    nonce = str(hello["nonce"])
                    protocol.transport.write(
                        encode({"type": AUTH, "proof": proof(link_key(), nonce)})
                    )
                    ready = await protocol.next()
                    if ready is None or ready.get("type") != READY:
                        raise ConnectionError("the router refused the key (another SECRET_KEY?)")
        except (OSError, TimeoutError, ValueError) as exc:
            if protocol is not None:
                protocol.transport.close()
            if self._backoff == FIRST_BACKOFF:
                log.warning("router link: cannot connect to %s (%s)", self.address, exc)
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF)
            return None
        self._backoff = FIRST_BACKOFF
        conn = Connection(protocol, str(hello.get("boot") or ""))
        conn.watch(watch)
        self.connection = conn
        return conn

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()


async def _open(address: Address) -> _ClientProtocol:
    loop = asyncio.get_running_loop()
    if address.kind == "unix":
        _, protocol = await loop.create_unix_connection(_ClientProtocol, address.path)
        return protocol
    _, protocol = await loop.create_connection(_ClientProtocol, address.host, address.port)
    sock = protocol.transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return protocol


_links: dict[tuple[int, str], Link] = {}


def enabled() -> bool:
    """``ROUTERPANEL_ROUTER_LINK`` (default on): off keeps team mode on the channel layer."""
    from django.conf import settings

    return bool(getattr(settings, "ROUTERPANEL_ROUTER_LINK", True))


def reachable(watch: RouterWatch) -> Address | None:
    """The address the live router advertises, if this process can use it (per request: the
    answer is kept for the last advertisement seen)."""
    beat = watch.beat
    if beat is None or not (beat.link or beat.tcp):
        return None
    key = (beat.link, beat.tcp, beat.host)
    if key not in _reachable:
        if len(_reachable) >= 64:  # routers come and go over weeks: keep the last few
            _reachable.clear()
        _reachable[key] = _usable(beat.link, beat.tcp, beat.host)
    return _reachable[key]


_reachable: dict[tuple[str, str, str], Address | None] = {}


def _usable(link: str, tcp: str, host: str) -> Address | None:
    """The Unix socket of a router on this host; else its TCP address; else None (channels)."""
    if not enabled():
        return None
    unix = Address.parse(link) if link else None
    if unix is not None and unix.kind == "unix" and host == socket.gethostname() and not _via_tcp():
        return unix
    address = Address.parse(tcp) if tcp else None
    return address if address is not None and address.kind == "tcp" else None


def _via_tcp() -> bool:
    from django.conf import settings

    return getattr(settings, "ROUTERPANEL_ROUTER_LINK_VIA", "auto") == "tcp"


async def connection(watch: RouterWatch) -> Connection | None:
    """This event loop's connection to the router, or None: use the channel layer."""
    await watch.first_poll(FIRST_POLL_WAIT)
    address = reachable(watch)
    if address is None:
        return None
    # One link per router (several nodes on this host: one each) and event loop. A router that
    # moved (a new socket path) leaves its old link behind: it is closed here.
    loop = asyncio.get_running_loop()
    key = (id(loop), watch.node)
    link = _links.get(key)
    if link is None or link.address != address or link.loop is not loop:
        if link is not None:
            link.close()
        link = _links[key] = Link(address)
    return await link.connect(watch)


def startup_note() -> str:
    """``serve --no-router``'s line about the data path, from the router's heartbeat now."""
    from django.conf import settings

    from models_app import liveness

    if not enabled():
        return "data path to the router: the channel layer (ROUTERPANEL_ROUTER_LINK is off)"
    try:
        import redis

        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1
        )
        try:
            beat = liveness.Beat.parse(client.get(liveness.heartbeat_key()))
        finally:
            client.close()
    except Exception as exc:
        return (
            f"data path to the router: not known yet (Redis: {exc}); socket when it advertises one"
        )
    if beat is None:
        return "data path to the router: no router running yet; socket when it advertises one"
    if not beat.link and not beat.tcp:
        return "data path to the router: the channel layer (the router advertises no socket)"
    address = _usable(beat.link, beat.tcp, beat.host)
    if address is None:
        where = f"{beat.link or beat.tcp} on {beat.host}"
        return f"data path to the router: the channel layer ({where} is out of reach)"
    return f"data path to the router: socket {address} (router boot {beat.boot})"
