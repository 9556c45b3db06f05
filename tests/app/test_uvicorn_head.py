"""``serve --http uvicorn`` answers byte for byte as uvicorn would (``HeadWithBody``).

``HeadWithBody`` has its own ``send``: it builds an answer's head itself and writes it with the
first piece of body. Whatever the application sends, the client must get the bytes uvicorn's
own cycle sends, and the same refusals. Each case runs on two real servers in the test's loop,
one with uvicorn's stock protocol and one with ours, and the bytes each client received are
compared whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from models_app.servers.uvicorn_server import ChunkNowProtocol
from tests.support.uvicorn_server import serving

DEADLINE = 30.0

Start = dict[str, Any]


def start(status: int = 200, *headers: tuple[bytes, bytes]) -> Start:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def body(data: bytes = b"", more: bool = False) -> Start:
    return {"type": "http.response.body", "body": data, "more_body": more}


LENGTH = (b"Content-Length", b"10")
# path -> what the application sends (an exception raised by the application ends the list)
CASES: dict[str, list[Start]] = {
    "/length": [start(200, LENGTH, (b"X-One", b"1")), body(b"0123456789")],
    "/length-in-pieces": [start(200, LENGTH), body(b"0123", True), body(b"456789")],
    "/no-length": [start(200, (b"content-type", b"text/plain")), body(b"ab", True), body(b"cd")],
    "/chunked-said": [start(200, (b"Transfer-Encoding", b"CHUNKED")), body(b"x", True), body()],
    "/empty-pieces": [start(200), body(b"", True), body(b"y", True), body(b"")],
    "/no-content": [start(204), body()],
    "/not-modified": [start(304, (b"etag", b'"1"')), body()],
    "/app-closes": [start(200, LENGTH, (b"Connection", b"keep-alive, Close")), body(b"9" * 10)],
    "/status-404": [start(404, (b"content-length", b"2")), body(b"no")],
    "/longer": [start(200, (b"content-length", b"3")), body(b"0123456789")],
    "/shorter": [start(200, LENGTH), body(b"012")],
    "/bad-name": [start(200, (b"X Bad", b"1"), LENGTH), body(b"0123456789")],
    "/bad-value": [start(200, (b"x-ok", b"1\r\nX-Injected: yes"), LENGTH), body(b"0123456789")],
    "/body-first": [body(b"0123456789")],
    "/two-starts": [start(200, LENGTH), start(200, LENGTH)],
    "/after-end": [start(200, LENGTH), body(b"0123456789"), body(b"more")],
    "/nothing": [],
    "/start-only": [start(200, LENGTH)],
}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    if scope["path"] == "/raises":
        raise ValueError("the application failed before its answer")
    for message in CASES[scope["path"]]:
        await send(message)


@pytest.fixture
async def ports() -> AsyncIterator[tuple[int, int]]:
    quiet = {"log_level": "critical", "server_header": False, "date_header": False}
    async with (
        serving(app, HttpToolsProtocol, **quiet) as stock,
        serving(app, ChunkNowProtocol, **quiet) as ours,
    ):
        yield stock, ours


async def received(port: int, request: bytes, settle: float = 0.3) -> bytes:
    """Everything the server wrote until it closed the connection or was quiet for ``settle``
    seconds after its last byte (a kept-alive connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        data = b""
        async with asyncio.timeout(DEADLINE):
            while True:
                try:
                    piece = await asyncio.wait_for(reader.read(65536), settle if data else 5.0)
                except (TimeoutError, ConnectionResetError):
                    break
                if not piece:
                    break
                data += piece
        return data
    finally:
        writer.close()


def get(path: str, method: str = "GET", version: str = "1.1", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()


@pytest.mark.parametrize("path", [*CASES, "/raises"])
async def test_every_answer_is_the_bytes_uvicorn_sends(ports: tuple[int, int], path: str) -> None:
    stock, ours = ports
    assert await received(ours, get(path)) == await received(stock, get(path))


@pytest.mark.parametrize("path", ["/length", "/no-length", "/no-content"])
async def test_a_head_request_is_answered_as_uvicorn_does(
    ports: tuple[int, int], path: str
) -> None:
    stock, ours = ports
    request = get(path, method="HEAD")
    assert await received(ours, request) == await received(stock, request)


@pytest.mark.parametrize(
    "request_",
    [get("/length", version="1.0"), get("/no-length", extra="Connection: close\r\n")],
    ids=["http-1.0", "client-closes"],
)
async def test_a_connection_that_is_not_kept_is_closed_as_uvicorn_does(
    ports: tuple[int, int], request_: bytes
) -> None:
    stock, ours = ports
    mine = await received(ours, request_, settle=5.0)
    assert mine == await received(stock, request_, settle=5.0)
    assert b"connection: close\r\n" in mine.lower()


async def test_two_answers_on_one_connection_match(ports: tuple[int, int]) -> None:
    stock, ours = ports
    request = get("/length-in-pieces") + get("/no-length")
    mine = await received(ours, request)
    assert mine == await received(stock, request)
    assert mine.count(b"HTTP/1.1 200 OK") == 2


async def test_a_header_that_would_inject_another_never_reaches_the_client(
    ports: tuple[int, int],
) -> None:
    _, ours = ports
    for path in ("/bad-value", "/bad-name"):
        data = await received(ours, get(path))
        assert b"X-Injected" not in data and b"X Bad" not in data
        assert b"0123456789" not in data
