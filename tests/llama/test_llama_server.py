"""The real llama-server (b11434) with tiny generated models, without the router engine.

What the router relies on: it loads our generated GGUFs, answers /health, chat (plain and SSE)
and /tokenize, and speaks the child protocol of ROUTER_SPEC §4 when LLAMA_SERVER_ROUTER_PORT is
set. Also compares routerpanel.router.gguf's memory estimate with the measured RSS.

Load times here (spawn to /health 200; 2 cores, CPU build): tiny (2.8 MB) 0.15 s, small (53 MB)
0.13 s, medium (196 MB) 0.13 s on a quiet machine, up to about 1 s while another build runs. The
file is memory-mapped, so its size barely matters. Writing the three models takes about 6 s per
session (the ``tiny_models`` fixture). LOAD_TIMEOUT (180 s) is for a loaded CI machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.gguf import estimate_memory, inspect
from tests.support.ggufgen import SIZES
from tests.support.llama_server import CHILD_PREFIX, StartServer

HTTP_TIMEOUT = 120.0
CHAT = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}


def states(lines: list[str]) -> list[dict[str, Any]]:
    return [
        json.loads(line[len(CHILD_PREFIX) :]) for line in lines if line.startswith(CHILD_PREFIX)
    ]


@pytest.mark.parametrize("size", list(SIZES))
def test_it_loads_each_tiny_model_and_answers_health(
    llama_servers: StartServer, tiny_models: dict[str, Path], size: str
) -> None:
    server = llama_servers(tiny_models[size])
    seconds = server.wait_healthy()
    print(f"{size}: {tiny_models[size].stat().st_size / 1e6:.1f} MB loaded in {seconds:.2f} s")
    body = httpx.get(f"{server.base_url}/v1/models", timeout=HTTP_TIMEOUT).json()
    meta = body["data"][0]["meta"]
    facts = inspect(tiny_models[size])
    assert meta["n_vocab"] == facts.vocab_size == 32000
    assert meta["n_embd"] == facts.embedding_length == SIZES[size].n_embd
    assert meta["n_params"] == facts.parameter_count
    assert meta["n_ctx_train"] == facts.context_length


def test_a_chat_completion_returns_tokens(
    llama_servers: StartServer, tiny_models: dict[str, Path]
) -> None:
    server = llama_servers(tiny_models["tiny"])
    server.wait_healthy()
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=HTTP_TIMEOUT)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] > 0
    assert body["choices"][0]["message"]["content"]


def test_a_streamed_chat_completion_sends_chunks_and_ends_with_done(
    llama_servers: StartServer, tiny_models: dict[str, Path]
) -> None:
    server = llama_servers(tiny_models["tiny"])
    server.wait_healthy()
    url = f"{server.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json={**CHAT, "stream": True}, timeout=HTTP_TIMEOUT) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_tokenize_uses_the_copied_spm_vocab(
    llama_servers: StartServer, tiny_models: dict[str, Path]
) -> None:
    server = llama_servers(tiny_models["tiny"])
    server.wait_healthy()
    response = httpx.post(
        f"{server.base_url}/tokenize",
        json={"content": "Hello world", "with_pieces": True},
        timeout=HTTP_TIMEOUT,
    )
    assert response.status_code == 200, response.text
    assert response.json()["tokens"] == [
        {"id": 15043, "piece": " Hello"},
        {"id": 3186, "piece": " world"},
    ]


class TestChildProtocol:
    """ROUTER_SPEC §4.B/§4.C, which llama-server speaks when LLAMA_SERVER_ROUTER_PORT is set."""

    ENV = {"LLAMA_SERVER_ROUTER_PORT": "9"}  # only its presence matters; nothing connects to it

    def test_it_reports_loading_then_ready_with_the_model_object(
        self, llama_servers: StartServer, tiny_models: dict[str, Path]
    ) -> None:
        server = llama_servers(tiny_models["tiny"], env=self.ENV)
        server.wait_for_line(lambda line: '"state":"ready"' in line, timeout=180)
        assert all(line.startswith(CHILD_PREFIX) for line in server.lines), server.lines
        sent = states(server.lines)
        assert [s["state"] for s in sent] == ["loading"] * (len(sent) - 1) + ["ready"]
        assert sent[0]["payload"] == {
            "stages": ["text_model"],
            "current": "text_model",
            "value": 0.0,
        }
        assert sent[-2]["payload"]["value"] == 1.0
        ready = sent[-1]["payload"]
        assert ready["id"] == str(tiny_models["tiny"])
        assert ready["object"] == "model"
        assert ready["meta"]["n_vocab"] == 32000
        assert ready["meta"]["ftype"] == "F16"

    def test_the_exit_command_on_stdin_exits_with_0(
        self, llama_servers: StartServer, tiny_models: dict[str, Path]
    ) -> None:
        server = llama_servers(tiny_models["tiny"], env=self.ENV)
        # stdin is read only after the first `ready` (§4.12): wait for it before writing. And
        # b11434 loses an exit command that arrives before its task loop has started (the loop
        # sets running = true over terminate()'s false): a /slots answer comes from that loop.
        server.wait_for_line(lambda line: '"state":"ready"' in line, timeout=180)
        assert httpx.get(f"{server.base_url}/slots", timeout=HTTP_TIMEOUT).status_code == 200
        server.write_stdin(b"cmd_router_to_child:exit\n")
        assert server.wait_exit() == 0

    def test_closing_stdin_exits_with_1(
        self, llama_servers: StartServer, tiny_models: dict[str, Path]
    ) -> None:
        server = llama_servers(tiny_models["tiny"], env=self.ENV)
        server.wait_for_line(lambda line: '"state":"ready"' in line, timeout=180)
        server.close_stdin()
        assert server.wait_exit() == 1


@pytest.mark.parametrize("size", list(SIZES))
def test_the_memory_estimate_is_within_a_factor_of_the_measured_rss(
    llama_servers: StartServer, tiny_models: dict[str, Path], size: str
) -> None:
    # Explicit -c/-np so the estimate gets the same numbers; n_ubatch is the default 512.
    server = llama_servers(tiny_models[size], "--ctx-size", "512", "--parallel", "4")
    server.wait_healthy()
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=HTTP_TIMEOUT)
    assert response.status_code == 200, response.text  # a batch ran: its buffers are in the RSS
    assert response.json()["usage"]["completion_tokens"] > 0
    rss = int(psutil.Process(server.proc.pid).memory_info().rss)
    estimate = estimate_memory(inspect(tiny_models[size]), 512, n_parallel=4)
    ratio = estimate.total / rss
    print(
        f"{size}: estimate {estimate.total / 2**20:.1f} MiB (weights {estimate.weights / 2**20:.1f}"
        f" kv {estimate.kv_cache / 2**20:.2f} compute {estimate.compute / 2**20:.1f}"
        f" output {estimate.output / 2**20:.2f} runtime {estimate.runtime / 2**20:.0f})"
        f" / rss {rss / 2**20:.1f} MiB = {ratio:.2f}"
    )
    assert 0.2 < ratio < 5
