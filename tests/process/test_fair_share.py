"""Fair share through a real ``manage.py serve`` with simulated children (issue 17.5).

``--models-max 1``, two static keys: the first (``key:api-key-1``) is the heavy user, the second
(``key:api-key-2``) the light one. The heavy user streams a long answer from ``c`` and, while it
runs, queues three requests for ``a``; then the light user asks for ``b``. When ``c`` is free:

* under ``--queue-policy fair`` the light user (no recent use) is served first: ``b`` loads and
  answers before any of the heavy user's backlog for ``a``;
* under ``fifo`` (the default) the queue is served in arrival order: ``a`` first, then ``b``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.serving import run_manage, sim_preset, wait_until

HEAVY, LIGHT = "heavy-key-0123456789", "light-key-0123456789"


def chat(model: str, tokens: int, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": messages, "max_tokens": tokens, "stream": stream}


@pytest.mark.parametrize("policy", ["fair", "fifo"])
def test_a_light_users_request_is_served_before_a_heavy_backlog_only_under_fair(
    tmp_path: Path, policy: str
) -> None:
    marker = f"fair-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text("".join(sim_preset(m, marker, token_ms=100) for m in ("a", "b", "c")))
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    args += ["--api-key", f"{HEAVY},{LIGHT}"]
    if policy == "fair":
        args += ["--queue-policy", "fair"]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        done: dict[str, float] = {}
        status: dict[str, int] = {}
        streaming = threading.Event()

        def send(name: str, key: str, body: dict[str, Any]) -> None:
            client = server.client(headers={"authorization": f"Bearer {key}"})
            with client, client.stream("POST", "/v1/chat/completions", json=body) as response:
                status[name] = response.status_code
                for _ in response.iter_raw():
                    streaming.set()
            done[name] = time.monotonic()

        def depth(model: str) -> int:
            client = server.client(headers={"authorization": f"Bearer {LIGHT}"})
            with client:
                listing = client.get("/v1/models").json()["data"]
            return int(next(m for m in listing if m["id"] == model)["queue_depth"])

        threads = [threading.Thread(target=send, args=("hold", HEAVY, chat("c", 40, True)))]
        threads[0].start()
        assert streaming.wait(60), "the heavy user's stream on c never started"
        for i in range(3):
            threads.append(threading.Thread(target=send, args=(f"a{i}", HEAVY, chat("a", 2))))
            threads[-1].start()
        wait_until(lambda: depth("a") == 3, 30, "three heavy requests queued for a")
        threads.append(threading.Thread(target=send, args=("light", LIGHT, chat("b", 2))))
        threads[-1].start()
        wait_until(lambda: depth("b") == 1, 30, "the light request queued for b")
        assert "hold" not in done, "c's stream ended before the queue was set up: too short"
        for thread in threads:
            thread.join(90)
        assert set(status.values()) == {200}, status
        heavy = [done[f"a{i}"] for i in range(3)]
        if policy == "fair":
            assert done["light"] < min(heavy), (done, "fair: b should go before a")
        else:
            assert done["light"] > max(heavy), (done, "fifo: a arrived first")
