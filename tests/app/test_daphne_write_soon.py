"""``serve`` on Daphne sends each answer at the end of the loop's turn (``write_soon``).

Twisted alone asks the loop to watch every connection for writability before each send (an
``add_writer`` and a ``remove_writer`` per piece of an answer). Under ``RouterPanelServer`` an
idle connection's bytes leave without that; only an answer larger than the socket takes makes
Twisted watch it. Each test reads what a real client gets: small answers, a streamed one, one
far larger than the socket's buffer read slowly, and a connection closed after its answer.

The server runs in a child Python (Daphne installs Twisted's reactor); it counts the loop's
``add_writer`` calls and answers the count on ``/count``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.daphne_child import daphne_child, run_script

DEADLINE = 30.0
BIG = 8 * 1024 * 1024  # far more than a loopback socket's send buffer takes at once

SERVER = r"""
import asyncio, json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers.daphne_server import RouterPanelServer  # installs the reactor
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
    elif path == "/bigstream":  # chunks far larger than the socket takes, each of one byte value
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(24):
            piece = bytes([65 + i]) * (256 * 1024)
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(0.002)  # the next piece comes while the rest of this one waits
        await send({"type": "http.response.body", "body": b""})
        return
    elif path == "/direct":  # the pieces through the scope's chunk_now, as the pump writes them
        chunk_now = scope["extensions"]["routerpanel.chunk_now"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        said = [chunk_now(b"0;")]  # the head has not gone out: it must go as a message
        await send({"type": "http.response.body", "body": b"0;", "more_body": True})
        for i in range(1, 50):
            said.append(chunk_now(b"%d;" % i))
            await asyncio.sleep(0)
        await send({"type": "http.response.body", "body": b""})
        said.append(chunk_now(b"late"))  # finished: nothing more goes out
        counts["direct"] = said
        return
    elif path == "/endless":  # goes on sending after the client has left
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(300):
            await send({"type": "http.response.body", "body": b"%d;" % i, "more_body": True})
            await asyncio.sleep(0.005)
        counts["endless_finished"] = counts.get("endless_finished", 0) + 1
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
    with daphne_child(SERVER, str(BIG), data_dir=tmp_path) as port:
        yield f"http://127.0.0.1:{port}"


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


def raw_exchange(base_url: str, request: bytes, done: Callable[[bytes], bool]) -> bytes:
    """Send ``request`` on a new connection; read until ``done(data)`` or the server closes."""
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
        sock.sendall(request)
        data = b""
        deadline = time.monotonic() + DEADLINE
        while not done(data):
            assert time.monotonic() < deadline, f"no end of the answer: {data[-200:]!r}"
            piece = sock.recv(65536)
            if not piece:
                break  # the server closed the connection
            data += piece
    return data


def test_a_connection_that_asks_to_close_is_closed_after_its_answer(base_url: str) -> None:
    request = b"GET /small HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    data = raw_exchange(base_url, request, lambda data: False)  # until the server closes
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\nhello")


def test_a_streamed_piece_goes_out_as_one_chunk_of_chunked_encoding(base_url: str) -> None:
    """The bytes on the wire: the head, then each piece framed as its own chunk, then the end."""
    assert_fifty_chunks(base_url, b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")


def assert_fifty_chunks(base_url: str, request: bytes) -> None:
    """The answer to ``request`` is chunked: the pieces ``0;`` to ``49;``, one chunk each."""
    data = raw_exchange(base_url, request, lambda data: data.endswith(b"\r\n0\r\n\r\n"))
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    expected = b"".join(b"%x\r\n%d;\r\n" % (len(b"%d;" % i), i) for i in range(50))
    assert body == expected + b"0\r\n\r\n"


def test_the_scopes_chunk_now_writes_the_same_bytes_once_the_head_went_out(base_url: str) -> None:
    """``chunk_now`` (what the proxy's pump uses instead of a message per piece) says False
    before the head went out and after the end, and writes what a message would have."""
    assert_fifty_chunks(base_url, b"GET /direct HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    with httpx.Client(base_url=base_url, timeout=DEADLINE) as client:
        assert client.get("/count").json()["direct"] == [False] + [True] * 49 + [False]


def test_streamed_pieces_larger_than_the_socket_reach_a_slow_reader_whole_and_in_order(
    base_url: str,
) -> None:
    """A piece the socket takes only in part: the rest, and every piece after it, wait in
    Twisted's buffer and leave in order once the client reads."""
    with httpx.Client(base_url=base_url, timeout=DEADLINE) as client:
        received = bytearray()
        with client.stream("GET", "/bigstream") as answer:
            for i, piece in enumerate(answer.iter_bytes(64 * 1024)):
                received += piece
                if i < 30:
                    time.sleep(0.01)
        assert client.get("/small").content == b"hello"  # the connection is still usable
    expected = b"".join(bytes([65 + i]) * (256 * 1024) for i in range(24))
    assert len(received) == len(expected)
    assert received == expected


def test_a_stream_whose_client_left_ends_quietly_and_the_server_serves_on(base_url: str) -> None:
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
        sock.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    # closed with a reset: the server's next sends meet a dead socket
    with httpx.Client(base_url=base_url, timeout=DEADLINE) as client:
        deadline = time.monotonic() + DEADLINE
        while client.get("/count").json().get("endless_finished") != 1:
            assert time.monotonic() < deadline, "the application did not run to its end"
            time.sleep(0.1)
        assert client.get("/small").content == b"hello"


SEND_RULES = r"""
import asyncio, json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers import daphne_writes  # installs the reactor

class Socket:
    def __init__(self, takes):
        self.takes, self.sent = takes, []
    def send(self, data):
        if isinstance(self.takes, BaseException):
            raise self.takes
        self.sent.append(bytes(data[: self.takes]))
        return min(self.takes, len(data))

class Transport:  # the attributes of twisted.internet.tcp.Server that the rule reads
    def __init__(self, takes=1 << 20, **state):
        self.connected, self.disconnecting, self._writeDisconnected, self.TLS = 1, 0, 0, False
        self._tempDataBuffer, self.dataBuffer, self.offset = [], b"", 0
        self.socket, self.written = Socket(takes), []
        self.__dict__.update(state)
    def write(self, data):
        self.written.append(bytes(data))
    def startWriting(self):
        pass

async def case(pending=False, **state):
    transport = Transport(**state)
    writer = daphne_writes._SoonWriter(transport)
    writer.pending = pending
    writer.send(b"0123456789")
    return {"socket": [d.decode() for d in transport.socket.sent],
            "twisted": [d.decode() for d in transport.written]}

async def main():
    cases = {
        "idle": {},
        "twisted holds a piece": {"_tempDataBuffer": [b"x"]},
        "twisted holds a rest": {"dataBuffer": b"xyz", "offset": 1},
        "a flush is due": {"pending": True},
        "the socket takes 3": {"takes": 3},
        "the socket is full": {"takes": BlockingIOError()},
        "the socket is broken": {"takes": BrokenPipeError()},
        "closing": {"disconnecting": 1},
        "half closed": {"_writeDisconnected": 1},
        "tls": {"TLS": True},
        "not connected": {"connected": 0},
    }
    print(json.dumps({name: await case(**state) for name, state in cases.items()}))

asyncio.run(main())
"""


def test_a_streamed_piece_is_sent_at_once_only_when_nothing_waits_before_it(
    tmp_path: Path,
) -> None:
    """``_SoonWriter.send``'s rule, on a stand-in socket and transport: the piece goes to the
    socket only when Twisted holds nothing, no flush is due and the connection is a plain open
    one; what the socket does not take, or everything otherwise, goes Twisted's way (after
    what Twisted holds). Bytes sent ahead of what Twisted holds would reach the client out of
    order, which a black-box client catches only by luck."""
    last = run_script(SEND_RULES, tmp_path)
    seen = json.loads(last)
    whole = {"socket": ["0123456789"], "twisted": []}
    deferred = {"socket": [], "twisted": ["0123456789"]}
    assert seen.pop("idle") == whole
    assert seen.pop("the socket takes 3") == {"socket": ["012"], "twisted": ["3456789"]}
    for name, result in seen.items():
        assert result == deferred, name


FLUSH_NOW = r"""
import asyncio, json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers import daphne_writes  # installs the reactor

class Transport:  # what _SoonWriter's flush reads of twisted.internet.tcp.Server
    connected, dataBuffer, _tempDataBuffer = 1, b"", []
    def __init__(self):
        self.writes = 0
    def fileno(self):
        return 7
    def doWrite(self):
        self.writes += 1
    def startWriting(self):
        pass

async def main():
    transport = Transport()
    writer = daphne_writes._SoonWriter(transport)
    writer.install()
    transport.startWriting()           # an answer's bytes are buffered: a flush is due ...
    transport.startWriting()           # ... once, however many writes come in the turn
    daphne_writes.send_now(transport)        # the answer is complete: sent now
    now = transport.writes
    await asyncio.sleep(0.05)          # the due flush was cancelled: nothing more
    later = transport.writes
    daphne_writes.send_now(transport)        # nothing due: nothing to send
    print(json.dumps({"now": now, "later": later, "idle": transport.writes}))

asyncio.run(main())
"""


def test_the_end_of_an_answer_is_sent_in_its_own_turn_once(tmp_path: Path) -> None:
    """``send_now``: the flush due at the end of the turn happens at once, and only once."""
    last = run_script(FLUSH_NOW, tmp_path)
    assert json.loads(last) == {"now": 1, "later": 1, "idle": 1}
