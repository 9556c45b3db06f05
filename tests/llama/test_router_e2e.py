"""RouterPanel end to end with the real llama-server, run as a user runs it.

Each test starts ``manage.py serve --models-preset FILE.ini --server-bin <llama-server>`` in a
subprocess (``tests.support.serving.run_manage``): the presets name a tiny generated GGUF
with ``model =`` and no ``server-bin``, so RouterPanel renders llama-server's command line
itself and speaks the child protocol with it (ROUTER_SPEC §4). Tests drive it over HTTP, read
``/v1/models`` and ``/models/sse``, and look at the children with psutil.

A ``ChildWatch`` thread samples the serve process's llama-server descendants for the whole test
(every 5 ms in the eviction test, 50 ms elsewhere): it gives the most that were ever alive at
once, and after the router has stopped it proves that none of them outlived it (a survivor is
SIGCONTed, SIGKILLed and reported, also when the test failed). Every wait is bounded. Each
router takes 5-25 s to start (migrations, GGUF inspection of the presets) on 2 busy cores.

Product bugs this tier found (null state payloads, the exit code of a force kill) are fixed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from routerpanel.router.gguf import estimate_memory, inspect
from tests.support.ports import free_port
from tests.support.serving import Server, run_manage

logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise

HTTP_TIMEOUT = 120.0  # per request; loads take ~0.1-1.5 s, more on a loaded CI machine
WAIT = 60.0  # for a state to show up
CHAT = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}
N_CTX = 512  # [*] ctx-size, for the memory estimate
QUARANTINE_AFTER = 3  # RouterSettings.quarantine_after default (DESIGN §4 A10)
TCP_LISTEN = "0A"  # /proc/net/tcp state column


# ---- helpers ---------------------------------------------------------------------------------


def preset_ini(models: Mapping[str, Path], extra: Mapping[str, str] | None = None) -> str:
    """An INI llama-server's router would accept too: ``model =`` and options, no server-bin."""
    extra = extra or {}
    text = "[*]\nctx-size = 512\nparallel = 1\nstop-timeout = 5\n"
    for name, path in models.items():
        text += f"\n[{name}]\nmodel = {path}\n{extra.get(name, '')}"
    return text


class ChildWatch:
    """Sample the llama-server descendants of ``root`` every ``interval`` s, in a thread."""

    def __init__(self, root: int, interval: float) -> None:
        self.root = root
        self.interval = interval
        self.maximum = 0
        self.samples = 0
        self.seen: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ChildWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def live(self) -> list[psutil.Process]:
        try:
            candidates = psutil.Process(self.root).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for proc in candidates:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                if proc.name() == "llama-server" and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            live = self.live()
            for proc in live:
                self.seen.setdefault(proc.pid, proc)
            self.maximum = max(self.maximum, len(live))
            self.samples += 1
            self._stop.wait(self.interval)

    def survivors(self) -> list[psutil.Process]:
        """Children ever seen that still run (``is_running`` also checks the create time)."""
        out = []
        for proc in self.seen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc)
        return out

    def kill_survivors(self, grace: float = 10.0) -> list[int]:
        """Wait up to ``grace`` s for every child seen to be gone; kill and return the rest."""
        deadline = time.monotonic() + grace
        while (left := self.survivors()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGCONT)  # a SIGSTOPped child of a failed test
                proc.kill()
        return [proc.pid for proc in left]


class SseLog:
    """Collect ``/models/sse`` events with the monotonic time they arrived, in a thread."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[float, str, str, dict[str, Any]]] = []
        self._url = url
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SseLog:
        # Daphne sends the response headers with the first event (or the 15 s keep-alive), so
        # the stream cannot be seen opening: give the subscription time to start (10.2).
        self._thread.start()
        time.sleep(0.5)
        return self

    def _run(self) -> None:
        stream = httpx.stream("GET", f"{self._url}/models/sse", timeout=None)
        with contextlib.suppress(httpx.HTTPError), stream as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    item = json.loads(line[6:])
                    with self._changed:
                        row = (time.monotonic(), item["model"], item["event"], item.get("data"))
                        self.events.append(row)
                        self._changed.notify_all()

    def find(self, model: str, status: str, since: float = 0.0) -> list[tuple[float, Any]]:
        return [
            (t, data or {})
            for t, m, _, data in list(self.events)
            if m == model and t >= since and (data or {}).get("status") == status
        ]

    def wait_for(self, model: str, status: str, since: float = 0.0, timeout: float = WAIT) -> Any:
        """Return ``(time, data)`` of the first event giving ``model`` this status."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not (found := self.find(model, status, since)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no SSE {status} for {model}; got {self.events!r}")
                self._changed.wait(min(remaining, 0.5))
        return found[0]


@dataclass
class Router:
    server: Server
    sse: SseLog
    watch: ChildWatch
    models: Mapping[str, Path]

    @property
    def url(self) -> str:
        return self.server.url

    def listing(self) -> dict[str, dict[str, Any]]:
        body = httpx.get(f"{self.url}/v1/models", timeout=HTTP_TIMEOUT).json()
        return {entry["id"]: entry for entry in body["data"]}

    def entry(self, name: str) -> dict[str, Any]:
        return self.listing()[name]

    def wait_state(self, name: str, *states: str, timeout: float = WAIT) -> dict[str, Any]:
        """Poll /v1/models (the router's own table; it never touches the child)."""
        deadline = time.monotonic() + timeout
        while True:
            entry = self.entry(name)
            if entry["state"] in states:
                return entry
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} is {entry['state']}, not {states}: {entry}")
            time.sleep(0.05)

    def post(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=dict(body), timeout=HTTP_TIMEOUT)

    def chat(self, name: str, **extra: Any) -> httpx.Response:
        return self.post("/v1/chat/completions", {**CHAT, "model": name, **extra})

    def tokenize(self, name: str, content: str = "Hello world") -> httpx.Response:
        return self.post("/tokenize", {"model": name, "content": content})

    def load(self, name: str) -> dict[str, Any]:
        response = self.post("/models/load", {"model": name})
        assert response.status_code == 200, response.text
        return self.wait_state(name, "loaded")

    def unload(self, name: str) -> httpx.Response:
        return self.post("/models/unload", {"model": name})

    def child(self, name: str) -> psutil.Process:
        pid = self.entry(name)["pid"]
        assert pid, f"{name} has no pid"
        return psutil.Process(pid)

    def audit(self, kind: str, model: str, timeout: float = 20.0) -> dict[str, Any]:
        """The newest audit row of ``kind`` for ``model``, read from the embedded database.

        Stop rows are written once the exit and the next memory sample are in (audit_writer).
        """
        db = self.server.data_dir / "routerpanel.sqlite3"
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                conn.row_factory = sqlite3.Row
                row = conn.execute(
                    "SELECT * FROM models_app_auditevent WHERE kind = ? AND model = ?"
                    " ORDER BY id DESC LIMIT 1",
                    (kind, model),
                ).fetchone()
            if row is not None:
                return dict(row)
            if time.monotonic() > deadline:
                raise AssertionError(f"no {kind} audit row for {model}")
            time.sleep(0.2)


@contextlib.contextmanager
def serve(
    server_bin: Path,
    root: Path,
    models: Mapping[str, Path],
    *,
    models_max: int,
    extra: Mapping[str, str] | None = None,
    watch_interval: float = 0.05,
) -> Iterator[Router]:
    """Run RouterPanel on ``models``; on exit prove no llama-server outlived it.

    The watch samples every ``watch_interval`` s: 5 ms where the count of live children is the
    point (eviction), 50 ms elsewhere, where it only has to see every child for the orphan check.
    """
    root.mkdir(parents=True, exist_ok=True)
    ini = root / "models.ini"
    ini.write_text(preset_ini(models, extra))
    args = ["serve", "--models-preset", str(ini), "--models-max", str(models_max)]
    args += ["--server-bin", str(server_bin)]
    watch: ChildWatch | None = None
    orphans: list[int] = []
    try:
        with run_manage(args, root / "data", port=free_port(), timeout=120) as server:
            watch = ChildWatch(server.process.pid, watch_interval).start()
            yield Router(server, SseLog(server.url).start(), watch, models)
    finally:  # also when the test failed: no child may survive it
        if watch is not None:
            watch.stop()
            orphans = watch.kill_survivors()
    assert not orphans, f"llama-server children outlived the router: {orphans}"


def port_of(proc: psutil.Process) -> int:
    argv = proc.cmdline()
    return int(argv[argv.index("--port") + 1])


def tcp_sockets(port: int) -> list[str]:
    """Rows of /proc/net/tcp{,6} with ``port`` at either end, listening sockets left out.

    A connection leaves a row for a minute after it closed (TIME_WAIT), so a /health poll
    during the load would still show here.
    """
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                ends = [int(addr.rsplit(":", 1)[1], 16) for addr in fields[1:3]]
                if port in ends and fields[3] != TCP_LISTEN:
                    rows.append(line.strip())
    return rows


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ---- one router for the serving tests ------------------------------------------------------


@pytest.fixture(scope="module")
def shared(
    llama_server_bin: Path, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Router]:
    """Three models and three slots: nothing is evicted, tests share the children."""
    root = tmp_path_factory.mktemp("shared-router")
    logs = {name: f"log-file = {root / f'{name}-child.log'}\n" for name in tiny_models}
    with serve(llama_server_bin, root, tiny_models, models_max=3, extra=logs) as router:
        yield router


@pytest.mark.http_server
class TestServing:
    def test_a_chat_completion_loads_the_model_and_answers(self, shared: Router) -> None:
        response = shared.chat("tiny")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == "tiny"
        assert body["usage"]["completion_tokens"] > 0
        assert body["choices"][0]["message"]["content"]
        assert shared.entry("tiny")["status"]["value"] == "loaded"

    def test_a_streamed_chat_arrives_as_chunks_ending_with_done(self, shared: Router) -> None:
        url = f"{shared.url}/v1/chat/completions"
        body = {**CHAT, "model": "tiny", "stream": True}
        with httpx.stream("POST", url, json=body, timeout=HTTP_TIMEOUT) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            data = [x[6:] for x in response.iter_lines() if x.startswith("data: ")]
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
        assert len([d for d in deltas if d]) >= 2, chunks
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    def test_tokenize_is_answered_by_the_child_with_its_vocab(self, shared: Router) -> None:
        response = shared.tokenize("small")
        assert response.status_code == 200, response.text
        assert response.json()["tokens"] == [15043, 3186]  # the SPM vocab's " Hello", " world"

    def test_v1_models_merges_the_childs_metadata_after_the_load(self, shared: Router) -> None:
        before = shared.entry("medium")
        assert before["state"] == "unloaded" and "meta" not in before
        assert shared.tokenize("medium").status_code == 200
        entry = shared.wait_state("medium", "loaded")
        facts = inspect(shared.models["medium"])
        meta = entry["meta"]
        assert meta["n_params"] == facts.parameter_count
        assert meta["n_ctx_train"] == facts.context_length == 512
        assert meta["n_vocab"] == facts.vocab_size == 32000
        assert meta["n_embd"] == facts.embedding_length == 768
        assert meta["n_ctx"] == N_CTX
        assert meta["ftype"] == "F16"
        assert entry["pid"] == shared.child("medium").pid
        assert entry["architecture"]["input_modalities"] == ["text"]

    def test_the_sse_of_a_load_carries_progress_and_the_childs_info(self, shared: Router) -> None:
        assert shared.tokenize("tiny").status_code == 200
        _, loaded = shared.sse.wait_for("tiny", "loaded")  # the first load in this router
        assert loaded["info"]["meta"]["n_vocab"] == 32000
        progress = [d["progress"] for _, d in shared.sse.find("tiny", "loading") if "progress" in d]
        assert progress and progress[-1]["value"] == 1.0

    def test_readiness_comes_from_the_child_protocol_without_health_polls(
        self, shared: Router
    ) -> None:
        if shared.entry("small")["state"] != "unloaded":  # a fresh child on a fresh port
            assert shared.unload("small").status_code == 200
            shared.wait_state("small", "unloaded")
        entry = shared.load("small")  # POST /models/load: nothing is proxied to the child
        child = psutil.Process(entry["pid"])
        port = port_of(child)
        assert "LLAMA_SERVER_ROUTER_PORT" in child.environ()  # S3: child protocol mode
        assert tcp_sockets(port) == [], "the router connected to the child while it loaded"
        # The check sees connections: one GET /health of our own leaves a TIME_WAIT row.
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        assert tcp_sockets(port), "a connection to the child left no /proc/net/tcp row"

    @pytest.mark.parametrize("size", ["tiny", "small", "medium"])
    def test_the_gguf_estimate_is_compared_with_the_measured_rss(
        self, shared: Router, size: str
    ) -> None:
        assert shared.chat(size).status_code == 200  # loaded, and a batch has run
        rss = shared.child(size).memory_info().rss
        facts = inspect(shared.models[size])
        estimate = estimate_memory(facts, N_CTX, n_parallel=1)
        ratio = estimate.total / rss
        sampled = shared.entry(size)["memory"]
        sampled_mib = "-" if sampled is None else f"{sampled / 2**20:.1f}"
        print(
            f"\n{size}: file {shared.models[size].stat().st_size / 2**20:.1f} MiB,"
            f" params {facts.parameter_count}, estimate {estimate.total / 2**20:.1f} MiB"
            f" (weights {estimate.weights / 2**20:.1f}, kv {estimate.kv_cache / 2**20:.2f},"
            f" compute {estimate.compute / 2**20:.1f}, runtime {estimate.runtime / 2**20:.0f}),"
            f" rss {rss / 2**20:.1f} MiB (router's sample"
            f" {sampled_mib} MiB): estimate/rss {ratio:.2f}"
        )
        assert 0.2 < ratio < 5

    def test_an_unload_sends_the_exit_command_and_counts_as_a_clean_exit(
        self, shared: Router
    ) -> None:
        assert shared.tokenize("tiny").status_code == 200
        pid = shared.entry("tiny")["pid"]
        asked = time.monotonic()
        assert shared.unload("tiny").json() == {"success": True}
        _, data = shared.sse.wait_for("tiny", "unloaded", since=asked)
        assert data == {"status": "unloaded", "exit_code": 0}
        entry = shared.wait_state("tiny", "unloaded")
        assert "failed" not in entry["status"] and "exit_code" not in entry["status"]
        assert entry["pid"] is None and not _alive(pid)
        row = shared.audit("unload", "tiny")
        assert (row["exit_code"], row["force_killed"]) == (0, 0), row
        log = (shared.server.data_dir.parent / "tiny-child.log").read_text(errors="replace")
        assert "exit command received, exiting..." in log  # llama-server's own words
        assert "EOF on stdin detected" not in log


# ---- one router per test ---------------------------------------------------------------------


@pytest.fixture
def router(
    llama_server_bin: Path, tiny_models: dict[str, Path], tmp_path: Path
) -> Callable[..., contextlib.AbstractContextManager[Router]]:
    def start(
        models: Mapping[str, Path] | None = None,
        models_max: int = 2,
        extra: Mapping[str, str] | None = None,
        watch_interval: float = 0.05,
    ) -> contextlib.AbstractContextManager[Router]:
        chosen = tiny_models if models is None else models
        return serve(
            llama_server_bin, tmp_path, chosen, models_max=models_max, extra=extra,
            watch_interval=watch_interval,
        )  # fmt: skip

    return start


def test_eviction_keeps_at_most_two_llama_servers_alive(router: Callable[..., Any]) -> None:
    with router(models_max=2, watch_interval=0.005) as r:
        order = ["tiny", "small", "medium", "tiny", "small", "medium", "small"]
        for name in order:
            assert r.tokenize(name).status_code == 200, name
        results: dict[str, int] = {}
        threads = [
            threading.Thread(target=lambda n=name: results.__setitem__(n, r.chat(n).status_code))
            for name in ("tiny", "medium", "small")
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HTTP_TIMEOUT)
        assert results == {"tiny": 200, "medium": 200, "small": 200}
        running = [n for n, e in r.listing().items() if e["state"] in ("loading", "loaded")]
        assert len(running) <= 2
        evicted = r.sse.find("tiny", "unloaded") + r.sse.find("small", "unloaded")
        evicted += r.sse.find("medium", "unloaded")
        assert len(evicted) >= 4
        assert all(data["exit_code"] == 0 for _, data in evicted)  # graceful evictions
        print(f"\nsampled {r.watch.samples} times; at most {r.watch.maximum} llama-server alive")
        assert r.watch.maximum == 2  # the cap was reached, and never passed (A6)
        assert len(r.watch.seen) >= 7  # a new process per load
    # The router's own order of events, exact where sampling is not: a spawn (model_status
    # loading) only ever follows the victim's reaped exit (status_change unloaded).
    assert max_running(r.sse.events) == 2


def max_running(events: list[tuple[float, str, str, Any]]) -> int:
    running: set[str] = set()
    peak = 0
    for _, model, event, data in events:
        status = (data or {}).get("status")
        if event == "model_status" and status == "loading":
            running.add(model)
        elif event == "status_change" and status == "unloaded":
            running.discard(model)
        peak = max(peak, len(running))
    return peak


def test_a_stopped_child_is_force_killed_at_its_stop_timeout(router: Callable[..., Any]) -> None:
    with router(models_max=2, extra={"tiny": "stop-timeout = 2\n"}) as r:
        child = psutil.Process(r.load("tiny")["pid"])
        child.suspend()  # SIGSTOP: it cannot read the exit command
        try:
            asked = time.monotonic()
            assert r.unload("tiny").json() == {"success": True}
            at, data = r.sse.wait_for("tiny", "unloaded", since=asked, timeout=30)
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.resume()
        took = at - asked
        print(f"\nunload of a SIGSTOPped child: unloaded after {took:.2f} s (stop-timeout 2 s)")
        assert 1.9 <= took <= 6.0
        assert not _alive(child.pid)
        entry = r.wait_state("tiny", "unloaded")
        assert entry["pid"] is None
        row = r.audit("force_kill", "tiny")
        assert row["force_killed"] == 1 and row["exit_code"] is None, row
        assert json.loads(row["details"])["signal"] == signal.SIGKILL
        assert 1.9 <= row["stop_seconds"] <= 6.0
        assert data["status"] == "unloaded"


def test_the_sse_exit_code_of_a_force_killed_child_is_not_0(router: Callable[..., Any]) -> None:
    with router(models_max=2, extra={"tiny": "stop-timeout = 1\n"}) as r:
        child = psutil.Process(r.load("tiny")["pid"])
        child.suspend()
        try:
            asked = time.monotonic()
            r.unload("tiny")
            _, data = r.sse.wait_for("tiny", "unloaded", since=asked, timeout=30)
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.resume()
        assert data == {"status": "unloaded", "exit_code": 1}


def test_a_missing_model_file_is_refused_before_any_child_starts(
    router: Callable[..., Any], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-model.gguf"
    with router({"tiny": tiny_models["tiny"], "gone": missing}, models_max=1) as r:
        assert r.chat("tiny").status_code == 200
        spawned = len(r.watch.seen)
        response = r.chat("gone")
        assert response.status_code == 503, response.text
        assert response.json()["error"]["message"] == (
            f"model file not found: {missing} (preset gone)"
        )
        assert len(r.watch.seen) == spawned  # no child, and tiny was not evicted for it
        assert r.entry("tiny")["status"]["value"] == "loaded"


def test_a_model_file_that_does_not_load_fails_then_is_quarantined(
    router: Callable[..., Any], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\xff" * 64)  # there and readable: only llama-server can tell
    models = {"tiny": tiny_models["tiny"], "bogus": corrupt}
    with router(models, models_max=2) as r:
        for attempt in range(1, QUARANTINE_AFTER + 1):
            response = r.chat("bogus")
            assert response.status_code == 500, response.text
            assert response.json()["error"]["message"] == "model name=bogus failed to load"
            entry = r.entry("bogus")
            expected = "quarantined" if attempt == QUARANTINE_AFTER else "failed"
            assert entry["state"] == expected, (attempt, entry)
            assert entry["status"]["value"] == "unloaded"
            assert (entry["status"]["failed"], entry["status"]["exit_code"]) == (True, 1)
        spawned = len(r.watch.seen)
        started = time.monotonic()
        response = r.chat("bogus")
        took = time.monotonic() - started
        assert response.status_code == 500
        error = response.json()["error"]
        assert error["type"] == "server_error"
        assert error["message"].startswith("model name=bogus failed to load (quarantined after 3")
        assert took < 2.0, f"a quarantined model should fail fast, took {took:.2f} s"
        assert len(r.watch.seen) == spawned  # no new child
        loads = [e for e in r.sse.events if e[1] == "bogus" and e[2] == "model_status"]
        assert len(loads) == QUARANTINE_AFTER
        assert r.chat("tiny").status_code == 200  # the others are unaffected


def test_sleep_idle_seconds_reaches_the_child_and_it_sleeps(
    router: Callable[..., Any], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    log = tmp_path / "small-child.log"
    extra = {"small": f"sleep-idle-seconds = 1\nlog-file = {log}\n"}
    with router({"small": tiny_models["small"]}, models_max=2, extra=extra) as r:
        assert r.tokenize("small").status_code == 200
        argv = r.child("small").cmdline()
        assert argv[argv.index("--sleep-idle-seconds") + 1] == "1"
        deadline = time.monotonic() + WAIT
        while "entering sleeping state" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the child never went to sleep"
            time.sleep(0.1)


def test_a_sleeping_child_shows_sleeping_and_a_request_wakes_it(
    router: Callable[..., Any], tiny_models: dict[str, Path]
) -> None:
    extra = {"small": "sleep-idle-seconds = 1\n"}
    with router({"small": tiny_models["small"]}, models_max=2, extra=extra) as r:
        loaded = time.monotonic()
        assert r.tokenize("small").status_code == 200
        r.sse.wait_for("small", "sleeping", since=loaded, timeout=8)
        assert r.entry("small")["status"]["value"] == "sleeping"
        woken = time.monotonic()
        assert r.tokenize("small").status_code == 200
        r.sse.wait_for("small", "loaded", since=woken, timeout=15)
        assert r.entry("small")["state"] in ("loaded", "sleeping")


def test_children_exit_when_the_router_is_killed(router: Callable[..., Any]) -> None:
    with router(models_max=2) as r:
        for name in ("tiny", "small"):
            assert r.tokenize(name).status_code == 200
        pids = [r.entry(name)["pid"] for name in ("tiny", "small")]
        assert all(pids) and {p.pid for p in r.watch.live()} == set(pids)
        killed = time.monotonic()
        os.kill(r.server.process.pid, signal.SIGKILL)
        r.server.process.wait(10)
        left = wait_gone(pids, timeout=10)
        print(f"\nrouter SIGKILLed: children gone after {time.monotonic() - killed:.2f} s")
        assert left == [], f"llama-server children still running: {left}"
