"""The router's events on the channel layer in batches: what came while the last group message
was being sent goes in the next one, in order, and every reader takes both message shapes.

A child writes a dozen log lines per request; sent one group message each, on Redis they cost
team mode's router more CPU per streamed token than streaming itself (bench/README.md).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from models_app.accounts.roles import Role
from models_app.routing import host as hosting
from models_app.routing import topology, wire
from models_app.routing.client import RouterClient
from models_app.routing.host import RouterHost
from routerpanel.router.catalogue import Event
from routerpanel.router.feed import EngineEvent, Subscription
from tests.support.dashboard_socket import TIMEOUT, connect, receive
from tests.support.panel import RouterStub, make_user

pytest_plugins = ("tests.support.panel",)


def log_event(seq: int) -> EngineEvent:
    return EngineEvent(seq, Event.MODEL_LOG, 1.0, {"model": "a", "stream": "stderr",
                                                  "text": f"line {seq}", "time": 1.0})  # fmt: skip


class RecordingLayer:
    """Records each group message; ``gate`` holds the first send until it is set."""

    def __init__(self, fail_first: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gate = asyncio.Event()
        self.fail_first = fail_first

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        assert group == topology.EVENTS_GROUP
        if not self.sent:
            await self.gate.wait()
        self.sent.append(message)
        if self.fail_first and len(self.sent) == 1:
            raise ConnectionError("Redis went away")


def seqs(message: dict[str, Any]) -> list[int]:
    return [payload["seq"] for payload in wire.unpack_events(message)]


class TestTake:
    def test_take_returns_what_waits_oldest_first_and_never_more_than_asked(self) -> None:
        sub = Subscription(100, lambda s: None)
        assert sub.take(5) == []
        for seq in range(1, 8):
            sub.push(log_event(seq))
        assert [e.seq for e in sub.take(5)] == [1, 2, 3, 4, 5]
        assert [e.seq for e in sub.take(5)] == [6, 7]
        assert sub.take(5) == []


class TestPublish:
    async def publish(self, layer: RecordingLayer, node: str = "") -> tuple[Subscription, Any]:
        sub = Subscription(10_000, lambda s: None)
        host = SimpleNamespace(layer=layer, overrides=SimpleNamespace(node=node))
        task = asyncio.ensure_future(RouterHost._publish_events(host, sub))  # type: ignore[arg-type]
        return sub, task

    async def test_events_that_come_during_a_send_go_together_in_order(self) -> None:
        layer = RecordingLayer()
        sub, task = await self.publish(layer)
        sub.push(log_event(1))
        await asyncio.sleep(0)  # the first is on its way (held at the gate)
        for seq in range(2, 2 + hosting.EVENT_BATCH + 5):
            sub.push(log_event(seq))
        layer.gate.set()
        async with asyncio.timeout(5):
            while sum(len(seqs(m)) for m in layer.sent) < hosting.EVENT_BATCH + 5:
                await asyncio.sleep(0.01)
        sub.push(log_event(100))
        sub.close()
        await asyncio.wait_for(task, 5)
        assert [m["type"] for m in layer.sent] == [
            "router.event", "router.events", "router.events", "router.event"
        ]  # fmt: skip
        assert [len(seqs(m)) for m in layer.sent] == [1, hosting.EVENT_BATCH, 5, 1]
        every = [seq for m in layer.sent for seq in seqs(m)]
        assert every == [*range(1, 2 + hosting.EVENT_BATCH + 5), 100]

    async def test_a_failed_send_loses_that_message_only_and_a_node_is_named(self) -> None:
        layer = RecordingLayer(fail_first=True)
        sub, task = await self.publish(layer, node="studio-1")
        sub.push(log_event(1))
        await asyncio.sleep(0)
        sub.push(log_event(2))
        sub.push(log_event(3))
        layer.gate.set()
        async with asyncio.timeout(5):
            while len(layer.sent) < 2:
                await asyncio.sleep(0.01)
        sub.close()
        await asyncio.wait_for(task, 5)
        assert [seqs(m) for m in layer.sent] == [[1], [2, 3]]
        assert {p["node"] for p in wire.unpack_events(layer.sent[1])} == {"studio-1"}


@pytest.mark.django_db(transaction=True)
async def test_the_dashboard_gets_each_event_of_a_batch_in_order(panel_router: RouterStub) -> None:
    socket = await connect(await sync_to_async(make_user)("vera", Role.VIEWER))
    await receive(socket, "audit")
    payloads = [
        {"seq": seq, "type": Event.MODEL_LOG.value, "time": 1.0, "data": {"text": f"l{seq}"}}
        for seq in (8, 9, 10)
    ]
    await get_channel_layer().group_send(topology.EVENTS_GROUP, wire.events_message(payloads))
    got = [(await receive(socket, "event"))["event"]["seq"] for _ in range(3)]
    assert got == [8, 9, 10]
    await socket.disconnect()


async def test_client_events_yields_each_event_of_a_batch_in_order(settings: Any) -> None:
    """What the SSE stream and the queue comments read in team mode (no router in process)."""
    client = RouterClient(get_channel_layer())
    received: list[int] = []

    async def read() -> None:
        async for payload in client.events():
            received.append(payload["seq"])
            if len(received) == 4:
                return

    reader = asyncio.ensure_future(read())
    layer = get_channel_layer()
    async with asyncio.timeout(TIMEOUT):
        while not await _group_has_members(layer):
            await asyncio.sleep(0.01)
        payloads = [
            {"seq": s, "type": Event.MODEL_LOG.value, "time": 1.0, "data": {}} for s in (1, 2, 3)
        ]
        await layer.group_send(topology.EVENTS_GROUP, wire.events_message(payloads))
        await layer.group_send(
            topology.EVENTS_GROUP, wire.events_message([payloads[0] | {"seq": 4}])
        )
        await reader
    assert received == [1, 2, 3, 4]


async def _group_has_members(layer: Any) -> bool:
    groups = getattr(layer, "groups", {})
    return bool(groups.get(topology.EVENTS_GROUP))
