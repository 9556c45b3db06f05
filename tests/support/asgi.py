"""Call an ASGI app directly, like Daphne does: ``AsgiClient`` and the ``Call`` it starts.

``AsgiClient`` calls the ASGI app with its own ``receive``/``send``: the body arrives as
``http.request`` messages, response messages are recorded with the time they were sent,
``disconnect()`` delivers ``http.disconnect`` at any moment, and after the last body message
``http.disconnect`` follows (Daphne sends one when it finishes a response). ``django_stand_in``
plays Django for the requests the API lets fall through.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

DEADLINE = 30.0  # generous: the machine is small and busy
ROUTER_TIMEOUT = 1.0  # the bridge's "router unavailable" timeout, small for tests


class Call:
    """One request in flight through an ASGI app."""

    def __init__(
        self,
        app: Any,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        body_parts: list[bytes] | None = None,
        headers: dict[str, str] | None = None,
        query: str = "",
        extensions: dict[str, Any] | None = None,
    ) -> None:
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[tuple[float, bytes]] = []
        self.started = asyncio.Event()
        self.ended = asyncio.Event()
        self._changed = asyncio.Condition()
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        parts = body_parts if body_parts is not None else [body]
        for n, part in enumerate(parts):
            more = n < len(parts) - 1
            self._inbox.put_nowait({"type": "http.request", "body": part, "more_body": more})
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
        }
        if extensions is not None:  # what a server offers beyond ASGI (request.CHUNK_NOW)
            scope["extensions"] = extensions
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        return await self._inbox.get()

    async def _send(self, message: dict[str, Any]) -> None:
        assert not self.ended.is_set(), f"message after the response ended: {message}"
        if message["type"] == "http.response.start":
            assert not self.started.is_set()
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            self.started.set()
        else:
            assert message["type"] == "http.response.body", message
            assert self.started.is_set()
            async with self._changed:
                self.chunks.append((time.monotonic(), message.get("body", b"")))
                self._changed.notify_all()
            if not message.get("more_body", False):
                self.ended.set()
                self._inbox.put_nowait({"type": "http.disconnect"})

    def disconnect(self) -> None:
        self._inbox.put_nowait({"type": "http.disconnect"})

    async def finish(self, timeout: float = DEADLINE) -> Call:
        async with asyncio.timeout(timeout):
            await self.task
        return self

    async def wait_started(self, timeout: float = DEADLINE) -> None:
        async with asyncio.timeout(timeout):
            await self.started.wait()

    async def wait_body(
        self, predicate: Callable[[bytes], bool], timeout: float = DEADLINE
    ) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: predicate(self.body))

    @property
    def body(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        values = [v.decode() for k, v in self.headers if k.lower() == wanted]
        assert len(values) <= 1, f"{name} appears {len(values)} times"
        return values[0] if values else None


class AsgiClient:
    def __init__(self, app: Any) -> None:
        self.app = app

    def start(self, method: str, path: str, *, json_body: Any = None, **kwargs: Any) -> Call:
        if json_body is not None:
            kwargs["body"] = json.dumps(json_body).encode()
            kwargs.setdefault("headers", {}).setdefault("content-type", "application/json")
        if "?" in path:
            path, kwargs["query"] = path.split("?", 1)
        return Call(self.app, method, path, **kwargs)

    async def request(self, method: str, path: str, **kwargs: Any) -> Call:
        return await self.start(method, path, **kwargs).finish()

    async def get(self, path: str, **kwargs: Any) -> Call:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, json_body: Any = None, **kwargs: Any) -> Call:
        return await self.request("POST", path, json_body=json_body, **kwargs)


async def django_stand_in(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Plays Django for the fall-through: /panel/ is a page, anything else its HTML 404."""
    status = 200 if scope["path"] == "/panel/" else 404
    headers = [(b"content-type", b"text/html; charset=utf-8")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"<html>django</html>"})
