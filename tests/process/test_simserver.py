"""The simulated llama-server, run as a real subprocess and driven over HTTP and its stdio.

Every wait has a deadline (the CI box has two busy cores, so they are generous) and no test
asserts on durations. Each process runs in its own session and the fixture SIGKILLs its group,
so nothing outlives a test even when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from routerpanel.router.simserver import (
    EXIT_COMMAND,
    STATE_PREFIX,
    SimOptions,
    UsageError,
    parse_args,
)

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0  # generous: the machine is small and busy
HTTP = httpx.Timeout(30.0)
MIB = 1 << 20
MODEL_KEYS = ["id", "aliases", "tags", "object", "architecture", "created", "owned_by", "meta"]


class Sim:
    """One simserver subprocess: stderr goes to a file, stdout state lines to a queue."""

    def __init__(self, args: tuple[str, ...], log_path: Path, child: bool) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("LLAMA_SERVER_ROUTER_PORT", "LLAMA_API_KEY")
        }
        if child:
            env["LLAMA_SERVER_ROUTER_PORT"] = "8080"
        self.log_path = log_path
        with log_path.open("wb") as log_file:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "routerpanel.router.simserver", "--port", "0", *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if child else subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        if child:
            threading.Thread(target=self._read_stdout, daemon=True).start()
        self._port: int | None = None

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.decode())
        self.lines.put(None)

    @property
    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def port(self) -> int:
        """Wait for the "listening on" log line and return the port it names."""
        if self._port is None:
            match = wait_until(
                lambda: re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.stderr), self
            )
            self._port = int(match.group(1))
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=HTTP)

    def wait_ready(self) -> None:
        """Poll /health until it answers 200."""
        with self.client() as client:
            wait_until(lambda: client.get("/health").status_code == 200, self)

    def next_line(self) -> str:
        line = self.lines.get(timeout=DEADLINE_S)
        assert line is not None, f"stdout closed early; stderr:\n{self.stderr}"
        return line

    def next_state(self) -> dict[str, Any]:
        line = self.next_line()
        assert line.startswith(STATE_PREFIX) and line.endswith("\n"), line
        state: dict[str, Any] = json.loads(line.removeprefix(STATE_PREFIX))
        return state

    def states_until(self, name: str) -> list[dict[str, Any]]:
        """Read state lines up to and including the first one named ``name``."""
        states = [self.next_state()]
        while states[-1]["state"] != name:
            states.append(self.next_state())
        return states

    def send(self, text: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def wait_exit(self) -> int:
        return self.proc.wait(timeout=DEADLINE_S)

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE_S)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def wait_until(predicate: Callable[[], Any], sim: Sim) -> Any:
    """Return the first truthy value of ``predicate``; fail at the deadline or if sim died."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except httpx.TransportError:
            value = None
        if value:
            return value
        if sim.proc.poll() is not None:
            pytest.fail(f"simserver exited with {sim.proc.returncode}; stderr:\n{sim.stderr}")
        time.sleep(0.02)
    pytest.fail(f"timed out; stderr:\n{sim.stderr}")


StartSim = Callable[..., Sim]


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[StartSim]:
    """Start simservers (``child=True`` sets LLAMA_SERVER_ROUTER_PORT); kill them all after."""
    sims: list[Sim] = []

    def start(*args: str, child: bool = False) -> Sim:
        sim = Sim(args, tmp_path / f"sim-{len(sims)}.log", child)
        sims.append(sim)
        return sim

    yield start
    for sim in sims:
        sim.kill()


def sse_events(response: httpx.Response) -> list[Any]:
    """Return the ``data:`` payloads of a stream, JSON-decoded except ``[DONE]``."""
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def simulated_text(model_id: str, n_tokens: int) -> str:
    words = f"simulated response from {model_id}".split()
    return " ".join(words[i % len(words)] for i in range(n_tokens))


CHAT = {"messages": [{"role": "user", "content": "Hello"}]}


class TestCommandLine:
    def test_it_ignores_unknown_flags_and_takes_their_values(self) -> None:
        opts = parse_args(
            ["--n-gpu-layers", "99", "--jinja", "--log-colors", "off", "-ngl", "5", "-m", "x.gguf"]
        )
        assert opts.ignored == ("--n-gpu-layers 99", "--jinja", "--log-colors off", "-ngl 5")
        assert opts.model_id == "x.gguf"

    def test_it_names_the_model_after_its_first_sorted_alias(self) -> None:
        opts = parse_args(["-m", "/m/a.gguf", "--alias", "zeta, alpha", "-a", "beta"])
        assert opts.model_id == "alpha"
        assert opts.aliases == ("alpha", "beta", "zeta")

    def test_it_refuses_a_bad_value_for_a_known_flag(self) -> None:
        with pytest.raises(UsageError):
            parse_args(["--port", "eighty"])
        with pytest.raises(UsageError):
            parse_args(["--sleep-idle-seconds", "0"])
        with pytest.raises(UsageError, match="failed to open file"):
            parse_args(["--api-key-file", "/nowhere/keys"])

    def test_it_defaults_like_llama_server(self) -> None:
        assert parse_args([], environ={}) == SimOptions()

    def test_it_prints_help_and_exits_0(self) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "routerpanel.router.simserver", "--help"],
            cwd=REPO,
            capture_output=True,
            timeout=DEADLINE_S,
        )
        assert result.returncode == 0
        assert b"--sim-crash-after" in result.stdout


class TestStartup:
    def test_it_answers_503_while_loading_then_200(self, start_sim: StartSim) -> None:
        sim = start_sim("--sim-load-ms", "5000")
        with sim.client() as client:
            loading = client.get("/health")
            assert loading.status_code == 503
            assert loading.json() == {
                "error": {"message": "Loading model", "type": "unavailable_error", "code": 503}
            }
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 503
            wait_until(lambda: client.get("/health").status_code == 200, sim)
            assert client.get("/health").json() == {"status": "ok"}

    def test_it_ignores_unknown_llama_server_flags_with_one_warning_each(
        self, start_sim: StartSim
    ) -> None:
        unknown = ("--n-gpu-layers", "99", "--jinja", "--log-colors", "off", "-ngl", "7")
        sim = start_sim("--ctx-size", "4096", *unknown)
        sim.wait_ready()
        warnings = [line for line in sim.stderr.splitlines() if "unknown llama-server flag" in line]
        assert [w.split("flag: ")[1] for w in warnings] == [
            "--n-gpu-layers 99",
            "--jinja",
            "--log-colors off",
            "-ngl 7",
        ]

    def test_it_exits_1_with_a_clear_error_when_the_load_fails(self, start_sim: StartSim) -> None:
        sim = start_sim("--sim-fail-load", "-m", "/models/broken.gguf", child=True)
        assert sim.next_state()["payload"]["value"] == 0.0
        assert sim.wait_exit() == 1
        assert "failed to load model, '/models/broken.gguf'" in sim.stderr
        assert sim.lines.get(timeout=DEADLINE_S) is None  # no ready line

    def test_it_exits_1_when_its_port_is_taken(self) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = str(taken.getsockname()[1])
            result = subprocess.run(
                [sys.executable, "-m", "routerpanel.router.simserver", "--port", port],
                cwd=REPO,
                capture_output=True,
                timeout=DEADLINE_S,
            )
        assert result.returncode == 1
        assert b"couldn't bind HTTP server socket" in result.stderr


class TestChildProtocol:
    def test_it_reports_loading_then_ready_with_the_model_object(self, start_sim: StartSim) -> None:
        sim = start_sim("--sim-load-ms", "500", "-a", "sim-model", "--tags", "demo", child=True)
        states = sim.states_until("ready")
        loading, ready = states[:-1], states[-1]
        assert {s["state"] for s in loading} == {"loading"}
        assert loading[0]["payload"] == {
            "stages": ["text_model"],
            "current": "text_model",
            "value": 0.0,
        }
        assert loading[-1]["payload"]["value"] == 1.0
        assert list(ready["payload"]) == MODEL_KEYS
        assert ready["payload"]["id"] == "sim-model"
        assert ready["payload"]["aliases"] == ["sim-model"]
        assert ready["payload"]["tags"] == ["demo"]
        with sim.client() as client:
            assert client.get("/health").status_code == 200

    def test_it_reads_its_keys_from_a_key_file_as_llama_server_does(
        self, start_sim: StartSim, tmp_path: Path
    ) -> None:
        keys = tmp_path / "keys"
        keys.write_text("# comment\n\nfile-key-1\nfile-key-2\n")
        sim = start_sim("--api-key-file", str(keys))
        sim.wait_ready()
        with sim.client() as client:
            refused = client.post("/tokenize", json={"content": "x"})
            assert refused.status_code == 401
            assert refused.json()["error"] == {
                "message": "Invalid API Key",
                "type": "authentication_error",
                "code": 401,
            }
            for key in ("file-key-1", "file-key-2"):
                bearer = {"Authorization": f"Bearer {key}"}
                assert client.post("/tokenize", json={"content": "x"}, headers=bearer).is_success
            comment = {"Authorization": "Bearer # comment"}
            assert client.get("/slots", headers=comment).status_code == 401

    def test_it_writes_only_protocol_lines_to_stdout_and_logs_to_stderr(
        self, start_sim: StartSim
    ) -> None:
        sim = start_sim("--jinja", child=True)
        sim.states_until("ready")
        sim.send(EXIT_COMMAND + b"\n")
        assert sim.wait_exit() == 0
        assert sim.lines.get(timeout=DEADLINE_S) is None  # nothing but state lines came before
        assert "listening on" in sim.stderr
        assert "unknown llama-server flag: --jinja" in sim.stderr

    def test_it_exits_0_on_the_exit_command(self, start_sim: StartSim) -> None:
        sim = start_sim(child=True)
        sim.states_until("ready")
        sim.send(b"something else\n" + EXIT_COMMAND + b"\n")
        assert sim.wait_exit() == 0

    def test_it_exits_1_at_once_on_stdin_eof(self, start_sim: StartSim) -> None:
        sim = start_sim(child=True)
        sim.states_until("ready")
        assert sim.proc.stdin is not None
        sim.proc.stdin.close()
        assert sim.wait_exit() == 1

    def test_it_ignores_stdin_outside_child_mode(self, start_sim: StartSim) -> None:
        sim = start_sim()
        sim.wait_ready()
        assert sim.proc.stdin is not None
        sim.proc.stdin.close()
        with sim.client() as client:
            assert client.get("/health").status_code == 200
        assert sim.proc.poll() is None


class TestSleeping:
    def test_it_sleeps_when_idle_and_wakes_on_a_completion(self, start_sim: StartSim) -> None:
        sim = start_sim(
            "--sleep-idle-seconds", "1", "--sim-rss-mb", "64", "--metrics", "--sim-load-ms", "300",
            child=True,
        )  # fmt: skip
        sim.states_until("ready")
        awake_rss = sim.rss()
        assert sim.next_state() == {"state": "sleeping", "payload": {}}
        wait_until(lambda: sim.rss() < awake_rss - 48 * MIB, sim)
        with sim.client() as client:
            for path in ("/health", "/props", "/v1/models", "/models", "/metrics"):
                assert client.get(path).status_code == 200, path
            assert client.get("/props").json()["is_sleeping"] is True
            assert sim.lines.empty()  # read-only routes did not wake it

            answer = client.post("/v1/chat/completions", json=CHAT)
            assert answer.status_code == 200
            wake = sim.states_until("ready")
            assert wake[0]["state"] == "loading" and wake[0]["payload"]["value"] == 0.0
            assert wake[-2]["payload"]["value"] == 1.0
            assert wake[-1] == {"state": "ready", "payload": {}}
            assert client.get("/props").json()["is_sleeping"] is False
            assert sim.rss() >= 64 * MIB

    def test_it_exits_0_on_the_exit_command_while_sleeping(self, start_sim: StartSim) -> None:
        sim = start_sim("--sleep-idle-seconds", "1", child=True)
        sim.states_until("sleeping")
        sim.send(EXIT_COMMAND + b"\n")
        assert sim.wait_exit() == 0


class TestMisbehaviour:
    def test_it_crashes_after_serving_n_completions(self, start_sim: StartSim) -> None:
        sim = start_sim("--sim-crash-after", "2")
        sim.wait_ready()
        with sim.client() as client:
            assert client.post("/completion", json={"prompt": "a"}).status_code == 200
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert sim.wait_exit() not in (0, None)
        assert "simulated crash" in sim.stderr

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
    def test_it_exits_0_on_a_termination_signal(self, start_sim: StartSim, signum: int) -> None:
        sim = start_sim()
        sim.wait_ready()
        sim.proc.send_signal(signum)
        assert sim.wait_exit() == 0

    def test_it_survives_sigterm_when_told_to_ignore_it_and_dies_on_sigkill(
        self, start_sim: StartSim
    ) -> None:
        sim = start_sim("--sim-ignore-sigterm")
        sim.wait_ready()
        sim.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "ignoring it" in sim.stderr, sim)
        with sim.client() as client:
            assert client.get("/health").status_code == 200
        assert sim.proc.poll() is None
        sim.proc.send_signal(signal.SIGKILL)
        assert sim.wait_exit() == -signal.SIGKILL

    def test_it_holds_the_requested_resident_memory(self, start_sim: StartSim) -> None:
        sim = start_sim("--sim-rss-mb", "96")
        sim.wait_ready()
        assert sim.rss() >= 96 * MIB


class TestCompletions:
    def test_it_streams_chat_completions_as_sse_ending_in_done(self, start_sim: StartSim) -> None:
        sim = start_sim("-a", "sim-model", "--sim-tokens", "5")
        sim.wait_ready()
        body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        with sim.client() as client, client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["transfer-encoding"] == "chunked"
            events = sse_events(r)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        assert text == simulated_text("sim-model", 5)
        finish, usage = chunks[-2], chunks[-1]
        assert finish["choices"][0]["finish_reason"] == "stop"
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
        assert usage["timings"]["predicted_n"] == 5
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}

    def test_it_answers_chat_completions_without_streaming(self, start_sim: StartSim) -> None:
        sim = start_sim("-a", "sim-model", "--sim-tokens", "6")
        sim.wait_ready()
        with sim.client() as client:
            answer = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3}).json()
        assert answer["object"] == "chat.completion"
        assert answer["model"] == "sim-model"
        assert answer["choices"][0]["message"] == {
            "role": "assistant",
            "content": simulated_text("sim-model", 3),
        }
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["completion_tokens"] == 3
        assert answer["usage"]["prompt_tokens"] > 0
        assert answer["timings"]["predicted_n"] == 3

    def test_it_serves_openai_completions_streamed_and_not(self, start_sim: StartSim) -> None:
        sim = start_sim("-a", "m", "--sim-tokens", "4")
        sim.wait_ready()
        with sim.client() as client:
            plain = client.post("/v1/completions", json={"prompt": "Once"}).json()
            with client.stream(
                "POST", "/v1/completions", json={"prompt": "Once", "stream": True}
            ) as r:
                events = sse_events(r)
        assert plain["object"] == "text_completion"
        assert plain["choices"][0]["text"] == simulated_text("m", 4)
        assert plain["usage"]["total_tokens"] == plain["usage"]["prompt_tokens"] + 4
        assert events[-1] == "[DONE]"
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == simulated_text("m", 4)
        assert events[-2]["choices"][0]["finish_reason"] == "stop"
        assert "usage" in events[-2] and "timings" in events[-2]

    def test_it_serves_the_native_completion_route_streamed_and_not(
        self, start_sim: StartSim
    ) -> None:
        sim = start_sim("-a", "m", "--sim-tokens", "4")
        sim.wait_ready()
        with sim.client() as client:
            plain = client.post("/completion", json={"prompt": "Once", "n_predict": 2}).json()
            with client.stream("POST", "/completion", json={"prompt": "Once", "stream": True}) as r:
                events = sse_events(r)
        assert plain["content"] == simulated_text("m", 2)
        assert plain["stop"] is True and plain["stop_type"] == "limit"
        assert plain["tokens_predicted"] == 2
        assert "[DONE]" not in events  # llama.cpp ends native streams without it
        assert "".join(e["content"] for e in events) == simulated_text("m", 4)
        assert events[-1]["stop"] is True and events[-1]["stop_type"] == "eos"

    def test_it_streams_concurrently_on_keep_alive_connections(self, start_sim: StartSim) -> None:
        sim = start_sim("-a", "m", "--sim-tokens", "8", "--sim-token-ms", "5", "--parallel", "4")
        sim.wait_ready()
        clients = 4
        barrier = threading.Barrier(clients, timeout=DEADLINE_S)
        results: list[tuple[set[Any], list[str]]] = []
        errors: list[BaseException] = []

        def stream(client: httpx.Client, meet: bool) -> tuple[Any, str]:
            body = {**CHAT, "stream": True}
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                if meet:
                    barrier.wait()  # every stream is open at once, or this times out
                rest = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
                local = r.extensions["network_stream"].get_extra_info("client_addr")
            chunks = [json.loads(first.removeprefix("data: "))] + [json.loads(x) for x in rest[:-1]]
            assert rest[-1] == "[DONE]"
            return local, "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)

        def worker() -> None:
            try:
                limits = httpx.Limits(max_connections=1)
                with httpx.Client(base_url=sim.url, timeout=HTTP, limits=limits) as client:
                    runs = [stream(client, meet=i == 0) for i in range(3)]
                results.append(({local for local, _ in runs}, [text for _, text in runs]))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=DEADLINE_S * 2)
        assert not errors, errors
        assert len(results) == clients
        for connections, texts in results:
            assert len(connections) == 1  # three streams on one kept-alive connection
            assert texts == [simulated_text("m", 8)] * 3


class TestOtherRoutes:
    def test_it_round_trips_tokenize_and_detokenize(self, start_sim: StartSim) -> None:
        sim = start_sim()
        sim.wait_ready()
        text = "Héllo, wörld ✓ 🚀\n\ttabs"
        with sim.client() as client:
            tokens = client.post("/tokenize", json={"content": text}).json()["tokens"]
            again = client.post("/tokenize", json={"content": text}).json()["tokens"]
            back = client.post("/detokenize", json={"tokens": tokens}).json()
            special = client.post("/tokenize", json={"content": "a", "add_special": True}).json()
            pieces = client.post("/tokenize", json={"content": "é", "with_pieces": True}).json()
        assert tokens == again and all(isinstance(t, int) for t in tokens)
        assert back == {"content": text}
        assert len(special["tokens"]) == 2
        assert [p["piece"] for p in pieces["tokens"]] == [
            [0xC3],
            [0xA9],
        ]  # bytes, as llama.cpp does

    def test_it_reads_chunked_request_bodies(self, start_sim: StartSim) -> None:
        sim = start_sim()
        sim.wait_ready()

        def body() -> Iterator[bytes]:
            yield b'{"content": '
            yield b'"hi"}'

        with sim.client() as client:
            answer = client.post("/tokenize", content=body())
        assert answer.status_code == 200
        assert len(answer.json()["tokens"]) == 2

    def test_it_serves_models_props_and_slots(self, start_sim: StartSim) -> None:
        sim = start_sim("-m", "/models/tiny.gguf", "--parallel", "2", "--ctx-size", "2048")
        sim.wait_ready()
        with sim.client() as client:
            models = client.get("/v1/models").json()
            props = client.get("/props").json()
            slots = client.get("/slots").json()
        assert models["object"] == "list"
        assert [list(m) for m in models["data"]] == [MODEL_KEYS]
        assert models["data"][0]["id"] == "tiny.gguf"
        assert props["model_alias"] == "tiny.gguf"
        assert props["total_slots"] == 2 and props["is_sleeping"] is False
        assert props["default_generation_settings"]["n_ctx"] == 2048
        assert [s["id"] for s in slots] == [0, 1]

    def test_it_serves_metrics_and_embeddings_only_when_enabled(self, start_sim: StartSim) -> None:
        plain, enabled = start_sim(), start_sim("--metrics", "--embeddings")
        plain.wait_ready()
        enabled.wait_ready()
        with plain.client() as client:
            assert client.get("/metrics").status_code == 501
            assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 501
        with enabled.client() as client:
            client.post("/completion", json={"prompt": "x"})
            metrics = client.get("/metrics")
            embeddings = client.post("/v1/embeddings", json={"input": ["a", "b"]}).json()
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "llamacpp:tokens_predicted_total 16" in metrics.text
        assert "llamacpp:requests_processing 0" in metrics.text
        assert [d["index"] for d in embeddings["data"]] == [0, 1]
        assert len(embeddings["data"][0]["embedding"]) == 64
        assert embeddings["usage"]["prompt_tokens"] > 0

    def test_it_answers_errors_in_llama_cpp_shapes(self, start_sim: StartSim) -> None:
        sim = start_sim()
        sim.wait_ready()
        with sim.client() as client:
            missing = client.get("/no/such/route")
            bad_json = client.post("/v1/chat/completions", content=b"{not json")
            no_messages = client.post("/v1/chat/completions", json={"model": "x"})
            no_prompt = client.post("/completion", json={})
        assert missing.status_code == 404
        assert missing.json() == {
            "error": {"message": "File Not Found", "type": "not_found_error", "code": 404}
        }
        for answer in (bad_json, no_messages, no_prompt):
            assert answer.status_code == 400
            assert list(answer.json()["error"]) == ["code", "message", "type"]
            assert answer.json()["error"]["type"] == "invalid_request_error"
            assert answer.headers["connection"] == "close"
        assert no_messages.json()["error"]["message"] == "'messages' is required"

    def test_it_requires_the_api_key_except_on_health(self, start_sim: StartSim) -> None:
        sim = start_sim("--api-key", "k1,k2")
        sim.wait_ready()
        with sim.client() as client:
            assert client.get("/v1/models").status_code == 401
            assert (
                client.get("/v1/models", headers={"Authorization": "Bearer k2"}).status_code == 200
            )
            assert client.get("/v1/models", headers={"X-Api-Key": "k1"}).status_code == 200
            assert client.get("/health").status_code == 200
