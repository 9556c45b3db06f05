"""One real llama-server process for the llama tier: its port, its stdout lines, its stderr.

``LlamaServer`` runs in its own session, so that ``stop()`` kills the whole process group, and
every wait is bounded. The ``llama_servers`` fixture (tests/llama/conftest.py) starts them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import pytest

CHILD_PREFIX = "cmd_child_to_router:state:"
LOAD_TIMEOUT = 180.0  # seconds; loads take under 1 s here, but the machine may be busy


class LlamaServer:
    """One llama-server process: its port, its stdout lines (read by a thread), its stderr file."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], stderr_path: Path, port: int):
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,  # its own process group, killed as a whole at teardown
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._changed:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_healthy(self, timeout: float = LOAD_TIMEOUT) -> float:
        """Poll /health until 200 and return the seconds since spawn; fail on exit or timeout."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pytest.fail(f"llama-server exited with {self.proc.returncode}:\n{self.tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return time.monotonic() - self.started
                time.sleep(0.1)
        pytest.fail(f"llama-server not healthy after {timeout} s:\n{self.tail()}")

    def wait_for_line(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """Return the first stdout line matching ``predicate``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = next((line for line in self.lines if predicate(line)), None)
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._reader.is_alive():
                    pytest.fail(f"no such stdout line; got {self.lines!r}\n{self.tail()}")
                self._changed.wait(min(remaining, 1.0))

    def write_stdin(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def wait_exit(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"llama-server still running after {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        self._stderr.flush()
        lines = self.stderr_path.read_text("utf-8", "replace").splitlines()
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        """Close stdin, SIGTERM the process group, SIGKILL it after 10 s, and reap."""
        # In child mode (LLAMA_SERVER_ROUTER_PORT set) a SIGTERMed llama-server cleans up and then
        # waits for EOF on stdin before it exits; closing stdin first lets it go at once.
        with contextlib.suppress(OSError):
            self.close_stdin()
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(10)
        self._reader.join(5)  # EOF once the process group is gone
        if self.proc.stdout is not None and not self._reader.is_alive():
            self.proc.stdout.close()
        self._stderr.close()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)


StartServer = Callable[..., LlamaServer]
