"""Receipts and usage in team mode: ``runrouter`` and ``serve --no-router`` over Redis, usage
rows in PostgreSQL (issue 17.2, 17.3)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support.serving import sim_preset
from tests.support.team_mode import chat, team

LOAD_MS = 300


def test_a_swap_over_redis_is_on_the_receipt_and_in_usage(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    marker = f"usage-team-{tmp_path.name}"
    presets = sim_preset("small", marker) + sim_preset("big", marker, load_ms=LOAD_MS)
    with team(tmp_path, pg_database, redis_url, presets, 1) as (_, web):
        client = httpx.Client(base_url=web.url, timeout=90)
        first = client.post("/v1/chat/completions", json=chat("small"))
        assert first.status_code == 200, first.text
        swap = client.post("/v1/chat/completions", json=chat("big", tokens=4))
        assert swap.status_code == 200, swap.text
        assert swap.headers["x-routerpanel-evicted"] == "small"
        assert int(swap.headers["x-routerpanel-load-ms"]) >= LOAD_MS

        deadline = time.monotonic() + 30
        rows: dict[str, dict[str, object]] = {}
        while time.monotonic() < deadline and len(rows) < 2:
            answer = client.get("/usage", params={"by": "model"})
            assert answer.status_code == 200, answer.text
            rows = {str(r["model"]): r for r in answer.json()["data"]}
            time.sleep(0.2)
        assert rows["big"]["loads_caused"] == 1 and rows["big"]["completion_tokens"] == 4
        assert float(str(rows["big"]["load_seconds_caused"])) >= LOAD_MS / 1000
