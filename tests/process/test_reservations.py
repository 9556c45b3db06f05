"""Reservations through a real ``manage.py serve`` with simulated children (issue 17.6).

``--models-max 2``, three models, the schedule ticking every second
(``ROUTERPANEL_RESERVATIONS_TICK_SECONDS=1``, run by the embedded beat). An admin books ``big``
on the panel (the form, with its CSRF token) from this minute on: without any request for it,
``big`` is loaded (the booking runs the schedule once at commit). Under eviction pressure (``a``
loaded after it, then ``b`` asked for) the victim is ``a``, though ``big`` was used longest ago:
it is pinned. When the window is over (its end moved to now in the database) the embedded
beat's next tick ends it: ``big`` is evictable again and is the victim of the next load. The
audit log has one ``reservation_started`` and one ``reservation_ended`` row.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.serving import (
    Server,
    alias_of,
    run_manage,
    sim_preset,
    simserver_processes,
    wait_until,
)

DEADLINE = 20.0  # seconds: a tick is due every second; the machine is small and shared
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def signed_in(server: Server) -> httpx.Client:
    client = server.client(headers={"Origin": server.url, "Referer": f"{server.url}/"})
    token = TOKEN.search(client.get("/login/").text)
    assert token
    data = {"username": "admin", "password": "test-only-password"}
    client.post("/login/", data=data | {"csrfmiddlewaretoken": token.group(1)})
    assert "sessionid" in client.cookies, "sign-in failed"
    return client


def book(panel: httpx.Client, model: str) -> None:
    """Book ``model`` for the admin from this minute for an hour, through the form (UTC)."""
    page = panel.get("/reservations/").text
    token = TOKEN.search(page)
    admin = re.search(r'<option value="(user:\d+)">user admin</option>', page)
    assert token and admin, page[:500]
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    fmt = "%Y-%m-%dT%H:%M"
    data = {
        "csrfmiddlewaretoken": token.group(1), "model": model, "subject": admin.group(1),
        "starts_at": now.strftime(fmt), "ends_at": (now + timedelta(hours=1)).strftime(fmt),
        "note": "process test",
    }  # fmt: skip
    done = panel.post("/reservations/new/", data=data)
    assert done.status_code == 302, done.text[-2000:]


def live_models(server: Server, marker: str) -> set[str]:
    procs = simserver_processes(marker, server.process.pid)
    return {name for proc in procs if (name := alias_of(proc.cmdline()))}


def audit_rows(server: Server, kind: str) -> list[tuple[str, str, str]]:
    with sqlite3.connect(server.data_dir / "routerpanel.sqlite3", timeout=10) as db:
        sql = "SELECT model, actor, reason FROM models_app_auditevent WHERE kind = ? ORDER BY id"
        return list(db.execute(sql, (kind,)).fetchall())


def end_the_window_now(server: Server) -> None:
    """The window is over: its end moved to now (as Django stores times in SQLite: UTC)."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    with sqlite3.connect(server.data_dir / "routerpanel.sqlite3", timeout=10) as db:
        db.execute("UPDATE models_app_reservation SET ends_at = ?", (now,))


def chat(client: httpx.Client, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text


def test_a_reserved_model_is_loaded_in_advance_pinned_and_evictable_after_its_window(
    tmp_path: Path,
) -> None:
    marker = f"resv-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text("".join(sim_preset(m, marker) for m in ("big", "a", "b")))
    args = ["serve", "--models-preset", str(ini), "--models-max", "2"]
    env = {"ROUTERPANEL_RESERVATIONS_TICK_SECONDS": "1"}
    with run_manage(args, tmp_path / "data", port=free_port(), env=env) as server:
        assert live_models(server, marker) == set()
        with closing(signed_in(server)) as panel:
            book(panel, "big")
        wait_until(lambda: live_models(server, marker) == {"big"}, DEADLINE, "big loaded")
        wait_until(lambda: audit_rows(server, "reservation_started"), DEADLINE, "started row")
        with server.client() as client:
            chat(client, "a")  # big + a: both slots
            assert live_models(server, marker) == {"big", "a"}
            chat(client, "b")  # a slot for b: big is older, but reserved
            assert live_models(server, marker) == {"big", "b"}
            end_the_window_now(server)
            wait_until(lambda: audit_rows(server, "reservation_ended"), DEADLINE, "ended row")
            chat(client, "a")  # now big, used longest ago, is the victim
            assert live_models(server, marker) == {"a", "b"}
        (started,) = audit_rows(server, "reservation_started")
        (ended,) = audit_rows(server, "reservation_ended")
        for model, actor, reason in (started, ended):
            assert (model, actor) == ("big", "user:admin")
            assert "for user admin" in reason and "booked by user:admin" in reason
        assert "window over" in ended[2]
