"""End to end: a request made with Alice's API key evicts a model, and the audit log says so.

Everything is real except the network: the router host (engine, supervisor, simulated
llama-server children, the audit writer and the metrics listener) and the HTTP app with the key
store reading the database, joined by the in-memory channel layer as in embedded mode.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer
from channels.routing import ChannelNameRouter
from channels.worker import Worker
from django.contrib.auth import get_user_model
from django.forms.models import model_to_dict
from prometheus_client.parser import text_string_to_metric_families

from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore
from models_app.models import ApiKey, AuditEvent, AuditKind
from models_app.routing.client import RouterClient
from models_app.routing.host import RouterHost
from models_app.routing.listener import RouterConsumer
from models_app.routing.topology import UNNAMED_CHANNEL
from tests.support.asgi import AsgiClient, django_stand_in
from tests.support.upstreams import save_two_sim_presets

pytestmark = pytest.mark.django_db(transaction=True)
DEADLINE = 60.0


def setup_database() -> str:
    save_two_sim_presets()
    alice = get_user_model().objects.create_user("alice")
    _, secret = ApiKey.objects.issue(alice, "laptop")
    return secret


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[RouterHost, AsgiClient, str]]:
    secret = await sync_to_async(setup_database)()
    layer = InMemoryChannelLayer()
    host = RouterHost(layer, state_file=tmp_path / "children.json")
    await host.start()
    app = ChannelNameRouter({UNNAMED_CHANNEL: RouterConsumer.as_asgi()})
    worker = asyncio.ensure_future(Worker(app, [UNNAMED_CHANNEL], layer).arun())
    api = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=10.0),
        keys=KeyStore(toucher=None),
        config=ApiConfig(),
    )
    yield host, AsgiClient(api), secret
    await api.aclose()
    worker.cancel()
    await asyncio.wait_for(host.stop(), DEADLINE)


async def chat(client: AsgiClient, model: str, **headers: str) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    call = await asyncio.wait_for(
        client.post("/v1/chat/completions", body, headers=headers), DEADLINE
    )
    assert call.status == 200, call.body
    return call


async def test_an_eviction_caused_by_a_named_key_is_attributed_to_its_owner(stack: Any) -> None:
    host, client, secret = stack
    await chat(client, "m1")  # anonymous: m1 loads and stays, idle
    await chat(client, "m2", authorization=f"Bearer {secret}", **{"x-request-id": "alice-1"})

    async def eviction() -> AuditEvent | None:
        await asyncio.to_thread(host.audit.flush, 10.0)
        rows = AuditEvent.objects.filter(kind=AuditKind.EVICTION, router_id=host.audit.router_id)
        return await rows.afirst()

    async with asyncio.timeout(DEADLINE):  # the row waits for the exit and the next sample
        while (row := await eviction()) is None:
            await asyncio.sleep(0.2)
    assert (row.model, row.actor) == ("m1", "key:alice/laptop")
    assert (row.trigger_model, row.trigger_request) == ("m2", "alice-1")
    assert row.queue_depth == 1 and row.idle_seconds is not None and row.idle_seconds >= 0
    assert row.stop_seconds is not None and row.force_killed is False
    assert row.memory_before is not None and row.memory_after is not None
    assert (row.from_state, row.to_state) == ("loaded", "unloaded")
    print("\neviction row:", json.dumps(model_to_dict(row) | {"time": row.time.isoformat()}))
    loading = await AuditEvent.objects.filter(kind=AuditKind.LOADING, model="m2").afirst()
    assert loading is not None and loading.actor == "key:alice/laptop"

    call = await client.get("/metrics")
    families = {f.name: f for f in text_string_to_metric_families(call.body.decode())}
    evictions = {s.labels["model"]: s.value for s in families["routerpanel_evictions"].samples}
    assert evictions == {"m1": 1}
    loaded = [
        s.labels["model"]
        for s in families["routerpanel_model_state"].samples
        if s.labels["state"] == "loaded" and s.value == 1
    ]
    assert loaded == ["m2"]
