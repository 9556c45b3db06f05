"""Quotas (issue 17.4): requests per minute and tokens per day, per user or per key; 429 with
Retry-After and a message naming the quota; the key table carries them; tokens come from the
usage rollups."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from models_app.api.auth import Caller, digest, load_from_database
from models_app.api.errors import ApiError
from models_app.api.quotas import Limit, QuotaBook, tokens_today_in_database
from models_app.models import ApiKey, Quota, UsageHour
from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter, Grant
from tests.support.opened import opened
from tests.support.upstreams import SimServer

pytest_plugins = ("tests.support.panel",)

NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
BEFORE_MIDNIGHT = datetime(2026, 12, 1, 23, 59, 0, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def caller(*limits: Limit) -> Caller:
    return Caller("key:alice/batch", 7, quotas=limits)


def refused(book: QuotaBook, who: Caller) -> ApiError | None:
    try:
        book.check(who, "qwen")
    except ApiError as exc:
        return exc
    return None


class TestRequestsPerMinute:
    def test_the_next_request_over_the_rate_is_429_until_the_window_moves(self) -> None:
        clock = Clock(NOON)
        book = QuotaBook(clock=clock)
        who = caller(Limit("key", "alice/batch", requests_per_minute=2))
        assert refused(book, who) is None
        clock.now += 10
        assert refused(book, who) is None
        clock.now += 5
        error = refused(book, who)
        assert error is not None and error.status == 429
        assert json.loads(error.body)["error"]["type"] == "rate_limit_error"
        assert dict(error.headers)[b"retry-after"] == b"45"  # the first leaves the window at 60
        assert "API key alice/batch is over its quota of 2 requests per minute" in str(error)
        clock.now += 44
        assert refused(book, who) is not None  # refusals did not count, but 1 s is still left
        clock.now += 1
        assert refused(book, who) is None

    def test_a_users_quota_counts_every_one_of_their_keys(self) -> None:
        book = QuotaBook(clock=Clock(NOON))
        user = Limit("user", "alice", requests_per_minute=1)
        laptop = Caller("key:alice/laptop", 1, quotas=(user,))
        batch = Caller("key:alice/batch", 2, quotas=(user,))
        assert refused(book, laptop) is None
        error = refused(book, batch)
        assert error is not None and "user alice is over its quota" in str(error)

    def test_a_request_refused_by_one_quota_is_not_counted_by_another(self) -> None:
        book = QuotaBook(clock=Clock(NOON))
        key = Limit("key", "alice/batch", requests_per_minute=1)
        user = Limit("user", "alice", requests_per_minute=5)
        who = caller(key, user)
        assert refused(book, who) is None
        assert refused(book, who) is not None
        other = caller(user)  # the user's window holds one request, not two
        for _ in range(4):
            assert refused(book, other) is None
        assert refused(book, other) is not None


class TestTokensPerDay:
    async def test_a_used_up_quota_is_429_until_midnight_utc(self) -> None:
        reads: list[datetime] = []
        used = {("user", "alice"): 0}

        def read(limits: Any, since: datetime) -> dict[tuple[str, str], int]:
            reads.append(since)
            return dict(used)

        clock = Clock(BEFORE_MIDNIGHT)
        book = QuotaBook(read, clock=clock, refresh_seconds=0.05)
        who = caller(Limit("user", "alice", tokens_per_day=1000))
        assert refused(book, who) is None  # not read yet: admitted, and read at once
        await _read_done(book)
        assert reads == [datetime(2026, 12, 1, tzinfo=UTC)]
        used[("user", "alice")] = 1200  # that request used 1,200 tokens
        assert refused(book, who) is None  # the figure read is still 0; a read follows
        await asyncio.sleep(0.1)
        await _read_done(book)
        clock.now += 5
        error = refused(book, who)
        assert error is not None and error.status == 429
        assert "user alice is over its quota of 1,000 tokens per day (1,200 used today)" in str(
            error
        )
        assert dict(error.headers)[b"retry-after"] == b"55"  # 23:59:05 -> midnight
        clock.now += 60  # the next UTC day: yesterday's tokens do not count
        assert refused(book, who) is None
        await _read_done(book)
        assert reads[-1] == datetime(2026, 12, 2, tzinfo=UTC)

    async def test_a_database_that_cannot_be_read_keeps_the_last_figures(self) -> None:
        failing = False

        def read(limits: Any, since: datetime) -> dict[tuple[str, str], int]:
            if failing:
                raise RuntimeError("database away")
            return {("key", "alice/batch"): 50}

        book = QuotaBook(read, clock=Clock(NOON), refresh_seconds=0.05)
        who = caller(Limit("key", "alice/batch", tokens_per_day=50))
        refused(book, who)
        await _read_done(book)
        failing = True
        assert refused(book, who) is not None
        await asyncio.sleep(0.1)
        await _read_done(book)
        assert refused(book, who) is not None  # still the last figure read, not forgotten


async def _read_done(book: QuotaBook) -> None:
    async with asyncio.timeout(5):
        await asyncio.sleep(0)  # a read due now starts on the next turn of the loop
        while book._reading is not None or (
            book._timer is not None and book._timer.when() <= (asyncio.get_running_loop().time())
        ):
            await asyncio.sleep(0.01)


@pytest.mark.django_db
class TestFromTheDatabase:
    def test_tokens_today_come_from_the_rollups_per_user_and_per_key(self) -> None:
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        rows = [
            (today, "alice", "alice/laptop", 100, 20),
            (today + timedelta(hours=1), "alice", "alice/batch", 300, 80),
            (today - timedelta(hours=1), "alice", "alice/batch", 5000, 0),  # yesterday
            (today, "bob", "bob/ci", 7, 7),
        ]
        for hour, actor, key, prompt, completion in rows:
            UsageHour.objects.create(
                hour=hour, actor=actor, key=key, model="m", requests=1,
                prompt_tokens=prompt, completion_tokens=completion,
            )  # fmt: skip
        user, key = Limit("user", "alice", 1), Limit("key", "alice/batch", 1)
        assert tokens_today_in_database([user, key], today) == {
            ("user", "alice"): 500,
            ("key", "alice/batch"): 380,
        }

    def test_the_key_table_carries_each_keys_quota_and_its_owners(self) -> None:
        alice = get_user_model().objects.create_user("alice")
        batch, secret = ApiKey.objects.issue(alice, "batch")
        _, other = ApiKey.objects.issue(alice, "laptop")
        Quota.objects.create(user=alice, tokens_per_day=10_000)
        Quota.objects.create(user=alice, key=batch, requests_per_minute=30)
        table = load_from_database()
        assert table.keys[digest(secret)].quotas == (
            Limit("key", "alice/batch", None, 30),
            Limit("user", "alice", 10_000, None),
        )
        assert table.keys[digest(other)].quotas == (Limit("user", "alice", 10_000, None),)


class TestThroughTheApi:
    async def test_over_the_rate_the_api_answers_429_in_llama_cpps_shape(
        self,
        client: AsgiClient,
        router: FakeRouter,
        key_table: dict[str, Any],
        simserver: SimServer,
    ) -> None:
        key_table["required"] = True
        limit = Limit("key", "bob/batch", requests_per_minute=1)
        key_table["keys"] = {digest("rp-bob"): Caller("key:bob/batch", 2, quotas=(limit,))}
        router.add("m", Grant(simserver.port), status="loaded")
        auth = {"authorization": "Bearer rp-bob"}
        first = await client.post("/tokenize", {"model": "m"}, headers=auth)
        assert first.status == 200
        second = await client.post("/tokenize", {"model": "m"}, headers=auth)
        assert second.status == 429
        assert second.header("retry-after") == "60"
        assert second.json() == {
            "error": {
                "code": 429,
                "message": "API key bob/batch is over its quota of 1 request per minute; "
                "retry in 60 s",
                "type": "rate_limit_error",
            }
        }
        assert len(router.of_type("router.acquire")) == 1  # refused before the queue


@pytest.mark.django_db
class TestPanel:
    def test_an_admin_sets_changes_and_removes_a_quota_and_each_change_is_audited(
        self, admin_client: Any, viewer: Any
    ) -> None:
        from models_app.models import AuditEvent, AuditKind

        subject = f"user:{viewer.pk}"

        def opened_page() -> dict[str, str]:
            return opened(admin_client, "/usage/")

        done = admin_client.post(
            "/usage/quotas/",
            {"subject": subject, "tokens_per_day": "5000"} | opened_page(),
            follow=True,
        )
        assert "Quota of user vera: 5,000 tokens per day." in done.content.decode()
        quota = Quota.objects.get(user=viewer, key=None)
        assert (quota.tokens_per_day, quota.requests_per_minute) == (5000, None)
        body = {"subject": subject, "requests_per_minute": "30"}
        admin_client.post("/usage/quotas/", body | opened_page())
        quota.refresh_from_db()
        assert (quota.tokens_per_day, quota.requests_per_minute) == (None, 30)
        admin_client.post("/usage/quotas/", {"subject": subject} | opened_page())  # both empty
        assert not Quota.objects.exists()
        rows = list(AuditEvent.objects.filter(kind=AuditKind.QUOTA_CHANGED).order_by("id"))
        assert [r.details["changes"] for r in rows] == [
            {"tokens_per_day": [None, 5000]},
            {"requests_per_minute": [None, 30], "tokens_per_day": [5000, None]},
            {"requests_per_minute": [30, None]},
        ]
        assert {r.actor for r in rows} == {"user:ada"}

    def test_a_bad_limit_saves_nothing_and_says_why(self, admin_client: Any, viewer: Any) -> None:
        done = admin_client.post(
            "/usage/quotas/",
            {"subject": f"user:{viewer.pk}", "tokens_per_day": "-3"}
            | opened(admin_client, "/usage/"),
            follow=True,
        )
        assert "Quota not saved: Tokens per day:" in done.content.decode()
        assert not Quota.objects.exists()

    def test_a_key_quota_and_what_a_viewer_sees(
        self, admin_client: Any, viewer_client: Any, viewer: Any, operator: Any
    ) -> None:
        key, _ = ApiKey.objects.issue(viewer, "laptop")
        body = {"subject": f"key:{key.pk}", "tokens_per_day": "100"}
        admin_client.post("/usage/quotas/", body | opened(admin_client, "/usage/"))
        Quota.objects.create(user=operator, requests_per_minute=5)
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        UsageHour.objects.create(
            hour=today, actor="vera", key="vera/laptop", model="m", requests=3,
            prompt_tokens=90, completion_tokens=30,
        )  # fmt: skip
        page = viewer_client.get("/usage/").content.decode()
        assert "API key vera/laptop" in page and "user otto" not in page  # only what binds vera
        assert "120" in page and "used up" in page
        assert 'id="quota-form"' not in page  # only admins set quotas
        assert (
            viewer_client.post("/usage/quotas/", {"subject": f"user:{viewer.pk}"}).status_code
            == 403
        )
        everyone = admin_client.get("/usage/").content.decode()
        assert "key vera/laptop" in everyone and "user otto" in everyone
