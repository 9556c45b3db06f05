"""One API request: its scope parsed once, its body, its response, and its client's departure.

``Request`` is the only place that talks ASGI to the server for the API routes, so the rules
that hold for every response live here: ``Server: llama.cpp`` and ``X-Request-Id`` on every
answer, CORS for browsers (§9.2), and the generic body on every 404 (§9.3a, §15.29 keep).

A body must arrive whole within the body timeout (``ROUTERPANEL_BODY_TIMEOUT``, 30 s) or the
request is answered 408; one longer than the limit is 413. Under ``serve`` the server itself
enforces both before the application sees the request (``servers/daphne_guard.py``):
these checks are the same rules for any other ASGI server.

Headers are kept as a dict of lower-case byte names (ASGI gives them lower-cased); a repeated
header keeps its last value, as llama.cpp's proxy collapses duplicates (§8.11).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings

from models_app.api.auth import ANONYMOUS_CALLER, Caller
from models_app.api.errors import NOT_FOUND, ApiError, dumps

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_TYPE = b"application/json; charset=utf-8"
WATCH_AFTER = 0.05  # seconds before a request starts watching for its client leaving
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")


class ClientGone(Exception):
    """The client disconnected before we answered: there is nobody to answer."""


def request_id_from(value: bytes | None) -> str:
    """Return the client's X-Request-Id if it is a sane token, else a fresh one."""
    if value is not None:
        value = value.strip()
        if _REQUEST_ID.fullmatch(value):
            return value.decode("ascii")
    return f"{_ID_PREFIX}{next(_ID_NUMBERS):08x}"


# The scope extension a server may offer for a streamed answer's pieces: a callable that writes
# one at once and says True, or says False when it must go as an ASGI message (``serve`` offers
# it under both servers, daphne_writes.chunk_now and uvicorn_server.chunk_now; the pump uses
# it, pump.py).
CHUNK_NOW = "routerpanel.chunk_now"

# Request ids this process makes: a random prefix per process and a counter (a uuid4 per
# request cost more than the rest of naming it); 32 hex digits like a uuid4's.
_ID_PREFIX = uuid.uuid4().hex[:24]
_ID_NUMBERS = itertools.count(1)


class Request:
    """An API request and its response; not used for the paths that go to Django."""

    __slots__ = (
        "_query",
        "_send",
        "_watcher",
        "actor",
        "caller",
        "client_gone",
        "cors",
        "event_stream",
        "finished",
        "headers",
        "method",
        "path",
        "receive",
        "request_id",
        "scope",
        "started",
    )

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self._send = send
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[bytes, bytes] = dict(scope["headers"])
        self.request_id = request_id_from(self.headers.get(b"x-request-id"))
        self.actor = "anonymous"
        self.caller: Caller = ANONYMOUS_CALLER  # the key's scope (issue 17.1), set with actor
        self.started = False  # the response's status line is out: errors can no longer be sent
        self.finished = False  # the last body message is (being) sent
        self.event_stream = False  # our own SSE head went out (issue 17.7): errors are events
        self.client_gone = False
        self.cors = True  # False: answer without CORS headers (a refused foreign origin)
        self._query: dict[str, str] | None = None
        self._watcher: asyncio.Task[None] | asyncio.TimerHandle | None = None

    # ---- reading ----------------------------------------------------------------------------

    def query(self, name: str) -> str | None:
        """Return a query parameter (its first value), or None."""
        if self._query is None:
            self._query = {}
            if raw := self.scope.get("query_string", b""):  # most requests have none
                for key, value in parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True):
                    self._query.setdefault(key, value)
        return self._query.get(name)

    async def read_body(self, limit: int, timeout: float | None = None) -> bytes:
        """Read the whole body; 413 beyond ``limit`` bytes, 408 if it is not all there within
        ``timeout`` seconds (default: the body timeout setting); ``ClientGone`` if the client
        left."""
        declared = self.headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large(limit)
        seconds = body_timeout() if timeout is None else timeout
        try:
            async with asyncio.timeout(seconds):
                return await self._read_all(limit)
        except TimeoutError:
            raise too_slow(seconds) from None

    async def _read_all(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # ---- the client leaving -----------------------------------------------------------------

    def watch_disconnect(self, after: float | None = None) -> None:
        """From now on, cancel the handling task if the client leaves (§8.15, rule A7).

        Call it after the body has been read: the watcher consumes ``receive``. The handler
        then sees ``CancelledError`` wherever it waits (queued in ``acquire``, reading from the
        child) and its ``finally`` blocks cancel the waiter or release the lease. Once the
        response is finished, a disconnect (Daphne sends one after every response) is ignored.

        The watcher starts ``after`` seconds from now (``WATCH_AFTER``), not at once: most
        answers (a ``/tokenize``, a short completion) are done by then, and a task per request
        to watch them cost as much as a tenth of the proxy's own time (issue 16.5). A client
        that leaves is noticed at most that much later.
        """
        task = asyncio.current_task()
        assert task is not None
        delay = WATCH_AFTER if after is None else after
        self._watcher = asyncio.get_running_loop().call_later(delay, self._watch, task)

    def _watch(self, task: asyncio.Task[Any]) -> None:
        async def watch() -> None:
            while True:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    if not self.finished:
                        self.client_gone = True
                        task.cancel()
                    return

        self._watcher = asyncio.ensure_future(watch())

    def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    # ---- answering --------------------------------------------------------------------------

    def common_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"server", b"llama.cpp"), (b"x-request-id", self.request_id.encode())]
        origin = self.headers.get(b"origin")
        # llama.cpp's default --cors-origins "*" with credentials echoes the Origin (§9.2)
        if origin and self.cors:
            headers.append((b"access-control-allow-origin", origin))
            headers.append((b"access-control-allow-credentials", b"true"))
        return headers

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON_TYPE,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        *,
        own_404: bool = False,
    ) -> None:
        """Send a whole response; a 404 carries the generic body (§9.3a keep) unless ``own_404``
        (OpenAI's routes, which llama.cpp does not have: ``GET /v1/models/{id}``)."""
        if status == 404 and not own_404:
            body, content_type = NOT_FOUND, JSON_TYPE
        start = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            *self.common_headers(),
            *headers,
        ]
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": start})
        self.finished = True
        await self._send({"type": "http.response.body", "body": body})

    async def respond_json(self, value: Any, status: int = 200) -> None:
        await self.respond(status, dumps(value))

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Start a streamed response: ``headers`` plus the common ones, no Content-Length."""
        self.started = True
        headers.extend(self.common_headers())
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    @property
    def sender(self) -> Send:
        """The server's ``send``, for the pump (pump.py), which runs it from a callback."""
        return self._send

    async def write(self, chunk: bytes) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end(self, chunk: bytes = b"") -> None:
        """End a streamed response, ``chunk`` being its last bytes (one message, not two)."""
        self.finished = True
        await self._send({"type": "http.response.body", "body": chunk, "more_body": False})


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body too large (limit: {limit} bytes)")


def too_slow(seconds: float) -> ApiError:
    return ApiError(408, f"request body not received within {seconds:g} s")


def body_timeout() -> float:
    """Seconds a request body may take to arrive (``ROUTERPANEL_BODY_TIMEOUT``)."""
    return float(settings.ROUTERPANEL["BODY_TIMEOUT"])
