"""The proxy's HTTP/1.1 client (models_app/api/relay.py), spoken to by hand-written children.

Framing, keep-alive, malformed answers and the retry-once rule are tested through the proxy in
test_proxy_fastpath.py and test_api_retry.py; here what those do not reach: ``HEAD``, connect
failures in cpp-httplib's words, back-pressure, and the request as it goes out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from models_app.api import relay, upstream_errors
from models_app.api.config import ApiConfig
from models_app.api.upstream import ChildPool, UpstreamError
from routerpanel.router.address import LOOPBACK, ChildAddress
from tests.support.raw_upstream import RawUpstream, answering, read_request

DEADLINE = 10.0


async def exchange(pool: ChildPool) -> tuple[int, bytes]:
    """POST one request through ``pool``; its answer's status and body, read to the end."""
    answer = await asyncio.wait_for(pool.send("POST", "/tokenize", [], b"{}"), DEADLINE)
    body = await asyncio.wait_for(answer.read(), DEADLINE)
    await answer.aclose()
    return answer.status, body


def test_a_request_is_one_buffer_head_then_body() -> None:
    headers = [(b"content-type", b"application/json"), (b"x-request-id", b"r1")]
    assert relay.encode_request("POST", "/tokenize?x=1", "127.0.0.1:8080", headers, b"{}") == (
        b"POST /tokenize?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8080\r\n"
        b"content-type: application/json\r\nx-request-id: r1\r\ncontent-length: 2\r\n\r\n{}"
    )
    get = relay.encode_request("GET", "/metrics", "h:1", [], b"")
    assert get == b"GET /metrics HTTP/1.1\r\nhost: h:1\r\n\r\n"  # no body, no length


async def test_an_answer_to_head_has_no_body_and_its_connection_is_not_reused() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n"
    async with RawUpstream(answering(head, head)) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
        for _ in range(2):
            answer = await asyncio.wait_for(pool.send("HEAD", "/health", [], b""), DEADLINE)
            assert answer.status == 200 and answer.header("content-length") == "5"
            assert await asyncio.wait_for(answer.read(), DEADLINE) == b""
            await answer.aclose()
        await pool.aclose()
    assert child.connections == 2


async def test_a_refused_connect_is_could_not_establish_connection() -> None:
    async with RawUpstream(answering()) as child:
        port = child.port
    pool = ChildPool(ChildAddress(LOOPBACK, port), ApiConfig())  # nobody listens there now
    with pytest.raises(UpstreamError) as failed:
        await asyncio.wait_for(pool.send("POST", "/tokenize", [], b"{}"), DEADLINE)
    assert failed.value.text == "Could not establish connection"


async def test_a_connect_that_hangs_is_connection_timed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    async def never(*args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(loop, "create_connection", never)
    pool = ChildPool(ChildAddress(LOOPBACK, 9), ApiConfig(connect_timeout=0.1))
    with pytest.raises(UpstreamError) as failed:
        await asyncio.wait_for(pool.send("POST", "/tokenize", [], b"{}"), DEADLINE)
    assert failed.value.text == "Connection timed out"


async def test_a_child_faster_than_its_reader_is_held_back_by_tcp_not_buffered_here() -> None:
    big = bytes(range(256)) * (32 * 1024)  # 8 MiB
    written = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big))
        for start in range(0, len(big), 65536):
            writer.write(big[start : start + 65536])
            await writer.drain()
        written.set()
        await reader.read()

    async with RawUpstream(handler) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
        answer = await asyncio.wait_for(pool.send("POST", "/completion", [], b"{}"), DEADLINE)
        conn = answer._conn
        async with asyncio.timeout(DEADLINE):
            while not conn.paused:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not written.is_set()  # the child waits on TCP: we stopped reading
        assert answer._buffered <= relay.HIGH_WATER + 65536 * 4  # not 8 MiB in memory
        body = await asyncio.wait_for(answer.read(), DEADLINE)  # reading resumes the socket
        assert body == big and not conn.paused
        await asyncio.wait_for(written.wait(), DEADLINE)
        await answer.aclose()
        await pool.aclose()


async def test_bytes_nobody_asked_for_make_an_idle_connection_unusable() -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok + b"HTTP/1.1 200 OK\r\n")  # a stray extra answer
        await read_request(reader)
        writer.write(ok)
        await reader.read()

    async with RawUpstream(handler) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
        assert await exchange(pool) == (200, b"ok")
        await asyncio.sleep(0.1)
        assert await exchange(pool) == (200, b"ok")
        await pool.aclose()
    assert child.connections == 2  # the first connection was not trusted again


def test_the_same_exchanges_run_on_uvloop() -> None:
    """``serve --http uvicorn`` runs on uvloop, whose transports are not asyncio's classes."""
    import uvloop

    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def exchanges() -> int:
        async with RawUpstream(answering(chunked, sized)) as child:
            pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
            for _ in range(2):
                answer = await asyncio.wait_for(pool.send("POST", "/x", [], b"{}"), DEADLINE)
                assert await answer.read() == b"ok"
                await answer.aclose()
            await pool.aclose()
            return child.connections

    assert uvloop.run(exchanges()) == 1  # kept alive between the two


async def test_chunks_that_arrived_together_are_read_as_one_piece() -> None:
    more = asyncio.Event()

    async def child(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n")
        await more.wait()
        writer.write(b"1\r\nc\r\n2\r\nde\r\n1\r\nf\r\n0\r\n\r\n")  # three chunks and the end
        await reader.read()

    async with RawUpstream(child) as upstream:
        pool = ChildPool(ChildAddress(LOOPBACK, upstream.port), ApiConfig())
        answer = await asyncio.wait_for(pool.send("POST", "/completion", [], b"{}"), DEADLINE)
        pieces = answer.chunks()
        assert await asyncio.wait_for(anext(pieces), DEADLINE) == b"ab"
        more.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while not answer.complete:  # all of it is in before the reader looks again
            assert loop.time() < deadline, "the rest of the answer never came"
            await asyncio.sleep(0.01)
        assert [piece async for piece in pieces] == [b"cdef"]
        await answer.aclose()
        await pool.aclose()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


async def test_a_second_answer_to_one_request_is_not_read_into_the_first() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK + b"HTTP/1.1 500 X\r\nContent-Length: 3\r\n\r\nbad")  # one write
        await read_request(reader)
        writer.write(OK)
        await reader.read()

    async with RawUpstream(handler) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
        for _ in range(2):
            assert await exchange(pool) == (200, b"ok")
        await pool.aclose()
    assert child.connections == 2  # the connection that sent two answers was not kept


async def test_an_informational_answer_in_its_own_write_is_skipped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)  # read by the client on its own
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
        await reader.read()

    async with RawUpstream(handler) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
        answer = await asyncio.wait_for(pool.send("POST", "/tokenize", [], b"{}"), DEADLINE)
        assert (answer.status, await asyncio.wait_for(answer.read(), DEADLINE)) == (201, b"ok")
        await answer.aclose()
        await pool.aclose()


async def exchange_then(second: bytes, hold: float = 0.0) -> tuple[ChildPool, UpstreamError, int]:
    """A kept-alive connection answers once, then reads a second request, waits ``hold`` s,
    writes ``second`` and closes; the second exchange's error, and the requests received."""
    received = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await read_request(reader))
        writer.write(OK)
        received.append(await read_request(reader))
        await asyncio.sleep(hold)
        writer.write(second)
        await writer.drain()

    async with RawUpstream(handler) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
        assert await exchange(pool) == (200, b"ok")
        with pytest.raises(UpstreamError) as failed:
            answer = await asyncio.wait_for(pool.send("POST", "/tokenize", [], b"{}"), DEADLINE)
            await asyncio.wait_for(answer.read(), DEADLINE)
        await pool.aclose()
    return pool, failed.value, len(received)


async def test_a_kept_alive_connection_that_breaks_off_after_answer_bytes_is_not_retried() -> None:
    pool, error, received = await exchange_then(b"HTTP/1.1 200 OK\r\nContent-Le")
    assert (error.text, pool.retries, received) == (upstream_errors.READ_FAILED, 0, 2)


async def test_a_request_the_child_held_before_it_closed_is_not_sent_again() -> None:
    # It read the request and failed later (not the idle close that crossed it): no second try
    pool, error, received = await exchange_then(b"", hold=2 * relay.STALE_WINDOW)
    assert (error.text, pool.retries, received) == (upstream_errors.READ_FAILED, 0, 2)
    assert not isinstance(error, upstream_errors.Stale)


async def test_a_body_with_a_transfer_coding_other_than_chunked_ends_at_close() -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nabc"
    async with RawUpstream(answering(answer, then_close=True)) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
        got = await asyncio.wait_for(pool.send("POST", "/x", [], b"{}"), DEADLINE)
        assert await asyncio.wait_for(got.read(), DEADLINE) == b"abc"
        await got.aclose()
        await pool.aclose()


async def test_a_reader_busy_longer_than_the_read_timeout_is_not_cut_off() -> None:
    go_on = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n")
        await go_on.wait()  # silent while its reader is busy elsewhere (a slow client)
        writer.write(b"2\r\ncd\r\n0\r\n\r\n")
        await reader.read()

    async with RawUpstream(handler) as child:
        pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig(upstream_timeout=0.2))
        answer = await asyncio.wait_for(pool.send("POST", "/completion", [], b"{}"), DEADLINE)
        pieces = answer.chunks()
        assert await asyncio.wait_for(anext(pieces), DEADLINE) == b"ab"
        await asyncio.sleep(0.8)  # four read timeouts, not waiting on the answer
        go_on.set()
        assert await asyncio.wait_for(anext(pieces), DEADLINE) == b"cd"
        await answer.aclose()
        await pool.aclose()
