"""Usage and receipts on the HTTP surface (issue 17.2, 17.3): the receipt's headers, the usage
row of every proxied request (tokens from the answer's tail, streamed or not), the batch writer
(a database that is away breaks nothing), ``GET /usage`` by role, retention and the counters."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from models_app import tasks
from models_app.accounts import usage, usage_report
from models_app.accounts.roles import Role
from models_app.api import Api
from models_app.api.auth import Caller, digest
from models_app.models import RouterSettings, UsageHour, UsageRecord
from models_app.routing.client import RouterClient
from routerpanel.router.receipts import Receipt
from tests.support.asgi import ROUTER_TIMEOUT, AsgiClient, django_stand_in
from tests.support.fake_router import FakeRouter, Grant
from tests.support.panel import make_user
from tests.support.upstreams import SimServer

VIEWER_KEY = "rp-viewer-key-0123456789"
OPERATOR_KEY = "rp-operator-key-0123456789"
SWAP = Receipt(2.5, 1.25, ("small",), True)


def chat(model: str, tokens: int = 3, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hello there"}]
    return {"model": model, "messages": messages, "max_tokens": tokens, "stream": stream}


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@pytest.fixture
def recorder() -> usage.UsageRecorder:
    return usage.UsageRecorder(flush_seconds=0.05)


@pytest.fixture
async def api(router: FakeRouter, layer: Any, keys: Any, config: Any, recorder: Any) -> Any:
    app = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=ROUTER_TIMEOUT),
        keys=keys,
        config=config,
        recorder=recorder,
    )
    yield app
    await app.aclose()


@pytest.fixture
def keyed(key_table: dict[str, Any]) -> None:
    key_table["required"] = True
    key_table["keys"] = {
        digest(VIEWER_KEY): Caller("key:vera/laptop", 1),
        digest(OPERATOR_KEY): Caller("key:otto/ci", 2),
    }


@pytest.fixture
def models(router: FakeRouter, simserver: SimServer) -> None:
    router.add("big", Grant(simserver.port, SWAP), status="loaded")
    router.add("small", Grant(simserver.port), status="loaded")


class TestTokensInTheTail:
    def test_a_streamed_openai_chat_ends_with_usage_and_timings(self) -> None:
        tail = (
            b'data: {"choices":[],"usage":{"completion_tokens":7,"prompt_tokens":12,'
            b'"total_tokens":19},"timings":{"prompt_n":12,"predicted_n":7}}\n\ndata: [DONE]\n\n'
        )
        assert usage.tokens_in(tail) == (12, 7)

    def test_anthropic_and_native_completion_names(self) -> None:
        anthropic = b'event: message_delta\ndata: {"usage":{"input_tokens":4,"output_tokens":9}}'
        assert usage.tokens_in(anthropic) == (4, 9)
        native = b'{"content":"x","tokens_evaluated":5,"tokens_predicted":2,"stop":true}'
        assert usage.tokens_in(native) == (5, 2)

    def test_text_that_looks_like_a_count_is_not_one(self) -> None:
        tail = b'{"content":"say \\"prompt_tokens\\":99 and \\"completion_tokens\\":98"}'
        assert usage.tokens_in(tail) == (None, None)

    def test_only_the_tail_is_read(self) -> None:
        body = b'{"usage":{"prompt_tokens":1,"completion_tokens":2}}' + b" " * usage.TAIL_BYTES
        assert usage.tokens_in(body) == (None, None)


class TestReceipts:
    async def test_a_whole_answer_carries_the_receipt(
        self, client: AsgiClient, models: None
    ) -> None:
        response = await client.post("/v1/chat/completions", chat("big"))
        assert response.status == 200
        assert response.header("x-routerpanel-queue-ms") == "2500"
        assert response.header("x-routerpanel-load-ms") == "1250"
        assert response.header("x-routerpanel-evicted") == "small"
        assert response.header("content-length") == str(len(response.body))

    async def test_a_stream_carries_it_and_a_loaded_model_says_load_0(
        self, client: AsgiClient, models: None
    ) -> None:
        response = await client.post("/v1/chat/completions", chat("small", stream=True))
        assert response.status == 200 and b"[DONE]" in response.body
        assert response.header("x-routerpanel-queue-ms") == "0"
        assert response.header("x-routerpanel-load-ms") == "0"
        assert response.header("x-routerpanel-evicted") is None

    async def test_a_child_that_cannot_be_reached_still_gets_a_receipt(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.add("gone", Grant(1, SWAP), status="loaded")  # nothing listens on port 1
        response = await client.post("/v1/chat/completions", chat("gone"))
        assert response.status == 500
        assert response.header("x-routerpanel-evicted") == "small"


class TestRecording:
    async def test_each_request_records_its_receipt_tokens_and_time(
        self, client: AsgiClient, models: None, recorder: usage.UsageRecorder
    ) -> None:
        recorder.flush_seconds = 3600  # keep the rows here
        await client.post("/v1/chat/completions", chat("big", tokens=4))
        await client.post("/v1/chat/completions", chat("small", tokens=5, stream=True))
        whole, streamed = recorder.pending
        assert (whole.model, whole.status, whole.completion_tokens) == ("big", 200, 4)
        assert whole.prompt_tokens and whole.prompt_tokens > 0
        assert (whole.queued, whole.load, whole.evicted, whole.caused_load) == (
            2.5, 1.25, ("small",), True,
        )  # fmt: skip
        assert whole.duration > 0 and whole.actor == "anonymous"
        assert (streamed.model, streamed.completion_tokens, streamed.load) == ("small", 5, 0.0)
        counters = recorder.counters
        assert counters.loads_caused[("anonymous", "big")] == 1
        assert counters.completion_tokens[("anonymous", "small")] == 5

    async def test_a_client_that_leaves_mid_stream_still_leaves_a_row(
        self,
        client: AsgiClient,
        router: FakeRouter,
        slow_simserver: SimServer,
        recorder: usage.UsageRecorder,
    ) -> None:
        recorder.flush_seconds = 3600
        router.add("slow", Grant(slow_simserver.port, SWAP), status="loaded")
        call = client.start("POST", "/v1/chat/completions", json_body=chat("slow", 100, True))
        await call.wait_body(lambda body: body.count(b'"content":"') >= 2)
        call.disconnect()
        await router.wait_for("router.release")
        async with asyncio.timeout(10):  # recorded right after the release is sent
            while not recorder.pending:
                await asyncio.sleep(0.01)
        (row,) = recorder.pending
        assert (row.model, row.status, row.caused_load) == ("slow", 200, True)
        assert row.completion_tokens is None  # the stream never reached its usage chunk
        assert 0 < row.duration < 10

    async def test_a_database_that_is_away_breaks_nothing_and_loses_nothing(
        self,
        client: AsgiClient,
        models: None,
        recorder: usage.UsageRecorder,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        attempts = []

        def down(batch: Any) -> int:
            attempts.append(len(batch))
            raise ConnectionError("database is away")

        monkeypatch.setattr(usage, "write_batch", down)
        for _ in range(3):
            response = await client.post("/v1/chat/completions", chat("small"))
            assert response.status == 200
        await recorder.drain(deadline=2)
        assert attempts and len(recorder.pending) == 3  # kept for the next try

    async def test_past_the_cap_the_oldest_rows_go(self) -> None:
        recorder = usage.UsageRecorder(flush_seconds=3600, max_pending=2)
        for n in range(3):
            recorder.record(usage.Usage("anonymous", f"m{n}", 0.0))
        assert [u.model for u in recorder.pending] == ["m1", "m2"] and recorder.dropped == 1


@pytest.mark.django_db(transaction=True)
class TestStored:
    async def test_rows_and_hourly_rollups_are_written_in_a_batch(
        self, client: AsgiClient, models: None, recorder: usage.UsageRecorder
    ) -> None:
        await client.post("/v1/chat/completions", chat("big", tokens=4))
        await client.post("/v1/chat/completions", chat("big", tokens=2))
        await recorder.drain()
        rows = await asyncio.to_thread(lambda: list(UsageRecord.objects.order_by("id")))
        assert [r.completion_tokens for r in rows] == [4, 2]
        assert rows[0].evicted == "small" and rows[0].caused_load and rows[0].load_ms == 1250
        (hour,) = await asyncio.to_thread(lambda: list(UsageHour.objects.all()))
        assert (hour.actor, hour.model, hour.requests) == ("anonymous", "big", 2)
        assert (hour.completion_tokens, hour.loads_caused) == (6, 2)
        assert hour.load_seconds_caused == pytest.approx(2.5)

    def test_every_column_of_a_row_is_written_as_the_orm_would(self) -> None:
        """write_batch inserts with its own column list: a field added to the model must be
        in it, and the values must read back as the ORM's (dates aware, booleans, NULLs)."""
        fields = {f.name for f in UsageRecord._meta.concrete_fields if not f.primary_key}
        assert set(usage._ROW_FIELDS) == fields
        arrived = datetime(2026, 12, 2, 10, 30, 15, 250000, tzinfo=UTC).timestamp()
        row = usage.Usage(
            "user:alice", "m", arrived, "/tokenize", "req-1", 200, 0.5, 0.25, True,
            ("a", "b"), 7, None, 1.5,
        )  # fmt: skip
        assert usage.write_batch([row]) == 1
        (r,) = UsageRecord.objects.all()
        assert r.time == datetime(2026, 12, 2, 10, 30, 15, 250000, tzinfo=UTC)
        assert (r.actor, r.model, r.path, r.request_id, r.status) == (
            "user:alice", "m", "/tokenize", "req-1", 200,
        )  # fmt: skip
        assert (r.queue_ms, r.load_ms, r.caused_load, r.evicted) == (500, 250, True, "a,b")
        assert (r.prompt_tokens, r.completion_tokens, r.duration_ms) == (7, None, 1500)

    async def test_viewers_see_their_own_rows_and_operators_everyones(
        self, client: AsgiClient, models: None, keyed: None, recorder: usage.UsageRecorder
    ) -> None:
        await asyncio.to_thread(make_user, "vera", Role.VIEWER)
        await asyncio.to_thread(make_user, "otto", Role.OPERATOR)
        await client.post("/v1/chat/completions", chat("big"), headers=bearer(VIEWER_KEY))
        await client.post("/v1/chat/completions", chat("small"), headers=bearer(OPERATOR_KEY))
        await client.post("/v1/chat/completions", chat("small"), headers=bearer(OPERATOR_KEY))
        await recorder.drain()

        mine = await client.get("/usage", headers=bearer(VIEWER_KEY))
        assert mine.status == 200, mine.body
        (row,) = mine.json()["data"]
        assert row["actor"] == "vera" and row["requests"] == 1
        assert (row["loads_caused"], row["load_seconds_caused"]) == (1, 1.25)
        assert row["queue_seconds"] == 2.5 and row["model_seconds"] > 0
        assert set(row) == {
            "actor", "requests", "prompt_tokens", "completion_tokens", "queue_seconds",
            "loads_caused", "load_seconds_caused", "model_seconds",
        }  # fmt: skip

        everyone = await client.get("/usage?by=actor", headers=bearer(OPERATOR_KEY))
        assert {r["actor"]: r["requests"] for r in everyone.json()["data"]} == {
            "vera": 1,
            "otto": 2,
        }
        by_key = await client.get("/usage?by=key", headers=bearer(OPERATOR_KEY))
        assert {r["key"] for r in by_key.json()["data"]} == {"vera/laptop", "otto/ci"}
        by_model = await client.get("/usage?by=model", headers=bearer(VIEWER_KEY))
        assert [r["model"] for r in by_model.json()["data"]] == ["big"]  # still only hers

    async def test_since_and_until_bound_the_rows(
        self, client: AsgiClient, recorder: usage.UsageRecorder
    ) -> None:
        old = datetime(2026, 1, 1, 12, tzinfo=UTC).timestamp()
        recorder.record(usage.Usage("anonymous", "m", old, duration=1.0))
        recorder.record(usage.Usage("anonymous", "m", old + 7200, duration=1.0))
        await recorder.drain()
        inside = await client.get("/usage?by=model&since=2026-01-01T11:00&until=2026-01-01T13:00")
        assert inside.json()["data"][0]["requests"] == 1
        both = await client.get(f"/usage?by=model&since={old - 1:.0f}&until={old + 7201:.0f}")
        assert both.json()["data"][0]["requests"] == 2
        assert (await client.get("/usage")).json()["data"] == []  # default: the last 24 h

    @pytest.mark.parametrize(
        "query",
        ["by=colour", "since=yesterday", "until=2026-13-01", "since=2026-02-01&until=2026-01-01"],
    )
    async def test_bad_parameters_are_400_in_llamacpps_shape(
        self, client: AsgiClient, query: str
    ) -> None:
        response = await client.get(f"/usage?{query}")
        assert response.status == 400
        error = response.json()["error"]
        assert list(error) == ["code", "message", "type"]
        assert (error["code"], error["type"]) == (400, "invalid_request_error")

    async def test_a_database_that_cannot_be_read_is_503_not_500(
        self, client: AsgiClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from django.db import OperationalError

        def away(*args: object) -> None:
            raise OperationalError("connection refused")

        monkeypatch.setattr(usage_report, "summary", away)
        response = await client.get("/usage?by=model")
        assert response.status == 503
        assert response.json()["error"] == {
            "code": 503,
            "message": "usage is not available: the database cannot be read",
            "type": "unavailable_error",
        }

    async def test_keys_are_required_for_usage_when_they_are_required(
        self, client: AsgiClient, keyed: None
    ) -> None:
        assert (await client.get("/usage")).status == 401


@pytest.mark.django_db(transaction=True)
def test_retention_deletes_old_usage_with_the_audit_rows() -> None:
    now = datetime.now(UTC)
    settings = RouterSettings.load()
    settings.audit_retention_days = 7
    settings.save()
    for age in (1, 10):
        when = now - timedelta(days=age)
        usage.write_batch([usage.Usage("anonymous", f"m{age}", when.timestamp())])
    tasks.apply_retention()
    assert list(UsageRecord.objects.values_list("model", flat=True)) == ["m1"]
    assert list(UsageHour.objects.values_list("model", flat=True)) == ["m1"]


async def test_metrics_have_per_actor_counters(client: AsgiClient, models: None) -> None:
    await client.post("/v1/chat/completions", chat("big", tokens=4))
    response = await client.get("/metrics")
    text = response.body.decode()
    assert 'routerpanel_usage_completion_tokens_total{actor="anonymous",model="big"} 4' in text
    assert 'routerpanel_usage_loads_caused_total{actor="anonymous",model="big"} 1' in text
