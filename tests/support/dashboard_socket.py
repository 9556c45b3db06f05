"""The dashboard WebSocket for the app tier's tests: connect as a user, read a message by type."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.testing import WebsocketCommunicator

from models_app.panel.consumers import DashboardConsumer

TIMEOUT = 10.0  # generous: a small, busy machine


async def connect(user: Any, path: str = "/ws/dashboard/") -> WebsocketCommunicator:
    socket = WebsocketCommunicator(DashboardConsumer.as_asgi(), path)
    socket.scope["user"] = user
    connected, code = await socket.connect(timeout=TIMEOUT)
    assert connected, code
    return socket


async def receive(socket: WebsocketCommunicator, kind: str) -> dict[str, Any]:
    """The next message of type ``kind``, skipping others (memory, audit, events)."""
    async with asyncio.timeout(TIMEOUT):
        while True:
            message = await socket.receive_json_from(timeout=TIMEOUT)
            if message["type"] == kind:
                return message
