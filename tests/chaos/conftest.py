"""The chaos tier: faults injected into real processes, and what a client sees (issue 11, 12).

Every test starts RouterPanel as a user does (``manage.py serve`` / ``runrouter`` with
simulated children), breaks something for real — a burst, SIGSTOP of a child, a crash loop, a
flood of output, ``kill -9``, Redis or PostgreSQL going away — and asserts the answer a client
gets, how long recovery takes, and that no audit row is lost. Every measured figure is also
appended to ``test-artifacts/faults.jsonl``: the fault table of docs/faults.md is made from
those lines.

The helpers (``record``, ``chat``, ``child_of``, ``kill9``…) are in tests/support/chaos.py,
``RedisServer`` in tests/support/redis_server.py; here are the fixtures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.ports import free_port
from tests.support.serving import Server, run_manage, sim_preset

logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise


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
