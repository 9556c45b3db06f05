"""Dashboard sockets in team mode (issue 45.6): the count per user is shared by every web
process through Redis, a dead process's places lapse, and the Redis layer keeps nothing for a
socket that has closed. Two layer objects stand for two ``serve --no-router`` processes."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from models_app.panel import dashboard_sockets
from models_app.routing import layers
from tests.support.waits import settled


@pytest.fixture
def team_layers(settings: Any, redis_url: str) -> list[layers.ResilientRedisLayer]:
    settings.REDIS_URL = redis_url
    settings.ROUTERPANEL_REDIS_PREFIX = f"test-{uuid.uuid4().hex[:8]}"
    settings.ROUTERPANEL = {**settings.ROUTERPANEL, "MAX_SOCKETS_PER_USER": 2}
    hosts = [{"address": redis_url}]
    return [layers.ResilientRedisLayer(hosts=hosts, prefix="t:asgi:") for _ in range(2)]


async def test_the_cap_counts_a_users_sockets_over_every_web_process(
    team_layers: list[layers.ResilientRedisLayer],
) -> None:
    one, two = team_layers
    assert await dashboard_sockets.admit(one, 7, "a!1")
    assert await dashboard_sockets.admit(two, 7, "b!1")
    assert not await dashboard_sockets.admit(two, 7, "b!2")  # the third, on either process
    assert not await dashboard_sockets.admit(one, 7, "a!2")
    assert await dashboard_sockets.admit(two, 8, "b!3")  # another user
    await dashboard_sockets.release(one, 7, "a!1")
    assert await dashboard_sockets.admit(two, 7, "b!2")


async def test_the_places_of_a_process_that_died_lapse(
    team_layers: list[layers.ResilientRedisLayer], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = team_layers
    monkeypatch.setattr(dashboard_sockets, "LEASE", 0.5)
    assert await dashboard_sockets.admit(one, 7, "a!1")
    assert await dashboard_sockets.admit(one, 7, "a!2")  # then `one` dies: no release
    assert not await dashboard_sockets.admit(two, 7, "b!1")
    deadline = time.monotonic() + 10
    while not await dashboard_sockets.admit(two, 7, "b!1"):
        assert time.monotonic() < deadline, "the dead process's places never lapsed"
        await asyncio.sleep(0.1)


async def test_a_message_for_a_forgotten_channel_is_not_buffered(
    team_layers: list[layers.ResilientRedisLayer],
) -> None:
    layer = team_layers[0]
    reader, closed, kept = [await layer.new_channel() for _ in range(3)]
    layer.forget(closed)
    for channel in (closed, kept):  # a group message already under way when `closed` ended
        await layer.send(channel, {"type": "router.event"})
    await layer.send(reader, {"type": "mine"})
    # The reader pulls the process's messages off Redis, its own and the others'.
    assert await settled(layer.receive(reader)) == {"type": "mine"}
    assert closed not in layer.receive_buffer
    assert layer.receive_buffer[kept].qsize() == 1
    await layer.flush()
