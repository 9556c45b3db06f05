"""The database is the one source of truth: a change any process makes reaches the router.

A real ``manage.py serve``, and ``manage.py import_presets`` run beside it as a second process (as
a user would): a new preset is listed by ``/v1/models`` and served, with no reload asked for; a
changed preset whose model runs is restarted with its new command; a removed one is stopped
and no longer listed. The same for a change made with plain SQL, which no Django signal sees.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.serving import (
    LiveChildSampler,
    manage_beside,
    run_manage,
    sim_preset,
    simserver_processes,
    wait_until,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def listed(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]}


def test_a_cli_import_beside_serve_is_listed_served_restarted_and_removed(
    tmp_path: Path,
) -> None:
    marker = f"dbchange-{tmp_path.name}"
    ini = tmp_path / "first.ini"
    ini.write_text(sim_preset("a", marker))
    args = ["serve", "--models-preset", str(ini), "--models-max", "1"]
    with (
        run_manage(args, tmp_path / "data", port=free_port()) as server,
        LiveChildSampler(marker, server.process.pid) as sampler,
    ):
        url = server.url
        assert listed(url) == {"a"}
        phi = tmp_path / "phi.ini"
        phi.write_text(sim_preset("phi-3-mini", marker))
        out = manage_beside(server, "import_presets", str(phi))
        committed = time.monotonic()  # the import's process has ended: its rows are committed
        assert "1 created" in out
        wait_until(lambda: "phi-3-mini" in listed(url), 10, "the imported preset listed")
        seen_after = time.monotonic() - committed
        print(f"a CLI import was listed by /v1/models {seen_after * 1000:.0f} ms after it ended")
        chat = httpx.post(
            f"{url}/v1/chat/completions", json=CHAT | {"model": "phi-3-mini"}, timeout=60
        )
        assert chat.status_code == 200, chat.text
        [before] = [p.pid for p in simserver_processes(marker, server.process.pid)]

        phi.write_text(sim_preset("phi-3-mini", marker, extra="sim-token-ms = 1\n"))
        assert "1 updated" in manage_beside(server, "import_presets", str(phi))

        def restarted() -> bool:
            now = simserver_processes(marker, server.process.pid)
            return len(now) == 1 and now[0].pid != before and "--sim-token-ms" in now[0].cmdline()

        wait_until(restarted, 30, "phi-3-mini restarted with its changed command")

        db = sqlite3.connect(server.data_dir / "routerpanel.sqlite3", timeout=30)
        with db:  # a change no Django code makes: only the database's triggers see it
            db.execute("DELETE FROM models_app_preset WHERE name = ?", ("phi-3-mini",))
        db.close()
        wait_until(lambda: "phi-3-mini" not in listed(url), 10, "the deleted preset gone")
        wait_until(lambda: not simserver_processes(marker, server.process.pid), 30, "stopped")
        sampler.sample_enough()
    # A restart for a changed preset stops the old child before it starts the new (A6, A14).
    assert sampler.saw() == (1, {"phi-3-mini"})
