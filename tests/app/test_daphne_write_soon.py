"""``serve`` on Daphne sends each answer at the end of the loop's turn (``_daphne.write_soon``).

Twisted alone asks the loop to watch every connection for writability before each send (an
``add_writer`` and a ``remove_writer`` per piece of an answer). Under ``RouterPanelServer`` an
idle connection's bytes leave without that; only an answer larger than the socket takes makes
Twisted watch it. Each test reads what a real client gets: small answers, a streamed one, one
far larger than the socket's buffer read slowly, and a connection closed after its answer.

The server runs in a child Python (Daphne installs Twisted's reactor); it counts the loop's
``add_writer`` calls and answers the count on ``/count``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30.0
BIG = 8 * 1024 * 1024  # far more than a loopback socket's send buffer takes at once

SERVER = r"""
import asyncio, json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.management.commands._daphne import RouterPanelServer  # installs the reactor
from twisted.internet import reactor

counts = {"add_writer": 0}

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    path = scope["path"]
    if path == "/count":
        body = json.dumps(counts).encode()
    elif path == "/big":
        body = b"x" * int(sys.argv[1])
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(50):
            await send({"type": "http.response.body", "body": b"%d;" % i, "more_body": True})
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b""})
        return
    else:
        body = b"hello"
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})

server = RouterPanelServer(app, endpoints=["tcp:port=0:interface=127.0.0.1"])

def ready():
    loop = asyncio.get_running_loop()
    add_writer = loop.add_writer
    def counted(*args, **kwargs):
        counts["add_writer"] += 1
        return add_writer(*args, **kwargs)
    loop.add_writer = counted
    print("listening", server.listening_addresses[0][1], flush=True)

server.on_listening = lambda: reactor.callLater(0, ready)
server.run()
"""


@pytest.fixture
def base_url(tmp_path: Path) -> Iterator[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routerpanel.settings",
        "ROUTERPANEL_DATA_DIR": str(tmp_path),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(BIG)], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the child prints its port once it listens
        if not line.startswith("listening"):
            child.kill()
            pytest.fail(f"server did not start: {line!r} {child.communicate(timeout=10)[1]}")
        yield f"http://127.0.0.1:{line.split()[1]}"
    finally:
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=DEADLINE)
        if child.poll() is None:
            child.kill()
            child.wait(timeout=DEADLINE)


def add_writers(client: httpx.Client) -> int:
    count: int = client.get("/count").json()["add_writer"]
    return count


def test_small_answers_leave_without_the_loop_watching_the_socket(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=DEADLINE) as client:
        before = add_writers(client)
        bodies = [client.get("/small").content for _ in range(30)]
        after = add_writers(client)
    assert bodies == [b"hello"] * 30
    assert after - before <= 1  # Twisted alone: one add_writer per answer (30 or more)


def test_a_streamed_answer_arrives_whole_and_in_order(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=DEADLINE) as client:
        before = add_writers(client)
        with client.stream("GET", "/stream") as answer:
            body = b"".join(answer.iter_bytes())
        after = add_writers(client)
    assert body == b"".join(b"%d;" % i for i in range(50))
    assert after - before <= 1


def test_an_answer_larger_than_the_socket_reaches_a_slow_reader_whole(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=DEADLINE) as client:
        before = add_writers(client)
        received = 0
        with client.stream("GET", "/big") as answer:
            for i, piece in enumerate(answer.iter_raw(64 * 1024)):
                assert set(piece) == {ord("x")}
                received += len(piece)
                if i < 20:
                    time.sleep(0.01)  # the server's socket fills up: it must wait, then go on
        after = add_writers(client)
        assert client.get("/small").content == b"hello"  # the connection is still usable
    assert received == BIG
    assert after - before >= 1  # the rest was sent as Twisted does: when the socket took it


def test_a_connection_that_asks_to_close_is_closed_after_its_answer(base_url: str) -> None:
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
        sock.sendall(b"GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            piece = sock.recv(65536)
            if not piece:
                break  # the server closed the connection
            data += piece
        else:
            pytest.fail("the server kept the connection open")
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\nhello")
