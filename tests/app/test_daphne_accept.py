"""``serve`` on Daphne: how a listening port accepts (``daphne_connection.accept``).

``RouterPanelServer`` replaces Twisted's ``Port.doRead`` with a shorter accept for the common
case and hands every accept error to Twisted's own. These tests check on a real server what a
client sees: a burst of connections is accepted and each answered with its own address, no
accepted socket is inheritable by a child process (Twisted set close-on-exec itself; Python's
``accept`` already does), and a server out of file descriptors sheds the connections it cannot
take and serves again once descriptors are free.

The server runs in a child Python (Daphne installs Twisted's reactor).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daphne_child import daphne_child, get_json

DEADLINE = 30.0
BURST = 200

SERVER = r"""
import json, os, resource, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers import daphne_connection
from models_app.servers.daphne_server import RouterPanelServer
from twisted.internet import reactor

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    sockets = [p.channel.transport.socket for p in list(server.connections)
               if getattr(p, "channel", None) is not None]
    port = server.ports[0]
    body = json.dumps({
        "client": scope["client"],
        "ours": getattr(port.doRead, "func", None) is daphne_connection.accept,
        "open": len(sockets),
        "inheritable": sum(s.get_inheritable() for s in sockets),
    }).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})

server = RouterPanelServer(app, endpoints=["tcp:port=0:interface=127.0.0.1:backlog=1024"])

def ready():
    spare = int(sys.argv[1])
    if spare:  # run out of descriptors: only ``spare`` more than are open now
        in_use = len(os.listdir("/proc/self/fd"))
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + spare, hard))
    print("listening", server.listening_addresses[0][1], flush=True)

server.on_listening = lambda: reactor.callLater(0, ready)
server.run()
"""


@contextlib.contextmanager
def server(tmp_path: Path, spare: int = 0) -> Iterator[int]:
    with daphne_child(SERVER, str(spare), data_dir=tmp_path) as port:
        yield port


def read_answer(sock: socket.socket) -> bytes:
    """Everything ``sock`` receives until the server closes it (or an empty reset)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def settled_shed(socks: list[socket.socket], quiet: float = 0.5) -> int:
    """How many of ``socks`` the server closed unanswered, once that number has stopped
    growing for ``quiet`` seconds (and is not 0), or at the deadline."""
    shed: set[int] = set()
    deadline = time.monotonic() + DEADLINE
    changed = time.monotonic()
    while time.monotonic() < deadline:
        for i, sock in enumerate(socks):
            if i in shed:
                continue
            try:
                if sock.recv(1) == b"":
                    shed.add(i)
                    changed = time.monotonic()
            except BlockingIOError:
                pass  # accepted and kept (it waits for its request), or not accepted yet
            except ConnectionResetError:
                shed.add(i)
                changed = time.monotonic()
        if shed and time.monotonic() - changed >= quiet:
            break
        time.sleep(0.05)
    return len(shed)


def test_a_burst_of_connections_is_accepted_and_each_answered_with_its_own_address(
    tmp_path: Path,
) -> None:
    with server(tmp_path) as port:
        socks = []
        try:
            for _ in range(BURST):  # all connected before the server reads any of them
                sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
                socks.append(sock)
            for sock in socks:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answers = [read_answer(sock) for sock in socks]
            mine = [list(sock.getsockname()) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
        bodies = []
        for raw in answers:
            head, _, body = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), raw[:200]
            bodies.append(json.loads(body))
        assert [b["client"] for b in bodies] == mine  # each its own connection
        assert all(b["ours"] for b in bodies)  # the port accepts with ``daphne_connection.accept``
        assert max(b["open"] for b in bodies) > 1  # several were open together
        assert sum(b["inheritable"] for b in bodies) == 0  # none leaks into a child process


def test_out_of_descriptors_the_server_sheds_what_it_cannot_take_and_serves_on(
    tmp_path: Path,
) -> None:
    spare = 20
    with server(tmp_path, spare=spare) as port:
        first = get_json(port)
        assert first["ours"]
        socks = []
        try:
            for _ in range(spare * 3):  # more than the server has descriptors for
                sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
                socks.append(sock)
            # The server accepts what it can; the rest it accepts and closes at once (Twisted's
            # reserved descriptor), so no client waits for an answer that cannot come.
            for sock in socks:
                sock.setblocking(False)
            shed = settled_shed(socks)
            assert shed > 0, "no connection was shed although the descriptors ran out"
            assert shed < len(socks), "every connection was shed"
        finally:
            for sock in socks:
                sock.close()
        # Descriptors are free again: the port still listens and answers.
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                answer = get_json(port)
                break
            except (ConnectionError, http.client.HTTPException, OSError):
                if time.monotonic() > deadline:
                    pytest.fail("the server did not answer again after the descriptors were free")
                time.sleep(0.1)
        assert answer["ours"]
