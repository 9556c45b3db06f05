"""Team mode under faults: ``runrouter`` + ``serve --no-router`` on PostgreSQL and Redis.

``Team`` starts them as a user runs them (each a context manager on its stack); the functions
send chats through a web process, kill one mid-stream, and wait until a model is served again.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from tests.support.chaos import chat
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.serving import Server, run_manage, sim_preset


class Team:
    """runrouter + serve --no-router on PostgreSQL and the test's Redis."""

    def __init__(self, tmp_path: Path, database: str, redis: RedisServer) -> None:
        self.tmp = tmp_path
        self.redis = redis
        self.marker = f"team-{tmp_path.name}"
        self.env = {
            "DATABASE_URL": database,
            "REDIS_URL": redis.url,
            "ROUTERPANEL_REDIS_PREFIX": f"rp-{uuid.uuid4().hex[:8]}",
            "SECRET_KEY": "chaos-team-secret-not-for-production",
        }
        self.stack = ExitStack()

    def router(self, presets: str, *extra: str, data: str = "router") -> Server:
        ini = self.tmp / "models.ini"
        ini.write_text(presets)
        args = ["runrouter", "--models-preset", str(ini), *extra]
        return self.stack.enter_context(
            run_manage(args, self.tmp / data, env=self.env, ready="router running")
        )

    def web(self, name: str = "web", *extra: str) -> Server:
        args = ["serve", "--no-router", *extra]
        return self.stack.enter_context(
            run_manage(args, self.tmp / name, env=self.env, port=free_port())
        )

    def preset(self, name: str, **kw: Any) -> str:
        return sim_preset(name, self.marker, **kw)


def post_chat(url: str, model: str, timeout: float = 30, **kw: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=chat(model, **kw), timeout=timeout)


def first_token(chunks: Iterator[bytes]) -> bytes:
    """Read a stream until its first data event. The caller keeps ``chunks``: a body iterator
    that is dropped is closed, and the client's connection with it (the web process would then
    end the request and release its lease itself)."""
    seen = b""
    while b"data:" not in seen:
        chunk = next(chunks, None)
        if chunk is None:
            raise AssertionError(f"the stream ended before its first token: {seen[:300]!r}")
        seen += chunk
    return seen


def kill_mid_stream(doomed: Server, model: str) -> float:
    """Stream ``model`` through the web process ``doomed`` and SIGKILL it after the first token,
    while its client is still connected (it then holds a lease); return when (monotonic)."""
    body = chat(model, 200, True)
    with httpx.stream("POST", f"{doomed.url}/v1/chat/completions", json=body, timeout=60) as r:
        chunks = r.iter_bytes()
        first_token(chunks)
        doomed.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        doomed.process.wait(10)
        del chunks  # only now: the client leaves after the kill
    return killed


def until_served(url: str, model: str, timeout: float = 30) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if post_chat(url, model, timeout=10).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{model} not served within {timeout} s")
