"""No request waits without an end (a real ``manage.py serve``).

With both slots held by pinned models, a request for a third model can never get a slot while
nothing changes: it is answered 503 at once with the reason. One that asked to wait
(``X-RouterPanel-Wait: 1``) waits, shows in the queue, and is answered 503 with Retry-After at
the max wait (``serve --max-wait``; 600 s by default).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port
from tests.support.serving import LiveChildSampler, run_manage, sim_preset, wait_until

CHAT = {"model": "c", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def queue_depth(url: str, model: str) -> int:
    data = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return int(next(m for m in data if m["id"] == model)["queue_depth"])


def test_a_request_no_slot_can_ever_serve_is_answered_at_once_or_at_max_wait(
    tmp_path: Path,
) -> None:
    marker = f"blocked-{tmp_path.name}"
    pinned = "pinned = true\n"
    ini = tmp_path / "models.ini"
    ini.write_text(
        sim_preset("a", marker, extra=pinned) + sim_preset("b", marker, extra=pinned)
        + sim_preset("c", marker)
    )  # fmt: skip
    args = ["serve", "--models-preset", str(ini), "--models-max", "2", "--max-wait", "2"]
    with (
        run_manage(args, tmp_path / "data", port=free_port()) as server,
        LiveChildSampler(marker, server.process.pid) as sampler,
    ):
        url = server.url
        for name in ("a", "b"):
            assert httpx.post(f"{url}/models/load", json={"model": name}, timeout=60).is_success
        wait_until(lambda: queue_depth(url, "a") == 0 and _loaded(url) == {"a", "b"}, 30, "a, b")

        started = time.monotonic()
        refused = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=60)
        took = time.monotonic() - started
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["message"] == (
            "model name=c cannot start while nothing changes: all 2 slots are held (a is "
            "pinned, b is pinned); unpin one or raise models_max, or send X-RouterPanel-Wait: 1 "
            "to wait"
        )
        print(f"answered in {took * 1000:.0f} ms")

        answer: dict[str, Any] = {}

        def patient() -> None:
            headers = {"X-RouterPanel-Wait": "1"}
            asked = time.monotonic()
            response = httpx.post(
                f"{url}/v1/chat/completions", json=CHAT, headers=headers, timeout=60
            )
            answer.update(response=response, waited=time.monotonic() - asked)

        waiter = threading.Thread(target=patient)
        waiter.start()
        wait_until(lambda: queue_depth(url, "c") == 1, 30, "the patient request queued")
        waiter.join(60)
        response = answer["response"]
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "5"
        assert response.json()["error"]["message"] == "waited 2 s for model name=c; retry later"
        assert answer["waited"] >= 2.0
        assert _loaded(url) == {"a", "b"}
        sampler.sample_enough()
    assert sampler.saw() == (2, {"a", "b"})


def _loaded(url: str) -> set[str]:
    data = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return {m["id"] for m in data if m["status"]["value"] == "loaded"}
