"""Team mode under faults: Redis and router outages heal by themselves (issue 12).

A real PostgreSQL database, a ``redis-server`` of the test's own on a spare port (never the
machine's shared one: these tests kill it), ``runrouter`` and ``serve --no-router`` as a user
runs them, simulated children. Each test breaks one thing and measures what a client sees and
how long the system takes to serve again.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from models_app.routing import layer, liveness
from tests.support.auditdb import pg_audit_rows
from tests.support.chaos import record
from tests.support.chaos_team import Team, kill_mid_stream, post_chat, until_served
from tests.support.live_sockets import login
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer, redis_server_available
from tests.support.serving import ROOT, Server, wait_until
from tests.support.tiers import missing


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if not redis_server_available():
        missing("redis-server is not installed (Debian package redis-server)")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@contextmanager
def team(tmp_path: Path, pg_database: str, redis: RedisServer) -> Iterator[Team]:
    t = Team(tmp_path, pg_database, redis)
    with t.stack:
        yield t


def children_pids(router: Server) -> set[int]:
    try:
        kids = psutil.Process(router.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {k.pid for k in kids if "routerpanel.router.simserver" in " ".join(k.cmdline())}


def probe_during(url: str, seconds: float, model: str) -> list[tuple[float, int, float]]:
    """Send a chat every 0.25 s for ``seconds``: (start, status, how long it took)."""
    out = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.monotonic()
        try:
            status = post_chat(url, model, timeout=20).status_code
        except httpx.HTTPError:
            status = 0  # no answer at all
        out.append((t0 - started, status, time.monotonic() - t0))
        time.sleep(0.25)
    return out


@pytest.mark.parametrize("outage", [1.0, 10.0])
def test_the_router_outlives_a_redis_outage_and_serves_again(
    tmp_path: Path,
    pg_database: str,
    redis: RedisServer,
    outage: float,
) -> None:
    with team(tmp_path, pg_database, redis) as t:
        router = t.router(t.preset("a"))
        web = t.web()
        assert post_chat(web.url, "a").status_code == 200
        before = children_pids(router)
        redis.kill()
        killed = time.monotonic()
        during = probe_during(web.url, outage, "a")
        redis.start()
        back = time.monotonic()
        recovered = until_served(web.url, "a")
        assert router.process.poll() is None, router.output()[-2000:]  # it never exited
        assert children_pids(router) == before  # and kept its child
        statuses = {s for _, s, _ in during}
        assert statuses <= {200, 503}, during  # never a 500, never a hang
        # Each answer within the web side's own deadlines (the router's heartbeat is called
        # dead after DEAD_AFTER, a first answer is awaited ROUTER_TIMEOUT), with room for a
        # busy machine, never the client's 20 s. Serving again needs no restart: until_served
        # has its own deadline; the figure goes to the fault table.
        bound = liveness.DEAD_AFTER + layer.ROUTER_TIMEOUT
        assert all(took < bound for _, _, took in during), during
        outage_rows = pg_audit_rows(pg_database, "outage")
        wait_until(lambda: pg_audit_rows(pg_database, "outage"), 15, "the outage's audit row")
        outage_rows = pg_audit_rows(pg_database, "outage")
        assert "Redis was unreachable" in outage_rows[-1]["reason"]
        record(
            f"Redis down {outage:g} s (team mode)", answers_during=sorted(statuses),
            slowest_answer_s=round(max(took for _, _, took in during), 2),
            served_again_after_redis_back_s=round(recovered, 2),
            router_exited=False, children_kept=True,
            outage_total_s=round(back - killed + recovered, 2),
        )  # fmt: skip


def test_a_redis_blip_keeps_the_dashboard_socket_open_and_resyncs(
    tmp_path: Path,
    pg_database: str,
    redis: RedisServer,
) -> None:
    import websockets

    with team(tmp_path, pg_database, redis) as t:
        t.router(t.preset("a"))
        web = t.web()
        cookies = login(web.url, "admin", "test-only-password")

        async def watch() -> dict[str, Any]:
            ws_url = web.url.replace("http", "ws") + "/ws/dashboard/?memory=0"
            headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}
            async with websockets.connect(ws_url, origin=web.url, additional_headers=headers) as ws:
                first = await _next_of(ws, "snapshot", 20)
                assert "snapshot" in first, first
                await asyncio.to_thread(redis.kill)
                await asyncio.sleep(0.1)
                await asyncio.to_thread(redis.start)
                blip = time.monotonic()
                await asyncio.to_thread(post_chat, web.url, "a")  # an event after the blip
                again = await _next_of(ws, "snapshot", 30, require_ok=True)
                return {"resynced_after": time.monotonic() - blip, "snapshot": again}

        outcome = asyncio.run(watch())
        assert outcome["snapshot"]["snapshot"]["models"]
        record("Redis restarted (0.1 s) under an open dashboard", socket_closed=False,
               fresh_snapshot_after_s=round(outcome["resynced_after"], 2))  # fmt: skip


def test_a_killed_router_answers_its_queued_requests_and_restarts_at_once(
    tmp_path: Path,
    pg_database: str,
    redis: RedisServer,
) -> None:
    with team(tmp_path, pg_database, redis) as t:
        presets = t.preset("a", token_ms=100) + t.preset("b")
        router = t.router(presets, "--models-max", "1")
        web = t.web()
        streaming = threading.Thread(
            target=lambda: post_chat(web.url, "a", tokens=200, stream=True, timeout=60)
        )
        streaming.start()
        wait_until(lambda: b"loaded" in httpx.get(f"{web.url}/v1/models").content, 20, "a")
        answer: dict[str, Any] = {}

        def queued() -> None:
            started = time.monotonic()
            answer["response"] = post_chat(web.url, "b", timeout=60)
            answer["took"] = time.monotonic() - started

        waiter = threading.Thread(target=queued)
        waiter.start()
        time.sleep(1.0)  # b waits behind the busy a
        router.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        router.process.wait(10)
        waiter.join(20)
        response = answer["response"]
        answered_after = time.monotonic() - killed
        assert response.status_code == 503, response.text
        assert answered_after < 10.0
        assert "router unavailable" in response.json()["error"]["message"]
        ready = httpx.get(f"{web.url}/ready", timeout=10)
        assert ready.status_code == 503
        # What a health check or supervisor sees once the beat is stale (DEAD_AFTER): the web
        # side answered before that, when the router's socket closed.
        wait_until(lambda: _routerstatus(t) == 1, 15, "routerstatus to say the router is down")

        started = time.monotonic()
        t.router(presets, "--models-max", "1")  # same data dir: the dead owner is replaced
        restart = time.monotonic() - started
        served = until_served(web.url, "b", 30)
        assert httpx.get(f"{web.url}/ready", timeout=10).status_code == 200
        assert _routerstatus(t, "--this-host") == 0
        streaming.join(30)
        record(
            "runrouter killed with SIGKILL (team mode)",
            queued_request_answered_503_after_s=round(answered_after, 2),
            restart_refused=False, restart_took_s=round(restart, 2),
            served_again_after_restart_s=round(served, 2),
        )  # fmt: skip


def test_a_killed_web_process_loses_its_leases_and_the_slot_frees(
    tmp_path: Path,
    pg_database: str,
    redis: RedisServer,
) -> None:
    with team(tmp_path, pg_database, redis) as t:
        presets = t.preset("a", token_ms=200) + t.preset("b")
        t.router(presets, "--models-max", "1", "--lease-ttl", "3")
        web = t.web()
        doomed = t.web("doomed")
        killed = kill_mid_stream(doomed, "a")
        response = post_chat(web.url, "b", timeout=60)
        freed = time.monotonic() - killed
        assert response.status_code == 200, response.text
        assert freed < 15
        wait_until(lambda: pg_audit_rows(pg_database, "lease_expired"), 20, "the lease_expired row")
        record(
            "a web process killed with SIGKILL mid-stream (team mode, lease ttl 3 s)",
            other_clients_served_after_s=round(freed, 2),
            audit_row="lease_expired",
        )


def test_a_request_refused_while_the_router_was_frozen_never_runs_later(
    tmp_path: Path,
    pg_database: str,
    redis: RedisServer,
) -> None:
    with team(tmp_path, pg_database, redis) as t:
        router = t.router(t.preset("a") + t.preset("b"), "--models-max", "1")
        web = t.web()
        assert post_chat(web.url, "a").status_code == 200
        os.kill(router.process.pid, signal.SIGSTOP)  # alive for Redis, deaf to messages
        try:
            response = post_chat(web.url, "b", timeout=30)
            load = httpx.post(f"{web.url}/models/load", json={"model": "b"}, timeout=30)
        finally:
            os.kill(router.process.pid, signal.SIGCONT)
        assert response.status_code == 503 and load.status_code == 503
        wait_until(lambda: pg_audit_rows(pg_database, "message_expired"), 20, "the expired row")
        time.sleep(1.0)
        models = httpx.get(f"{web.url}/v1/models", timeout=10).json()["data"]
        states = {m["id"]: m["status"]["value"] for m in models}
        assert states["b"] == "unloaded" and states["a"] == "loaded"  # no ghost swap
        [row] = pg_audit_rows(pg_database, "message_expired")
        counts = json.loads(row["details"])["counts"] if isinstance(row["details"], str) \
            else row["details"]["counts"]  # fmt: skip
        assert counts.get("router.acquire", 0) >= 1
        metrics = httpx.get(f"{web.url}/metrics", timeout=10).text
        assert re.search(
            r'routerpanel_expired_messages_total\{type="router.acquire"\} [1-9]', metrics
        )
        record("router frozen (SIGSTOP) while requests arrive", client_saw=503,
               executed_later=False, audit_row="message_expired")  # fmt: skip


def test_the_database_closing_loses_no_audit_row(
    tmp_path: Path,
    pg_database: str,
    redis: RedisServer,
) -> None:
    import psycopg

    from tests.support.databases import PG_ADMIN_URL

    name = pg_database.rsplit("/", 1)[1]
    with team(tmp_path, pg_database, redis) as t:
        t.router(t.preset("a") + t.preset("b"), "--models-max", "1")
        web = t.web()
        assert post_chat(web.url, "a").status_code == 200
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True)
        before = len(pg_audit_rows(pg_database, "eviction"))
        try:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", (name,),
            )  # fmt: skip
            swaps = [post_chat(web.url, m).status_code for m in ("b", "a", "b", "a")]
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            admin.close()
        reopened = time.monotonic()
        assert swaps == [200, 200, 200, 200]  # serving does not need the database
        wait_until(
            lambda: len(pg_audit_rows(pg_database, "eviction")) >= before + 4, 60, "4 evictions"
        )
        stored_after = time.monotonic() - reopened
        wait_until(lambda: pg_audit_rows(pg_database, "outage"), 30, "the outage row")
        record(
            "PostgreSQL refuses connections during 4 swaps (team mode)",
            requests_served=4,
            audit_rows_lost=0,
            stored_after_reopen_s=round(stored_after, 2),
        )


def test_two_web_processes_started_together_on_a_fresh_database(
    tmp_path: Path,
    pg_database: str,
    redis: RedisServer,
) -> None:
    env = {**os.environ, "DATABASE_URL": pg_database, "REDIS_URL": redis.url}
    procs = []
    ports = [free_port(), free_port()]
    for i, port in enumerate(ports):
        data = tmp_path / f"w{i}"
        data.mkdir()
        own = {**env, "ROUTERPANEL_DATA_DIR": str(data), "ROUTERPANEL_ADMIN_PASSWORD": "twin"}
        command = [sys.executable, "manage.py", "serve", "--no-router", "--port", str(port)]
        procs.append(
            subprocess.Popen(
                command, cwd=ROOT, env=own, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    try:
        for port in ports:
            wait_until(lambda p=port: _healthy(p), 90, "both web processes")
        assert all(p.poll() is None for p in procs)
        admins = _query(pg_database, "SELECT count(*) FROM auth_user WHERE is_superuser")
        assert admins == [(1,)]
    finally:
        for proc in procs:
            proc.terminate()
        outputs = [p.communicate(timeout=30)[0].decode() for p in procs]
    assert not any("IntegrityError" in out or "Traceback" in out for out in outputs), outputs


def _routerstatus(t: Team, *args: str) -> int:
    env = {**os.environ, **t.env, "ROUTERPANEL_DATA_DIR": str(t.tmp / "status")}
    command = [sys.executable, "manage.py", "routerstatus", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=60).returncode


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _query(database: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(database) as conn:
        return conn.execute(sql, params).fetchall()


async def _next_of(ws: Any, kind: str, timeout: float, require_ok: bool = False) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            message = json.loads(await ws.recv())
            if message.get("type") == kind and (not require_ok or "snapshot" in message):
                return message
