"""``GET /metrics``: counted from a real engine's events on the router side, served by the web
side in Prometheus text, and read back with prometheus_client's parser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer
from prometheus_client.parser import text_string_to_metric_families

from models_app.api import Api, ApiConfig
from models_app.api.auth import KeyStore, KeyTable
from models_app.routing import wire
from models_app.routing.client import RouterClient
from models_app.routing.metrics import RouterMetrics, render
from routerpanel.router.commands import MemorySampled
from routerpanel.router.memory import ChildMemory, SystemMemory
from routerpanel.router.supervisor import ChildExited
from tests.support.asgi import AsgiClient, django_stand_in
from tests.support.engine import Harness, engine_config
from tests.support.fake_router import FakeRouter
from tests.support.waits import settled

pytest_plugins = ("tests.support.engine",)  # the h fixture: Engine, fake supervisor, clock

GIB = 1 << 30


def parse(text: str) -> dict[str, Any]:
    """Family name -> {(sample name, sorted labels): value}."""
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {
            (s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples
        }
        out[family.name]["type"] = family.type
    return out


async def drive(h: Harness) -> RouterMetrics:
    """Loads, an eviction whose victim is force-killed, a waiter, memory: a busy minute."""
    await h.warm("a")  # load a
    victim_waiter = h.acquire("b", actor="user:x")  # evicts a
    await h.idle()
    pid = h.sup.children.pop("a")
    h.sup.post(ChildExited("a", pid, 1, None, 9, 5.0, True, True, True, 10.0, None, ()))
    await h.idle()
    h.sup.ready("b")
    await h.idle()
    await settled(victim_waiter)
    h.acquire("c", actor="user:y")  # waits: b is busy, nothing to evict
    await h.idle()
    system = SystemMemory(64 * GIB, 40 * GIB, 24 * GIB, 8 * GIB, GIB, None)
    h.sup.post(MemorySampled(system, (ChildMemory("b", h.model("b")["pid"], 3 * GIB, 2),)))
    await h.idle()
    metrics = RouterMetrics()
    for event in h.events:
        metrics.observe(event)
    return metrics  # b's lease still held: in flight 1


class TestRouterMetrics:
    @engine_config("a", "b", "c", models_max=1)
    async def test_the_text_parses_and_counts_what_the_engine_did(self, h: Harness) -> None:
        metrics = await drive(h)
        families = metrics.families(h.engine.snapshot())
        found = parse(render(families).decode())

        assert found["routerpanel_loads"]["type"] == "counter"
        loads = found["routerpanel_loads"]
        assert loads[("routerpanel_loads_total", (("model", "a"),))] == 1
        assert loads[("routerpanel_loads_total", (("model", "b"),))] == 1
        assert loads[("routerpanel_loads_total", (("model", "c"),))] == 0
        evictions = found["routerpanel_evictions"]
        key = ("routerpanel_evictions_total", (("model", "a"), ("reason", "eviction")))
        assert evictions[key] == 1
        unloads = found["routerpanel_unloads"]
        assert unloads[("routerpanel_unloads_total", (("model", "a"), ("reason", "eviction")))] == 1
        kills = found["routerpanel_force_kills"]
        assert kills[("routerpanel_force_kills_total", (("model", "a"),))] == 1

        durations = found["routerpanel_load_duration_seconds"]
        assert durations["type"] == "histogram"
        assert durations[("routerpanel_load_duration_seconds_count", (("model", "b"),))] == 1
        assert durations[("routerpanel_load_duration_seconds_sum", (("model", "b"),))] == 0.25
        bucket = ("routerpanel_load_duration_seconds_bucket", (("le", "0.25"), ("model", "b")))
        assert durations[bucket] == 1
        waits = found["routerpanel_queue_wait_seconds"]
        assert waits[("routerpanel_queue_wait_seconds_count", ())] == 1  # b's entry, served

        assert found["routerpanel_queue_depth"][("routerpanel_queue_depth", ())] == 1
        state = found["routerpanel_model_state"]
        assert state[("routerpanel_model_state", (("model", "b"), ("state", "loaded")))] == 1
        assert state[("routerpanel_model_state", (("model", "a"), ("state", "loaded")))] == 0
        in_flight = found["routerpanel_model_in_flight"]
        assert in_flight[("routerpanel_model_in_flight", (("model", "b"),))] == 1
        memory = found["routerpanel_model_memory_bytes"]
        assert memory[("routerpanel_model_memory_bytes", (("model", "b"),))] == 3 * GIB
        system = found["routerpanel_system_memory_bytes"]
        assert system[("routerpanel_system_memory_bytes", (("kind", "available"),))] == 40 * GIB
        assert ("routerpanel_system_memory_bytes", (("kind", "wired"),)) not in system

    def test_label_values_are_escaped(self) -> None:
        family = {"name": "x", "type": "gauge", "help": "a\\b", "samples": []}
        family["samples"] = [("", {"model": 'we"ird\\name\n'}, 1.5)]
        (parsed,) = text_string_to_metric_families(render([family]).decode())
        assert parsed.samples[0].labels == {"model": 'we"ird\\name\n'}
        assert parsed.samples[0].value == 1.5


class MetricsRouter(FakeRouter):
    families: list[dict[str, Any]] = []

    async def router_metrics(self, message: dict[str, Any]) -> None:
        body = {"metrics": self.families}
        await self._reply(message, wire.result(message["request_id"], body))


@pytest.fixture
async def served() -> AsyncIterator[tuple[MetricsRouter, AsgiClient, dict[str, Any]]]:
    layer = InMemoryChannelLayer()
    fake = await MetricsRouter(layer).start()
    table: dict[str, Any] = {"required": False}
    app = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=2.0),
        keys=KeyStore(lambda: KeyTable(table["required"], {}), None),
        config=ApiConfig(),
    )
    yield fake, AsgiClient(app), table
    await app.aclose()
    await fake.stop()


class TestMetricsRoute:
    @engine_config("a", "b", "c", models_max=1)
    async def test_get_metrics_answers_prometheus_text_from_the_router(
        self, h: Harness, served: Any
    ) -> None:
        fake, client, _ = served
        fake.families = (await drive(h)).families(h.engine.snapshot())
        call = await client.get("/metrics")
        assert call.status == 200
        assert call.header("content-type") == "text/plain; version=0.0.4; charset=utf-8"
        names = {f.name for f in text_string_to_metric_families(call.body.decode())}
        assert {"routerpanel_loads", "routerpanel_model_state", "routerpanel_queue_depth"} <= names
        await fake.wait_for("router.metrics")
        assert fake.of_type("router.snapshot") == []  # the families, not the snapshot

    async def test_it_needs_a_key_like_the_rest_of_the_api(self, served: Any) -> None:
        _, client, table = served
        table["required"] = True
        assert (await client.get("/metrics")).status == 401

    async def test_a_router_that_does_not_answer_is_a_503(self) -> None:
        app = Api(
            django_stand_in,
            router=RouterClient(InMemoryChannelLayer(), timeout=0.2),
            keys=KeyStore(lambda: KeyTable(False, {}), None),
        )
        call = await AsgiClient(app).get("/metrics")
        assert call.status == 503 and b"router unavailable" in call.body
        await app.aclose()
