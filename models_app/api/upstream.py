"""Keep-alive connection pools to the children, one per port, and the retry-once rule (§8.C).

A pool is an ``httpx.AsyncHTTPTransport`` (httpcore's connection pool), made the first time a
port is granted and retired when its model shows up on another port (the child was restarted);
a retired pool closes once its last request ends. Requests go to the transport directly, not
through an ``httpx.AsyncClient``: the proxy needs none of the client's work (URL merging,
cookies, auth, redirects, event hooks, default headers), which was about a third of its own time
per request (bench/README.md, "The proxy's client"). So no ``Accept`` or ``User-Agent`` the
client did not send reaches the child, and the timeouts go in each request's extensions.

llama-server (cpp-httplib) closes a keep-alive connection after a stream, or when idle for 5 s,
without saying so. httpcore drops a pooled connection it finds closed before reusing it, but the
close can race with the reuse: the request is then written to a dead socket and fails before any
response byte with ``RemoteProtocolError`` ("Server disconnected without sending a response"),
``ReadError`` or ``WriteError``. Such a request never reached the child, so it is sent once more
on a connection made for it. A failure on a *new* connection is a real error (the child is gone
or broken) and is not retried; the trace extension tells the two apart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from models_app.api.config import ApiConfig

log = logging.getLogger(__name__)

RETRYABLE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)

Headers = Sequence[tuple[bytes, bytes]]

# §8.11 drops the client's Accept-Encoding: the bytes pass through as the child made them.
_IDENTITY = (b"accept-encoding", b"identity")


class ChildPool:
    """Connections to one child port: a keep-alive pool, and fresh connections for retries."""

    def __init__(self, port: int, config: ApiConfig) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self._config = config
        timeout = httpx.Timeout(config.upstream_timeout, connect=config.connect_timeout)
        self._timeout = timeout.as_dict()  # what a Client would put in every request
        self.transport = self._transport(keepalive=config.max_keepalive_per_child)
        self._fresh: httpx.AsyncHTTPTransport | None = None
        self.active = 0
        self.retired = False
        self.retries = 0  # requests sent a second time (observability and tests)

    def _transport(self, keepalive: int) -> httpx.AsyncHTTPTransport:
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=keepalive,
            keepalive_expiry=self._config.keepalive_expiry,
        )
        # Never through an HTTP(S)_PROXY (children are on loopback); plain HTTP, so no CA
        # certificates are loaded for each pool.
        return httpx.AsyncHTTPTransport(verify=False, trust_env=False, limits=limits)

    async def send(self, method: str, target: str, headers: Headers, body: bytes) -> httpx.Response:
        """Send a request and return the response with its body still to be streamed.

        httpx adds ``Host`` and, for a body or a POST, ``Content-Length``; nothing else.
        """
        reused = True

        async def trace(event: str, info: dict[str, Any]) -> None:
            nonlocal reused
            if event == "connection.connect_tcp.started":
                reused = False

        request = httpx.Request(
            method,
            self.base + target,
            headers=[*headers, _IDENTITY],
            content=body,
            extensions={"timeout": self._timeout, "trace": trace},
        )
        try:
            return await self.transport.handle_async_request(request)
        except RETRYABLE as exc:
            if not reused:
                raise
            log.debug("pooled connection to port %s was closed (%s): retrying once", self.port, exc)
        self.retries += 1
        if self._fresh is None:
            self._fresh = self._transport(keepalive=0)
        return await self._fresh.handle_async_request(request)  # the body is bytes: resendable

    async def aclose(self) -> None:
        await self.transport.aclose()
        if self._fresh is not None:
            await self._fresh.aclose()


class Upstreams:
    """The pools of this web process, by child port (see module doc)."""

    def __init__(self, config: ApiConfig) -> None:
        self._config = config
        self._pools: dict[int, ChildPool] = {}
        self._port_of: dict[str, int] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def checkout(self, model: str, port: int) -> ChildPool:
        """Return the pool for ``port``, counting one more request on it."""
        previous = self._port_of.get(model)
        if previous != port:
            self._port_of[model] = port
            if previous is not None and previous not in self._port_of.values():
                self._retire(previous)
        pool = self._pools.get(port)
        if pool is None:
            pool = self._pools[port] = ChildPool(port, self._config)
        pool.active += 1
        return pool

    def checkin(self, pool: ChildPool) -> None:
        pool.active -= 1
        if pool.retired and pool.active == 0:
            self._close(pool)

    def _retire(self, port: int) -> None:
        pool = self._pools.pop(port, None)
        if pool is None:
            return
        pool.retired = True
        if pool.active == 0:
            self._close(pool)

    def _close(self, pool: ChildPool) -> None:
        task = asyncio.ensure_future(pool.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def pool(self, port: int) -> ChildPool | None:
        return self._pools.get(port)

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.aclose() for p in pools), *self._closing)
