"""GET /models/sse: router events become llama.cpp's SSE events (ROUTER_SPEC §10)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.layers import InMemoryChannelLayer

from models_app.api.sse import LlamaEvents
from models_app.routing.topology import EVENTS_GROUP
from routerpanel.router.catalogue import Event
from tests.support.asgi import AsgiClient, Call
from tests.support.fake_router import FakeRouter

INFO = {"id": "m", "aliases": ["m"], "object": "model", "meta": {"n_ctx": 4096}}


def state(frm: str, to: str, **extra: Any) -> dict[str, Any]:
    status = {"failed": "unloaded", "quarantined": "unloaded", "stuck": "unloaded"}.get(to, to)
    return {"model": "m", "from": frm, "to": to, "status": status, "stopping": False, **extra}


def events_in(call: Call) -> list[dict[str, Any]]:
    frames = call.body.decode().split("\n\n")
    return [json.loads(f.removeprefix("data: ")) for f in frames if f.startswith("data: ")]


async def open_stream(client: AsgiClient) -> Call:
    call = client.start("GET", "/models/sse")
    await call.wait_started()
    return call


async def until_events(call: Call, count: int) -> list[dict[str, Any]]:
    await call.wait_body(lambda body: body.count(b"data: ") >= count)
    return events_in(call)


class TestTranslation:
    def test_a_spawn_is_model_status_loading(self) -> None:
        out = LlamaEvents().translate(
            {"type": Event.MODEL_STATE, "data": state("unloaded", "loading")}
        )
        assert out == [{"model": "m", "event": "model_status", "data": {"status": "loading"}}]

    def test_a_retry_after_a_failure_is_a_spawn_too(self) -> None:
        out = LlamaEvents().translate(
            {"type": Event.MODEL_STATE, "data": state("failed", "loading")}
        )
        assert out[0]["event"] == "model_status"

    def test_ready_carries_the_info(self) -> None:
        data = state("loading", "loaded", info=INFO)
        out = LlamaEvents().translate({"type": Event.MODEL_STATE, "data": data})
        assert out == [
            {"model": "m", "event": "status_change", "data": {"status": "loaded", "info": INFO}}
        ]

    def test_loading_progress_is_a_status_change(self) -> None:
        progress = {"stages": ["load"], "current": 0, "value": 0.5}
        data = state("loading", "loading", progress=progress)
        out = LlamaEvents().translate({"type": Event.MODEL_STATE, "data": data})
        assert out[0]["data"] == {"status": "loading", "progress": progress}

    def test_a_wake_from_sleep_is_a_status_change(self) -> None:
        out = LlamaEvents().translate(
            {"type": Event.MODEL_STATE, "data": state("sleeping", "loading")}
        )
        assert out == [{"model": "m", "event": "status_change", "data": {"status": "loading"}}]

    def test_the_exit_code_comes_from_the_exit_event_before(self) -> None:
        events = LlamaEvents()
        exited = {"type": Event.MODEL_EXITED, "data": {"model": "m", "exit_code": 0}}
        assert events.translate(exited) == []
        out = events.translate({"type": Event.MODEL_STATE, "data": state("loaded", "unloaded")})
        assert out[0]["data"] == {"status": "unloaded", "exit_code": 0}

    def test_a_failure_without_an_exit_code_reports_1(self) -> None:
        out = LlamaEvents().translate({"type": Event.MODEL_STATE, "data": state("loaded", "stuck")})
        assert out[0]["data"] == {"status": "unloaded", "exit_code": 1}

    def test_changes_llama_cpp_cannot_see_send_nothing(self) -> None:
        events = LlamaEvents()
        stopping = state("loaded", "loaded", stopping=True)
        assert events.translate({"type": Event.MODEL_STATE, "data": stopping}) == []
        assert (
            events.translate({"type": Event.MODEL_STATE, "data": state("failed", "unloaded")}) == []
        )
        for kind in (
            Event.QUEUE_CHANGED,
            Event.MEMORY_SAMPLE,
            Event.MODEL_LOG,
            Event.MODEL_EVICTED,
        ):
            assert events.translate({"type": kind, "data": {"model": "m"}}) == []

    def test_a_reload_is_models_reload_for_every_model(self) -> None:
        out = LlamaEvents().translate({"type": Event.PRESETS_RELOADED, "data": {"added": []}})
        assert out == [{"model": "*", "event": "models_reload"}]


class TestStream:
    async def test_it_opens_with_nothing_and_streams_a_cold_load(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        call = await open_stream(client)
        assert call.status == 200
        assert call.header("content-type") == "text/event-stream"
        assert call.header("x-accel-buffering") == "no"
        assert call.body == b""  # no snapshot, no greeting (§10.1)
        await router.emit(Event.MODEL_STATE, state("unloaded", "loading"))
        progress = {"stages": ["load"], "current": 0, "value": 0.0}
        await router.emit(Event.MODEL_STATE, state("loading", "loading", progress=progress))
        await router.emit(Event.QUEUE_CHANGED, {"entries": [], "depth": 0})
        await router.emit(Event.MODEL_STATE, state("loading", "loaded", info=INFO))
        assert await until_events(call, 3) == [
            {"model": "m", "event": "model_status", "data": {"status": "loading"}},
            {
                "model": "m",
                "event": "status_change",
                "data": {"status": "loading", "progress": progress},
            },
            {"model": "m", "event": "status_change", "data": {"status": "loaded", "info": INFO}},
        ]
        assert call.body.startswith(b'data: {"model":"m","event":"model_status"')
        call.disconnect()
        await call.finish()

    async def test_it_streams_an_unload_and_a_reload(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        call = await open_stream(client)
        await router.emit(Event.MODEL_STATE, state("loaded", "loaded", stopping=True))
        await router.emit(Event.MODEL_EXITED, {"model": "m", "exit_code": 0, "clean": True})
        await router.emit(Event.MODEL_STATE, state("loaded", "unloaded"))
        await router.emit(Event.PRESETS_RELOADED, {"added": ["n"], "removed": [], "changed": []})
        assert await until_events(call, 2) == [
            {
                "model": "m",
                "event": "status_change",
                "data": {"status": "unloaded", "exit_code": 0},
            },
            {"model": "*", "event": "models_reload"},
        ]
        call.disconnect()
        await call.finish()

    async def test_it_sends_keep_alive_comments_when_idle(self, client: AsgiClient) -> None:
        call = await open_stream(client)
        await call.wait_body(lambda body: body.count(b": keep-alive\n\n") >= 2)
        assert events_in(call) == []
        call.disconnect()
        await call.finish()

    async def test_a_disconnect_ends_the_stream_and_the_subscription(
        self, client: AsgiClient, layer: InMemoryChannelLayer
    ) -> None:
        call = await open_stream(client)
        assert len(layer.groups.get(EVENTS_GROUP, {})) == 1
        call.disconnect()
        await call.finish()
        await asyncio.sleep(0.05)
        assert not call.ended.is_set()  # nobody left to end it for
        assert layer.groups.get(EVENTS_GROUP, {}) == {}

    async def test_every_subscriber_gets_every_event(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        calls = [await open_stream(client) for _ in range(3)]
        await router.emit(Event.MODEL_STATE, state("unloaded", "loading"))
        for call in calls:
            assert (await until_events(call, 1))[0]["event"] == "model_status"
            call.disconnect()
            await call.finish()
