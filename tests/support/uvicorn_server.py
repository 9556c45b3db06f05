"""uvicorn serving an ASGI application in the test's own loop, on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

DEADLINE = 30.0


@contextlib.asynccontextmanager
async def serving(app: Any, protocol: type[asyncio.Protocol], **config: Any) -> AsyncIterator[int]:
    """Serve ``app`` with the HTTP ``protocol`` class on 127.0.0.1; yield the port. uvicorn's
    signal handling is left out (the test runner keeps its own)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    options: dict[str, Any] = {"lifespan": "off", "log_level": "warning", "access_log": False}
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, **(options | config)))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    running = asyncio.ensure_future(server.serve(sockets=[sock]))
    async with asyncio.timeout(DEADLINE):
        while not server.started:
            if running.done():
                running.result()  # uvicorn failed to start: its error
            await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(DEADLINE):
                await running
