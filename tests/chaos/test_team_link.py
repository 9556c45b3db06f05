"""Team mode's router connection under kill -9 (issue 16.2): real processes, PostgreSQL, Redis.

``runrouter`` and ``serve --no-router`` as a user runs them; acquire/renew/release/cancel go
over the socket the router advertises in its heartbeat (routing/link_client.py). Redis is the shared
one (these tests never stop it), under a key prefix of the test's own.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.support.auditdb import pg_audit_rows
from tests.support.chaos import chat, record
from tests.support.chaos_team import Team, kill_mid_stream, post_chat, until_served
from tests.support.serving import wait_until


def acquires(url: str) -> dict[str, int]:
    """The router's acquires by transport, from the web process's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.findall(r'routerpanel_acquires_total\{transport="(\w+)"\} ([0-9.e+]+)', text)
    return {kind: int(float(n)) for kind, n in found}


def kill_with_one_queued(router: Any, web: Any, socket_before: int) -> float:
    """Hold model a with a long answer, queue b behind it on the router link, kill -9 the
    router: b must be answered 503 router unavailable by the link's close, not the heartbeat
    (DEAD_AFTER, 6 s). Returns the seconds from the kill to b's answer."""
    answers: dict[str, Any] = {}

    def ask(model: str, **kw: Any) -> None:
        try:
            answers[model] = post_chat(web.url, model, timeout=60, **kw)
        except httpx.HTTPError as exc:  # a stream cut off by the child's death
            answers[model] = exc
        answers[f"{model}-at"] = time.monotonic()

    busy = threading.Thread(target=ask, args=("a",), kwargs={"tokens": 300})
    busy.start()
    wait_until(lambda: acquires(web.url).get("socket") == socket_before + 1, 20, "a's acquire")
    wait_until(lambda: b"loaded" in httpx.get(f"{web.url}/v1/models").content, 20, "a")
    waiter = threading.Thread(target=ask, args=("b",))
    waiter.start()  # b waits behind the busy a, on the link
    wait_until(lambda: acquires(web.url).get("socket") == socket_before + 2, 10, "b's acquire")
    time.sleep(0.3)
    router.process.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    router.process.wait(10)
    waiter.join(20)
    busy.join(20)
    response = answers["b"]
    assert isinstance(response, httpx.Response) and response.status_code == 503
    # The link's close answered it, not the heartbeat ("no heartbeat from the router for 6 s")
    # and not a deadline: the message names the connection.
    message = response.json()["error"]["message"]
    assert message.startswith("router unavailable: the connection to the router"), message
    answered_after: float = answers["b-at"] - killed
    return answered_after


def make_team(tmp_path: Path, database: str, url: str) -> Team:
    return Team(tmp_path, database, SimpleNamespace(url=url))  # type: ignore[arg-type]


def test_requests_flow_over_the_socket_not_the_channel_layer(
    tmp_path: Path,
    pg_database: str,
    redis_url: str,
) -> None:
    t = make_team(tmp_path, pg_database, redis_url)
    with t.stack:
        router = t.router(t.preset("a"))
        assert "data path: unix:" in router.output(), router.output()[-2000:]
        web = t.web()
        assert "data path to the router: socket unix:" in web.output(), web.output()[-2000:]
        for _ in range(5):
            assert post_chat(web.url, "a").status_code == 200
        with httpx.stream(
            "POST", f"{web.url}/v1/chat/completions", json=chat("a", 5, True), timeout=30
        ) as streamed:
            assert streamed.status_code == 200
            assert b"[DONE]" in b"".join(streamed.iter_bytes())
        counts = acquires(web.url)
        assert counts == {"socket": 6, "channel": 0}, counts


def test_a_web_process_on_another_host_uses_tcp_and_a_stranger_the_channel_layer(
    tmp_path: Path,
    pg_database: str,
    redis_url: str,
) -> None:
    """Several nodes (issue 18): a web process reaches a router on another host over TCP,
    proving the installation's key; one with another SECRET_KEY is refused there and served
    over the channel layer. ``ROUTERPANEL_ROUTER_LINK_VIA=tcp`` stands in for another host."""
    t = make_team(tmp_path, pg_database, redis_url)
    with t.stack:
        presets = t.preset("a", token_ms=100) + t.preset("b")
        router = t.router(presets, "--models-max", "1", "--link-port", "0")
        found = re.search(r"data path: unix:\S+ and (tcp:127\.0\.0\.1:\d+)", router.output())
        assert found, router.output()[-2000:]
        t.env["ROUTERPANEL_ROUTER_LINK_VIA"] = "tcp"
        web = t.web()
        assert f"data path to the router: socket {found[1]}" in web.output(), web.output()[-2000:]
        for _ in range(3):
            assert post_chat(web.url, "b").status_code == 200
        assert acquires(web.url) == {"socket": 3, "channel": 0}

        t.env["SECRET_KEY"] = "another-installation-secret-not-this-one"
        stranger = t.web("stranger")
        assert post_chat(stranger.url, "b").status_code == 200
        assert acquires(web.url) == {"socket": 3, "channel": 1}
        assert "refused a TCP connection" in router.output(), router.output()[-2000:]

        answered_after = kill_with_one_queued(router, web, socket_before=3)
        record(
            "runrouter killed with SIGKILL, a request queued on its TCP link (team mode)",
            queued_request_answered_503_after_s=round(answered_after, 3),
        )


def test_a_router_killed_mid_request_answers_503_at_once_and_the_next_one_is_used(
    tmp_path: Path,
    pg_database: str,
    redis_url: str,
) -> None:
    t = make_team(tmp_path, pg_database, redis_url)
    with t.stack:
        presets = t.preset("a", token_ms=100) + t.preset("b")
        router = t.router(presets, "--models-max", "1")
        web = t.web()
        answered_after = kill_with_one_queued(router, web, socket_before=0)

        t.router(presets, "--models-max", "1")  # same data dir: the stale socket is replaced
        served = until_served(web.url, "b", 30)
        wait_until(lambda: post_chat(web.url, "b").status_code == 200, 10, "b again")
        wait_until(lambda: acquires(web.url).get("socket", 0) >= 1, 10, "socket acquires")
        record(
            "runrouter killed with SIGKILL, a request queued on the socket (team mode)",
            queued_request_answered_503_after_s=round(answered_after, 3),
            served_again_after_restart_s=round(served, 2),
        )


def test_a_killed_web_process_frees_its_leases_at_once_not_after_the_ttl(
    tmp_path: Path,
    pg_database: str,
    redis_url: str,
) -> None:
    t = make_team(tmp_path, pg_database, redis_url)
    with t.stack:
        presets = t.preset("a", token_ms=200) + t.preset("b")
        router = t.router(presets, "--models-max", "1", "--lease-ttl", "120")
        web = t.web()
        doomed = t.web("doomed")
        killed = kill_mid_stream(doomed, "a")
        response = post_chat(web.url, "b", timeout=60)  # needs a evicted: its lease gone
        freed = time.monotonic() - killed
        assert response.status_code == 200, response.text
        assert freed < 10, f"b served {freed:.1f} s after the kill (lease TTL 120 s)"
        try:  # 45 s: the audit writer backs off (up to 30 s) when PostgreSQL failed a write
            wait_until(
                lambda: pg_audit_rows(pg_database, "lease_expired"), 45, "the lease_expired row"
            )
        except AssertionError:
            kinds = [(r["kind"], r["model"], r["reason"]) for r in _all_rows(pg_database)]
            raise AssertionError(
                f"no lease_expired row: {kinds}\nrouter: {router.output()[-2000:]}\n"
                f"killed web process: {doomed.output()[-2000:]}"
            ) from None
        [row] = pg_audit_rows(pg_database, "lease_expired")
        assert "closed its connection" in row["reason"], row
        record(
            "a web process killed with SIGKILL mid-stream (team mode, socket, lease ttl 120 s)",
            other_clients_served_after_s=round(freed, 2),
            audit_row="lease_expired (disconnected)",
        )


def _all_rows(database: str) -> list[dict[str, Any]]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(database, row_factory=dict_row, connect_timeout=3) as conn:
        return list(conn.execute("SELECT * FROM models_app_auditevent ORDER BY id").fetchall())


@pytest.mark.http_server
def test_a_stopping_web_process_tells_its_streams_why_and_releases_their_leases(
    tmp_path: Path,
    pg_database: str,
    redis_url: str,
) -> None:
    """SIGTERM to team mode's web process mid-stream: after --shutdown-grace the stream ends
    with an SSE error event (not cut mid-chunk), the web process exits, and the router, which
    keeps running, has the lease back: the model is idle and serves the next web process."""
    from tests.support.serving import StreamReader

    t = make_team(tmp_path, pg_database, redis_url)
    with t.stack:
        t.router(t.preset("a", token_ms=50, extra="sim-tokens = 5000\n"))
        web = t.web("web", "--shutdown-grace", "1")
        with StreamReader(f"{web.url}/v1/chat/completions", chat("a", 5000, True)) as streamed:
            streamed.wait_started()
            web.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert web.process.wait(30) == 0
            exited = time.monotonic() - signalled
        assert streamed.ended_at is not None, "the stream was cut mid-chunk"
        assert [e["error"] for e in streamed.errors()] == [
            {"code": 503, "message": "server is shutting down", "type": "unavailable_error"}
        ]
        assert 1.0 <= streamed.ended_at - signalled < 5 and exited < 10

        other = t.web("web2")

        def in_flight() -> int:
            models = httpx.get(f"{other.url}/v1/models", timeout=10).json()["data"]
            return int(next(m for m in models if m["id"] == "a")["in_flight"])

        wait_until(lambda: in_flight() == 0, 10, "the lease released")
        assert post_chat(other.url, "a").status_code == 200
        record("team web process stopped mid-stream", grace=1.0,
               stream_error_after=round(streamed.ended_at - signalled, 2),
               web_exited_after=round(exited, 2))  # fmt: skip
