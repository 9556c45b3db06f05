"""Scoped keys on the HTTP surface (issue 17.1): a key's models (by name or alias), its limit of
concurrent requests (given back however a request ends), the listing, and the audit rows."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from models_app.api import Api, ApiConfig, scopes
from models_app.api.auth import Caller, KeyStore, KeyTable, digest
from models_app.models import AuditEvent, AuditKind
from models_app.routing.client import RouterClient
from routerpanel.router.catalogue import Event
from tests.support.asgi import AsgiClient, django_stand_in
from tests.support.fake_router import FakeRouter, Grant, QueueThenGrant, Reject
from tests.support.upstreams import SimServer

SCOPED = "rp-scoped-key-0123456789"
LIMITED = "rp-limited-key-0123456789"
OPEN = "rp-open-key-0123456789"


def chat(model: str, tokens: int = 3) -> dict[str, Any]:
    return {"model": model, "stream": True, "max_tokens": tokens, "messages": [{"role": "user"}]}


def as_key(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def start_chat(client: AsgiClient, model: str, secret: str, tokens: int = 3) -> Any:
    """Start a streamed chat for ``model`` with ``secret``; return the call in flight."""
    return client.start(
        "POST", "/v1/chat/completions", json_body=chat(model, tokens), headers=as_key(secret)
    )


async def tokenize(client: AsgiClient, model: str, secret: str) -> int:
    """POST /tokenize for ``model`` with ``secret``; return the status."""
    call = await client.post("/tokenize", {"model": model}, headers=as_key(secret))
    assert call.status is not None
    return call.status


@pytest.fixture
def scoped(key_table: dict[str, Any]) -> dict[str, Any]:
    """Three keys: qwen* only, one request at a time, and unscoped; qwen-7b has alias "fast"."""
    key_table["required"] = True
    key_table["keys"] = {
        digest(SCOPED): Caller("key:alice/ci", 1, ("qwen*",), None, "low"),
        digest(LIMITED): Caller("key:bob/batch", 2, (), 1),
        digest(OPEN): Caller("key:carol/laptop", 3),
    }
    key_table["names"] = {"qwen-7b": ("qwen-7b", "fast"), "fast": ("qwen-7b", "fast")}
    key_table["operators"] = {"key:alice/ci"}
    return key_table


@pytest.fixture
def models(router: FakeRouter, simserver: SimServer) -> None:
    router.add("qwen-7b", Grant(simserver.port), status="loaded", aliases=["fast"])
    router.add("llama-3", Grant(simserver.port), status="loaded", aliases=["qwen-like"])
    router.add("mistral", Grant(simserver.port), status="loaded")


class TestModelScope:
    async def test_a_model_outside_the_scope_is_403_naming_the_key_and_the_model(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, models: None
    ) -> None:
        response = await client.post(
            "/v1/chat/completions", chat("mistral"), headers=as_key(SCOPED)
        )
        assert response.status == 403
        assert response.json() == {
            "error": {
                "code": 403,
                "message": "API key key:alice/ci may not use model 'mistral' (allowed: qwen*)",
                "type": "permission_error",
            }
        }
        assert router.of_type("router.acquire") == []  # refused before the queue

    async def test_a_model_inside_the_scope_is_served(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, models: None
    ) -> None:
        assert await tokenize(client, "qwen-7b", SCOPED) == 200
        assert (await router.wait_for("router.acquire"))["actor"] == "key:alice/ci"

    async def test_an_alias_is_checked_with_its_presets_name_and_aliases(
        self, client: AsgiClient, scoped: dict, models: None, key_table: dict
    ) -> None:
        # "fast" matches no pattern itself, but names qwen-7b, which qwen* matches
        assert await tokenize(client, "fast", SCOPED) == 200
        # and a key scoped to the alias may use the preset by its name
        key_table["keys"][digest(SCOPED)] = Caller("key:alice/ci", 1, ("fast",))
        key_table["required"] = True
        client.app.keys.invalidate()
        assert await tokenize(client, "qwen-7b", SCOPED) == 200
        assert await tokenize(client, "mistral", SCOPED) == 403

    async def test_an_unknown_name_is_checked_as_given(
        self, client: AsgiClient, scoped: dict, models: None
    ) -> None:
        assert await tokenize(client, "nope", SCOPED) == 403
        assert await tokenize(client, "qwen-nope", SCOPED) == 400  # in scope: the router's 400

    async def test_unscoped_and_static_keys_use_every_model(
        self, client: AsgiClient, scoped: dict, models: None, keys: KeyStore
    ) -> None:
        assert await tokenize(client, "mistral", OPEN) == 200
        keys.configure(["static"])
        assert await tokenize(client, "mistral", "static") == 200

    async def test_get_routes_with_a_model_are_checked_too(
        self, client: AsgiClient, scoped: dict, models: None
    ) -> None:
        for path in ("/props?model=mistral", "/metrics?model=mistral", "/slots?model=mistral"):
            assert (await client.get(path, headers=as_key(SCOPED))).status == 403, path

    async def test_load_unload_and_cancel_outside_the_scope_are_403(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, models: None
    ) -> None:
        for path in ("/models/load", "/models/unload", "/models/cancel"):
            refused = await client.post(path, {"model": "mistral"}, headers=as_key(SCOPED))
            assert refused.status == 403, path
            assert "key:alice/ci" in refused.json()["error"]["message"]
        assert router.of_type("router.load") == router.of_type("router.unload") == []
        unloaded = await client.post("/models/unload", {"model": "fast"}, headers=as_key(SCOPED))
        assert unloaded.status == 200


class TestListing:
    @pytest.mark.parametrize("path", ["/v1/models", "/models"])
    async def test_the_listing_shows_only_what_the_key_may_use(
        self, client: AsgiClient, scoped: dict, models: None, path: str
    ) -> None:
        async def ids(secret: str) -> list[str]:
            response = await client.get(path, headers=as_key(secret))
            return [m["id"] for m in response.json()["data"]]

        # llama-3 is listed: its alias qwen-like is in scope, so the key may use it
        assert await ids(SCOPED) == ["llama-3", "qwen-7b"]
        assert await ids(OPEN) == ["llama-3", "mistral", "qwen-7b"]


class TestEvents:
    async def test_the_sse_stream_sends_only_the_keys_models_and_reloads(
        self, client: AsgiClient, router: FakeRouter, scoped: dict
    ) -> None:
        call = client.start("GET", "/models/sse", headers=as_key(SCOPED))
        await call.wait_started()
        for model in ("mistral", "qwen-7b"):
            change = {"model": model, "from": "unloaded", "to": "loading", "status": "loading"}
            await router.emit(Event.MODEL_STATE, change)
        await router.emit(Event.PRESETS_RELOADED, {"added": [], "removed": [], "changed": []})
        await call.wait_body(lambda body: body.count(b"data: ") >= 2)
        call.disconnect()
        await call.finish()
        frames = [f for f in call.body.decode().split("\n\n") if f.startswith("data: ")]
        assert [json.loads(f.removeprefix("data: "))["model"] for f in frames] == ["qwen-7b", "*"]


class TestConcurrency:
    async def test_one_over_the_limit_is_429_with_retry_after(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, slow_simserver: SimServer
    ) -> None:
        router.add("slow", Grant(slow_simserver.port), status="loaded")
        first = start_chat(client, "slow", LIMITED, 5)
        await first.wait_started()
        second = await client.post("/v1/chat/completions", chat("slow"), headers=as_key(LIMITED))
        assert second.status == 429
        assert second.header("retry-after") == "1"
        error = second.json()["error"]
        assert error["code"] == 429 and error["type"] == "rate_limit_error"
        assert "key:bob/batch" in error["message"] and "limit is 1" in error["message"]
        assert await tokenize(client, "slow", OPEN) == 200  # another key is not held back
        await first.finish()
        assert first.status == 200
        assert await tokenize(client, "slow", LIMITED) == 200
        assert client.app.gate.in_flight == {}

    async def test_a_queued_request_counts_and_leaving_the_queue_gives_the_slot_back(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, simserver: SimServer
    ) -> None:
        queued = QueueThenGrant(simserver.port)
        router.add("cold", queued, status="unloaded")
        call = start_chat(client, "cold", LIMITED)
        await router.wait_for("router.acquire")
        assert await tokenize(client, "cold", LIMITED) == 429
        call.disconnect()
        await router.wait_for("router.cancel")
        await call.finish()
        assert client.app.gate.in_flight == {}

    async def test_leaving_while_streaming_gives_the_slot_back(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, slow_simserver: SimServer
    ) -> None:
        router.add("slow", Grant(slow_simserver.port), status="loaded")
        call = start_chat(client, "slow", LIMITED, 50)
        await call.wait_body(lambda body: b'"content":"' in body)
        assert client.app.gate.in_flight == {2: 1}
        call.disconnect()
        await router.wait_for("router.release")
        await call.finish()
        assert client.app.gate.in_flight == {}

    async def test_a_refusal_by_the_router_gives_the_slot_back(
        self, client: AsgiClient, router: FakeRouter, scoped: dict
    ) -> None:
        router.add(
            "full", Reject(503, "queue is full", "unavailable_error", 2.0), status="unloaded"
        )
        for _ in range(3):
            assert await tokenize(client, "full", LIMITED) == 503
        assert client.app.gate.in_flight == {}

    async def test_a_cancelled_handler_gives_the_slot_back(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, simserver: SimServer
    ) -> None:
        router.add("cold", QueueThenGrant(simserver.port), status="unloaded")
        call = client.start(
            "POST", "/tokenize", json_body={"model": "cold"}, headers=as_key(LIMITED)
        )
        await router.wait_for("router.acquire")
        call.task.cancel()  # the server shutting down, say
        with pytest.raises(asyncio.CancelledError):
            await call.finish()
        assert client.app.gate.in_flight == {}


class TestRefusalsAreAudited:
    async def test_a_flood_of_refusals_writes_at_most_two_rows_per_window(self) -> None:
        written: list[tuple[int, dict[str, Any]]] = []
        refusals = scopes.KeyRefusals(lambda n, details: written.append((n, details)), window=0.3)
        caller = Caller("key:alice/ci", 1, ("qwen*",))

        class Req:
            scope = {"client": ("10.0.0.7", 4000)}

        for n in range(200):
            refusals.note(caller, f"m{n % 2}", Req())  # type: ignore[arg-type]
        await refusals.drain()
        await asyncio.sleep(0.4)
        await refusals.drain()
        assert [n for n, _ in written] == [1, 199]
        assert written[1][1]["keys"] == {"key:alice/ci": 199}
        assert written[1][1]["models"] == {"m1": 100, "m0": 99}

    @pytest.mark.django_db(transaction=True)
    async def test_403_and_429_land_in_the_audit_log(
        self, router: FakeRouter, layer: InMemoryChannelLayer, simserver: SimServer
    ) -> None:
        router.add("mistral", Grant(simserver.port), status="loaded")
        router.add("cold", QueueThenGrant(simserver.port), status="unloaded")
        table = KeyTable(
            True,
            {
                digest(SCOPED): Caller("key:alice/ci", 1, ("qwen*",)),
                digest(LIMITED): Caller("key:bob/batch", 2, (), 1),
            },
        )
        keys = KeyStore(lambda: table, None)
        gate = scopes.Gate(
            keys,
            scope_refusals=scopes.audited(scopes.SCOPE),
            busy_refusals=scopes.audited(scopes.BUSY),
        )
        app = Api(
            django_stand_in,
            router=RouterClient(layer, timeout=1.0),
            keys=keys,
            config=ApiConfig(),
            gate=gate,
        )
        client = AsgiClient(app)
        assert await tokenize(client, "mistral", SCOPED) == 403
        held = client.start(
            "POST", "/tokenize", json_body={"model": "cold"}, headers=as_key(LIMITED)
        )
        await router.wait_for("router.acquire")
        assert await tokenize(client, "cold", LIMITED) == 429
        held.disconnect()
        await held.finish()
        await gate.drain()
        scope_row = await AuditEvent.objects.aget(kind=AuditKind.KEY_SCOPE)
        assert (scope_row.actor, scope_row.model) == ("key:alice/ci", "mistral")
        assert scope_row.reason == "1 request outside the key's models"
        busy_row = await AuditEvent.objects.aget(kind=AuditKind.KEY_BUSY)
        assert (busy_row.actor, busy_row.model) == ("key:bob/batch", "cold")
        assert busy_row.details["clients"] == {"127.0.0.1": 1}
        await app.aclose()


class TestPriority:
    async def test_the_acquire_carries_the_keys_priority_class_to_the_router(
        self, client: AsgiClient, router: FakeRouter, scoped: dict, models: None
    ) -> None:
        """Issue 17.5: the fair queue policy orders by it (unscoped keys are normal)."""
        assert await tokenize(client, "qwen-7b", SCOPED) == 200
        assert await tokenize(client, "mistral", OPEN) == 200
        sent = {m["actor"]: m["priority"] for m in router.of_type("router.acquire")}
        assert sent == {"key:alice/ci": "low", "key:carol/laptop": "normal"}
