"""``serve --http uvicorn`` offers ``chunk_now`` in each request's scope (``_uvicorn.chunk_now``).

The proxy's pump writes each piece of a streamed answer with it instead of an ASGI message. It
must write exactly what uvicorn's own ``send`` would, and refuse (False, so the piece goes as a
message) wherever ``send`` would do something else: before the head, after the end, for a HEAD
request, and while the client's socket takes no more (``send`` waits for it to drain).

uvicorn runs in the test's loop with our protocol class, on a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from models_app.api.request import CHUNK_NOW
from models_app.management.commands._uvicorn import ChunkNowProtocol

DEADLINE = 30.0
BIG = 4 * 1024 * 1024  # more than a loopback socket takes at once: uvicorn pauses writing

said: dict[str, list[bool]] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    chunk_now = scope["extensions"][CHUNK_NOW]
    path = scope["path"]
    seen = said.setdefault(path, [])
    seen.append(chunk_now(b"early"))  # the head has not gone out
    await send({"type": "http.response.start", "status": 200, "headers": []})
    if path == "/pieces":
        for i in range(50):
            seen.append(chunk_now(b"%d;" % i))
    elif path == "/big":  # one piece the socket cannot take: the next must wait for the drain
        seen.append(chunk_now(b"x" * BIG))
        seen.append(chunk_now(b"after"))
        await send({"type": "http.response.body", "body": b"after", "more_body": True})
    await send({"type": "http.response.body", "body": b""})
    seen.append(chunk_now(b"late"))  # the answer ended


@pytest.fixture
async def port() -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=ChunkNowProtocol, lifespan="off", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    async with asyncio.timeout(DEADLINE):
        while not server.started:
            await asyncio.sleep(0.01)
    said.clear()
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            async with asyncio.timeout(DEADLINE):
                await serving


async def exchange(port: int, request: bytes, *, slow: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        if slow:
            await asyncio.sleep(0.3)  # let the server fill the socket and pause writing
        data = b""
        async with asyncio.timeout(DEADLINE):
            while not data.endswith(b"\r\n0\r\n\r\n") and not (b"HEAD" in request and data):
                piece = await reader.read(65536)
                if not piece:
                    break
                data += piece
        return data
    finally:
        writer.close()


async def test_pieces_go_out_as_chunks_once_the_head_went_out_and_not_after_the_end(
    port: int,
) -> None:
    data = await exchange(port, b"GET /pieces HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    assert body == b"".join(b"%x\r\n%d;\r\n" % (len(b"%d;" % i), i) for i in range(50)) + (
        b"0\r\n\r\n"
    )
    assert said["/pieces"] == [False] + [True] * 50 + [False]


async def test_a_head_request_gets_no_piece(port: int) -> None:
    data = await exchange(port, b"HEAD /pieces HTTP/1.1\r\nHost: x\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200")
    assert said["/pieces"] == [False] * 52


async def test_a_full_socket_sends_the_next_piece_the_way_that_waits_for_it(port: int) -> None:
    data = await exchange(port, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n", slow=True)
    body = data.partition(b"\r\n\r\n")[2]
    assert body == b"%x\r\n" % BIG + b"x" * BIG + b"\r\n5\r\nafter\r\n0\r\n\r\n"
    assert said["/big"] == [False, True, False, False]
