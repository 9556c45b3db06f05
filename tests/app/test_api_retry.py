"""Keep-alive pools per child, and the retry-once rule for a pooled connection found closed."""

from __future__ import annotations

from models_app.api import Api
from routerpanel.router.address import LOOPBACK, ChildAddress
from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter, Grant
from tests.support.upstreams import ScriptedUpstream


async def tokenize(client: AsgiClient, content: str) -> tuple[int, bytes]:
    response = await client.post("/tokenize", {"model": "m", "content": content})
    return response.status or 0, response.body


class TestRetryOnce:
    async def test_a_pooled_connection_closed_under_us_is_retried_on_a_new_one(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream, api: Api
    ) -> None:
        # The child reads the second request on the kept-alive connection and hangs up without
        # a byte, as llama-server does when it closed the connection first.
        upstream.drop = lambda r: (r.connection, r.index) == (1, 2)
        router.add("m", Grant(upstream.port), status="loaded")
        assert (await tokenize(client, "a"))[0] == 200
        assert await tokenize(client, "b") == (200, b'{"ok":true}')
        seen = [(r.connection, r.index) for r in upstream.received]
        assert seen == [(1, 1), (1, 2), (2, 1)]
        assert upstream.received[1].body == upstream.received[2].body
        pool = api.upstreams.pool(ChildAddress(LOOPBACK, upstream.port))
        assert pool is not None and pool.retries == 1

    async def test_a_failure_on_a_new_connection_is_not_retried(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        upstream.drop = lambda r: True
        router.add("m", Grant(upstream.port), status="loaded")
        status, body = await tokenize(client, "a")
        assert status == 500
        assert b"proxy error: Failed to read connection" in body
        assert len(upstream.received) == 1

    async def test_the_retry_happens_only_once(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        upstream.drop = lambda r: r.index == 2 or r.connection > 1
        router.add("m", Grant(upstream.port), status="loaded")
        assert (await tokenize(client, "a"))[0] == 200
        assert (await tokenize(client, "b"))[0] == 500
        assert len(upstream.received) == 3


class TestPools:
    async def test_connections_are_kept_alive_between_requests(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        router.add("m", Grant(upstream.port), status="loaded")
        for content in "abc":
            assert (await tokenize(client, content))[0] == 200
        assert {r.connection for r in upstream.received} == {1}

    async def test_a_model_on_a_new_port_retires_the_old_pool(
        self, client: AsgiClient, router: FakeRouter, api: Api
    ) -> None:
        first = await ScriptedUpstream().start()
        second = await ScriptedUpstream().start()
        try:
            router.add("m", Grant(first.port), status="loaded")
            assert (await tokenize(client, "a"))[0] == 200
            assert api.upstreams.pool(ChildAddress(LOOPBACK, first.port)) is not None
            router.behaviour["m"] = Grant(second.port)  # the child was restarted elsewhere
            assert (await tokenize(client, "b"))[0] == 200
            assert api.upstreams.pool(ChildAddress(LOOPBACK, first.port)) is None
            assert api.upstreams.pool(ChildAddress(LOOPBACK, second.port)) is not None
        finally:
            await first.stop()
            await second.stop()
