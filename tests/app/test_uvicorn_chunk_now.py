"""``serve --http uvicorn``'s protocol (``uvicorn_server.ChunkNowProtocol``).

It offers ``chunk_now`` in each request's scope (``uvicorn_server.chunk_now``).

The proxy's pump writes each piece of a streamed answer with it instead of an ASGI message. It
must write exactly what uvicorn's own ``send`` would, and refuse (False, so the piece goes as a
message) wherever ``send`` would do something else: before the head, after the end, for a HEAD
request, and while the client's socket takes no more (``send`` waits for it to drain).

An answer's head leaves in one write with its first piece of body (``HeadWithBody``), or alone
when the application waits between the two or sends no body; a connection's addresses are the
ones uvloop read at the accept.

uvicorn runs in the test's loop with our protocol class, on a real socket; the writes are
counted by a recorder around each connection's transport.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from models_app.api.request import CHUNK_NOW
from models_app.servers.uvicorn_server import ChunkNowProtocol
from tests.support.uvicorn_server import serving

DEADLINE = 30.0
# More than a loopback connection takes at once, so uvicorn pauses writing: the client's receive
# buffer is kept small (exchange), and the server's send buffer grows to at most tcp_wmem's
# maximum (4 MiB on Debian; a 4 MiB piece fitted on a machine whose receive side took more).
BIG = 16 * 1024 * 1024

said: dict[str, list[bool]] = {}
writes: list[bytes] = []  # every write of every connection, in order
scopes: list[dict[str, Any]] = []


class Recorder:
    """A connection's transport, its writes counted."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class RecordingProtocol(ChunkNowProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Recorder(transport))  # type: ignore[arg-type]


async def whole(send: Any, body: bytes, length: int | None = None) -> None:
    size = str(len(body) if length is None else length).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", size)]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    scopes.append(scope)
    if scope["path"] == "/whole":
        await whole(send, b"0123456789")
        return
    if scope["path"] == "/wrong-length":  # uvicorn refuses a body longer than it said
        await whole(send, b"0123456789", length=3)
        return
    if scope["path"] == "/slow":  # the body comes a while after the head
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"4")]})  # fmt: skip
        await asyncio.sleep(1.0)
        await send({"type": "http.response.body", "body": b"late"})
        return
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
    async with serving(app, RecordingProtocol) as number:
        said.clear()
        writes.clear()
        scopes.clear()
        yield number


async def exchange(
    port: int, request: bytes, *, slow: bool = False, until: bytes = b"\r\n0\r\n\r\n"
) -> bytes:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # no autotuning past 64 KiB
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(request)
        if slow:
            await asyncio.sleep(0.3)  # let the server fill the socket and pause writing
        data = b""
        async with asyncio.timeout(DEADLINE):
            while not data.endswith(until) and not (b"HEAD" in request and data):
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


async def test_an_answer_with_a_length_leaves_in_one_write(port: int) -> None:
    data = await exchange(port, b"GET /whole HTTP/1.1\r\nHost: x\r\n\r\n", until=b"0123456789")
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\n0123456789")
    assert writes == [data]


async def test_a_head_request_gets_its_head_alone(port: int) -> None:
    data = await exchange(port, b"HEAD /whole HTTP/1.1\r\nHost: x\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"\r\n\r\n")
    assert b"content-length: 10" in data.lower()
    assert writes == [data]


async def test_a_head_whose_body_is_late_goes_out_at_once(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(0.8):  # the body comes 1 s after the head
            head = await reader.readuntil(b"\r\n\r\n")
        async with asyncio.timeout(DEADLINE):
            body = await reader.readexactly(4)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 OK") and body == b"late"
    assert writes == [head, body]


async def test_a_first_piece_of_a_stream_leaves_with_the_head(port: int) -> None:
    data = await exchange(port, b"GET /pieces HTTP/1.1\r\nHost: x\r\n\r\n")
    head = data.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
    assert writes[0] == head + b"2\r\n0;\r\n"
    assert b"".join(writes) == data and len(writes) == 51  # 50 pieces, then the end


async def test_a_body_uvicorn_refuses_still_lets_the_head_out(port: int) -> None:
    data = await exchange(port, b"GET /wrong-length HTTP/1.1\r\nHost: x\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 3" in data.lower()
    assert b"0123456789" not in data


async def test_the_scope_has_the_addresses_of_both_ends(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        mine = writer.get_extra_info("sockname")
        writer.write(b"GET /whole HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(DEADLINE):
            await reader.readuntil(b"0123456789")
    finally:
        writer.close()
    assert scopes[0]["client"] == ("127.0.0.1", mine[1])
    assert scopes[0]["server"] == ("127.0.0.1", port)
