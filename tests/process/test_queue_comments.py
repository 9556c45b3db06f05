"""Queue position in the client's stream (issue 17.7), through a real ``manage.py serve`` with
simulated children that load slowly.

A streamed chat that asks for queue comments (``X-RouterPanel-Queue-Comments: 1`` or its key's
setting) and has to wait gets its head at once and SSE comment lines — its queue position, the
models loading with their progress — then its receipt as a comment and the child's stream. An
operator's cancel while it waits is one SSE error event; a client that leaves gives its place
back. Without the opt-in, or for a model that is ready, the answer is what it always was.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.ports import free_port
from tests.support.serving import Server, manage_beside, run_manage, sim_preset, wait_until

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too

HEADER = {"x-routerpanel-queue-comments": "1"}
LOAD_MS = 1200  # long enough for a status line or two, short enough for CI
DEADLINE = 30  # seconds for any one request or wait
RECEIPT = re.compile(r": routerpanel queue_ms=(\d+) load_ms=(\d+)( evicted=(\S+))?")
LOADING = re.compile(r": loading (\S+)( ~?\d+%)? \(\d+ s\)")


def chat(model: str, tokens: int = 3) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": messages, "max_tokens": tokens, "stream": True}


def serve(tmp_path: Path, **load_ms: int) -> AbstractContextManager[Server]:
    """``serve --models-max 1`` with one simulated model per keyword (its load time in ms)."""
    marker = f"qpos-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    presets = (
        sim_preset(name, marker, load_ms=ms, token_ms=20, extra="sim-tokens = 1000\n")
        for name, ms in load_ms.items()
    )
    ini.write_text("".join(presets))
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    return run_manage(args, tmp_path / "data", port=free_port())


class Reader:
    """Stream one chat in a thread, keeping its headers and non-empty lines; ``first`` is set
    when the first line arrives."""

    def __init__(self, server: Server, model: str, headers: dict[str, str], **body: int) -> None:
        self.server, self.model, self.headers = server, model, headers
        self.body = chat(model, **body)
        self.lines: list[str] = []
        self.response_headers: httpx.Headers | None = None
        self.first = threading.Event()
        self.leave = threading.Event()  # set: close the connection after the first line
        self.thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> Reader:
        self.thread.start()
        return self

    def _read(self) -> None:
        with (
            httpx.Client(base_url=self.server.url, timeout=DEADLINE) as client,
            client.stream(
                "POST", "/v1/chat/completions", json=self.body, headers=self.headers
            ) as r,
        ):
            self.response_headers = r.headers
            for line in r.iter_lines():
                if line:
                    self.lines.append(line)
                    self.first.set()
                    if self.leave.is_set():
                        return

    def join(self) -> Reader:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive(), f"the stream for {self.model} did not end in time"
        return self

    def comments_before_data(self) -> list[str]:
        """The lines before the first ``data:`` line; fails unless they are all comments."""
        head = []
        for line in self.lines:
            if line.startswith("data:"):
                break
            head.append(line)
        assert all(line.startswith(": ") for line in head), head
        return head


def read(server: Server, model: str, headers: dict[str, str]) -> Reader:
    return Reader(server, model, headers).start().join()


def assert_plain(reader: Reader) -> None:
    """An answer as it always was: receipt headers, no comment line, the child's chunks."""
    assert reader.response_headers is not None
    assert "x-routerpanel-queue-ms" in reader.response_headers
    assert not [line for line in reader.lines if line.startswith(":")], reader.lines
    assert reader.lines[-1] == "data: [DONE]"


def test_a_waiting_stream_reads_its_place_and_the_load_and_others_are_unchanged(
    tmp_path: Path,
) -> None:
    with serve(tmp_path, first=LOAD_MS, second=LOAD_MS) as server:
        loading = Reader(server, "first", HEADER).start()
        assert loading.first.wait(DEADLINE), "no line while the model loaded"
        queued = Reader(server, "second", HEADER).start()  # models_max 1: behind "first"
        loading.join()
        queued.join()

        assert loading.response_headers is not None
        assert loading.response_headers["content-type"] == "text/event-stream"
        assert loading.response_headers["x-accel-buffering"] == "no"
        assert "x-routerpanel-queue-ms" not in loading.response_headers  # sent before the grant
        head = loading.comments_before_data()
        assert head[0].startswith(": loading first"), head
        assert all(LOADING.fullmatch(line) for line in head[:-1]), head
        receipt = RECEIPT.fullmatch(head[-1])
        assert receipt is not None, head
        assert int(receipt[2]) >= LOAD_MS * 0.8 and receipt[3] is None, head[-1]
        assert any("simulated" in line for line in loading.lines)
        assert loading.lines[-1] == "data: [DONE]"

        head = queued.comments_before_data()
        states = [line.split(",")[0] for line in head[:-1]]
        # The entry loading "first" is ahead of it, then its own model loads.
        assert re.fullmatch(r": queued 2 of 2, loading first( \d+%)? \(\d+ s\)", head[0]), head
        own = [i for i, line in enumerate(head[:-1]) if LOADING.fullmatch(line)]
        assert own and all(head[i].startswith(": loading second") for i in own), head
        # Once "first" is granted its entry is gone: 1 of 1, until "first" is idle and stops.
        assert set(states[: own[0]]) <= {": queued 2 of 2", ": queued 1 of 1"}, head
        receipt = RECEIPT.fullmatch(head[-1])
        assert receipt is not None and receipt[4] == "first", head[-1]
        assert int(receipt[1]) > int(receipt[2]) >= LOAD_MS * 0.8, head[-1]

        ready = read(server, "second", HEADER)  # "second" is loaded: nothing early
        without = read(server, "second", {})
        assert_plain(ready)
        assert_plain(without)
        assert ready.response_headers is not None and without.response_headers is not None
        assert sorted(ready.response_headers) == sorted(without.response_headers)
        assert ready.response_headers["x-routerpanel-queue-ms"] == "0"

        plain = read(server, "first", {})  # no opt-in, and it waits for a load: no comments
        assert_plain(plain)
        assert plain.response_headers is not None
        assert int(plain.response_headers["x-routerpanel-load-ms"]) >= LOAD_MS * 0.8
        assert plain.response_headers["x-routerpanel-evicted"] == "second"


class Tee(httpx.BaseTransport):
    """An httpx transport that keeps a copy of every response's bytes as they are read."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.seen = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Copied(response.stream, self.seen),  # type: ignore[arg-type]
            extensions=response.extensions,
        )


class _Copied(httpx.SyncByteStream):
    def __init__(self, stream: httpx.SyncByteStream, into: bytearray) -> None:
        self.stream, self.into = stream, into

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.stream:
            self.into.extend(chunk)
            yield chunk

    def close(self) -> None:
        self.stream.close()


def test_the_sdk_reads_its_chunks_a_key_opts_in_a_cancel_is_an_error_a_leaver_leaves(
    tmp_path: Path,
) -> None:
    """One server for four cases (a serve start costs seconds): the SDK, a key's setting,
    an operator's cancel while queued, a client that leaves while queued."""
    with serve(tmp_path, first=LOAD_MS, second=LOAD_MS, busy=50, other=50) as server:
        the_sdk_and_a_key(server)
        a_cancel_and_a_leaver(server)


def the_sdk_and_a_key(server: Server) -> None:
    tee = Tee()
    client = openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=DEADLINE,
        http_client=httpx.Client(transport=tee, timeout=DEADLINE),
    )
    stream = client.chat.completions.create(
        model="first",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=5,
        stream=True,
        extra_headers=HEADER,
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) == 5
    assert "simulated" in "".join(pieces)
    raw = tee.seen.decode()
    assert raw.startswith(": loading first"), raw[:200]  # the SDK read past them
    assert re.search(r"\n: routerpanel queue_ms=\d+ load_ms=\d+\n\ndata: ", raw), raw[:600]

    secret = manage_beside(server, "create_api_key", "admin", "w", "--queue-comments").strip()
    key = {"authorization": f"Bearer {secret}"}
    by_key = read(server, "second", key)  # no header: the key asks for them
    head = by_key.comments_before_data()
    assert LOADING.fullmatch(head[0]) and head[0].startswith(": loading second"), head
    assert RECEIPT.fullmatch(head[-1]), head

    turned_off = read(server, "first", {**key, "x-routerpanel-queue-comments": "0"})
    assert_plain(turned_off)  # the header's 0 wins over the key
    assert turned_off.response_headers is not None
    assert int(turned_off.response_headers["x-routerpanel-load-ms"]) >= LOAD_MS * 0.8


def queued_now(server: Server) -> int:
    ready = httpx.get(f"{server.url}/ready", timeout=DEADLINE).json()
    return int(ready["router"]["queued"])


def a_cancel_and_a_leaver(server: Server) -> None:
    keeper = Reader(server, "busy", {}, tokens=1000).start()  # holds the one slot
    assert keeper.first.wait(DEADLINE)

    cancelled = Reader(server, "other", HEADER).start()
    assert cancelled.first.wait(DEADLINE), "no comment while queued"
    assert cancelled.lines[0] == ": queued 1 of 1", cancelled.lines
    answer = httpx.post(f"{server.url}/models/cancel", json={"model": "other"}, timeout=10)
    assert answer.status_code == 200, answer.text
    cancelled.join()
    assert all(line.startswith(": queued 1 of 1") for line in cancelled.lines[:-1])
    assert cancelled.lines[-1] == (
        'data: {"error":{"code":499,"message":"the request was cancelled by anonymous while '
        'queued for model name=other","type":"cancelled"}}'
    ), cancelled.lines
    assert "[DONE]" not in " ".join(cancelled.lines)

    leaving = Reader(server, "other", HEADER)
    leaving.leave.set()
    leaving.start().join()
    assert leaving.lines == [": queued 1 of 1"]
    # Well before the keeper's 1000 tokens (20 s) would free the slot and serve the queue:
    wait_until(lambda: queued_now(server) == 0, 5, "the leaver's place given back")
    assert keeper.thread.is_alive()
    keeper.leave.set()  # it leaves mid-stream
    keeper.join()
