"""Team limits under a burst, on a real ``manage.py serve`` with simulated children (issue 17).

- A key with a requests-per-minute quota fires 120 requests at once beside another user's 60:
  exactly its quota is served, every other one of its requests is a 429 naming the quota with a
  Retry-After within the minute, and the other user loses nothing.
- ``--queue-policy fair`` with 300 concurrent requests from three owners of different priority
  over three models and two slots: every request is answered 200 and a third child never runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx

from tests.support.chaos import chat, record
from tests.support.serving import LiveChildSampler, Server, manage_beside

SET_UP = """
from django.contrib.auth import get_user_model
from models_app.models import ApiKey, Quota
users = get_user_model().objects
for name, priority in (("heavy", "low"), ("light", "high"), ("third", "normal")):
    user = users.create_user(name)
    key, secret = ApiKey.objects.issue(user, "k", priority=priority)
    if name == "heavy":
        Quota.objects.create(key=key, user=user, requests_per_minute=RPM)
    print(name, secret)
"""


def keys(server: Server, rpm: int) -> dict[str, str]:
    out = manage_beside(server, "shell", "-c", SET_UP.replace("RPM", str(rpm)))
    return dict(line.split() for line in out.splitlines() if " rp-" in line)


async def fire(url: str, plan: list[tuple[str, str]]) -> list[httpx.Response]:
    """Send every (key, model) of ``plan`` at once; return the answers in plan order."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one(key: str, model: str) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"}
            return await client.post("/v1/chat/completions", json=chat(model), headers=headers)

        return list(await asyncio.gather(*(one(k, m) for k, m in plan)))


def test_a_requests_per_minute_quota_holds_exactly_under_a_burst(serve: Any) -> None:
    rpm = 25
    with serve(serve.preset("small", load_ms=50), 1) as server:
        secret = keys(server, rpm)
        plan = [(secret["heavy"], "small")] * 120 + [(secret["light"], "small")] * 60
        started = time.monotonic()
        answers = asyncio.run(fire(server.url, plan))
        wall = time.monotonic() - started
    heavy, light = answers[:120], answers[120:]
    statuses = Counter(a.status_code for a in heavy)
    record(
        "rpm quota burst", requests=len(plan), quota=rpm, heavy=dict(statuses),
        light=dict(Counter(a.status_code for a in light)), seconds=round(wall, 2),
    )  # fmt: skip
    assert statuses == {200: rpm, 429: 120 - rpm}, statuses
    for refused in (a for a in heavy if a.status_code == 429):
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error", error
        assert error["message"].startswith(f"API key heavy/k is over its quota of {rpm} requests")
        assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert [a.status_code for a in light] == [200] * 60  # another user loses nothing


def test_fair_share_answers_a_burst_of_three_owners_with_two_slots(serve: Any) -> None:
    presets = "".join(serve.preset(f"m{i}", load_ms=100) for i in range(3))
    with (
        serve(presets, 2, "--queue-policy", "fair") as server,
        LiveChildSampler(serve.marker, server.process.pid) as peak,
    ):
        secret = keys(server, 10_000)
        owners = ["heavy", "light", "third"]
        plan = [(secret[owners[i % 3]], f"m{(i // 3) % 3}") for i in range(300)]
        started = time.monotonic()
        answers = asyncio.run(fire(server.url, plan))
        wall = time.monotonic() - started
        statuses = Counter(a.status_code for a in answers)
        record(
            "fair share burst", requests=len(plan), models=3, models_max=2,
            statuses=dict(statuses), seconds=round(wall, 2), peak_children=peak.maximum,
        )  # fmt: skip
        assert statuses == {200: 300}, statuses
        assert all(a.json()["choices"][0]["message"]["content"] for a in answers)
        assert peak.samples > 10 and peak.maximum == 2  # swaps happened, never a third child
