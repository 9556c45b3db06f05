"""A ``RouterPanelServer`` in a child Python, for tests of what a real client sees.

Daphne installs Twisted's reactor when it is imported, so a test's server runs in a child
process: its script prints ``listening PORT`` once it listens.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30.0


@contextlib.contextmanager
def daphne_child(script: str, *args: str, data_dir: Path) -> Iterator[int]:
    """Run ``script`` with ``args``; yield the port it printed; stop it afterwards."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "routerpanel.settings",
        "ROUTERPANEL_DATA_DIR": str(data_dir),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the child prints its port once it listens
        if not line.startswith("listening"):
            child.kill()
            pytest.fail(f"server did not start: {line!r} {child.communicate(timeout=10)[1]}")
        yield int(line.split()[1])
    finally:
        child.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=DEADLINE)
        if child.poll() is None:
            child.kill()
            child.wait(timeout=DEADLINE)


def run_script(script: str, data_dir: Path) -> str:
    """Run ``script`` to its end in a child Python; return the last line it printed."""
    env = {**os.environ, "ROUTERPANEL_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=DEADLINE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def get_json(port: int, path: str = "/") -> dict:
    """GET ``path`` from a child's server; its JSON answer (which must be a 200)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 200
        answer: dict = json.loads(response.read())
        return answer
    finally:
        conn.close()
