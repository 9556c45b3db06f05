"""Every router channel gets the large capacity, a named node's too (several hosts)."""

from __future__ import annotations

from channels_redis.core import RedisChannelLayer
from django.conf import settings

from models_app.routing import topology

LARGE = 100_000


def test_every_router_channel_and_reply_channel_has_room_for_a_burst() -> None:
    layer = RedisChannelLayer(capacity=1000, channel_capacity=settings.CHANNEL_CAPACITY)
    assert layer.get_capacity(topology.channel()) == LARGE
    assert layer.get_capacity(topology.channel("studio-1")) == LARGE  # was 1,000: "router" only
    assert layer.get_capacity("specific.a1b2!c3d4") == LARGE
    assert layer.get_capacity("group-less.x") == 1000  # any other name: the default
