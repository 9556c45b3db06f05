"""Slow and oversized bodies under the real ``manage.py serve``, over raw sockets (issue 13).

The probes: a 40 MiB ``Content-Length`` with no body got no answer (the 413 came only after the
upload), and a chunked body that never ends was never timed out — Daphne reads the whole body
before the application sees the request. ``serve``'s server now answers both itself: 413 as
soon as the headers are in, 408 when the request has not arrived whole within the body timeout
(``ROUTERPANEL_BODY_TIMEOUT``, 3 s here). The same server, started on all interfaces without
an API key, shows ``serve``'s loud warning.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from models_app.security import open_to_network, warn_if_open
from tests.support.ports import free_port
from tests.support.serving import Server, run_manage

BODY_TIMEOUT = 3.0
MIB = 1 << 20
LIMIT = 32 * MIB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"ROUTERPANEL_BODY_TIMEOUT": str(int(BODY_TIMEOUT))}
    data_dir = Path(tmp_path_factory.mktemp("bodies"))
    with run_manage(["serve", "--host", "0.0.0.0"], data_dir, env=env, port=free_port()) as running:
        yield running


def connect(server: Server) -> socket.socket:
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response whose body has a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the body"
        body += chunk
    return status, headers, body[:length]


def request_head(path: str, *lines: str) -> bytes:
    return ("\r\n".join([f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *lines]) + "\r\n\r\n").encode()


def assert_api_error(headers: dict[str, str], body: bytes, status: int, text: str) -> None:
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers["server"] == "llama.cpp"
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == (status, "invalid_request_error")
    assert text in error["message"]


class TestOversizedBodies:
    def test_a_40_mib_content_length_is_answered_413_before_any_body(self, server: Server) -> None:
        with connect(server) as sock:
            started = time.monotonic()
            sock.sendall(
                request_head(
                    "/v1/chat/completions",
                    "Content-Type: application/json",
                    f"Content-Length: {40 * MIB}",
                )
            )
            status, headers, body = read_response(sock)
            elapsed = time.monotonic() - started
        assert status == 413
        assert_api_error(headers, body, 413, f"request body too large (limit: {LIMIT} bytes)")
        assert elapsed < BODY_TIMEOUT  # not the timeout: nothing of the body was awaited

    def test_a_panel_path_gets_a_plain_413(self, server: Server) -> None:
        with connect(server) as sock:
            sock.sendall(request_head("/presets/import/", f"Content-Length: {40 * MIB}"))
            status, headers, body = read_response(sock)
        assert status == 413
        assert headers["content-type"] == "text/plain; charset=utf-8"
        assert body.startswith(b"request body too large")

    def test_no_100_continue_precedes_the_413(self, server: Server) -> None:
        with connect(server) as sock:
            sock.sendall(
                request_head("/tokenize", f"Content-Length: {40 * MIB}", "Expect: 100-continue")
            )
            status, _, _ = read_response(sock)
        assert status == 413

    def test_a_chunked_body_past_the_limit_is_answered_413(self, server: Server) -> None:
        piece = b"x" * MIB
        chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        with connect(server) as sock:
            sock.sendall(request_head("/v1/embeddings", "Transfer-Encoding: chunked"))
            for _ in range(LIMIT // MIB + 2):
                sock.sendall(chunk)
            status, headers, body = read_response(sock)
        assert status == 413
        assert_api_error(headers, body, 413, "request body too large")

    def test_a_client_that_uploads_anyway_still_reads_the_413(self, server: Server) -> None:
        response = httpx.post(
            f"{server.url}/v1/chat/completions", content=b"x" * (40 * MIB), timeout=60
        )
        assert response.status_code == 413
        assert response.json()["error"]["code"] == 413


class TestSlowBodies:
    def test_a_chunked_body_that_never_ends_is_answered_408(self, server: Server) -> None:
        with connect(server) as sock:
            started = time.monotonic()
            sock.sendall(request_head("/v1/chat/completions", "Transfer-Encoding: chunked"))
            sock.settimeout(0.5)
            answer = b""
            while not answer:  # a chunk every half second: never idle, never finished
                assert time.monotonic() - started < BODY_TIMEOUT + 10, "no 408 came"
                sock.sendall(b"2\r\n{}\r\n")
                try:
                    answer = sock.recv(65536)
                except TimeoutError:
                    continue
            elapsed = time.monotonic() - started
            sock.settimeout(30)
            while b'"code":408' not in answer:
                answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert BODY_TIMEOUT - 0.5 <= elapsed < BODY_TIMEOUT + 10

    def test_a_body_shorter_than_its_content_length_is_answered_408(self, server: Server) -> None:
        with connect(server) as sock:
            sock.sendall(request_head("/models/unload", "Content-Length: 100") + b'{"model":')
            status, headers, body = read_response(sock)
        assert status == 408
        assert_api_error(headers, body, 408, f"not received within {BODY_TIMEOUT:g} s")

    def test_headers_that_never_end_are_answered_408(self, server: Server) -> None:
        with connect(server) as sock:
            sock.sendall(b"POST /presets/import/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            status, headers, _ = read_response(sock)
        assert status == 408
        assert headers["content-type"] == "text/plain; charset=utf-8"

    def test_an_ordinary_request_is_untouched(self, server: Server) -> None:
        response = httpx.post(f"{server.url}/tokenize", json={"model": "nope"}, timeout=30)
        assert response.status_code == 400  # no such model: the router's answer, not ours
        assert httpx.get(f"{server.url}/health", timeout=30).json() == {"status": "ok"}


class TestTheOpenServerWarning:
    def test_serve_on_all_interfaces_without_a_key_says_so_loudly(self, server: Server) -> None:
        output = server.output()
        assert "WARNING: the API on 0.0.0.0 is open to the network" in output
        assert "'Require an API key for the router API' in the panel's Settings." in output

    @pytest.mark.parametrize(
        ("host", "keys", "required", "open_"),
        [
            ("0.0.0.0", [], False, True),
            ("192.168.1.20", [], False, True),
            ("studio.local", [], False, True),
            ("::", [], False, True),
            ("0.0.0.0", ["k"], False, False),
            ("0.0.0.0", [], True, False),
            ("127.0.0.1", [], False, False),
            ("127.0.0.2", [], False, False),
            ("localhost", [], False, False),
            ("::1", [], False, False),
            ("[::1]", [], False, False),
        ],
    )
    def test_only_a_non_loopback_listener_without_keys_is_open(
        self, host: str, keys: list[str], required: bool, open_: bool
    ) -> None:
        assert open_to_network(host, keys, required) is open_

    @pytest.mark.django_db
    def test_a_loopback_listener_prints_nothing(self) -> None:
        import io

        out = io.StringIO()
        assert warn_if_open("127.0.0.1", [], out) is False
        assert out.getvalue() == ""
