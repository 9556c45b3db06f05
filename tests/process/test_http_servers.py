"""``serve --http daphne|uvicorn``: the same router behind either server (issue 16, item 4).

CI runs the whole process and browser tiers a second time with ``ROUTERPANEL_HTTP=uvicorn``;
these tests run under both servers in every run, so ``make test`` alone covers the switch too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.ports import free_port
from tests.support.serving import ROOT, run_manage, wait_until

CHAT = {"model": "demo-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("http", ["daphne", "uvicorn"])
def test_either_server_proxies_streams_and_stops_its_children(http: str, tmp_path: Path) -> None:
    port = free_port()
    with run_manage(["serve", "--demo", "--http", http], tmp_path, port=port) as server:
        with server.client() as client:
            answer = client.post("/v1/chat/completions", json=CHAT)
            assert answer.status_code == 200
            assert answer.json()["usage"]["completion_tokens"] == 4
            # The child's framing and our headers, nothing the server adds of its own.
            assert answer.headers["content-length"] == str(len(answer.content))
            assert answer.headers.get_list("server") == ["llama.cpp"]
            assert answer.headers.get_list("x-accel-buffering") == ["no"]

            with client.stream(
                "POST", "/v1/chat/completions", json={**CHAT, "stream": True}
            ) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                events = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            assert len(events) >= 5  # 4 tokens and the end, one event each

            assert client.get("/ready").json()["status"] == "ok"
            login = client.get("/login/")
            assert login.status_code == 200 and b"<form" in login.content

        assert server.process.poll() is None
        children = psutil.Process(server.process.pid).children(recursive=True)
        assert children, "the demo model's child should be running"
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        wait_until(lambda: not any(c.is_running() for c in children), 10, "children gone")
    assert "Unclosed" not in server.output(), server.output()  # connections to children closed


@pytest.mark.parametrize("http", ["daphne", "uvicorn"])
def test_an_open_event_stream_does_not_hold_up_stopping(http: str, tmp_path: Path) -> None:
    # A dashboard or a script following /models/sse never leaves by itself. uvicorn waits
    # for every open response before it stops; serve ends the event streams first, so SIGTERM
    # stops the server at once. With a grace of 120 s for requests under way, a server that
    # counted the stream as one would outlast the 30 s this test waits.
    import threading
    import time

    import httpx

    port = free_port()
    args = ["serve", "--demo", "--http", http, "--shutdown-grace", "120"]
    with run_manage(args, tmp_path, port=port) as server:
        lines: list[str] = []
        opened = threading.Event()

        def follow() -> None:
            with httpx.stream("GET", f"{server.url}/models/sse", timeout=60) as events:
                assert events.status_code == 200
                opened.set()
                for line in events.iter_lines():
                    lines.append(line)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert opened.wait(30), "the event stream did not open"
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        took = time.monotonic() - started
        reader.join(10)
        assert not reader.is_alive(), "the event stream did not end with the server"
    print(f"stopping took {took:.1f} s with an event stream open")


@pytest.mark.parametrize("http", ["daphne", "uvicorn"])
def test_sigterm_gives_requests_under_way_their_grace_then_tells_the_rest_why(
    http: str, tmp_path: Path
) -> None:
    # A restart of a shared server: a stream that ends within --shutdown-grace ends whole; one
    # that would run on is told "router is shutting down" in an SSE error event, not cut
    # mid-chunk (Daphne cut both at once); and the server is gone within grace + stop-timeout
    # (uvicorn used to wait for every stream to end: 116 s for a 5,000-token one).
    import json
    import os
    import time

    from tests.support.serving import StreamReader, sim_preset

    grace, marker = 4.0, f"grace-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text(
        sim_preset("short", marker, token_ms=40, extra="sim-tokens = 1000\n")
        + sim_preset("long", marker, token_ms=40, extra="sim-tokens = 5000\n")
    )
    args = ["serve", "--http", http, "--models-preset", str(ini), "--models-max", "2"]
    args += ["--shutdown-grace", str(grace)]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        url = f"{server.url}/v1/chat/completions"

        def chat(model: str, tokens: int) -> dict[str, object]:
            return {**CHAT, "model": model, "max_tokens": tokens, "stream": True}

        with (
            StreamReader(url, chat("long", 5000)) as long,
            StreamReader(url, chat("short", 10), started_after=1) as short,
        ):
            long.wait_started()
            short.wait_started()
            [stuck] = [
                p for p in psutil.Process(server.process.pid).children(recursive=True)
                if marker in p.cmdline() and "long" in p.cmdline()
            ]  # fmt: skip
            server.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            # The long model's child will not finish its stream by itself when stopped: the
            # router's stop-timeout (3 s) kills it and the proxy says why.
            os.kill(stuck.pid, signal.SIGSTOP)
            assert server.process.wait(30) == 0
            gone = time.monotonic() - signalled

    assert short.status == 200 and short.ended_at is not None, short.lines[-3:]
    assert short.lines[-2] == "data: [DONE]"  # whole: 10 tokens, the last chunk, the end
    chunks = [json.loads(x[6:]) for x in short.lines if x.startswith('data: {"choices"')]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert short.ended_at - signalled < grace  # 0.4 s of tokens left at most: it had its grace

    assert long.status == 200 and long.ended_at is not None, "the stream was cut mid-chunk"
    assert [e["error"] for e in long.errors()] == [
        {"code": 503, "message": "router is shutting down", "type": "unavailable_error"}
    ]
    # Told at the end of the grace, not before; and not when its 5,000 tokens would have
    # ended (200 s): the stop-timeout (3 s) ends it. The server waited for nothing else: the
    # 30 s wait above is far short of the stream's own end.
    assert grace <= long.ended_at - signalled < grace + 30
    print(f"stopping took {gone:.1f} s (grace {grace} s, stop-timeout 3 s)")


PROBE = """
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerpanel.settings")
from routerpanel import reactor
reactor.prepare(sys.argv[1:])
import django
django.setup()  # imports daphne.server, which installs its reactor unless one is installed
from twisted.internet import reactor as installed
print(type(installed._asyncioEventloop).__module__)
"""


@pytest.mark.parametrize(
    ("argv", "loop"),
    [(["manage.py", "serve"], "uvloop"), (["manage.py", "serve", "--http", "uvicorn"], "asyncio")],
)
def test_daphne_keeps_the_reactor_installed_before_django_setup(
    argv: list[str], loop: str, tmp_path: Path
) -> None:
    env = {"ROUTERPANEL_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split()[-1].startswith(loop)


@pytest.mark.parametrize("http", ["daphne", "uvicorn"])
def test_a_child_killed_is_seen_and_ctrl_c_stops_the_server(http: str, tmp_path: Path) -> None:
    # Both servers run the router on uvloop (Daphne through Twisted's reactor on it, reactor.py):
    # a child's exit is seen, and SIGINT, handled by the loop, stops the server and its children.
    def status(client: object) -> str:
        models = client.get("/v1/models").json()["data"]  # type: ignore[attr-defined]
        return str(next(m for m in models if m["id"] == "demo-small")["status"]["value"])

    with run_manage(["serve", "--demo", "--http", http], tmp_path, port=free_port()) as server:
        with server.client() as client:
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
            [child] = psutil.Process(server.process.pid).children(recursive=True)
            child.kill()
            wait_until(lambda: status(client) != "loaded", 10, "the dead child seen")
            # Up less than 60 s: a crash-loop strike, so an explicit load starts it again.
            assert client.post("/models/load", json={"model": "demo-small"}).is_success
            wait_until(lambda: status(client) == "loaded", 20, "started again")
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        children = psutil.Process(server.process.pid).children(recursive=True)
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(30) == 0
        wait_until(lambda: not any(c.is_running() for c in children), 10, "children gone")


@pytest.mark.parametrize("http", ["daphne", "uvicorn"])
def test_a_client_that_never_finishes_its_headers_is_answered_408_and_closed(
    http: str, tmp_path: Path
) -> None:
    """Slowloris: a request whose headers do not arrive within the body timeout holds no
    connection for ever, on either server (uvicorn used to hold them: 300 sockets after 90 s)."""
    import socket

    env = {"ROUTERPANEL_BODY_TIMEOUT": "2"}
    with run_manage(
        ["serve", "--demo", "--http", http], tmp_path, port=free_port(), env=env
    ) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and no more
            answer = b""
            while chunk := sock.recv(4096):  # until the server closes it (30 s at most)
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:200]
        assert b'"code":408' in answer.replace(b" ", b"") and b"not received within" in answer
        assert server.client().get("/health").status_code == 200  # others are served
