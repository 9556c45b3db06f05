"""llama.cpp's own router scenarios, through a real ``manage.py serve`` with simulated children.

Each test starts RouterPanel as a user would (an INI preset file, ``--models-max``), drives it
over HTTP from several threads, and reads the order of events from ``/models/sse``. A sampler
counts the live children every 5 ms and names the models it saw: exactly the peak each scenario
must reach (never more than ``models_max``), and only the models it must start. Every response a
test sends is checked. The eviction choice (LRU, pinned models) and the idle ttl are checked here
with real children too, not only in the scheduler's tests.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.auditdb import wait_for_rows
from tests.support.ports import free_port
from tests.support.serving import (
    LiveChildSampler,
    run_manage,
    sim_preset,
    simserver_processes,
    wait_until,
)

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too


def status_of(url: str, model: str) -> tuple[str, int]:
    """The model's status in /v1/models and how many requests wait for it."""
    entry = next(m for m in httpx.get(f"{url}/v1/models").json()["data"] if m["id"] == model)
    return entry["status"]["value"], entry["queue_depth"]


def chat(model: str, tokens: int = 4, stream: bool = False) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": stream,
    }


class SseLog:
    """Collect /models/sse events in a thread."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[str, str, dict[str, object]]] = []
        self._url = url
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._open = threading.Event()

    def start(self) -> SseLog:
        """Subscribe, and return once the router has answered: from then on nothing is missed."""
        self._thread.start()
        assert self._open.wait(30), "the SSE subscription did not open"
        return self

    def _run(self) -> None:
        try:
            with httpx.stream("GET", f"{self._url}/models/sse", timeout=None) as response:
                self._open.set()  # the headers come after the subscription exists
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        item = json.loads(line[6:])
                        self.events.append((item["model"], item["event"], item["data"]))
        except httpx.HTTPError:
            pass  # the server stopped at the end of the test

    def statuses(self, status: str) -> list[str]:
        """Models in the order they reached ``status`` (progress updates are not a change)."""
        return [
            model
            for model, _, data in self.events
            if data.get("status") == status and "progress" not in data
        ]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[object]:
    marker = f"scn-{tmp_path.name}"

    def start(presets: str, models_max: int) -> object:
        ini = tmp_path / "models.ini"
        ini.write_text(presets)
        return run_manage(
            ["serve", "--models-preset", str(ini), "--models-max", str(models_max)],
            tmp_path / "data",
            port=free_port(),
        )

    start.marker = marker  # type: ignore[attr-defined]
    yield start
    assert simserver_processes(marker) == [], "children outlived the router"


def test_a_busy_model_is_not_evicted_and_the_queued_request_waits(serve: object) -> None:
    marker = serve.marker  # type: ignore[attr-defined]
    presets = sim_preset("a", marker, token_ms=100) + sim_preset("b", marker)
    with serve(presets, 1) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        sse = SseLog(server.url).start()
        done: dict[str, float] = {}
        streamed: dict[str, object] = {}
        streaming = threading.Event()

        def long_stream() -> None:
            with httpx.stream(
                "POST", f"{server.url}/v1/chat/completions", json=chat("a", 20, True), timeout=60
            ) as response:
                streamed["status"] = response.status_code
                chunks = []
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    streaming.set()
                streamed["body"] = b"".join(chunks)
            done["a"] = time.monotonic()

        thread = threading.Thread(target=long_stream)
        thread.start()
        assert streaming.wait(30), "a never streamed"  # a is loaded and streaming
        response = httpx.post(f"{server.url}/v1/chat/completions", json=chat("b"), timeout=60)
        done["b"] = time.monotonic()
        thread.join(60)
        assert response.status_code == 200
        assert streamed["status"] == 200
        assert b"[DONE]" in streamed["body"]  # type: ignore[operator]  # not cut short
        assert done["b"] > done["a"]
        assert sampler.saw() == (1, {"a", "b"})
    assert sse.statuses("unloaded")[:1] == ["a"]


def test_three_waiters_for_one_model_share_one_eviction(serve: object) -> None:
    marker = serve.marker  # type: ignore[attr-defined]
    presets = sim_preset("a", marker) + sim_preset("b", marker, load_ms=500)
    with serve(presets, 1) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        assert httpx.post(f"{server.url}/models/load", json={"model": "a"}).status_code == 200
        sse = SseLog(server.url).start()
        results: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    httpx.post(
                        f"{server.url}/v1/chat/completions", json=chat("b"), timeout=60
                    ).status_code
                )
            )
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert results == [200, 200, 200]
        assert sampler.saw() == (1, {"a", "b"})
    spawns_of_b = [m for m, event, _ in sse.events if m == "b" and event == "model_status"]
    assert len(spawns_of_b) == 1
    assert sse.statuses("unloaded").count("a") == 1


def test_a_client_that_leaves_the_queue_costs_nobody_their_slot(serve: object) -> None:
    marker = serve.marker  # type: ignore[attr-defined]
    presets = (
        sim_preset("a", marker, token_ms=100) + sim_preset("b", marker) + sim_preset("c", marker)
    )
    with serve(presets, 1) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        sse = SseLog(server.url).start()
        streamed: list[tuple[int, bytes]] = []
        streaming = threading.Event()

        def stream_a() -> None:
            url, body = f"{server.url}/v1/chat/completions", chat("a", 15, True)
            with httpx.stream("POST", url, json=body, timeout=60) as response:
                chunks = []
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    streaming.set()
                streamed.append((response.status_code, b"".join(chunks)))

        streamer = threading.Thread(target=stream_a)
        streamer.start()
        assert streaming.wait(30), "a never streamed"  # a holds the only slot
        with pytest.raises(httpx.ReadTimeout):  # b's client gives up while queued
            httpx.post(f"{server.url}/v1/chat/completions", json=chat("b"), timeout=0.5)
        response = httpx.post(f"{server.url}/v1/chat/completions", json=chat("c"), timeout=60)
        streamer.join(60)
        assert response.status_code == 200
        ((status, content),) = streamed
        assert status == 200 and b"[DONE]" in content  # a was not cut short
        assert sampler.saw() == (1, {"a", "c"})  # b's child never existed
    assert "b" not in sse.statuses("loading")
    assert "c" in sse.statuses("loading")


def arrived(url: str, model: str) -> bool:
    """The router has the request for ``model``: it waits in the queue, or is being served."""
    entry = next(m for m in httpx.get(f"{url}/v1/models").json()["data"] if m["id"] == model)
    return entry["queue_position"] is not None or entry["status"]["value"] != "unloaded"


def test_the_queue_is_fifo(serve: object) -> None:
    marker = serve.marker  # type: ignore[attr-defined]
    presets = "".join(sim_preset(n, marker, token_ms=60 if n == "a" else 0) for n in "abcd")
    with serve(presets, 1) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        sse = SseLog(server.url).start()
        answers: dict[str, httpx.Response] = {}

        def post(name: str) -> None:
            body = chat(name, 40 if name == "a" else 2, name == "a")
            url = f"{server.url}/v1/chat/completions"
            answers[name] = httpx.post(url, json=body, timeout=60)

        threads = [threading.Thread(target=post, args=(name,)) for name in "abcd"]
        for name, thread in zip("abcd", threads, strict=True):
            thread.start()
            wait_until(lambda n=name: arrived(server.url, n), 30, f"{name} to arrive")  # in order
        for thread in threads:
            thread.join(60)
        assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys("abcd", 200)
        assert b"[DONE]" in answers["a"].content  # the stream ahead of the queue ran to its end
        assert all(answers[name].json()["model"] == name for name in "bcd")
        assert sampler.saw() == (1, {"a", "b", "c", "d"})
    assert sse.statuses("loading") == ["a", "b", "c", "d"]


def test_two_waiters_that_find_the_same_idle_victims_are_both_served(serve: object) -> None:
    marker = serve.marker  # type: ignore[attr-defined]
    presets = "".join(sim_preset(n, marker) for n in "abcd")
    with serve(presets, 2) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        for name in "ab":
            assert (
                httpx.post(f"{server.url}/v1/chat/completions", json=chat(name)).status_code == 200
            )
        results: dict[str, int] = {}
        threads = [
            threading.Thread(
                target=lambda n=name: results.__setitem__(
                    n,
                    httpx.post(
                        f"{server.url}/v1/chat/completions", json=chat(n), timeout=60
                    ).status_code,
                )
            )
            for name in "cd"
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert results == {"c": 200, "d": 200}
        assert sampler.saw() == (2, {"a", "b", "c", "d"})
        listed = httpx.get(f"{server.url}/v1/models").json()["data"]
        running = sorted(m["id"] for m in listed if m["status"]["value"] == "loaded")
        assert running == ["c", "d"]


def test_sse_shows_loading_progress_and_the_childs_info_as_llama_cpp_does(serve: object) -> None:
    marker = serve.marker  # type: ignore[attr-defined]
    with serve(sim_preset("a", marker, load_ms=600), 1) as server:  # type: ignore[operator]
        sse = SseLog(server.url).start()
        assert httpx.post(f"{server.url}/models/load", json={"model": "a"}).status_code == 200
        wait_until(lambda: "a" in sse.statuses("loaded"), 30, "a to be loaded")
    events = [(event, data) for model, event, data in sse.events if model == "a"]
    assert events[0] == ("model_status", {"status": "loading"})
    progress = [d["progress"] for e, d in events if e == "status_change" and "progress" in d]
    assert progress and progress[0]["value"] == 0.0 and progress[-1]["value"] == 1.0
    loaded = [d for e, d in events if d.get("status") == "loaded"]
    assert loaded[0]["info"]["id"] == "a"


def test_an_operator_cancels_a_queued_request_and_its_client_gets_499(serve: object) -> None:
    """A request queued behind a busy model is cancelled over the API; the busy stream and a
    second waiter are untouched, and the slot then goes to the second waiter as usual."""
    marker = serve.marker  # type: ignore[attr-defined]
    presets = sim_preset("a", marker, token_ms=100) + sim_preset("b", marker)
    with serve(presets, 1) as server:  # type: ignore[operator]
        answers: dict[str, httpx.Response] = {}

        def post(name: str, model: str, **kw: object) -> threading.Thread:
            def run() -> None:
                headers = {"x-request-id": name}
                url = f"{server.url}/v1/chat/completions"
                answers[name] = httpx.post(url, json=chat(model, **kw), headers=headers, timeout=60)

            thread = threading.Thread(target=run)
            thread.start()
            return thread

        busy = post("busy", "a", tokens=25)
        # a is granted to "busy" when it becomes loaded, and busy for ~2.5 s: b must queue
        wait_until(lambda: status_of(server.url, "a")[0] == "loaded", 30, "a to be loaded")
        doomed = post("doomed", "b")
        wait_until(lambda: status_of(server.url, "b")[1] == 1, 30, "doomed to queue")
        kept = post("kept", "b")
        wait_until(lambda: status_of(server.url, "b")[1] == 2, 30, "kept to queue")
        cancel = httpx.post(f"{server.url}/models/cancel", json={"request_id": "doomed"})
        assert (cancel.status_code, cancel.json()) == (
            200,
            {"success": True, "cancelled": ["doomed"]},
        )
        doomed.join(10)
        assert answers["doomed"].status_code == 499
        error = answers["doomed"].json()["error"]
        assert error["type"] == "cancelled" and "cancelled by anonymous" in error["message"]
        again = httpx.post(f"{server.url}/models/cancel", json={"request_id": "doomed"})
        assert again.status_code == 404 and again.json()["error"]["type"] == "not_found_error"
        busy.join(30)
        kept.join(30)
        assert answers["busy"].status_code == 200 and answers["kept"].status_code == 200


def loaded(url: str) -> set[str]:
    listed = httpx.get(f"{url}/v1/models").json()["data"]
    return {m["id"] for m in listed if m["status"]["value"] == "loaded"}


def test_the_least_recently_used_idle_model_is_the_one_evicted(serve: object) -> None:
    """a loads first but is used last: c's arrival evicts b, the least recently used (A5)."""
    marker = serve.marker  # type: ignore[attr-defined]
    presets = "".join(sim_preset(n, marker) for n in "abc")
    with serve(presets, 2) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        sse = SseLog(server.url).start()
        for name in "abac":
            response = httpx.post(f"{server.url}/v1/chat/completions", json=chat(name), timeout=60)
            assert response.status_code == 200, (name, response.text)
        assert loaded(server.url) == {"a", "c"}
        assert sampler.saw() == (2, {"a", "b", "c"})
    assert sse.statuses("unloaded")[:1] == ["b"]


def test_a_pinned_model_is_never_the_victim(serve: object) -> None:
    """a is pinned and the least recently used: c's arrival evicts b instead."""
    marker = serve.marker  # type: ignore[attr-defined]
    presets = sim_preset("a", marker, extra="pinned = true\n")
    presets += sim_preset("b", marker) + sim_preset("c", marker)
    with serve(presets, 2) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        sse = SseLog(server.url).start()
        for name in "abc":
            response = httpx.post(f"{server.url}/v1/chat/completions", json=chat(name), timeout=60)
            assert response.status_code == 200, (name, response.text)
        assert loaded(server.url) == {"a", "c"}
        assert sampler.saw() == (2, {"a", "b", "c"})
    assert sse.statuses("unloaded")[:1] == ["b"]


def test_an_idle_model_is_stopped_at_its_ttl_and_the_others_stay(serve: object) -> None:
    """a has ttl = 1 s: it stops after a second without requests, by itself (no request comes
    after its last one). b has none: used before a, it has been idle longer when a stops, and
    stays."""
    marker = serve.marker  # type: ignore[attr-defined]
    presets = sim_preset("a", marker, extra="ttl = 1\n") + sim_preset("b", marker)
    with serve(presets, 2) as server, LiveChildSampler(marker, server.process.pid) as sampler:  # type: ignore[operator]
        sse = SseLog(server.url).start()
        for name in "ba":
            response = httpx.post(f"{server.url}/v1/chat/completions", json=chat(name), timeout=60)
            assert response.status_code == 200, (name, response.text)
        wait_until(lambda: "a" in sse.statuses("unloaded"), 30, "a's ttl to stop it")
        assert loaded(server.url) == {"b"}
        assert sampler.saw() == (2, {"a", "b"})
        [row] = wait_for_rows(server.data_dir, "ttl")
        # The router's own count of a's idle time when it decided: never short of the ttl.
        assert row["model"] == "a" and row["idle_seconds"] >= 1.0, row
    assert sse.statuses("unloaded")[:1] == ["a"]
