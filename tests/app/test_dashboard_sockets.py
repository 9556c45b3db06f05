"""Dashboard sockets in one process (issue 45.6): the cap per user, and what a closed socket
leaves in the in-memory channel layer. The same on a real ``serve``: tests/process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from models_app.accounts.roles import Role
from models_app.panel import dashboard_sockets
from models_app.panel.consumers import DashboardConsumer
from models_app.routing import layers, topology, wire
from routerpanel.router.catalogue import Event
from tests.support.dashboard_socket import TIMEOUT, connect, receive
from tests.support.panel import RouterStub, make_user
from tests.support.waits import polled, settled

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cap_2(settings: Any, panel_router: RouterStub) -> int:
    settings.ROUTERPANEL = {**settings.ROUTERPANEL, "MAX_SOCKETS_PER_USER": 2}
    return 2


async def refused(user: Any) -> dict[str, Any]:
    """Open one more socket for ``user``: accepted, then closed; the close message."""
    socket = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
    socket.scope["user"] = user
    connected, _ = await socket.connect(timeout=TIMEOUT)
    assert connected
    closed: dict[str, Any] = await socket.receive_output(TIMEOUT)
    await socket.disconnect()
    return closed


async def test_one_socket_over_the_cap_is_closed_with_why_and_the_others_stay(cap_2: int) -> None:
    alice = await sync_to_async(make_user)("alice", Role.VIEWER)
    bob = await sync_to_async(make_user)("bob", Role.VIEWER)
    mine = [await connect(alice) for _ in range(cap_2)]
    for socket in mine:
        await receive(socket, "snapshot")
    assert await refused(alice) == {
        "type": "websocket.close",
        "code": dashboard_sockets.CLOSE_TOO_MANY,
        "reason": "too many dashboard tabs open for alice (2): close one",
    }
    await mine[0].send_json_to({"type": "resync"})  # the oldest still answer
    assert (await receive(mine[0], "snapshot"))["snapshot"]["seq"] == 7
    theirs = await connect(bob)  # another user is not counted with alice
    await receive(theirs, "snapshot")
    await mine.pop().disconnect()
    again = await connect(alice)  # a place came free
    await receive(again, "snapshot")
    assert dashboard_sockets.OPEN.count(alice.pk) == 2
    for socket in [*mine, theirs, again]:
        await socket.disconnect()
    assert dashboard_sockets.OPEN.count(alice.pk) == dashboard_sockets.OPEN.count(bob.pk) == 0


async def test_no_cap_at_zero(settings: Any, panel_router: RouterStub) -> None:
    settings.ROUTERPANEL = {**settings.ROUTERPANEL, "MAX_SOCKETS_PER_USER": 0}
    alice = await sync_to_async(make_user)("alice", Role.VIEWER)
    sockets = [await connect(alice) for _ in range(10)]
    for socket in sockets:
        await receive(socket, "snapshot")
        await socket.disconnect()


def test_the_reason_fits_a_close_frame_whatever_the_name() -> None:
    reason = dashboard_sockets.too_many("ä" * 150, 8)
    assert len(reason.encode()) <= 123
    assert reason.startswith("too many dashboard tabs open for ää")
    assert reason.endswith("ä… (8): close one")


async def test_a_closed_socket_leaves_no_queue_and_no_membership(
    panel_router: RouterStub,
) -> None:
    layer = get_channel_layer()
    assert isinstance(layer, layers.InMemoryLayer)
    others = set(layer.channels)  # what other tests left, the router's channel among them
    socket = await connect(await sync_to_async(make_user)("vera", Role.VIEWER))
    await receive(socket, "snapshot")
    event = {"seq": 8, "type": Event.MODEL_LOG, "time": 1.0, "data": {}}
    for _ in range(5):  # the socket does not read these: they wait in its queue
        await layer.group_send(topology.EVENTS_GROUP, wire.event(event))
    (mine,) = set(layer.channels) - others
    assert layer.channels[mine].qsize() >= 1
    assert mine in layer.groups[topology.EVENTS_GROUP]
    await socket.disconnect()
    await polled(lambda: mine in layer.channels, lambda kept: not kept, what="dropped")
    assert mine not in layer.groups.get(topology.EVENTS_GROUP, ())


async def test_a_group_message_goes_only_to_members_of_that_moment() -> None:
    layer = layers.InMemoryLayer()
    stay, leave = await layer.new_channel(), await layer.new_channel()
    for channel in (stay, leave):
        await layer.group_add("g", channel)
    sending = asyncio.ensure_future(layer.group_send("g", {"type": "x"}))
    await asyncio.sleep(0)  # the send has begun: Channels' own has made a task per member
    await layer.group_discard("g", leave)  # the member leaves meanwhile, as a closing tab does
    layer.forget(leave)
    await settled(sending)
    assert await asyncio.wait_for(layer.receive(stay), 1) == {"type": "x"}
    assert leave not in layer.channels  # not made again by a send that began before
