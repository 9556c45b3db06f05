"""Receipts and usage through a real ``manage.py serve`` with simulated children (issue 17).

models_max 1 and two models: a chat for the second one evicts the first, waits for its own
load, and its answer says so (``X-RouterPanel-Queue-Ms``, ``-Load-Ms``, ``-Evicted``); the
usage row lands in the database and ``GET /usage`` charges the load to the key that caused it,
with the child's token counts, streamed or not.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.scoped_keys import chat, create_key
from tests.support.serving import run_manage, sim_preset

LOAD_MS = 400


def usage_rows(client: httpx.Client, by: str) -> list[dict[str, object]]:
    answer = client.get("/usage", params={"by": by})
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, object]] = answer.json()["data"]
    return rows


def test_a_swap_is_on_the_receipt_and_charged_to_its_cause(tmp_path: Path) -> None:
    marker = f"usage-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text(sim_preset("small", marker) + sim_preset("big", marker, load_ms=LOAD_MS))
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        secret = create_key(server, "batch")
        client = server.client(headers={"authorization": f"Bearer {secret}"})

        first = client.post("/v1/chat/completions", json=chat("small", tokens=3))
        assert first.status_code == 200, first.text
        assert int(first.headers["x-routerpanel-load-ms"]) > 0  # small was loaded for it
        assert "x-routerpanel-evicted" not in first.headers

        again = client.post("/v1/chat/completions", json=chat("small", tokens=3))
        assert again.headers["x-routerpanel-load-ms"] == "0"  # already loaded
        assert "x-routerpanel-evicted" not in again.headers

        with client.stream(
            "POST", "/v1/chat/completions", json=chat("big", tokens=4, stream=True)
        ) as swap:
            assert swap.status_code == 200
            body = b"".join(swap.iter_bytes())
            headers = swap.headers
        assert b"[DONE]" in body
        assert headers["x-routerpanel-evicted"] == "small"
        assert int(headers["x-routerpanel-load-ms"]) >= LOAD_MS
        assert int(headers["x-routerpanel-queue-ms"]) >= int(headers["x-routerpanel-load-ms"])

        deadline = time.monotonic() + 30
        rows: list[dict[str, object]] = []
        while time.monotonic() < deadline:  # written in a batch, off the request path
            rows = usage_rows(client, "model")
            if sum(int(str(r["requests"])) for r in rows) == 3:
                break
            time.sleep(0.2)
        by_model = {r["model"]: r for r in rows}
        assert by_model["big"]["requests"] == 1
        assert by_model["big"]["loads_caused"] == 1
        assert float(str(by_model["big"]["load_seconds_caused"])) >= LOAD_MS / 1000
        assert by_model["big"]["completion_tokens"] == 4  # from the stream's last chunk
        assert by_model["small"]["requests"] == 2
        assert by_model["small"]["loads_caused"] == 1
        assert by_model["small"]["completion_tokens"] == 6
        assert int(str(by_model["small"]["prompt_tokens"])) > 0

        (mine,) = usage_rows(client, "actor")
        assert mine["actor"] == "admin" and mine["requests"] == 3 and mine["loads_caused"] == 2
        (key,) = usage_rows(client, "key")
        assert key["key"] == "admin/batch"

        bad = client.get("/usage", params={"by": "colour"})
        assert bad.status_code == 400
        assert bad.json()["error"]["type"] == "invalid_request_error"
        assert client.get("/usage", params={"since": "yesterday"}).status_code == 400

        metrics = client.get("/metrics").text
        assert 'routerpanel_usage_requests_total{actor="admin",model="big"} 1' in metrics
