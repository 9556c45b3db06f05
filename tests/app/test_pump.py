"""The pump (models_app.api.pump): a streamed body goes to the client from the relay's callback.

``start_now`` runs an awaitable up to its first suspension and finishes it in a task only if it
suspends; the pump sends each chunk from the callback that parsed it, and when a send suspends
(a slow client), keeps what comes meanwhile and sends it in order afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from models_app.api.pump import start_now
from models_app.api.request import CHUNK_NOW
from tests.support.asgi import DEADLINE, AsgiClient, Call
from tests.support.fake_router import FakeRouter, Grant
from tests.support.raw_upstream import RawUpstream, read_request
from tests.support.waits import settled

CHUNKS = 60


# ---- start_now ------------------------------------------------------------------------------


async def test_an_awaitable_that_does_not_suspend_runs_to_its_end_at_once() -> None:
    done: list[str] = []

    async def quick() -> None:
        done.append("ran")

    assert start_now(quick()) is None
    assert done == ["ran"]


async def test_an_exception_is_raised_where_it_was_started() -> None:
    async def refuses() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        start_now(refuses())


async def test_one_that_suspends_is_finished_by_a_task_with_the_value_it_waited_for() -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def waits() -> None:
        seen.append("before")
        seen.append(await settled(gate))
        await asyncio.sleep(0)  # a bare yield as well
        seen.append("after")

    task = start_now(waits())
    assert task is not None and seen == ["before"]
    gate.set_result("value")
    async with asyncio.timeout(DEADLINE):
        await task
    assert seen == ["before", "value", "after"]


async def test_cancelling_its_task_cancels_it_where_it_waits() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def waits() -> None:
        try:
            await settled(gate)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = start_now(waits())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(DEADLINE):
            await task
    assert seen == ["cancelled"] and gate.cancelled()


# ---- the pump in the proxy ------------------------------------------------------------------


class WatchedCall(Call):
    """A client that records whether each body message was sent from a task or from a
    callback, and, when ``slow_every`` is set, suspends on every such message (a client whose
    socket is full)."""

    def __init__(self, *args: Any, slow_every: int = 0, **kwargs: Any) -> None:
        self.from_task: list[bool] = []
        self.slow_every = slow_every
        super().__init__(*args, **kwargs)

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("more_body"):
            self.from_task.append(asyncio.current_task() is not None)
            if self.slow_every and len(self.from_task) % self.slow_every == 0:
                await asyncio.sleep(0.01)
        await super()._send(message)


def streaming_child(chunks: int, *, then: bytes = b"0\r\n\r\n", gap: float = 0.002):
    """A child that streams ``chunks`` numbered SSE events, chunked, ``gap`` s apart, then
    ``then`` (the end; anything else is followed by closing the connection)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for n in range(chunks):
            event = b"data: %d\n\n" % n
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(gap)
        writer.write(then)
        if then == b"0\r\n\r\n":
            await reader.read()

    return handler


def expected_body(chunks: int) -> bytes:
    return b"".join(b"data: %d\n\n" % n for n in range(chunks))


@pytest.fixture
def model_on(router: FakeRouter) -> Callable[[int], None]:
    def add(port: int) -> None:
        router.add("m", Grant(port), status="loaded")

    return add


def stream(client: AsgiClient, **kwargs: Any) -> WatchedCall:
    body = b'{"model":"m","stream":true}'
    headers = {"content-type": "application/json"}
    return WatchedCall(client.app, "POST", "/v1/chat/completions", body=body, headers=headers,
                       **kwargs)  # fmt: skip


async def test_chunks_go_out_from_the_callback_that_parsed_them_not_from_a_task(
    client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
) -> None:
    async with RawUpstream(streaming_child(CHUNKS)) as child:
        model_on(child.port)
        call = await stream(client).finish()
    assert call.status == 200
    assert b"".join(chunk for _, chunk in call.chunks) == expected_body(CHUNKS)
    # Chunks that came while the request's task was parked went out from the relay's
    # callback; only what was kept before the pump started is sent by the task.
    assert call.from_task.count(False) >= CHUNKS - 5, call.from_task
    await router.wait_for("router.release")


class DirectCall(WatchedCall):
    """A client whose server offers ``chunk_now`` as Daphne's does under ``serve``: False until
    a piece went out as a message after the head (Twisted writes the head with it), then each
    piece is written at once, into the same record as a message's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.direct = 0
        super().__init__(*args, extensions={CHUNK_NOW: self.chunk_now}, **kwargs)

    def chunk_now(self, body: bytes) -> bool:
        if not self.from_task or self.ended.is_set():
            return False
        self.direct += 1
        self.chunks.append((0.0, body))
        return True


async def test_a_server_that_offers_chunk_now_gets_the_pieces_through_it_whole_and_in_order(
    client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
) -> None:
    async with RawUpstream(streaming_child(CHUNKS)) as child:
        model_on(child.port)
        body = b'{"model":"m","stream":true}'
        headers = {"content-type": "application/json"}
        call = DirectCall(client.app, "POST", "/v1/chat/completions", body=body, headers=headers)
        await call.finish()
    assert call.status == 200
    assert b"".join(chunk for _, chunk in call.chunks) == expected_body(CHUNKS)
    assert len(call.from_task) == 1  # only the first piece went as a message
    assert call.direct == CHUNKS - 1
    await router.wait_for("router.release")


async def test_a_client_that_suspends_gets_every_chunk_in_order(
    client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
) -> None:
    async with RawUpstream(streaming_child(CHUNKS, gap=0.001)) as child:
        model_on(child.port)
        call = await stream(client, slow_every=3).finish()
    assert call.status == 200
    assert b"".join(chunk for _, chunk in call.chunks) == expected_body(CHUNKS)
    assert True in call.from_task  # kept chunks went out from the task after a slow send
    assert False in call.from_task
    await router.wait_for("router.release")


async def test_a_child_that_breaks_off_after_a_slow_send_ends_the_stream_after_what_it_sent(
    client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
) -> None:
    handler = streaming_child(20, then=b"5\r\nda")  # a chunk cut short, then the close
    async with RawUpstream(handler) as child:
        model_on(child.port)
        call = await stream(client, slow_every=2).finish()
    assert call.status == 200
    assert b"".join(chunk for _, chunk in call.chunks).startswith(expected_body(20))
    assert call.ended.is_set()
    await router.wait_for("router.release")


async def test_a_client_that_leaves_mid_stream_closes_the_childs_connection(
    client: AsgiClient, router: FakeRouter, model_on: Callable[[int], None]
) -> None:
    closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        try:
            while True:
                writer.write(b"9\r\ndata: x\n\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.005)
        except ConnectionError:
            closed.set()

    async with RawUpstream(endless) as child:
        model_on(child.port)
        call = stream(client, slow_every=4)
        await call.wait_body(lambda body: body.count(b"data: x") >= 10)
        call.disconnect()
        async with asyncio.timeout(DEADLINE):
            await closed.wait()
        await settled(call.task)
    await router.wait_for("router.release")
