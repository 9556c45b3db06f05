"""Children off loopback are protected (issue 18), through the API.

With ``child_keys`` on, every child the router spawns wants its own per-spawn key. The router
hands it to the web side with the grant and the proxy sends it (and only it): the client's
``Authorization``/``X-Api-Key`` are RouterPanel keys and never reach a child. The key shows up
nowhere else: not in the snapshot, ``/models``, ``/v1/models``, the events or the audit rows.

Everything is real except the network (as in test_usage_router): router host, engine, simulated
children, the worker consumer and the HTTP app, joined by the in-memory channel layer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer
from channels.routing import ChannelNameRouter
from channels.worker import Worker

from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore
from models_app.audit.writer import AuditWriter
from models_app.models import AuditEvent
from models_app.presets.specs import Overrides
from models_app.routing.client import RouterClient
from models_app.routing.host import RouterHost
from models_app.routing.listener import RouterConsumer
from models_app.routing.topology import UNNAMED_CHANNEL
from routerpanel.router.engine import EngineEvent
from tests.support.asgi import AsgiClient, django_stand_in
from tests.support.fake_router import FakeRouter, Grant
from tests.support.upstreams import ScriptedUpstream, save_two_sim_presets

DEADLINE = 60.0
CLIENT_KEYS = {"authorization": "Bearer sk-routerpanel-client", "x-api-key": "sk-also-ours"}
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@dataclass
class Stack:
    client: AsgiClient
    host: RouterHost
    events: list[EngineEvent]
    writer: AuditWriter
    data: Path

    def key(self) -> str:
        """The running child's key, read where the child reads it."""
        (path,) = self.data.glob("child-key-*")
        return path.read_text().strip()

    def child_port(self, model: str) -> int:
        assert self.host.engine is not None
        snapshot = self.host.engine.snapshot()
        port: int = next(m["port"] for m in snapshot["models"] if m["name"] == model)
        return port


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    await sync_to_async(save_two_sim_presets)(50)
    layer = InMemoryChannelLayer()
    data = tmp_path / "data"
    host = RouterHost(
        layer, overrides=Overrides(child_keys=True), state_file=data / "children.json"
    )
    events: list[EngineEvent] = []
    writer = AuditWriter(tmp_path / "journal", router_id="keyed-router", interval=0.02).start()
    host.add_listener(events.append)
    host.add_listener(writer)
    await host.start()
    app = ChannelNameRouter({UNNAMED_CHANNEL: RouterConsumer.as_asgi()})
    worker = asyncio.ensure_future(Worker(app, [UNNAMED_CHANNEL], layer).arun())
    api = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=10.0),
        keys=KeyStore(toucher=None),
        config=ApiConfig(),
    )
    yield Stack(AsgiClient(api), host, events, writer, data)
    await api.aclose()
    worker.cancel()
    await asyncio.wait_for(host.stop(), DEADLINE)
    await asyncio.to_thread(writer.close, 10.0)


async def post(client: AsgiClient, path: str, body: Any, **headers: str) -> Any:
    call = await asyncio.wait_for(client.post(path, body, headers=headers), DEADLINE)
    assert call.status == 200, call.body
    return call


@pytest.mark.django_db(transaction=True)
class TestThroughTheRouter:
    async def test_a_keyed_child_answers_the_proxy_and_refuses_anyone_else(
        self, stack: Stack
    ) -> None:
        chat = await post(stack.client, "/v1/chat/completions", CHAT, **CLIENT_KEYS)
        assert chat.json()["choices"]
        tokens = await post(stack.client, "/tokenize", {"model": "m1", "content": "hi"})
        assert tokens.json()["tokens"]
        port = stack.child_port("m1")
        async with httpx.AsyncClient(trust_env=False, timeout=DEADLINE) as direct:
            bare = await direct.post(f"http://127.0.0.1:{port}/tokenize", json={"content": "x"})
            client_key = await direct.post(
                f"http://127.0.0.1:{port}/tokenize", json={"content": "x"}, headers=CLIENT_KEYS
            )
        assert bare.status_code == client_key.status_code == 401

    async def test_a_new_child_gets_a_new_key_and_the_proxy_follows(self, stack: Stack) -> None:
        await post(stack.client, "/v1/chat/completions", CHAT)
        first = stack.key()
        await post(stack.client, "/v1/chat/completions", CHAT | {"model": "m2"})  # swaps m1 out
        await post(stack.client, "/v1/chat/completions", CHAT)  # and back: a new spawn
        assert stack.key() != first

    async def test_the_key_is_in_no_listing_snapshot_event_or_audit_row(self, stack: Stack) -> None:
        await post(stack.client, "/v1/chat/completions", CHAT, **CLIENT_KEYS)
        key = stack.key()
        assert stack.host.engine is not None
        seen = {
            "snapshot": json.dumps(stack.host.engine.snapshot()),
            "status": json.dumps(stack.host.engine.status()),
            "logs": json.dumps(stack.host.engine.logs("m1")),
        }
        for path in ("/models", "/v1/models"):
            listing = await asyncio.wait_for(stack.client.get(path), DEADLINE)
            assert listing.status == 200
            seen[path] = listing.body.decode()
        assert '"--host"' in seen["/models"]  # the listing does show the command line
        seen["events"] = json.dumps([e.data for e in stack.events], default=str)
        assert await asyncio.to_thread(stack.writer.flush, 30.0), "audit rows not stored"
        rows = await sync_to_async(list)(
            AuditEvent.objects.filter(router_id="keyed-router").values()
        )
        assert rows
        seen["audit"] = json.dumps(rows, default=str)
        leaked = [where for where, text in seen.items() if key in text]
        assert leaked == []


class TestTheProxy:
    """What reaches a child, on a scripted upstream that records it."""

    async def test_the_child_gets_its_own_key_and_never_the_clients(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        router.add("m", Grant(upstream.port, key="child-secret"), status="loaded")
        response = await client.post("/tokenize", {"model": "m"}, headers=CLIENT_KEYS)
        assert response.status == 200
        (seen,) = upstream.received
        assert seen.headers["authorization"] == "Bearer child-secret"
        assert "x-api-key" not in seen.headers

    async def test_an_unkeyed_child_gets_no_key_at_all(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        router.add("m", Grant(upstream.port), status="loaded")
        response = await client.post("/tokenize", {"model": "m"}, headers=CLIENT_KEYS)
        assert response.status == 200
        (seen,) = upstream.received
        assert "authorization" not in seen.headers and "x-api-key" not in seen.headers

    async def test_a_new_key_on_the_same_port_is_a_new_pool(
        self, api: Api, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        router.add("m", Grant(upstream.port, key="first"), status="loaded")
        assert (await client.post("/tokenize", {"model": "m"})).status == 200
        router.behaviour["m"] = Grant(upstream.port, key="second")  # restarted on the same port
        assert (await client.post("/tokenize", {"model": "m"})).status == 200
        keys = [r.headers["authorization"] for r in upstream.received]
        assert keys == ["Bearer first", "Bearer second"]
        assert [r.connection for r in upstream.received] == [1, 2]  # the old pool was retired
