"""Dashboard sockets on a real ``serve`` (issue 45.6): a cap per user with a reason the page can
show, and nothing left behind by 200 sockets once they close.

What the sockets hold is read from ``GET /metrics`` (models_app/dashboard_sockets.py): open
sockets, their tasks, the events group's members, and the messages the channel layer keeps for
this process's channels. Those counts are exact; the server's RSS is also compared, after a
warm-up round, with a stated margin.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.live_sockets import add_user, drain, login, metrics, next_of, open_socket
from tests.support.ports import free_port
from tests.support.serving import run_manage, sim_preset
from tests.support.waits import polled, settled

ADMIN_PASSWORD = "test-only-password"  # run_manage's ROUTERPANEL_ADMIN_PASSWORD
CAP = 3
SOCKETS = 200
SWAPS = 6  # swaps made while the sockets are open (each: a dozen events to every socket)
RSS_MARGIN_MB = 8.0  # one round left 14 MB behind before the fix; after it, under 2 MB
SETTLE = 20.0  # seconds; the channel layer's expiry (60 s) freed the leftovers only after that


@pytest.mark.http_server
@pytest.mark.parametrize("http", ["daphne", "uvicorn"])
def test_one_socket_over_the_cap_is_closed_with_the_reason_and_the_rest_keep_working(
    http: str, tmp_path: Path
) -> None:
    env = {"ROUTERPANEL_MAX_SOCKETS_PER_USER": str(CAP)}
    args = ["serve", "--demo", "--http", http]
    with run_manage(args, tmp_path, port=free_port(), env=env) as server:
        add_user(server, "alice", "alice-pw-for-tests")
        admin = login(server.url, "admin", ADMIN_PASSWORD)
        alice = login(server.url, "alice", "alice-pw-for-tests")

        async def scenario() -> dict[str, Any]:
            mine = [await open_socket(server.url, admin) for _ in range(CAP)]
            for ws in mine:
                await next_of(ws, "snapshot")
            extra = await open_socket(server.url, admin)  # accepted, then closed at once
            await settled(extra.wait_closed(), 30)
            # The oldest keep working: each answers a resync with a fresh snapshot.
            for ws in mine:
                await ws.send(json.dumps({"type": "resync"}))
                assert "snapshot" in await next_of(ws, "snapshot")
            theirs = await open_socket(server.url, alice)  # another user: not counted
            assert "snapshot" in await next_of(theirs, "snapshot")
            await mine.pop().close()
            await polled(
                lambda: metrics(server.url)["dashboard_sockets"], lambda n: n == CAP, what="freed"
            )
            again = await open_socket(server.url, admin)  # a place is free again
            assert "snapshot" in await next_of(again, "snapshot")
            for ws in [*mine, theirs, again]:
                await ws.close()
            return {"code": extra.close_code, "reason": extra.close_reason}

        closed = asyncio.run(scenario())
        print(f"{http}: socket {CAP + 1} of admin closed with {closed}")
        assert closed == {
            "code": 4429,
            "reason": f"too many dashboard tabs open for admin ({CAP}): close one",
        }
        assert metrics(server.url)["dashboard_sockets_refused_total"] == 1


def test_200_dashboard_sockets_leave_nothing_behind_once_closed(tmp_path: Path) -> None:
    marker = f"sockets-{uuid.uuid4().hex[:8]}"
    ini = tmp_path / "models.ini"
    ini.write_text(sim_preset("a", marker, load_ms=20) + sim_preset("b", marker, load_ms=20))
    env = {"ROUTERPANEL_MAX_SOCKETS_PER_USER": str(SOCKETS)}
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    with run_manage(args, tmp_path / "data", port=free_port(), env=env) as server:
        cookies = login(server.url, "admin", ADMIN_PASSWORD)
        at_rest = holdings(server.url)  # the router worker's own channel, no socket
        assert at_rest["dashboard_sockets"] == at_rest["channel_layer_messages"] == 0, at_rest
        process = psutil.Process(server.process.pid)
        figures = []
        for name in ("warm-up", "measured"):
            opened = asyncio.run(_round(server.url, cookies))
            left = asyncio.run(
                polled(
                    lambda: holdings(server.url),
                    lambda now: now == at_rest,
                    SETTLE,
                    f"back to {at_rest} after round {name} ({opened})",
                )
            )
            rss = round(process.memory_info().rss / 2**20, 1)
            figures.append({"round": name, **opened, "after_close": left, "rss_mib": rss})
            print(figures[-1])
        grew = figures[1]["rss_mib"] - figures[0]["rss_mib"]
        before, after = figures[0]["rss_mib"], figures[1]["rss_mib"]
        print(f"serve's RSS: {before} MiB after the warm-up round, {after} MiB after the measured")
        print(f"round: {grew:+.1f} MiB (margin {RSS_MARGIN_MB})")
        assert grew < RSS_MARGIN_MB


HELD = ("dashboard_sockets", "dashboard_socket_tasks", "channel_layer_events_group",
        "channel_layer_channels", "channel_layer_messages")  # fmt: skip


def holdings(url: str) -> dict[str, float]:
    """What serve holds for dashboard sockets (models_app/dashboard_sockets.py, families)."""
    now = metrics(url)
    return {key: now[key] for key in HELD}


async def _round(url: str, cookies: dict[str, str]) -> dict[str, Any]:
    """Open ``SOCKETS`` sockets as one user, swap models while they read, close them all while
    events still flow; what the server held while they were open."""
    sockets = [await open_socket(url, cookies) for _ in range(SOCKETS)]
    await asyncio.gather(*(next_of(ws, "snapshot") for ws in sockets))
    while_open = await asyncio.to_thread(holdings, url)
    assert while_open["dashboard_sockets"] == SOCKETS, while_open
    assert while_open["channel_layer_events_group"] == SOCKETS, while_open
    readers = [asyncio.ensure_future(drain(ws)) for ws in sockets]
    swapped = asyncio.Event()
    closed = asyncio.Event()
    swapper = asyncio.ensure_future(_swap(url, swapped, closed))
    await asyncio.wait_for(swapped.wait(), 120)
    await asyncio.gather(*(ws.close() for ws in sockets))
    closed.set()
    received = sum(await asyncio.gather(*readers))
    await asyncio.wait_for(swapper, 60)
    return {"while_open": while_open, "messages_read": received}


async def _swap(url: str, swapped: asyncio.Event, closed: asyncio.Event) -> None:
    """Swap a and b (models_max 1) ``SWAPS`` times, then on until the sockets have closed."""
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        count = 0
        while not closed.is_set():
            model = "ab"[count % 2]
            answer = await client.post("/v1/chat/completions", json={**body, "model": model})
            assert answer.status_code == 200, answer.text
            count += 1
            if count >= SWAPS:
                swapped.set()
