"""The proxy's exchanges with the children over raw sockets (models_app.api.upstream).

How an answer's body ends (length, chunked, until close), which connections are kept and which
are not, the errors a client sees, large bodies both ways, and a client that leaves while the
child is still thinking. The retry-once rule is in test_api_retry.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from models_app.api import Api, ApiConfig
from models_app.api.upstream import ChildPool
from routerpanel.router.address import LOOPBACK, ChildAddress
from tests.support.asgi import DEADLINE, AsgiClient
from tests.support.fake_router import FakeRouter, Grant
from tests.support.raw_upstream import RawUpstream, answering, read_request
from tests.support.upstreams import ScriptedUpstream

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


async def tokenize(client: AsgiClient, **kwargs: object):  # type: ignore[no-untyped-def]
    return await client.post("/tokenize", {"model": "m", "content": "x"}, **kwargs)


@pytest.fixture
def model_on(router: FakeRouter) -> Callable[[int], None]:
    def add(port: int) -> None:
        router.add("m", Grant(port), status="loaded")

    return add


class TestFraming:
    async def test_a_chunked_answer_is_relayed_dechunked_without_extensions_or_trailers(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        answer = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        async with RawUpstream(answering(answer)) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert (response.status, response.body) == (200, b"hello world")
        assert response.header("content-type") == "text/event-stream"
        assert response.header("transfer-encoding") is None

    async def test_a_small_answer_keeps_the_childs_content_length(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        async with RawUpstream(answering(OK)) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert (response.status, response.body) == (200, b'{"ok":true}')
        assert response.header("content-length") == "11"  # llama.cpp re-chunks it (§15.13)
        assert response.header("x-accel-buffering") == "no"

    async def test_x_accel_buffering_goes_out_once_when_the_child_sent_it(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        answer = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Accel-Buffering: no\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        async with RawUpstream(answering(answer)) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert response.body == b"hello"
        assert [v for k, v in response.headers if k == b"x-accel-buffering"] == [b"no"]

    async def test_an_answer_bigger_than_whole_answer_bytes_streams_without_length(
        self, client: AsgiClient, api: Api, model_on: Callable[[int], None]
    ) -> None:
        size = api.config.whole_answer_bytes + 1
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size
        async with RawUpstream(answering(answer)) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert (response.status, len(response.body)) == (200, size)
        assert response.header("content-length") is None
        assert len(response.chunks) > 1  # relayed as it came, not held

    async def test_an_answer_without_length_runs_until_the_child_closes(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
        async with RawUpstream(answering(answer, then_close=True)) as child:
            model_on(child.port)
            first = await tokenize(client)
            second = await tokenize(client)
        assert first.body == second.body == b"until the end"
        assert child.connections == 2  # such a connection cannot be reused

    async def test_connection_close_from_the_child_is_honoured(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
        async with RawUpstream(answering(answer, answer)) as child:
            model_on(child.port)
            assert (await tokenize(client)).body == b"ok"
            assert (await tokenize(client)).body == b"ok"
        assert child.connections == 2

    async def test_an_informational_answer_is_skipped(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
        async with RawUpstream(answering(answer)) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert (response.status, response.body) == (201, b"ok")

    @pytest.mark.parametrize(
        "answer",
        [
            b"garbage\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2",  # the head never ends
        ],
    )
    async def test_a_malformed_answer_is_500_failed_to_read(
        self, client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None], answer: bytes
    ) -> None:
        async with RawUpstream(answering(answer, then_close=True)) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert response.status == 500
        assert response.json()["error"]["message"] == "proxy error: Failed to read connection"
        await router.wait_for("router.release")

    @pytest.mark.parametrize("tail", [b"", b"3", b"3\r\nab", b"5\r\nhello"])
    async def test_a_chunked_stream_that_breaks_off_just_ends(
        self, client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None], tail: bytes
    ) -> None:
        answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n" + tail
        async with RawUpstream(answering(answer, then_close=True)) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert response.status == 200
        assert response.body == b"hello" + tail.partition(b"\r\n")[2]
        await router.wait_for("router.release")

    async def test_a_whole_small_answer_reaches_daphne_in_two_messages(
        self, client: AsgiClient, model_on: Callable[[int], None], upstream: ScriptedUpstream
    ) -> None:
        model_on(upstream.port)
        response = await tokenize(client)
        # http.response.start, then one body message that also ends the response.
        assert [chunk for _, chunk in response.chunks] == [b'{"ok":true}']

    async def test_chunks_pass_one_by_one_as_the_child_sends_them(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        go_on = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nfirst \r\n")
            await go_on.wait()
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
            await reader.read()

        async with RawUpstream(handler) as child:
            model_on(child.port)
            call = client.start("POST", "/tokenize", json_body={"model": "m"})
            await call.wait_body(lambda body: body == b"first ")
            assert not call.ended.is_set()
            go_on.set()
            await call.finish()
        # A chunked body's end is known only after its last chunk: an empty message ends it.
        assert [chunk for _, chunk in call.chunks] == [b"first ", b"second", b""]


class TestConnections:
    async def test_an_idle_connection_the_child_closed_is_neither_reused_nor_retried(
        self, client: AsgiClient, api: Api, model_on: Callable[[int], None]
    ) -> None:
        async with RawUpstream(answering(OK, then_close=True)) as child:  # as after a stream
            model_on(child.port)
            assert (await tokenize(client)).status == 200
            await asyncio.sleep(0.1)  # the EOF arrives while the connection is idle
            assert (await tokenize(client)).status == 200
            pool = api.upstreams.pool(ChildAddress(LOOPBACK, child.port))
        assert child.connections == 2
        assert pool is not None and pool.retries == 0

    async def test_a_connection_idle_past_keepalive_expiry_is_not_reused(self) -> None:
        async with RawUpstream(answering(OK, OK)) as child:
            pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig(keepalive_expiry=0.1))
            for pause in (0.0, 0.3):
                await asyncio.sleep(pause)
                response = await pool.send("POST", "/tokenize", [], b"{}")
                assert await response.read() == b'{"ok":true}'
                await response.aclose()
            await pool.aclose()
        assert child.connections == 2

    async def test_a_response_closed_before_its_end_closes_the_connection(self) -> None:
        ended = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
            await reader.read()  # returns at EOF: the proxy closed the connection
            ended.set()

        async with RawUpstream(handler) as child:
            pool = ChildPool(ChildAddress(LOOPBACK, child.port), ApiConfig())
            response = await pool.send("POST", "/completion", [], b"{}")
            assert await anext(response.chunks()) == b"part"
            await response.aclose()
            await asyncio.wait_for(ended.wait(), 5)
            await pool.aclose()

    async def test_only_the_clients_headers_and_the_framing_reach_the_child(
        self, client: AsgiClient, model_on: Callable[[int], None], upstream: ScriptedUpstream
    ) -> None:
        model_on(upstream.port)
        await client.post("/tokenize", {"model": "m"}, headers={"x-custom": "1"})
        (seen,) = upstream.received
        assert sorted(seen.headers) == [
            "accept-encoding", "content-length", "content-type", "host", "x-custom", "x-request-id"
        ]  # fmt: skip
        assert seen.headers["host"] == f"127.0.0.1:{upstream.port}"


class TestDeparture:
    async def test_leaving_while_the_child_thinks_closes_its_connection(
        self, client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
    ) -> None:
        received, closed = asyncio.Event(), asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            received.set()
            await reader.read()
            closed.set()

        async with RawUpstream(handler) as child:
            model_on(child.port)
            call = client.start("POST", "/completion", json_body={"model": "m"})
            await asyncio.wait_for(received.wait(), 5)
            call.disconnect()
            await asyncio.wait_for(closed.wait(), DEADLINE)  # no read timeout to wait for
            await router.wait_for("router.release")
            await call.finish()
        assert call.status is None


class TestLargeBodies:
    async def test_large_bodies_pass_both_ways_intact(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        big = bytes(range(256)) * (16 * 1024)  # 4 MiB: more than the socket buffers hold

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            body = await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(body) + len(big)))
            writer.write(body)
            await writer.drain()
            for start in range(0, len(big), 65536):
                writer.write(big[start : start + 65536])
                await writer.drain()
            await reader.read()

        padding = "p" * (6 * 1024 * 1024)
        body = b'{"model":"m","padding":"' + padding.encode() + b'"}'
        async with RawUpstream(handler) as child:
            model_on(child.port)
            response = await client.request("POST", "/tokenize", body=body)
        assert response.status == 200
        assert response.body == body + big


class TestTimeouts:
    @pytest.fixture
    def config(self) -> ApiConfig:
        return ApiConfig(upstream_timeout=0.3)

    async def test_a_child_that_never_answers_is_500_read_timeout(
        self, client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
    ) -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            await reader.read()

        async with RawUpstream(handler) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert response.status == 500
        assert response.json()["error"]["message"] == "proxy error: Read timeout"
        await router.wait_for("router.release")

    async def test_a_child_that_goes_quiet_mid_body_is_cut_off_after_the_read_timeout(
        self, client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
    ) -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await reader.read()  # and never another byte

        async with RawUpstream(handler) as child:
            model_on(child.port)
            started = asyncio.get_running_loop().time()
            response = await tokenize(client)
            took = asyncio.get_running_loop().time() - started
        assert (response.status, response.body) == (200, b"hello")  # the head went out: it ends
        # Not before the read timeout (0.3 s); and it was that timeout, not the client's deadline
        # (DEADLINE, 30 s), that ended it: nothing else in between can.
        assert 0.3 <= took < DEADLINE / 2
        await router.wait_for("router.release")

    async def test_a_slow_child_that_never_pauses_for_the_read_timeout_is_not_cut_off(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        # Ten chunks 0.1 s apart: a second in all, more than three read timeouts, but no gap
        # is one. The timeout is between two reads of the child's, not for the whole body.
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(10):
                await asyncio.sleep(0.1)
                writer.write(b"1\r\nx\r\n")
            writer.write(b"0\r\n\r\n")
            await reader.read()

        async with RawUpstream(handler) as child:
            model_on(child.port)
            response = await tokenize(client)
        assert (response.status, response.body) == (200, b"x" * 10)

    async def test_the_read_timeout_waits_again_on_a_kept_connection(
        self, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        # One connection, two requests 0.5 s apart (longer than the timeout): the second
        # request's wait is measured from its own start, not from the first answer's bytes.
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(2):
                await read_request(reader)
                await asyncio.sleep(0.2)
                writer.write(OK)

        async with RawUpstream(handler) as child:
            model_on(child.port)
            first = await tokenize(client)
            await asyncio.sleep(0.5)
            second = await tokenize(client)
        assert (first.status, second.status) == (200, 200)
        assert child.connections == 1


class TestDrain:
    """``Api.drain``: what the server's stop (serve.Stopping) asks of the API first."""

    async def test_a_request_under_way_ends_the_drain_and_new_ones_are_refused(
        self, api: Api, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        received, answer = asyncio.Event(), asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            received.set()
            await answer.wait()
            writer.write(OK)
            await writer.drain()

        async with RawUpstream(handler) as child:
            model_on(child.port)
            call = client.start("POST", "/tokenize", json_body={"model": "m", "content": "x"})
            await asyncio.wait_for(received.wait(), DEADLINE)
            assert api.in_flight() == 1
            draining = asyncio.ensure_future(api.drain(30))
            await asyncio.sleep(0.05)
            assert not draining.done()  # it waits for the request under way

            refused = await tokenize(client)
            assert refused.status == 503
            assert refused.json()["error"] == {
                "code": 503, "message": "router is shutting down", "type": "unavailable_error"
            }  # fmt: skip

            answer.set()
            await call.finish()
            assert call.status == 200 and call.json() == {"ok": True}  # it ended whole
            await asyncio.wait_for(draining, DEADLINE)  # at once, not after 30 s

    async def test_the_drain_gives_up_after_its_grace(
        self, api: Api, client: AsgiClient, model_on: Callable[[int], None]
    ) -> None:
        received, release = asyncio.Event(), asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            received.set()
            await release.wait()

        async with RawUpstream(handler) as child:
            model_on(child.port)
            call = client.start("POST", "/completion", json_body={"model": "m"})
            await asyncio.wait_for(received.wait(), DEADLINE)
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(api.drain(0.2), DEADLINE)
            waited = asyncio.get_running_loop().time() - started
            assert 0.2 <= waited < 2 and api.in_flight() == 1  # still under way: not its job
            call.disconnect()
            release.set()
            await call.finish()

    async def test_a_drain_with_nothing_under_way_returns_at_once(self, api: Api) -> None:
        await asyncio.wait_for(api.drain(30), 1)
        assert api.stopping
