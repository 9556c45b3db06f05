"""The chaos tier's helpers: keep a measured figure, a chat body, a server's children, kill -9.

Every measured figure goes to ``test-artifacts/faults.jsonl`` (``record``): docs/faults.md's fault
table is made from those lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

import httpx
import psutil

from tests.support.serving import ROOT, Server

FAULTS = ROOT / "test-artifacts" / "faults.jsonl"


def record(fault: str, **figures: Any) -> None:
    """Keep a measured figure for the fault table of docs/faults.md (and print it)."""
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


def kill9(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def env_without_redis() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}


def get(url: str, path: str, timeout: float = 10) -> httpx.Response:
    return httpx.get(f"{url}{path}", timeout=timeout)
