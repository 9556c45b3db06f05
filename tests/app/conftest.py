"""Fixtures for the HTTP surface: the ASGI app on a fake router, a driver, and real upstreams.

The driver (``AsgiClient``, ``Call``) is in ``tests/support/asgi.py``; the upstreams (the
simulated llama-server, ``ScriptedUpstream``) are in ``tests/support/upstreams.py``. Here are
the fixtures that build them for a test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore, KeyTable
from models_app.routing.client import RouterClient
from tests.support.asgi import ROUTER_TIMEOUT, AsgiClient, django_stand_in
from tests.support.fake_router import FakeRouter
from tests.support.serving import llama_server_stand_in
from tests.support.upstreams import ScriptedUpstream, SimServer

# ---- the llama-server the presets are checked against ---------------------------------------


@pytest.fixture(autouse=True, scope="session")
def llama_server_b11434(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Put a ``llama-server`` on PATH that prints b11434's ``--help`` (recorded from the real
    build), so that preset keys are checked against b11434 whatever this machine has installed
    (a newer llama-server on PATH would otherwise change what the app tier accepts)."""
    bin_dir = tmp_path_factory.mktemp("llama-bin")
    script = llama_server_stand_in(bin_dir)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        yield script


# ---- fixtures: router, keys, app --------------------------------------------------------------


@pytest.fixture
def layer() -> InMemoryChannelLayer:
    return InMemoryChannelLayer()


@pytest.fixture
async def router(layer: InMemoryChannelLayer) -> AsyncIterator[FakeRouter]:
    fake = await FakeRouter(layer).start()
    yield fake
    await fake.stop()


@pytest.fixture
def key_table() -> dict[str, Any]:
    """Edit to change what the 'database' says: {"required": bool, "keys": {hash: Caller},
    "names": {name or alias: (name, *aliases)}, "operators": {actor}}."""
    return {"required": False, "keys": {}, "names": {}, "operators": set()}


@pytest.fixture
def keys(key_table: dict[str, Any]) -> KeyStore:
    def load() -> KeyTable:
        return KeyTable(
            key_table["required"],
            dict(key_table["keys"]),
            frozenset(key_table["operators"]),
            dict(key_table["names"]),
        )

    return KeyStore(load, None)


@pytest.fixture
def config() -> ApiConfig:
    return ApiConfig(sse_keepalive=0.3)


@pytest.fixture
async def api(
    router: FakeRouter, layer: InMemoryChannelLayer, keys: KeyStore, config: ApiConfig
) -> AsyncIterator[Api]:
    app = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=ROUTER_TIMEOUT),
        keys=keys,
        config=config,
    )
    yield app
    await app.aclose()


@pytest.fixture
def client(api: Api) -> AsgiClient:
    return AsgiClient(api)


# ---- upstreams ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def simserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """A fast simulated child: no token delay, metrics and embeddings on."""
    sim = SimServer(
        tmp_path_factory.mktemp("sim") / "fast.log", "-m", "fast.gguf", "--metrics", "--embeddings"
    )
    yield sim
    sim.stop()


@pytest.fixture(scope="session")
def slow_simserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """A slow simulated child: 100 ms per token, up to 100 tokens (ask for fewer: n_predict)."""
    log_path = tmp_path_factory.mktemp("sim") / "slow.log"
    args = ("-m", "slow.gguf", "--sim-token-ms", "100", "--sim-tokens", "100", "--metrics")
    sim = SimServer(log_path, *args)
    yield sim
    sim.stop()


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    server = await ScriptedUpstream().start()
    yield server
    await server.stop()
