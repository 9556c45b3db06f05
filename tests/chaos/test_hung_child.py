"""A child that stops answering (SIGSTOP: what a wedged Metal queue looks like from outside).

The question llama.cpp's users ask of its router — can a hung child stay counted as running and
block every load? Here: no. With ``hang-timeout = 2`` the watchdog notices the silence, probes
the child's ``/slots`` (no answer), kills its process group and frees the slot; the streamed
client gets an SSE error event naming the cause, a non-streamed one a 503, the request queued
for another model is served, and one audit row says what happened. A long prompt that is still
making progress (its counters move) is never killed.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from tests.support.auditdb import audit_rows, wait_for_rows
from tests.support.chaos import chat, child_of, record
from tests.support.serving import LiveChildSampler, StreamReader, wait_until

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too

HANG = 2  # seconds: the presets' hang-timeout


def test_a_hung_child_is_killed_its_stream_says_why_and_the_queue_moves_on(serve: Any) -> None:
    presets = serve.preset("a", token_ms=50, extra=f"hang-timeout = {HANG}\nsim-tokens = 400\n")
    presets += serve.preset("b", extra=f"hang-timeout = {HANG}\n")
    with serve(presets, 1) as server, LiveChildSampler(serve.marker, server.process.pid) as peak:
        url = f"{server.url}/v1/chat/completions"
        with StreamReader(url, chat("a", 400, True)) as streamed:
            streamed.wait_started()
            child = child_of(server, serve.marker, "a")
            os.kill(child.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            other = httpx.post(url, json=chat("b"), timeout=60)
            served = time.monotonic()
        assert streamed.status == 200 and streamed.ended_at is not None

        assert other.status_code == 200, other.text  # the queue moved on
        errors = streamed.errors()
        assert len(errors) == 1, streamed.lines[-3:]
        error = errors[0]["error"]
        assert error["code"] == 503 and error["type"] == "unavailable_error"
        assert "model name=a stopped responding (no progress for" in error["message"]
        assert not child.is_running() or child.status() == "zombie"
        [row] = wait_for_rows(server.data_dir, "hung")
        details = json.loads(row["details"])
        assert details["holders"] == {"anonymous": 1} and details["pid"] == child.pid
        assert row["actor"] == "watchdog" and row["force_killed"] in (1, True)
        assert peak.samples > 10 and peak.maximum == 1
        record(
            "hung child (SIGSTOP mid-stream)", hang_timeout=HANG,
            stream_error_after=round(streamed.ended_at - stopped, 2),
            queued_request_served_after=round(served - stopped, 2),
            audit_rows={"hung": 1}, rows_lost=0,
        )  # fmt: skip


def test_a_silent_non_streamed_request_gets_a_503(serve: Any) -> None:
    presets = serve.preset("a", token_ms=200, extra=f"hang-timeout = {HANG}\nsim-tokens = 50\n")
    with serve(presets, 1) as server:
        assert httpx.post(f"{server.url}/models/load", json={"model": "a"}, timeout=30).is_success
        wait_until(lambda: _state(server.url, "a") == "loaded", 30, "a loaded")
        child = child_of(server, serve.marker, "a")
        answer: dict[str, httpx.Response] = {}

        def ask() -> None:
            answer["r"] = httpx.post(
                f"{server.url}/v1/chat/completions", json=chat("a", 50), timeout=60
            )

        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        asking.join(30)
        response = answer["r"]
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert "stopped responding" in response.json()["error"]["message"]
        record("hung child (SIGSTOP, non-streamed)", hang_timeout=HANG,
               answered_503_after=round(time.monotonic() - stopped, 2))  # fmt: skip


def test_a_long_prompt_that_makes_progress_is_not_killed(serve: Any) -> None:
    extra = "hang-timeout = 1\nsim-prefill-ms = 5000\n"  # 5 s without a byte, counters moving
    with serve(serve.preset("p", extra=extra), 1) as server:
        started = time.monotonic()
        response = httpx.post(f"{server.url}/v1/chat/completions", json=chat("p"), timeout=60)
        took = time.monotonic() - started
        assert response.status_code == 200, response.text
        assert took >= 5.0
        assert audit_rows(server.data_dir, "WHERE kind = ?", "hung") == []
        record("long prompt, no output for 5 s (hang-timeout 1 s)", killed=False,
               answered_after=round(took, 2))  # fmt: skip


def _state(url: str, model: str) -> str:
    rows = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
    return str(next(m for m in rows if m["id"] == model)["status"]["value"])
