"""The chaos tier: faults injected into real processes, and what a client sees (issue 11, 12).

Every test starts RouterPanel as a user does (``manage.py serve`` / ``runrouter`` with
simulated children), breaks something for real — a burst, SIGSTOP of a child, a crash loop, a
flood of output, ``kill -9``, Redis or PostgreSQL going away — and asserts the answer a client
gets, how long recovery takes, and that no audit row is lost. Every measured figure is also
appended to ``test-artifacts/faults.jsonl``: the README's fault table is made from those lines.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.serving import ROOT, Server, free_port, run_manage, sim_preset, wait_until

FAULTS = ROOT / "test-artifacts" / "faults.jsonl"
logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise


def record(fault: str, **figures: Any) -> None:
    """Keep a measured figure for the README's fault table (and print it)."""
    FAULTS.parent.mkdir(exist_ok=True)
    line = {"fault": fault, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **figures}
    with FAULTS.open("a") as f:
        f.write(json.dumps(line) + "\n")
    print(f"\nFAULT {json.dumps(line)}")


def chat(model: str, tokens: int = 4, stream: bool = False) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": stream,
    }


def children(server: Server, marker: str) -> list[psutil.Process]:
    """This server's live simulated children started from presets tagged ``marker``."""
    found = []
    try:
        candidates = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for proc in candidates:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and marker in proc.cmdline():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def child_of(server: Server, marker: str, model: str) -> psutil.Process:
    """The live child serving ``model`` (its argv carries ``--alias <model>``)."""
    for proc in children(server, marker):
        cmd = proc.cmdline()
        if "--alias" in cmd and cmd[cmd.index("--alias") + 1] == model:
            return proc
    raise AssertionError(f"no live child for {model}")


def audit_rows(data_dir: Path, sql: str = "", *params: Any) -> list[dict[str, Any]]:
    """Read the embedded SQLite audit table directly (read-only), newest last."""
    import sqlite3

    db = sqlite3.connect(f"file:{data_dir / 'routerpanel.sqlite3'}?mode=ro", uri=True, timeout=30)
    db.row_factory = sqlite3.Row
    try:
        query = "SELECT * FROM models_app_auditevent " + (sql or "") + " ORDER BY id"
        return [dict(row) for row in db.execute(query, params)]
    finally:
        db.close()


def wait_for_rows(data_dir: Path, kind: str, count: int = 1, timeout: float = 30) -> list[Any]:
    wait_until(
        lambda: len(audit_rows(data_dir, "WHERE kind = ?", kind)) >= count, timeout, f"{kind} rows"
    )
    return audit_rows(data_dir, "WHERE kind = ?", kind)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Start ``serve`` on a preset file (a context manager); check no child outlives it."""
    marker = f"chaos-{tmp_path.name}"
    started: list[Server] = []

    def start(presets: str, models_max: int, *extra: str, env: dict[str, str] | None = None) -> Any:
        ini = tmp_path / "models.ini"
        ini.write_text(presets)
        args = ["serve", "--models-preset", str(ini), "--models-max", str(models_max), *extra]
        return run_manage(args, tmp_path / "data", port=free_port(), env=env)

    start.marker = marker  # type: ignore[attr-defined]
    start.preset = lambda name, **kw: sim_preset(name, marker, **kw)  # type: ignore[attr-defined]
    start.started = started  # type: ignore[attr-defined]
    yield start
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _tagged(marker):
        time.sleep(0.1)
    left = _tagged(marker)
    for proc in left:
        proc.kill()
    assert not left, "children outlived the router"


def _tagged(marker: str) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and marker in proc.cmdline():
                out.append(proc)
        except psutil.Error:
            continue
    return out


def kill9(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def spare_port() -> int:
    return free_port()


class RedisServer:
    """A ``redis-server`` of the test's own on a spare port (never the machine's shared one)."""

    def __init__(self, directory: Path) -> None:
        self.port = spare_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self.answers, 20, "redis-server to answer")
        return self

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        self.kill()


def redis_server_available() -> bool:
    return subprocess.run(["which", "redis-server"], capture_output=True).returncode == 0


def env_without_redis() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}


def get(url: str, path: str, timeout: float = 10) -> httpx.Response:
    return httpx.get(f"{url}{path}", timeout=timeout)
