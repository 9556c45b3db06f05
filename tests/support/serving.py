"""Run RouterPanel as a user does — ``manage.py serve`` / ``runrouter`` subprocesses — for tests.

Shared by the process, services and llama tiers. Every process gets its own data dir and a free
port, is stopped with SIGTERM (then SIGKILL) at teardown, and leaves no child behind.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
SIMSERVER = f"{sys.executable} -m routerpanel.router.simserver"


B11434_HELP = ROOT / "tests/fixtures/llama-server-b11434-help.txt"


def llama_server_stand_in(directory: Path) -> Path:
    """Write ``directory/llama-server``: it prints b11434's ``--help`` (recorded from the real
    build) and refuses anything else. With it first on PATH, preset keys are checked against
    b11434 whatever this machine has installed (another llama-server, or none)."""
    script = directory / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        f'for arg in "$@"; do [ "$arg" = --help ] && exec cat "{B11434_HELP}"; done\n'
        'echo "a stand-in for llama-server b11434: only --help works" >&2; exit 1\n'
    )
    script.chmod(0o755)
    return script


def sim_preset(
    name: str, marker: str, *, load_ms: int = 50, token_ms: int = 0, extra: str = ""
) -> str:
    """An INI section running the simulated llama-server, tagged with ``marker`` in its argv
    (``--sim-tag``) so that a test can count exactly its own children."""
    return (
        f"[{name}]\nserver-bin = {SIMSERVER}\nsim-load-ms = {load_ms}\n"
        f"sim-token-ms = {token_ms}\nstop-timeout = 3\nsim-tag = {marker}\n{extra}"
    )


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log: Path

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)  # type: ignore[arg-type]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def run_manage(
    args: Sequence[str],
    data_dir: Path,
    *,
    env: dict[str, str] | None = None,
    port: int | None = None,
    ready: str = "health",
    timeout: float = 90,
    log_dir: Path | None = None,
) -> Iterator[Server]:
    """Run ``manage.py <args>`` until the block ends; ``ready`` is "health" or a log text.
    Its output goes to a file in ``log_dir`` (default: the data dir)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir or data_dir) / f"{args[0]}-{time.monotonic_ns()}.log"
    full_env = {**os.environ, "ROUTERPANEL_DATA_DIR": str(data_dir), **(env or {})}
    full_env.setdefault("ROUTERPANEL_ADMIN_PASSWORD", "test-only-password")
    command = [sys.executable, "manage.py", *args]
    url = ""
    if port is not None:
        command += ["--port", str(port)]
        url = f"http://127.0.0.1:{port}"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=sink, stderr=subprocess.STDOUT
        )
    server = Server(process, url, data_dir, log)
    try:
        if ready == "health":
            wait_until(lambda: _healthy(url) or process.poll() is not None, timeout, "health")
        else:
            wait_until(
                lambda: ready in server.output() or process.poll() is not None, timeout, ready
            )
        if process.poll() is not None:
            raise AssertionError(f"{args[0]} exited early:\n{server.output()}")
        yield server
    finally:
        stop(process)


def manage_beside(server: Server, *args: str) -> str:
    """Run ``manage.py ARGS`` on ``server``'s data dir while it runs; its stdout (it must
    succeed)."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "ROUTERPANEL_DATA_DIR": str(server.data_dir)},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def simserver_processes(marker: str, root: int | None = None) -> list[psutil.Process]:
    """Live simulated servers started from presets tagged with ``marker``; only descendants of
    ``root`` when given (much cheaper than scanning every process)."""
    return [proc for proc, _ in _simservers(marker, root)]


def _simservers(marker: str, root: int | None) -> list[tuple[psutil.Process, list[str]]]:
    if root is None:
        candidates = list(psutil.process_iter())
    else:
        try:
            candidates = psutil.Process(root).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
    found = []
    for proc in candidates:
        try:
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if "routerpanel.router.simserver" in cmdline and marker in cmdline:
            found.append((proc, cmdline))
    return found


def alias_of(cmdline: list[str]) -> str | None:
    """The model a child serves: the router passes its name as ``--alias``."""
    for flag, value in itertools.pairwise(cmdline):
        if flag == "--alias":
            return value
    return None


class LiveChildSampler:
    """Count this test's live children every few milliseconds, in a thread; keep the maximum
    and the models (``--alias``) of every child it saw.

    Read the result with ``saw()``: a sampler that barely ran, or a marker that matches no
    child, would otherwise make "never more than N children" pass on nothing.
    """

    MIN_SAMPLES = 20

    def __init__(self, marker: str, root: int | None = None, interval: float = 0.005) -> None:
        import threading

        self.marker = marker
        self.root = root
        self.interval = interval
        self.maximum = 0
        self.samples = 0
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LiveChildSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def sample_enough(self, timeout: float = 30) -> None:
        """Wait until it has taken enough samples for ``saw`` (a quick test ends sooner)."""
        wait_until(lambda: self.samples >= self.MIN_SAMPLES, timeout, "enough child samples")

    def saw(self) -> tuple[int, set[str]]:
        """Return (the peak of live children, the models seen); fail unless it really sampled."""
        assert self.samples >= self.MIN_SAMPLES, f"the sampler took only {self.samples} samples"
        return self.maximum, set(self.seen)

    def _run(self) -> None:
        while not self._stop.is_set():
            live = _simservers(self.marker, self.root)
            self.maximum = max(self.maximum, len(live))
            self.seen.update(name for _, cmdline in live if (name := alias_of(cmdline)))
            self.samples += 1
            self._stop.wait(self.interval)


def in_threads(target: Callable[[str], None], items: Iterable[str], timeout: float = 120) -> None:
    """Call ``target(item)`` for every item at once, one thread each; wait for them all."""
    import threading

    threads = [threading.Thread(target=target, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)


class StreamReader:
    """A streamed POST read by a thread: its SSE lines, a flag once ``started_after`` lines came,
    and when it ended (a test can then break the child mid-stream and see what the client got).
    Use as a context manager: ``__exit__`` waits for the stream to end (bounded)."""

    def __init__(self, url: str, body: dict[str, Any], started_after: int = 5) -> None:
        import threading

        self.url, self.body, self.started_after = url, body, started_after
        self.lines: list[str] = []
        self.started = threading.Event()
        self.ended_at: float | None = None
        self.status: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StreamReader:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.join(30)
        else:  # the body's own failure is the one to report: wait, but do not assert over it
            self._thread.join(30)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"

    def wait_started(self, timeout: float = 30) -> None:
        assert self.started.wait(timeout), f"the stream never started (status {self.status})"

    def errors(self) -> list[dict[str, Any]]:
        """The SSE error events it got."""
        return [json.loads(x[6:]) for x in self.lines if x.startswith('data: {"error"')]

    def _run(self) -> None:
        with httpx.stream("POST", self.url, json=self.body, timeout=60) as response:
            self.status = response.status_code
            for line in response.iter_lines():
                self.lines.append(line)
                if len(self.lines) > self.started_after:
                    self.started.set()
        self.ended_at = time.monotonic()
