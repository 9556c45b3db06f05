"""Process-tier guard: a test must not leave a child server running behind it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psutil
import pytest

SERVERS = ("routerpanel.router.simserver", "llama-server")


def live_servers() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(name in part for part in child.cmdline() for name in SERVERS):
                found.append(child)
        except psutil.Error:
            continue
    return found


@pytest.fixture(autouse=True)
def no_orphan_servers() -> Iterator[None]:
    before = {p.pid for p in live_servers()}
    yield
    deadline = time.monotonic() + 5
    left = [p for p in live_servers() if p.pid not in before]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in live_servers() if p.pid not in before]
    for proc in left:
        proc.kill()
    assert not left, f"the test left servers running: {[' '.join(p.cmdline()) for p in left]}"
