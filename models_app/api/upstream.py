"""Keep-alive connections to the children, one pool per child, and the retry-once rule (§8.C).

A pool is a list of idle ``relay.Connection``s to one child, made the first time a child's
address (host, port and key: ``ChildAddress``) is granted and retired when its model shows up at
another address (the child was restarted, and a protected one got a new key); a retired pool
closes once its last request ends. A protected child's key goes with every request on its pool
(issue 18); the client's own keys never do (the proxy drops them).

The client is our own small one on an asyncio protocol with the ``httptools`` parser
(relay.py; issue 16.3): measured against aiohttp's client, httpcore and httpx on one real
llama-server in one run (bench/upstream_clients.py), it costs a fraction of their time per
request, and it sends only what the client sent plus ``Host``, ``Accept-Encoding: identity``
(§8.11: the bytes pass through as the child made them) and the body's ``Content-Length``.

llama-server (cpp-httplib) closes a keep-alive connection after a stream, after 100 requests, or
when idle for 5 s, without saying so. A pooled connection the child closed while it was idle
is noticed (EOF) and dropped; one idle longer than ``keepalive_expiry`` is not reused. The close
can still race with the reuse: the request is then written to a dead socket and the connection
ends at once, before any answer byte (``Stale``: within ``relay.STALE_WINDOW``). Such a
request never reached the child, so it is sent once more on a connection made for it; one that
ends later without an answer was read by a child that failed, and is not sent again. A failure
on a *new* connection is a real error (the child is gone or broken) and is not retried.

What a client of the proxy sees of a failure is cpp-httplib's text (``UpstreamError.text``,
§8.14).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from models_app.api import relay
from models_app.api.config import ApiConfig
from models_app.api.relay import Answer
from models_app.api.upstream_errors import Stale, UpstreamError
from routerpanel.router.address import ChildAddress

log = logging.getLogger(__name__)

Headers = Sequence[tuple[bytes, bytes]]

__all__ = ["Answer", "ChildPool", "UpstreamError", "Upstreams"]

# §8.11 drops the client's Accept-Encoding: the bytes pass through as the child made them.
_IDENTITY = (b"accept-encoding", b"identity")


class ChildPool:
    """Connections to one child: idle ones kept for reuse (newest first)."""

    def __init__(self, address: ChildAddress, config: ApiConfig) -> None:
        self.address = address
        self.port = address.port
        self.base = address.url
        self._netloc = address.netloc
        self._auth = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                      for k, v in address.headers().items()]  # fmt: skip
        self._auth_names = frozenset(name for name, _ in self._auth)
        self._config = config
        self._idle: list[relay.Connection] = []
        self._busy: set[relay.Connection] = set()
        self.active = 0
        self.retired = False
        self.closed = False
        self.retries = 0  # requests sent a second time (observability and tests)

    async def send(self, method: str, target: str, headers: Headers, body: bytes) -> Answer:
        """Send a request; return the answer with its body still to be read.

        Raises ``UpstreamError``.
        """
        fields = [pair for pair in headers if pair[0].lower() not in self._auth_names]
        fields.append(_IDENTITY)
        fields.extend(self._auth)  # the child's key, in place of anything sent as one
        request = relay.encode_request(method, target, self._netloc, fields, body)
        conn = self._reuse()
        if conn is not None:
            try:
                return await self._exchange(conn, request, method)
            except Stale as exc:
                log.debug("pooled connection to port %s was closed (%s): retrying once",
                          self.port, exc)  # fmt: skip
                self.retries += 1
        conn = await relay.connect(
            self.address.host, self.port, self._config.connect_timeout,
            self._config.upstream_timeout,
        )  # fmt: skip
        try:
            return await self._exchange(conn, request, method)
        except Stale as exc:
            raise UpstreamError(exc.text) from None

    def _reuse(self) -> relay.Connection | None:
        now = time.monotonic()
        expiry = self._config.keepalive_expiry
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable(now, expiry):
                return conn
            conn.close()
        return None

    async def _exchange(self, conn: relay.Connection, request: bytes, method: str) -> Answer:
        self._busy.add(conn)
        conn.on_idle = self._back
        try:
            return await conn.send(request, method)
        except BaseException:
            self._busy.discard(conn)
            conn.close()
            raise

    def _back(self, conn: relay.Connection) -> None:
        """``conn`` finished its answer (relay.Connection.finished): keep it if it may serve."""
        self._busy.discard(conn)
        if conn.closed or self.closed:
            conn.close()
        else:
            self._idle.append(conn)

    async def aclose(self) -> None:
        self.closed = True
        for conn in (*self._idle, *self._busy):
            conn.close()
        self._idle.clear()
        self._busy.clear()


class Upstreams:
    """The pools of this web process, by child address (see module doc)."""

    def __init__(self, config: ApiConfig) -> None:
        self._config = config
        self._pools: dict[ChildAddress, ChildPool] = {}
        self._address_of: dict[str, ChildAddress] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def checkout(self, model: str, address: ChildAddress) -> ChildPool:
        """Return the pool for ``address``, counting one more request on it."""
        previous = self._address_of.get(model)
        if previous != address:
            self._address_of[model] = address
            if previous is not None and previous not in self._address_of.values():
                self._retire(previous)
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = ChildPool(address, self._config)
        pool.active += 1
        return pool

    def checkin(self, pool: ChildPool) -> None:
        pool.active -= 1
        if pool.retired and pool.active == 0:
            self._close(pool)

    def _retire(self, address: ChildAddress) -> None:
        pool = self._pools.pop(address, None)
        if pool is None:
            return
        pool.retired = True
        if pool.active == 0:
            self._close(pool)

    def _close(self, pool: ChildPool) -> None:
        task = asyncio.ensure_future(pool.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def pool(self, address: ChildAddress) -> ChildPool | None:
        return self._pools.get(address)

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.aclose() for p in pools), *self._closing)
