"""Receipts over the channel layer: the real router host answers ``router.acquire`` with a
``router.granted`` that carries the receipt (team mode's path), and the answer shows it.

Everything is real except the network: router host, engine, simulated children, the worker
consumer, and the HTTP app, joined by the in-memory channel layer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer
from channels.routing import ChannelNameRouter
from channels.worker import Worker

from models_app.accounts import usage
from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore
from models_app.routing.client import RouterClient
from models_app.routing.host import RouterHost
from models_app.routing.listener import RouterConsumer
from models_app.routing.topology import UNNAMED_CHANNEL
from tests.support.asgi import AsgiClient, django_stand_in
from tests.support.upstreams import save_two_sim_presets

pytestmark = pytest.mark.django_db(transaction=True)
DEADLINE = 60.0
LOAD_MS = 300


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[AsgiClient, usage.UsageRecorder]]:
    await sync_to_async(save_two_sim_presets)(LOAD_MS)
    layer = InMemoryChannelLayer()
    host = RouterHost(layer, state_file=tmp_path / "children.json")
    await host.start()
    app = ChannelNameRouter({UNNAMED_CHANNEL: RouterConsumer.as_asgi()})
    worker = asyncio.ensure_future(Worker(app, [UNNAMED_CHANNEL], layer).arun())
    recorder = usage.UsageRecorder(flush_seconds=3600)
    api = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=10.0),
        keys=KeyStore(toucher=None),
        config=ApiConfig(),
        recorder=recorder,
    )
    yield AsgiClient(api), recorder
    await api.aclose()
    worker.cancel()
    await asyncio.wait_for(host.stop(), DEADLINE)


async def chat(client: AsgiClient, model: str) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    call = await asyncio.wait_for(client.post("/v1/chat/completions", body), DEADLINE)
    assert call.status == 200, call.body
    return call


async def test_a_grant_over_the_layer_carries_the_swap(stack: Any) -> None:
    client, recorder = stack
    first = await chat(client, "m1")
    assert int(first.header("x-routerpanel-load-ms")) >= LOAD_MS
    assert first.header("x-routerpanel-evicted") is None
    warm = await chat(client, "m1")
    assert warm.header("x-routerpanel-load-ms") == "0"
    swap = await chat(client, "m2")
    assert swap.header("x-routerpanel-evicted") == "m1"
    assert int(swap.header("x-routerpanel-load-ms")) >= LOAD_MS
    assert int(swap.header("x-routerpanel-queue-ms")) >= int(swap.header("x-routerpanel-load-ms"))
    caused = [(u.model, u.caused_load, u.evicted) for u in recorder.pending]
    assert caused == [("m1", True, ()), ("m1", False, ()), ("m2", True, ("m1",))]
