"""A child that crashes after every request is not respawned at once, forever.

Before issue 11: eight requests, eight crashes, eight respawns. Now each quick death holds the
next start back 1, 2, 4 … s; requests meanwhile get 503 with Retry-After saying why; the audit
log has a row per back-off; an explicit load starts it again at once.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import httpx

from tests.support.auditdb import wait_for_rows
from tests.support.chaos import chat, record
from tests.support.serving import wait_until


def model_row(url: str, name: str) -> dict[str, Any]:
    rows = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
    return next(m for m in rows if m["id"] == name)


def test_a_crash_loop_backs_off_and_an_explicit_load_resets_it(serve: Any) -> None:
    presets = serve.preset("c", extra="sim-crash-after = 1\n")
    with serve(presets, 1) as server:
        url = server.url
        spawned_at: list[float] = []
        outcomes: list[tuple[float, int, str | None]] = []
        started = time.monotonic()
        while time.monotonic() - started < 8.0:
            response = httpx.post(f"{url}/v1/chat/completions", json=chat("c"), timeout=30)
            outcomes.append(
                (
                    time.monotonic() - started,
                    response.status_code,
                    response.headers.get("retry-after"),
                )
            )
            if response.status_code == 200:
                spawned_at.append(time.monotonic() - started)
            time.sleep(0.05)
        served = [o for o in outcomes if o[1] == 200]
        refused = [o for o in outcomes if o[1] == 503]
        assert 2 <= len(served) <= 5, outcomes  # 1, 2, 4 s apart: not one per request
        assert refused and all(o[2] is not None and int(o[2]) >= 1 for o in refused)
        assert {o[1] for o in outcomes} <= {200, 503}
        body = httpx.post(f"{url}/v1/chat/completions", json=chat("c"), timeout=30)
        if body.status_code == 503:
            assert "died soon after it started" in body.json()["error"]["message"]
        gaps = [b - a for a, b in itertools.pairwise(spawned_at)]
        assert all(g2 > g1 * 1.4 for g1, g2 in itertools.pairwise(gaps)), gaps
        rows = wait_for_rows(server.data_dir, "crash_backoff", len(served) - 1)
        assert "died soon after it started" in rows[0]["reason"]
        backoff = model_row(url, "c")["backoff"]
        if backoff is not None:  # shown while it lasts
            assert backoff["strikes"] >= 1 and "exit code 3" in backoff["reason"]

        # An explicit load clears the back-off: it starts at once.
        load = httpx.post(f"{url}/models/load", json={"model": "c"}, timeout=30)
        assert load.status_code == 200, load.text
        wait_until(lambda: model_row(url, "c")["status"]["value"] == "loaded", 30, "c loaded")
        record(
            "crash after every request", requests=len(outcomes), children_started=len(served),
            refused_503=len(refused), gaps_s=[round(g, 2) for g in gaps],
            explicit_load_resets=True,
        )  # fmt: skip
