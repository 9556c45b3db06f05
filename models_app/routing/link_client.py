"""The router link, web side: one connection per router and event loop, made lazily and kept,
retried with back-off (docs/architecture.md, "The router link").

A web process uses the Unix socket of a router on its own host, else its TCP address
(``ROUTERPANEL_ROUTER_LINK_VIA=tcp``: always TCP), as the router's heartbeat advertises them.
Every request still waiting on a connection that closes is answered 503 at once; the heartbeat
watch answers them too when the router freezes or is replaced (the connection stays). While no
connection can be made, the channel layer serves (linked.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from models_app.routing.link import (
    AUTH,
    CONNECT_TIMEOUT,
    FIRST_BACKOFF,
    FIRST_POLL_WAIT,
    HELLO,
    MAX_BACKOFF,
    READY,
    Address,
    LineProtocol,
    encode,
    link_key,
    proof,
)
from models_app.routing.singleflight import SingleFlight

if TYPE_CHECKING:
    from models_app.routing.liveness import RouterWatch

log = logging.getLogger(__name__)


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


class _ClientProtocol(LineProtocol):
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

    from models_app.routing import liveness

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
