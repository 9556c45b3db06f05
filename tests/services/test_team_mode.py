"""Team mode for real: ``serve --no-router`` and ``runrouter`` as two processes over Redis.

PostgreSQL holds the presets, Redis carries the channel layer, simulated llama-servers are the
children. A sampler counts live children every 5 ms while requests swap models concurrently.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.serving import (
    LiveChildSampler,
    in_threads,
    run_manage,
    sim_preset,
    simserver_processes,
)
from tests.support.team_mode import chat, team


def test_requests_swap_models_through_two_processes(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    marker = f"team-{tmp_path.name}"
    presets = "".join(sim_preset(name, marker, load_ms=100) for name in "abc")
    with team(tmp_path, pg_database, redis_url, presets, 1) as (router, web):
        with LiveChildSampler(marker, router.process.pid) as sampler:
            results: list[int] = []
            lock = threading.Lock()

            def ask(model: str) -> None:
                response = httpx.post(
                    f"{web.url}/v1/chat/completions", json=chat(model), timeout=90
                )
                with lock:
                    results.append(response.status_code)

            in_threads(ask, "abcabc")
        assert results == [200] * 6
        print(f"team mode swap: max live children {sampler.maximum} over {sampler.samples} samples")
        assert sampler.saw() == (1, {"a", "b", "c"})  # each model ran, never two at once
        listed = httpx.get(f"{web.url}/v1/models").json()["data"]
        assert sum(m["status"]["value"] == "loaded" for m in listed) == 1
    assert simserver_processes(marker) == []


def test_a_dead_web_process_does_not_pin_its_model_forever(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    marker = f"lease-{tmp_path.name}"
    presets = sim_preset("a", marker, token_ms=200) + sim_preset("b", marker)
    with team(tmp_path, pg_database, redis_url, presets, 1, "--lease-ttl", "3") as (router, web):
        env = {"DATABASE_URL": pg_database, "REDIS_URL": redis_url}
        with run_manage(
            ["serve", "--no-router"], tmp_path / "doomed", env=env, port=free_port()
        ) as doomed:
            stream = httpx.stream(
                "POST", f"{doomed.url}/v1/chat/completions", json=chat("a", 200, True), timeout=60
            )
            with stream as response:
                next(response.iter_bytes())  # a is streaming through the doomed web process
                doomed.process.send_signal(signal.SIGKILL)
                doomed.process.wait(10)
        started = time.monotonic()
        response = httpx.post(f"{web.url}/v1/chat/completions", json=chat("b"), timeout=90)
        waited = time.monotonic() - started
        # Without lease expiry a's request would stay in flight forever and b would never get
        # the only slot: the 90 s timeout would fail this test.
        assert response.status_code == 200, (
            f"{response.text} after {waited:.1f}s; router log:\n{router.output()[-3000:]}"
        )
        assert waited < 30
        print(f"b was served {waited:.1f}s after the web process died (lease ttl 3s)")


def test_a_second_router_on_the_same_host_is_refused(
    tmp_path: Path, pg_database: str, redis_url: str
) -> None:
    marker = f"lock-{tmp_path.name}"
    with team(tmp_path, pg_database, redis_url, sim_preset("a", marker), 1):
        env = {**os.environ, "DATABASE_URL": pg_database, "REDIS_URL": redis_url,
               "ROUTERPANEL_DATA_DIR": str(tmp_path / "second")}  # fmt: skip
        import subprocess
        import sys

        from tests.support.serving import ROOT

        second = subprocess.run(
            [sys.executable, "manage.py", "runrouter"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0
        assert "another router is already running" in second.stderr


@pytest.fixture(autouse=True)
def _needs_services(pg_database: str, redis_url: str) -> None:
    """Both services must be up (the fixtures skip, or fail under CI=true, when they are not)."""
