"""``GET /models/sse`` on an idle router: headers at once, then keep-alive comments (issue 14).

llama.cpp sends nothing until the first event; a client (or a proxy) then cannot tell a live
stream from a dead server. Through a real ``manage.py serve``.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.serving import run_manage

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too

KEEPALIVE = 3  # seconds (ROUTERPANEL_SSE_KEEPALIVE)


def test_an_idle_stream_sends_its_headers_at_once_then_keep_alive_comments(
    tmp_path: Path,
) -> None:
    env = {"ROUTERPANEL_SSE_KEEPALIVE": str(KEEPALIVE)}
    with run_manage(["serve", "--demo"], tmp_path / "data", port=free_port(), env=env) as server:
        started = time.monotonic()
        with httpx.stream("GET", f"{server.url}/models/sse", timeout=30) as response:
            headers_after = time.monotonic() - started
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream"
            assert response.headers["x-accel-buffering"] == "no"
            # Well before the first keep-alive could have pushed them out.
            assert headers_after < KEEPALIVE / 2, f"headers after {headers_after:.2f} s"
            lines = response.iter_lines()
            first = next(lines)
            comment_after = time.monotonic() - started
        assert first == ": keep-alive"
        assert KEEPALIVE * 0.8 <= comment_after < KEEPALIVE * 3, comment_after
