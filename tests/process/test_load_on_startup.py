"""Load-on-startup presets and ``models_max`` through a real ``manage.py serve`` (A13).

More load-on-startup presets than ``models_max`` refuse to start with llama.cpp's message,
whether the limit comes from ``--models-max`` or from ``LLAMA_ARG_MODELS_MAX``, and no child
starts. ``--models-max 0`` is unlimited (llama.cpp refuses there too, ROUTER_SPEC §15.3): every
load-on-startup model runs, and one more loads beside them without an eviction.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.serving import ROOT, LiveChildSampler, run_manage, sim_preset, stop, wait_until

START_TIMEOUT = 90


def presets(marker: str, at_startup: str, later: str = "") -> str:
    startup = "load-on-startup = true\n"
    sections = [sim_preset(name, marker, extra=startup) for name in at_startup]
    return "".join(sections + [sim_preset(name, marker) for name in later])


def loaded(client: httpx.Client) -> set[str]:
    models = client.get("/v1/models").json()["data"]
    return {m["id"] for m in models if m["status"]["value"] == "loaded"}


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--models-max", "2"], {}), ([], {"LLAMA_ARG_MODELS_MAX": "2"})],
    ids=["flag", "environment"],
)
def test_more_startup_models_than_models_max_refuse_to_start_with_llama_cpps_message(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    marker = f"startup-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text(presets(marker, "abc"))
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    full_env = inherited | {
        "ROUTERPANEL_DATA_DIR": str(tmp_path / "data"),
        "ROUTERPANEL_ADMIN_PASSWORD": "test-only-password",
        **env,
    }
    command = [sys.executable, "manage.py", "serve", "--port", str(free_port())]
    command += ["--models-preset", str(ini), *args]
    process = subprocess.Popen(
        command, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        with LiveChildSampler(marker, process.pid) as sampler:

            def over() -> bool:  # it exited by itself, or started a child instead of refusing
                return process.poll() is not None or sampler.maximum > 0

            wait_until(over, START_TIMEOUT, "serve to refuse")
    finally:
        stop(process)
    stdout, stderr = process.communicate(timeout=10)
    assert b"RouterPanel on http" not in stdout  # it never said it was serving
    assert sampler.saw() == (0, set())  # no child was started (the next test sees children)
    assert process.returncode == 1
    assert stderr.decode().splitlines() == [
        "failed to start the router: number of models to load on startup (3) exceeds models_max (2)"
    ]


def test_models_max_0_runs_every_startup_model_and_loads_one_more_without_an_eviction(
    tmp_path: Path,
) -> None:
    marker = f"unlimited-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text(presets(marker, "abc", later="d"))
    with (
        run_manage(
            ["serve", "--models-preset", str(ini), "--models-max", "0"],
            tmp_path / "data",
            port=free_port(),
        ) as server,
        LiveChildSampler(marker, server.process.pid) as sampler,
        server.client() as client,
    ):
        assert client.get("/props").json()["max_instances"] == 0
        wait_until(lambda: loaded(client) == {"a", "b", "c"}, 30, "the startup models")
        chat = {"model": "d", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        response = client.post("/v1/chat/completions", json=chat, timeout=20)  # loads in 50 ms
        assert response.status_code == 200, response.text
        assert loaded(client) == {"a", "b", "c", "d"}  # nothing was evicted for d
        assert sampler.saw() == (4, {"a", "b", "c", "d"})
