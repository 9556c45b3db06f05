"""``serve`` on Daphne: what a connection keeps across its requests (``tune_channel``).

Twisted re-arms a connection's idle timeout in its own timer heap at the end of every request
and asks the socket for both addresses on every request; ``RouterPanelServer`` keeps one lazy
deadline per connection and the addresses it read at the first request. These tests check on
a real server, with an idle timeout of ``IDLE`` seconds, that what a client sees did not
change: each request sees its own addresses, an idle connection is closed after the timeout,
one in use (or waiting on a slow answer) is not, and a closed one leaves no timer behind. The
input queue each request gets (``_RequestInbox``) is checked on its own at the end.

The server runs in a child Python (Daphne installs Twisted's reactor).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daphne_child import daphne_child, run_script

DEADLINE = 30.0
IDLE = 1.0  # the server's idle timeout in these tests (Daphne's own: 12 hours)

SERVER = r"""
import asyncio, json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers.daphne_connection import _IdleTimer
from models_app.servers.daphne_server import RouterPanelServer
from twisted.internet import reactor

counts = {"twisted_idle_timers": 0}

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    if scope["path"] == "/slow":
        await asyncio.sleep(float(sys.argv[1]) * 1.6)
    loop = asyncio.get_running_loop()
    fire = _IdleTimer.fire
    ours = [h for h in loop._scheduled if not h.cancelled() and h._callback.__func__ is fire]
    body = json.dumps({
        "client": scope["client"], "server": scope["server"], "scheme": scope["scheme"],
        "twisted_idle_timers": counts["twisted_idle_timers"], "idle_timers": len(ours),
    }).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})

server = RouterPanelServer(app, endpoints=["tcp:port=0:interface=127.0.0.1"])

def ready():
    server.http_factory.timeOut = float(sys.argv[1])
    call_later = reactor.callLater
    def counted(delay, f, *args, **kwargs):
        if getattr(f, "__name__", "").endswith("__timedOut"):  # TimeoutMixin's own timer
            counts["twisted_idle_timers"] += 1
        return call_later(delay, f, *args, **kwargs)
    reactor.callLater = counted
    print("listening", server.listening_addresses[0][1], flush=True)

server.on_listening = lambda: reactor.callLater(0, ready)
server.run()
"""


@pytest.fixture
def port(tmp_path: Path) -> Iterator[int]:
    with daphne_child(SERVER, str(IDLE), data_dir=tmp_path) as port:
        yield port


def ask(conn: http.client.HTTPConnection, path: str = "/") -> dict:
    conn.request("GET", path)
    response = conn.getresponse()
    assert response.status == 200
    answer: dict = json.loads(response.read())
    return answer


def closed_after(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes ``sock`` (it sends nothing more); fails after ``limit``."""
    started = time.monotonic()
    sock.settimeout(limit)
    try:
        data = sock.recv(1024)
    except TimeoutError:
        pytest.fail(f"the connection was still open after {limit} s")
    assert data == b"", data
    return time.monotonic() - started


def test_each_request_sees_its_addresses_and_no_twisted_timer_is_armed(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    first = ask(conn)
    assert conn.sock is not None
    client = list(conn.sock.getsockname())
    later = [ask(conn) for _ in range(30)]
    for answer in [first, *later]:
        assert answer["client"] == client
        assert answer["server"] == ["127.0.0.1", port]
        assert answer["scheme"] == "http"
    # The connection's idle timeout is ours from the start: Twisted never armed its own.
    assert first["twisted_idle_timers"] == later[-1]["twisted_idle_timers"] == 0
    other = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    answer = ask(other)  # a second connection: its own address, not the first one's
    assert other.sock is not None
    assert answer["client"] == list(other.sock.getsockname()) != client
    conn.close()
    other.close()


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    for _ in range(5):
        ask(conn)
    assert conn.sock is not None
    waited = closed_after(conn.sock, IDLE + 5)
    assert IDLE * 0.9 <= waited <= IDLE + 3, waited


def test_a_connection_in_use_or_waiting_on_a_slow_answer_stays_open(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    first = ask(conn)
    assert conn.sock is not None
    sock = conn.sock
    client = first["client"]
    started = time.monotonic()
    while time.monotonic() - started < 3 * IDLE:  # a request every 0.4 timeouts
        assert ask(conn)["client"] == client
        time.sleep(IDLE * 0.4)
    # An answer that takes longer than the idle timeout: the timeout waits for it.
    assert ask(conn, "/slow")["client"] == client
    assert ask(conn)["client"] == client
    assert conn.sock is sock  # never re-opened
    waited = closed_after(sock, IDLE + 5)  # and idle again, it is closed in time
    assert IDLE * 0.9 <= waited <= IDLE + 3, waited


def test_closed_connections_leave_no_idle_timer_behind(port: int) -> None:
    for _ in range(60):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
        ask(conn)
        conn.close()
    time.sleep(0.3)  # the server sees the last close
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    left = ask(conn)["idle_timers"]
    conn.close()
    assert left <= 2, f"{left} idle timers for 60 closed connections"


INBOX = r"""
import asyncio, json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers.daphne_server import _RequestInbox  # installs the reactor

async def main():
    seen = {}
    inbox = _RequestInbox()
    inbox.put_nowait({"n": 1})
    inbox.put_nowait({"n": 2})
    seen["in order"] = [(await inbox.get())["n"], (await inbox.get())["n"]]

    inbox = _RequestInbox()
    got = []
    async def getter(name):
        got.append((name, (await inbox.get())["n"]))
    tasks = [asyncio.create_task(getter(name)) for name in "abc"]
    await asyncio.sleep(0)
    for n in (1, 2, 3):
        inbox.put_nowait({"n": n})
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    seen["getters in turn"] = got

    inbox = _RequestInbox()
    first = asyncio.create_task(inbox.get())
    second = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    inbox.put_nowait({"n": 7})  # wakes the first getter ...
    first.cancel()              # ... which is cancelled before it runs: the second gets it
    seen["handed on"] = (await asyncio.wait_for(second, 5))["n"]
    seen["first cancelled"] = first.cancelled()

    inbox = _RequestInbox()
    waiting = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.sleep(0)
    inbox.put_nowait({"n": 9})
    seen["kept after a cancelled wait"] = (await asyncio.wait_for(inbox.get(), 5))["n"]
    seen["waiters left"] = len(inbox.getters)
    seen["truthy"] = bool(inbox)  # Daphne tests `if self.application_queue:`
    print(json.dumps(seen))

asyncio.run(main())
"""


def test_a_requests_inbox_is_a_queue_for_its_getters(tmp_path: Path) -> None:
    """``_RequestInbox``: items in order, waiting getters served in turn, a getter woken and
    then cancelled hands the item to the next one, and a cancelled wait loses nothing."""
    last = run_script(INBOX, tmp_path)
    seen = json.loads(last)
    assert seen == {
        "in order": [1, 2],
        "getters in turn": [["a", 1], ["b", 2], ["c", 3]],
        "handed on": 7,
        "first cancelled": True,
        "kept after a cancelled wait": 9,
        "waiters left": 0,
        "truthy": True,
    }
