"""Streaming through the proxy: chunks pass as they come, leases are kept and given back, and a
client that leaves cancels its place in the queue or its upstream request.

Timing assertions are orderings, not durations: the machine is small and busy.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx

from models_app.api import Api
from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter, Grant, QueueThenGrant
from tests.support.upstreams import ScriptedUpstream, SimServer

DEADLINE = 30.0


def chat(model: str, tokens: int) -> dict:
    return {
        "model": model,
        "stream": True,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": "hi"}],
    }


async def metric(sim: SimServer, name: str) -> float:
    async with httpx.AsyncClient(trust_env=False) as http:
        text = (await http.get(f"http://127.0.0.1:{sim.port}/metrics")).text
    found = re.search(rf"^llamacpp:{name} (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


async def eventually(check, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


class TestPassthrough:
    async def test_tokens_arrive_before_the_child_finishes(
        self, client: AsgiClient, router: FakeRouter, slow_simserver: SimServer
    ) -> None:
        router.add("slow", Grant(slow_simserver.port), status="loaded")
        call = client.start("POST", "/v1/chat/completions", json_body=chat("slow", 15))
        await call.wait_body(lambda body: b'"content":"' in body)
        assert not call.ended.is_set()  # the first token is here, the stream is not over
        await call.finish()
        assert call.status == 200
        assert call.header("content-type") == "text/event-stream"
        data = [t for t, chunk in call.chunks if chunk.startswith(b"data: ")]
        assert len(data) >= 15  # one chunk per token, not one buffered body
        assert data == sorted(data)
        assert data[-1] - data[0] > 0.5  # spread over the stream's time (15 x 100 ms)
        assert call.body.rstrip().endswith(b"data: [DONE]")

    async def test_a_child_that_dies_before_its_whole_answer_is_a_500_not_a_short_body(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        # An answer framed by Content-Length is read whole before it goes out, so a child that
        # breaks off cannot hand the client a short body that looks complete.
        upstream.answer = lambda r: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"
        router.add("m", Grant(upstream.port), status="loaded")
        response = await client.post("/completion", {"model": "m"})
        assert response.status == 500
        assert response.json()["error"]["message"] == "proxy error: Failed to read connection"
        await router.wait_for("router.release")

    async def test_a_big_answer_that_breaks_off_mid_stream_just_ends(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream, api: Api
    ) -> None:
        # Beyond whole_answer_bytes the answer streams (chunked) and ends where the child did.
        size = api.config.whole_answer_bytes + 1
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size
        upstream.answer = lambda r: head + b"partial"
        router.add("m", Grant(upstream.port), status="loaded")
        response = await client.post("/completion", {"model": "m"})
        assert (response.status, response.body) == (200, b"partial")
        assert response.header("content-length") is None
        await router.wait_for("router.release")


class TestLease:
    async def test_it_is_renewed_while_streaming_and_released_at_the_end(
        self, client: AsgiClient, router: FakeRouter, slow_simserver: SimServer
    ) -> None:
        router.lease_ttl = 0.6  # renew every 0.2 s
        router.add("slow", Grant(slow_simserver.port), status="loaded")
        await client.post("/v1/chat/completions", chat("slow", 15))
        release = await router.wait_for("router.release")
        renewals = router.of_type("router.renew")
        assert len(renewals) >= 3
        assert {m["lease_id"] for m in renewals} == {release["lease_id"]}
        assert router.received.index(release) > router.received.index(renewals[-1])
        await asyncio.sleep(0.5)
        assert len(router.of_type("router.renew")) == len(renewals)  # stopped with the release

    async def test_a_short_request_costs_one_acquire_and_one_release(
        self, client: AsgiClient, router: FakeRouter, simserver: SimServer
    ) -> None:
        router.add("fast", Grant(simserver.port), status="loaded")
        await client.post("/tokenize", {"model": "fast", "content": "x"})
        await router.wait_for("router.release")
        assert [m["type"] for m in router.received] == ["router.acquire", "router.release"]


class TestDisconnect:
    async def test_leaving_while_queued_cancels_the_wait(
        self, client: AsgiClient, router: FakeRouter, simserver: SimServer
    ) -> None:
        queued = QueueThenGrant(simserver.port)
        router.add("cold", queued, status="unloaded")
        call = client.start("POST", "/v1/chat/completions", json_body=chat("cold", 3))
        acquire = await router.wait_for("router.acquire")
        await asyncio.sleep(0.2)  # the queued answer is in: the client now waits (A2)
        assert not call.started.is_set()
        call.disconnect()
        cancel = await router.wait_for("router.cancel")
        assert cancel["request_id"] == acquire["request_id"]
        await call.finish()
        assert call.status is None  # nobody to answer
        assert router.of_type("router.release") == []

    async def test_leaving_while_streaming_releases_and_cancels_upstream(
        self, client: AsgiClient, router: FakeRouter, slow_simserver: SimServer
    ) -> None:
        router.add("slow", Grant(slow_simserver.port), status="loaded")
        predicted = await metric(slow_simserver, "tokens_predicted_total")
        call = client.start("POST", "/v1/chat/completions", json_body=chat("slow", 100))
        await call.wait_body(lambda body: body.count(b'"content":"') >= 2)
        assert await metric(slow_simserver, "requests_processing") == 1
        call.disconnect()
        await router.wait_for("router.release")
        await call.finish()
        assert not call.ended.is_set()

        async def child_is_idle() -> bool:
            return await metric(slow_simserver, "requests_processing") == 0

        await eventually(child_is_idle)
        # The child stopped generating: an aborted run is never counted as predicted tokens,
        # while finishing the 100 tokens would have taken 10 s more.
        assert await metric(slow_simserver, "tokens_predicted_total") == predicted
