"""``GET /models?reload=1`` after editing the ``--models-preset`` file, as llama.cpp does it.

A real ``manage.py serve --models-preset FILE``: a section renamed in the file replaces its old
preset (which is stopped if it runs); presets made elsewhere stay (ROUTER_SPEC 2.19–2.20).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.ports import free_port
from tests.support.serving import ROOT, run_manage, sim_preset, simserver_processes, wait_until


def model_ids(client: object) -> list[str]:
    response = client.get("/models", params={"reload": "1"})  # type: ignore[attr-defined]
    assert response.status_code == 200, response.text
    return sorted(entry["id"] for entry in response.json()["data"])


def test_a_renamed_section_replaces_the_old_model_and_stops_it(tmp_path: Path) -> None:
    marker = f"reload-{tmp_path.name}"
    data = tmp_path / "data"
    data.mkdir()
    by_hand = tmp_path / "by-hand.ini"
    by_hand.write_text(sim_preset("by-hand", marker))
    for command in (["migrate", "-v0"], ["import_presets", str(by_hand)]):
        done = subprocess.run(
            [sys.executable, "manage.py", *command],
            cwd=ROOT,
            env={**os.environ, "ROUTERPANEL_DATA_DIR": str(data)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    ini = tmp_path / "models.ini"
    ini.write_text(sim_preset("model-a", marker) + sim_preset("model-b", marker))

    with run_manage(["serve", "--models-preset", str(ini)], data, port=free_port()) as server:
        client = server.client()
        assert model_ids(client) == ["by-hand", "model-a", "model-b"]
        loaded = client.post("/models/load", json={"model": "model-a"})
        assert loaded.status_code == 200, loaded.text
        pid = server.process.pid
        wait_until(lambda: len(simserver_processes(marker, pid)) == 1, 30, "model-a running")

        ini.write_text(sim_preset("model-z", marker) + sim_preset("model-b", marker))
        # The reload answers once model-a has stopped, and lists it no more (ROUTER_SPEC 2.19).
        assert model_ids(client) == ["by-hand", "model-b", "model-z"]
        assert simserver_processes(marker, pid) == []
        gone = client.post("/models/load", json={"model": "model-a"})
        assert gone.status_code == 404
