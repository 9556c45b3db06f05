"""``serve`` on Daphne: how a ready socket reaches Twisted (``daphne_server``).

* A new connection is read in the turn of the loop that accepted it
  (``daphne_connection.accept``): the request a client sent right after its connect is handled
  without waiting for the loop to report the socket readable. A client that has sent nothing
  yet, or that sent its request and closed at once, is served (or let go) as before.
* The reactor calls each ready socket's handler without Twisted's log context
  (``daphne_server._call_without_log_context``); a handler that fails is logged, with the socket's
  log prefix, and the server serves on.

Each server runs in a child Python (Daphne installs Twisted's reactor). The child counts the
reads the loop itself dispatched for each connection: the answer says whether its own request
came that way.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.daphne_child import daphne_child, get_json, run_script

DEADLINE = 30.0

SERVER = r"""
import json, os, sys, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers import daphne_server
from models_app.servers.daphne_server import RouterPanelServer
from twisted.internet import asyncioreactor, reactor, tcp

daphne_server.install()

loop_reads = {}  # connection -> reads the loop dispatched to it
dispatch = asyncioreactor.callWithLogger  # ours, installed by daphne_server.install()

def counting(selectable, function, *args):
    if isinstance(selectable, tcp.Server) and args[-1] is True:
        loop_reads[selectable] = loop_reads.get(selectable, 0) + 1
    return dispatch(selectable, function, *args)

asyncioreactor.callWithLogger = counting

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    if scope["path"] == "/stall":  # hold the whole loop: connections queue up meanwhile
        time.sleep(float(scope["query_string"] or b"0.5"))
    transports = [p.channel.transport for p in list(server.connections)
                  if getattr(p, "channel", None) is not None
                  and p.channel.transport.getPeer().port == scope["client"][1]]
    body = json.dumps({
        "loop_reads": loop_reads.get(transports[0], 0) if transports else None,
        "ours": daphne_server.asyncioreactor.callWithLogger is counting,
    }).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})

server = RouterPanelServer(app, endpoints=["tcp:port=0:interface=127.0.0.1"])
server.on_listening = lambda: print("listening", server.listening_addresses[0][1], flush=True)
server.run()
"""

HANDLER_FAILS = r"""
import io, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
import django
django.setup()
from models_app.servers import daphne_server
from twisted.internet import asyncioreactor
from twisted.python import log

assert asyncioreactor.callWithLogger is not daphne_server._call_without_log_context  # not on import
daphne_server.install()

lines = []
log.addObserver(lines.append)

class Socket:
    def logPrefix(self):
        return "HTTPChannel,7,127.0.0.1"

def fails():
    raise RuntimeError("handler broke")

def interrupted():
    raise KeyboardInterrupt

assert asyncioreactor.callWithLogger is daphne_server._call_without_log_context
assert asyncioreactor.callWithLogger(Socket(), lambda a, b: a + b, 2, 3) == 5
assert asyncioreactor.callWithLogger(Socket(), fails) is None
logged = [e for e in lines if e.get("isError")]
assert len(logged) == 1, lines
assert logged[0]["system"] == "HTTPChannel,7,127.0.0.1"
assert "handler broke" in str(logged[0]["failure"].value)
try:
    asyncioreactor.callWithLogger(Socket(), interrupted)
except KeyboardInterrupt:
    print("interrupt passed through")
"""


@contextlib.contextmanager
def server(tmp_path: Path) -> Iterator[int]:
    with daphne_child(SERVER, data_dir=tmp_path) as port:
        yield port


def answer_of(sock: socket.socket) -> dict:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data[:200]
    answer: dict = json.loads(body)
    return answer


REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def test_a_request_waiting_at_the_accept_is_read_in_the_same_turn(tmp_path: Path) -> None:
    with server(tmp_path) as port:
        assert get_json(port, "/")["ours"]
        # The loop is held by /stall while these connect and send: when it comes round,
        # each request is already there when its connection is accepted.
        stall = threading.Thread(target=get_json, args=(port, "/stall?1.0"))
        stall.start()
        time.sleep(0.3)
        socks = []
        try:
            for _ in range(5):
                sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
                sock.sendall(REQUEST)
                socks.append(sock)
            answers = [answer_of(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
            stall.join(DEADLINE)
        assert [a["loop_reads"] for a in answers] == [0] * 5


def test_a_client_that_sends_later_is_read_when_it_does(tmp_path: Path) -> None:
    with server(tmp_path) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
            time.sleep(0.3)  # accepted meanwhile: the read at the accept found nothing
            sock.sendall(REQUEST)
            answer = answer_of(sock)
        assert answer["loop_reads"] >= 1  # the loop reported its request, as before


def test_a_client_that_sends_and_leaves_at_once_does_not_stop_the_server(
    tmp_path: Path,
) -> None:
    with server(tmp_path) as port:
        stall = threading.Thread(target=get_json, args=(port, "/stall?0.5"))
        stall.start()
        time.sleep(0.2)
        for _ in range(20):  # request and end of stream both wait at the accept
            with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.shutdown(socket.SHUT_WR)
        for _ in range(20):  # or only the end of stream
            socket.create_connection(("127.0.0.1", port), timeout=DEADLINE).close()
        stall.join(DEADLINE)
        assert get_json(port, "/")["ours"]  # still serving


def test_a_failing_handler_is_logged_with_its_prefix_and_an_interrupt_passes(
    tmp_path: Path,
) -> None:
    assert run_script(HANDLER_FAILS, tmp_path) == "interrupt passed through"
