"""A burst of concurrent requests over more models than slots: every one is answered, no 5xx.

The bench (bench/burst.py) fires 1,000; this is the smaller version that runs with every test
run: 300 concurrent chats over three simulated models with ``--models-max 2``, which makes the
router swap while hundreds wait. Before issue 11 the in-memory channel's capacity of 100 turned
some of them into 500s.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from tests.support.chaos import chat, record
from tests.support.serving import LiveChildSampler

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too

REQUESTS = 300


async def fire(url: str, n: int) -> tuple[Counter[int], list[float]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one(i: int) -> tuple[int, float]:
            started = time.monotonic()
            response = await client.post("/v1/chat/completions", json=chat(f"m{i % 3}"))
            if response.status_code == 200:
                assert response.json()["choices"][0]["message"]["content"]
            return response.status_code, time.monotonic() - started

        results = await asyncio.gather(*(one(i) for i in range(n)))
    return Counter(status for status, _ in results), sorted(t for _, t in results)


def test_a_burst_over_more_models_than_slots_gets_no_5xx(serve: Any) -> None:
    presets = "".join(serve.preset(f"m{i}", load_ms=100) for i in range(3))
    with serve(presets, 2) as server, LiveChildSampler(serve.marker, server.process.pid) as peak:
        started = time.monotonic()
        statuses, latencies = asyncio.run(fire(server.url, REQUESTS))
        wall = time.monotonic() - started
        answered = sum(statuses.values())
        p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99) - 1]
        record(
            "burst", requests=REQUESTS, models=3, models_max=2, statuses=dict(statuses),
            seconds=round(wall, 2), p50=round(p50, 3), p99=round(p99, 3),
            peak_children=peak.maximum,
        )  # fmt: skip
        assert answered == REQUESTS
        assert statuses == {200: REQUESTS}, statuses
        assert peak.samples > 10 and peak.maximum == 2  # swaps happened, never a third child
        health = httpx.get(f"{server.url}/ready", timeout=5)
        assert health.status_code == 200
