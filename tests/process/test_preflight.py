"""A load that cannot start evicts nobody and is answered at once, naming what is missing.

A real ``manage.py serve`` with ``--models-max 2``: two simulated models run, idle, so the
third would evict the older one. Its ``server-bin`` does not exist: the request is answered
503 at once with the path and the preset, both models keep running (sampled throughout), the
audit log has one ``load_refused`` row and no eviction. Then the same with a missing model file.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.support.auditdb import audit_rows, wait_for_rows
from tests.support.ports import free_port
from tests.support.serving import LiveChildSampler, run_manage, sim_preset

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def loaded(url: str) -> set[str]:
    data = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return {m["id"] for m in data if m["status"]["value"] == "loaded"}


def test_a_model_that_cannot_start_evicts_nobody_and_says_why(tmp_path: Path) -> None:
    marker = f"preflight-{tmp_path.name}"
    missing_bin = tmp_path / "opt" / "llama" / "bin" / "llama-server"
    missing_model = tmp_path / "models" / "gone.gguf"
    ini = tmp_path / "models.ini"
    ini.write_text(
        sim_preset("a", marker)
        + sim_preset("b", marker)
        + f"[qwen2.5-7b]\nserver-bin = {missing_bin}\n"
        + sim_preset("no-file", marker, extra=f"model = {missing_model}\n")
    )
    args = ["serve", "--models-preset", str(ini), "--models-max", "2"]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        url = server.url
        for name in ("a", "b"):
            chat = httpx.post(f"{url}/v1/chat/completions", json=CHAT | {"model": name}, timeout=60)
            assert chat.status_code == 200, chat.text
        with LiveChildSampler(marker, server.process.pid) as sampler:
            started = time.monotonic()
            refused = httpx.post(
                f"{url}/v1/chat/completions", json=CHAT | {"model": "qwen2.5-7b"}, timeout=60
            )
            took = time.monotonic() - started
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"] == {
                "code": 503,
                "message": f"llama-server not found: {missing_bin} (preset qwen2.5-7b)",
                "type": "unavailable_error",
            }
            no_file = httpx.post(f"{url}/models/load", json={"model": "no-file"}, timeout=60)
            assert no_file.status_code == 503, no_file.text
            message = no_file.json()["error"]["message"]
            assert message == f"model file not found: {missing_model} (preset no-file)"
            assert loaded(url) == {"a", "b"}  # nobody was evicted for either
            rows = wait_for_rows(server.data_dir, "load_refused", 2)
            assert loaded(url) == {"a", "b"}
            sampler.sample_enough()
        assert sampler.saw() == (2, {"a", "b"})
        print(f"a request for a model that cannot start was answered in {took * 1000:.0f} ms")
        assert [(r["model"], r["trigger_request"] != "") for r in rows] == [
            ("qwen2.5-7b", True),
            ("no-file", True),
        ]
        assert "nobody evicted" in rows[0]["reason"] and str(missing_bin) in rows[0]["reason"]
        assert audit_rows(server.data_dir, "WHERE kind = ?", "eviction") == []
        card = next(
            m for m in httpx.get(f"{url}/models", timeout=10).json()["data"]
            if m["id"] == "qwen2.5-7b"
        )  # fmt: skip
        assert card["status"]["value"] == "unloaded"


def test_a_load_that_passed_the_check_and_failed_names_what_it_evicted(tmp_path: Path) -> None:
    """The check cannot see everything (a corrupt model file): the cost is then in the audit."""
    marker = f"preflight-cost-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text(
        sim_preset("a", marker) + sim_preset("broken", marker, extra="sim-fail-load = true\n")
    )
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        url = server.url
        assert httpx.post(
            f"{url}/v1/chat/completions", json=CHAT | {"model": "a"}, timeout=60
        ).is_success
        failed = httpx.post(
            f"{url}/v1/chat/completions", json=CHAT | {"model": "broken"}, timeout=60
        )
        assert failed.status_code == 500, failed.text
        [row] = wait_for_rows(server.data_dir, "load_failed")
        assert row["model"] == "broken" and row["reason"].endswith("a had been evicted for it")
