"""Dashboard WebSockets against a running ``serve``: sign in, open sockets, read ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import websockets
from websockets.asyncio.client import ClientConnection

from tests.support.serving import Server, manage_beside

TIMEOUT = 30.0  # seconds for one message: 200 sockets on 2 busy cores


def login(url: str, username: str, password: str) -> dict[str, str]:
    """Sign in through the panel's form; the session's cookies."""
    with httpx.Client(base_url=url, timeout=10) as client:
        page = client.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text[:500]
        done = client.post(
            "/login/",
            data={"username": username, "password": password,
                  "csrfmiddlewaretoken": token.group(1)},
            headers={"Referer": f"{url}/login/", "Origin": url},
        )  # fmt: skip
        assert done.status_code in (200, 302), done.status_code
        assert "sessionid" in client.cookies, f"{username} could not sign in"
        return dict(client.cookies)


def add_user(server: Server, username: str, password: str, role: str = "VIEWER") -> None:
    """Create a user with a panel role in ``server``'s database, while it runs."""
    code = (
        "from django.contrib.auth import get_user_model\n"
        "from models_app.accounts.roles import Role, set_role\n"
        f"u = get_user_model().objects.create_user({username!r}, password={password!r})\n"
        f"set_role(u, Role.{role})\n"
    )
    manage_beside(server, "shell", "-c", code)


async def open_socket(url: str, cookies: dict[str, str]) -> ClientConnection:
    headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}
    ws_url = url.replace("http", "ws", 1) + "/ws/dashboard/?memory=0"
    return await websockets.connect(
        ws_url, origin=url, additional_headers=headers, open_timeout=TIMEOUT, max_size=None
    )


async def next_of(ws: ClientConnection, kind: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The next message of type ``kind``, skipping the others."""
    async with asyncio.timeout(timeout):
        while True:
            message: dict[str, Any] = json.loads(await ws.recv())
            if message.get("type") == kind:
                return message


async def drain(ws: ClientConnection) -> int:
    """Read what ``ws`` is sent until it closes, as a tab does; how many messages."""
    count = 0
    try:
        async for _ in ws:
            count += 1
    except websockets.ConnectionClosed:
        pass
    return count


def metrics(url: str, prefix: str = "routerpanel_") -> dict[str, float]:
    """``GET /metrics``'s samples without labels whose name starts with ``prefix``."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(prefix) and "{" not in name:
            found[name.removeprefix("routerpanel_")] = float(value)
    return found
