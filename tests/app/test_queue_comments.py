"""Queue position in the client's stream (issue 17.7): the lines, who asks for them, and the
stream through the ASGI app over the channel layer (team mode's path; ``serve``'s in-process
path is in tests/process/test_queue_comments.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from channels.layers import InMemoryChannelLayer

from models_app.api import waiting
from models_app.api.auth import Caller
from models_app.api.proxy import in_stream
from models_app.api.request import Request
from models_app.routing import wire
from routerpanel.router.catalogue import Event
from routerpanel.router.errors import RouterError
from routerpanel.router.receipts import Receipt
from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter, Grant, QueueThenGrant
from tests.support.upstreams import SimServer

NOW = 1_000_000.0
HEADER = {"x-routerpanel-queue-comments": "1"}


def model(name: str, state: str = "loaded", **fields: Any) -> dict[str, Any]:
    """A model of the router's snapshot, as much of it as the lines read."""
    return {
        "name": name, "aliases": [], "state": state, "stopping": False, "state_since": None,
        "progress": None, "load_seconds": None, "loaded_at": None,
    } | fields  # fmt: skip


def entry(name: str, position: int) -> dict[str, Any]:
    return {"model": name, "position": position, "waiters": 1, "starting": False}


def snapshot(*models: dict[str, Any], queue: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"models": list(models), "queue": list(queue)}


class TestLines:
    def test_queued_behind_others_with_the_loading_model_and_its_childs_progress(self) -> None:
        loading = model(
            "qwen-7b", "loading", state_since=NOW - 4.2,
            progress={"stages": ["text_model"], "current": "text_model", "value": 0.4},
        )  # fmt: skip
        snap = snapshot(
            loading, model("big", "unloaded"), model("small", "unloaded"),
            queue=(entry("qwen-7b", 1), entry("big", 2), entry("small", 3)),
        )  # fmt: skip
        assert waiting.status_line(snap, "big", NOW) == "queued 2 of 3, loading qwen-7b 40% (4 s)"

    def test_its_own_load_with_an_estimate_from_the_previous_load_never_past_99(self) -> None:
        mine = model("big", "loading", state_since=NOW - 6, load_seconds=10.0)
        assert waiting.status_line(snapshot(mine), "big", NOW) == "loading big ~60% (6 s)"
        late = model("big", "loading", state_since=NOW - 30, load_seconds=10.0)
        assert waiting.status_line(snapshot(late), "big", NOW) == "loading big ~99% (30 s)"

    def test_no_percentage_without_a_basis(self) -> None:
        first = model("big", "loading", state_since=NOW - 2)  # never loaded before
        assert waiting.status_line(snapshot(first), "big", NOW) == "loading big (2 s)"
        waking = model("big", "loading", state_since=NOW - 2, load_seconds=9.0, loaded_at=NOW - 60)
        assert waiting.status_line(snapshot(waking), "big", NOW) == "loading big (2 s)"
        unknown_time = model("big", "loading")
        assert waiting.status_line(snapshot(unknown_time), "big", NOW) == "loading big"
        for bad in ({"value": 1.5}, {"value": True}, {"stage": "mmproj_model"}, "40%"):
            assert waiting.progress(bad) is None

    def test_several_stages_name_the_current_one(self) -> None:
        stages = {"stages": ["text_model", "mmproj_model"], "current": "mmproj_model", "value": 0.5}
        assert waiting.progress(stages) == "mmproj_model 50%"

    def test_a_model_being_stopped_for_the_queue_is_named(self) -> None:
        snap = snapshot(
            model("small", stopping=True), model("big", "unloaded"), queue=(entry("big", 1),)
        )
        assert waiting.status_line(snap, "big", NOW) == "queued 1 of 1, stopping small"

    def test_an_alias_finds_its_model(self) -> None:
        snap = snapshot(
            model("qwen-7b", "unloaded", aliases=["fast"]), queue=(entry("qwen-7b", 1),)
        )
        assert waiting.status_line(snap, "fast", NOW) == "queued 1 of 1"

    def test_nothing_to_say_when_it_does_not_wait(self) -> None:
        assert waiting.status_line(snapshot(model("small")), "small", NOW) is None  # ready
        assert waiting.status_line(snapshot(model("small")), "nope", NOW) is None
        assert waiting.status_line({}, "small", NOW) is None

    def test_comments_and_the_receipt(self) -> None:
        assert waiting.comment("queued 1 of 2") == b": queued 1 of 2\n\n"
        assert waiting.comment("two\nlines\r") == b": two lines\n\n"  # never a data line
        receipt = Receipt(2.5, 1.25, ("small", "tiny"), True)
        line = b": routerpanel queue_ms=2500 load_ms=1250 evicted=small,tiny\n\n"
        assert waiting.receipt_line(receipt) == line
        assert waiting.receipt_line(Receipt(0.0105, 0.0, (), False)) == (
            b": routerpanel queue_ms=10 load_ms=0\n\n"
        )

    def test_a_childs_whole_answer_in_a_stream_that_started(self) -> None:
        error = b'{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}'
        assert in_stream(400, error) == b"data: " + error + b"\n\n"
        assert in_stream(500, b"boom") == (
            b'data: {"error":{"code":500,"message":"boom","type":"server_error"}}\n\n'
        )
        assert in_stream(404, b"whatever").startswith(b'data: {"error":{"message":"File Not')
        assert in_stream(200, b'{"x":1}') == b'data: {"x":1}\n\n'


async def layer_reply(router: FakeRouter, message: dict[str, Any], body: dict[str, Any]) -> None:
    await router.layer.send(
        message["reply_channel"], dict(wire.result(message["request_id"], body))
    )


def request(path: str, headers: dict[str, str], caller: Caller | None = None) -> Request:
    scope = {
        "type": "http", "method": "POST", "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }  # fmt: skip
    made = Request(scope, None, None)  # type: ignore[arg-type]
    if caller is not None:
        made.caller = caller
    return made


class TestWho:
    @pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
    def test_the_header_asks(self, value: str) -> None:
        asked = request("/v1/chat/completions", {"x-routerpanel-queue-comments": value})
        assert waiting.wanted(asked, streamed=True)

    def test_only_for_streamed_chats_and_completions(self) -> None:
        for path in ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completion"):
            assert waiting.wanted(request(path, HEADER), streamed=True)
        assert not waiting.wanted(request("/v1/chat/completions", HEADER), streamed=False)
        for path in ("/v1/embeddings", "/v1/messages", "/tokenize"):
            assert not waiting.wanted(request(path, HEADER), streamed=True)

    def test_the_keys_setting_asks_and_the_headers_0_turns_it_off(self) -> None:
        key = Caller("key:alice/ci", 1, queue_comments=True)
        assert waiting.wanted(request("/v1/chat/completions", {}, key), streamed=True)
        off = {"x-routerpanel-queue-comments": "0"}
        assert not waiting.wanted(request("/v1/chat/completions", off, key), streamed=True)
        assert not waiting.wanted(request("/v1/chat/completions", {}), streamed=True)


def chat(model: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "stream": True, "max_tokens": 3, "messages": messages}


class TestThroughTheChannelLayer:
    async def test_a_queued_stream_gets_its_head_and_a_comment_then_the_answer(
        self, client: AsgiClient, router: FakeRouter, simserver: SimServer
    ) -> None:
        queued = QueueThenGrant(simserver.port)
        router.add("cold", queued, status="loading")
        call = client.start("POST", "/v1/chat/completions", json_body=chat("cold"), headers=HEADER)
        await call.wait_body(lambda body: b": loading cold\n\n" in body)
        assert call.status == 200 and call.header("content-type") == "text/event-stream"
        assert call.header("x-routerpanel-queue-ms") is None  # it went out before the grant
        queued.release.set()
        await call.finish()
        lines = [line for line in call.body.decode().split("\n") if line]
        first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
        assert set(lines[: first_data - 1]) == {": loading cold"}
        assert lines[first_data - 1] == ": routerpanel queue_ms=0 load_ms=0"
        assert lines[-1] == "data: [DONE]" and "simulated" in call.body.decode()

    async def test_a_change_in_the_queue_is_told_at_once_not_at_the_next_tick(
        self,
        client: AsgiClient,
        router: FakeRouter,
        simserver: SimServer,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setattr(waiting, "INTERVAL", 60.0)  # no tick within the test's deadline
        queued = QueueThenGrant(simserver.port)
        router.add("cold", queued, status="unloaded")
        place = {"position": 2}

        async def router_snapshot(message: dict[str, Any]) -> None:
            entries = [entry("warm", 1), entry("cold", 2)][2 - place["position"] :]
            for n, each in enumerate(entries, start=1):
                each["position"] = n
            body = snapshot(model("warm"), model("cold", "unloaded"), queue=tuple(entries))
            await layer_reply(router, message, body)

        monkeypatch.setattr(router, "router_snapshot", router_snapshot)
        call = client.start("POST", "/v1/chat/completions", json_body=chat("cold"), headers=HEADER)
        await call.wait_body(lambda body: body == b": queued 2 of 2\n\n")
        place["position"] = 1
        async with asyncio.timeout(10):  # the talker subscribes beside its first look: retry
            while b"queued 1 of 1" not in call.body:
                await router.emit(Event.QUEUE_CHANGED, {"entries": []})
                with contextlib.suppress(TimeoutError):
                    await call.wait_body(lambda body: b"queued 1 of 1" in body, timeout=0.2)
        assert call.body == b": queued 2 of 2\n\n: queued 1 of 1\n\n"
        queued.release.set()
        await call.finish()

    async def test_a_rejection_after_the_head_is_one_sse_error_event(
        self, client: AsgiClient, router: FakeRouter, layer: InMemoryChannelLayer
    ) -> None:
        """Max wait, as the router answers it after the request had queued (A8)."""
        router.add("cold", QueueThenGrant(1), status="loading")  # never released
        call = client.start("POST", "/v1/chat/completions", json_body=chat("cold"), headers=HEADER)
        await call.wait_body(lambda body: b": loading cold" in body)
        acquire = await router.wait_for("router.acquire")
        text = "request waited longer than max wait (5 s) for model name=cold"
        error = RouterError(503, "unavailable_error", text, 5)
        await layer.send(
            acquire["reply_channel"], dict(wire.rejected(acquire["request_id"], error))
        )
        await call.finish()
        assert call.status == 200  # the head went out while it waited
        assert call.body.endswith(
            b"\n\ndata: " + json.dumps(error.body(), separators=(",", ":")).encode() + b"\n\n"
        )
        assert b"[DONE]" not in call.body

    async def test_a_childs_error_after_the_head_is_one_sse_error_event(
        self, client: AsgiClient, router: FakeRouter, simserver: SimServer
    ) -> None:
        queued = QueueThenGrant(simserver.port)
        router.add("cold", queued, status="loading")
        body = chat("cold") | {"max_tokens": "many"}  # the child answers 400
        call = client.start("POST", "/v1/chat/completions", json_body=body, headers=HEADER)
        await call.wait_body(lambda body: b": loading cold" in body)
        queued.release.set()
        await call.finish()
        lines = [line for line in call.body.decode().split("\n") if line]
        assert lines[-2] == ": routerpanel queue_ms=0 load_ms=0"
        assert json.loads(lines[-1].removeprefix("data: "))["error"] == {
            "code": 400, "message": '"max_tokens" must be an integer >= -1',
            "type": "invalid_request_error",
        }  # fmt: skip

    async def test_a_client_that_leaves_while_queued_cancels_its_place(
        self, client: AsgiClient, router: FakeRouter, simserver: SimServer
    ) -> None:
        router.add("cold", QueueThenGrant(simserver.port), status="loading")
        call = client.start("POST", "/v1/chat/completions", json_body=chat("cold"), headers=HEADER)
        await call.wait_body(lambda body: b": loading cold" in body)
        call.disconnect()
        await router.wait_for("router.cancel")
        await call.finish()

    async def test_without_the_opt_in_or_when_granted_at_once_nothing_changes(
        self, client: AsgiClient, router: FakeRouter, simserver: SimServer
    ) -> None:
        queued = QueueThenGrant(simserver.port)
        router.add("cold", queued, status="loading")
        router.add("warm", Grant(simserver.port), status="loaded")
        plain = client.start("POST", "/v1/chat/completions", json_body=chat("cold"))
        await router.wait_for("router.acquire")
        queued.release.set()
        await plain.finish()
        ready = await client.post("/v1/chat/completions", chat("warm"), headers=HEADER)
        for call in (plain, ready):
            assert call.header("x-routerpanel-queue-ms") == "0"
            assert b"\n:" not in call.body and not call.body.startswith(b":")
            assert call.body.endswith(b"data: [DONE]\n\n")
