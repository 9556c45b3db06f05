"""What a preset file's keys become in a real ``manage.py serve``.

Router flags (``models-max``, ``api-key``, …) in a preset file are warned about and dropped, as
llama.cpp drops them: never stored, exported or passed to a child, even to a program of the
preset's own whose options do not know them. Every ``/models`` entry carries ``status.preset``,
the preset's options as INI text, as llama.cpp's router sends it.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.serving import manage_beside, run_manage, sim_preset, simserver_processes


def test_router_flags_are_dropped_and_every_entry_carries_its_preset(tmp_path: Path) -> None:
    marker = f"keys-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text("[*]\nmodels-max = 2\n\n" + sim_preset("a", marker, extra="api-key = sk-x\n"))
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        log = server.output()
        assert "line 2: 'models-max' in preset '*' is ignored" in log, log[-2000:]
        loaded = httpx.post(f"{server.url}/models/load", json={"model": "a"}, timeout=60)
        assert loaded.status_code == 200, loaded.text
        [child] = simserver_processes(marker, server.process.pid)
        argv = child.cmdline()
        assert "--models-max" not in argv and "--api-key" not in argv and "sk-x" not in argv
        exported = manage_beside(server, "export_presets")
        assert "models-max" not in exported and "api-key" not in exported
        for path in ("/models", "/v1/models"):
            [entry] = httpx.get(f"{server.url}{path}", timeout=10).json()["data"]
            preset = entry["status"]["preset"]
            assert preset.startswith("[a]\n") and preset.endswith("\n\n"), preset
            assert "sim-tag = " + marker in preset and "port" not in preset
