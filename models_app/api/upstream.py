"""Keep-alive connections to the children, one pool per child, and the retry-once rule (§8.C).

A pool is an ``aiohttp.ClientSession`` on its own ``TCPConnector``, made the first time a child's
address (host, port and key: ``ChildAddress``) is granted and retired when its model shows up at
another address (the child was restarted, and a protected one got a new key); a retired pool
closes once its last request ends. A protected child's key goes with every request on its pool
(issue 18); the client's own keys never do (the proxy drops them).

aiohttp's client, measured against httpx's transport, httpcore and a minimal relay on one real
llama-server (bench/upstream_clients.py), costs about a quarter of httpx's time per request and
gets most of what a hand-written client would. The session adds nothing the client did not send
but ``Host`` and the body's ``Content-Length`` (no ``Accept``, ``User-Agent`` or
``Content-Type`` of its own), decompresses nothing, and follows no redirects.

llama-server (cpp-httplib) closes a keep-alive connection after a stream, after 100 requests, or
when idle for 5 s, without saying so. A pooled connection found closed before reuse is dropped,
but the close can race with the reuse: the request is then written to a dead socket and fails
before any response byte (``ServerDisconnectedError`` or a reset). Such a request never reached
the child, so it is sent once more on a connection made for it. A failure on a *new* connection
is a real error (the child is gone or broken) and is not retried; a trace tells the two apart.

What a client of the proxy sees of a failure is cpp-httplib's text (``UpstreamError.text``,
§8.14), never the client library's: the proxy does not depend on which library this is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import aiohttp
from multidict import CIMultiDict

from models_app.api.config import ApiConfig
from routerpanel.router.address import ChildAddress

log = logging.getLogger(__name__)

Headers = Sequence[tuple[bytes, bytes]]

# §8.11 drops the client's Accept-Encoding: the bytes pass through as the child made them.
_IDENTITY = ("accept-encoding", "identity")
# What aiohttp would add by itself; the child gets only what the client sent.
_SKIP_AUTO = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")

# cpp-httplib's texts for the failures a client sees in "proxy error: <text>" (§8.14); the
# first class that matches wins (more specific ones first).
_FAILURES: tuple[tuple[type[BaseException], str], ...] = (
    (aiohttp.ConnectionTimeoutError, "Connection timed out"),
    (aiohttp.ClientConnectorError, "Could not establish connection"),
    (aiohttp.SocketTimeoutError, "Read timeout"),
    (TimeoutError, "Read timeout"),
    (aiohttp.ServerDisconnectedError, "Failed to read connection"),
    (aiohttp.ClientPayloadError, "Failed to read connection"),
    (aiohttp.ClientResponseError, "Failed to read connection"),
    (aiohttp.ClientOSError, "Failed to read connection"),
    (aiohttp.ClientError, "Failed to read connection"),
)
# A reused connection that fails like this never got the request to the child: send it again.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


class UpstreamError(Exception):
    """The child could not be reached or broke off; ``text`` is cpp-httplib's wording."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _describe(exc: BaseException) -> str:
    for kind, text in _FAILURES:
        if isinstance(exc, kind):
            return text
    return str(exc) or type(exc).__name__


class Answer:
    """A child's answer: status and headers read, the body still to come."""

    __slots__ = ("_response", "raw_headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        self.raw_headers: tuple[tuple[bytes, bytes], ...] = response.raw_headers

    def header(self, name: str) -> str | None:
        value: str | None = self._response.headers.get(name)
        return value

    def has_header(self, name: str) -> bool:
        return name in self._response.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (de-chunked); raises ``UpstreamError`` if the child breaks
        off. Reading stops while the caller is not asking (back-pressure reaches the child)."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def aclose(self) -> None:
        """Give the connection back when the body was read to its end; else close it (the
        child sees the close and stops generating, §8.15)."""
        if self._response.content.at_eof() and not self._response.content.exception():
            self._response.release()
        else:
            self._response.close()


class ChildPool:
    """Connections to one child: a keep-alive pool, and fresh connections for retries."""

    def __init__(self, address: ChildAddress, config: ApiConfig) -> None:
        self.address = address
        self.port = address.port
        self.base = address.url
        self._auth = tuple(address.headers().items())
        self._config = config
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=config.connect_timeout,
            sock_read=config.upstream_timeout,
        )
        self.session = self._session(keepalive=True)
        self._fresh: aiohttp.ClientSession | None = None
        self.active = 0
        self.retired = False
        self.retries = 0  # requests sent a second time (observability and tests)

    def _session(self, keepalive: bool) -> aiohttp.ClientSession:
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_start.append(_new_connection)
        kept: dict[str, Any] = {"keepalive_timeout": self._config.keepalive_expiry}
        connector = aiohttp.TCPConnector(
            limit=0,  # no cap: as many connections as requests in flight
            use_dns_cache=False,
            **(kept if keepalive else {"force_close": True}),
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO,
            trust_env=False,  # never through an HTTP(S)_PROXY: children are ours to reach
            trace_configs=[trace],
            raise_for_status=False,
        )

    async def send(self, method: str, target: str, headers: Headers, body: bytes) -> Answer:
        """Send a request; return the answer with its body still to be read.

        Raises ``UpstreamError``. aiohttp adds ``Host`` and, for a body, ``Content-Length``.
        """
        fields = CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)
        fields.add(*_IDENTITY)
        for name, value in self._auth:  # the child's key, in place of anything sent as one
            fields[name] = value
        seen = SimpleNamespace(new=False)
        try:
            return await self._send(self.session, method, target, fields, body, seen)
        except _STALE as exc:
            if seen.new:
                raise UpstreamError(_describe(exc)) from exc
            log.debug("pooled connection to port %s was closed (%s): retrying once", self.port, exc)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(_describe(exc)) from exc
        self.retries += 1
        if self._fresh is None:
            self._fresh = self._session(keepalive=False)
        try:
            return await self._send(self._fresh, method, target, fields, body, SimpleNamespace())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(_describe(exc)) from exc

    async def _send(
        self,
        session: aiohttp.ClientSession,
        method: str,
        target: str,
        fields: CIMultiDict[str],
        body: bytes,
        seen: SimpleNamespace,
    ) -> Answer:
        response = await session.request(
            method,
            self.base + target,
            headers=fields,
            data=body if body or method in ("POST", "PUT", "PATCH") else None,
            allow_redirects=False,
            trace_request_ctx=seen,
        )
        return Answer(response)

    async def aclose(self) -> None:
        await self.session.close()
        if self._fresh is not None:
            await self._fresh.close()


async def _new_connection(
    session: aiohttp.ClientSession, context: SimpleNamespace, params: Any
) -> None:
    """Trace hook: this request is on a connection made for it (a failure is not retried)."""
    seen = context.trace_request_ctx
    if seen is not None:
        seen.new = True


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
