"""The Celery jobs in team mode: a real ``celery -A routerpanel worker`` (and ``beat``) on Redis,
PostgreSQL as the database, and a stand-in router answering on the Redis channel layer.

A preset saved in team mode queues its GGUF inspection (``delay_on_commit``) for the worker;
retention, the memory rollup, a preload and the reservations' tick are sent by name; a preload
scheduled every second in django-celery-beat's tables goes beat → worker → router, as the actor
``schedule``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.support.fake_router import MemoryRouter, ring
from tests.support.ggufgen import write_tiny_llama

ROOT = Path(__file__).resolve().parents[2]
CELERY = str(Path(sys.executable).with_name("celery"))
TIMEOUT = 90.0

SETUP = """
from datetime import timedelta
from django.utils import timezone
from models_app.models import AuditEvent, AuditKind, Preset, RouterSettings
row = RouterSettings.load(); row.audit_retention_days = 7; row.save()
old = AuditEvent.objects.record(AuditKind.CRASH, model="old")
AuditEvent.objects.filter(pk=old.pk).update(time=timezone.now() - timedelta(days=8))
AuditEvent.objects.record(AuditKind.CRASH, model="new")
Preset.objects.create(name="tiny", model_path={good!r}, args=[["c", "256"]])
Preset.objects.create(name="broken", model_path={broken!r})
"""
SCHEDULE = """
from django_celery_beat.models import IntervalSchedule, PeriodicTask
every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
PeriodicTask.objects.create(name="preload qwen", task="models_app.tasks.preload_model",
                            interval=every, args='["qwen"]')
"""


@pytest.fixture
def env(pg_database: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    values = {
        **os.environ,
        "DATABASE_URL": pg_database,
        "REDIS_URL": redis_url,
        "ROUTERPANEL_DATA_DIR": str(tmp_path / "data"),
        "DJANGO_SETTINGS_MODULE": "routerpanel.settings",
    }
    manage(values, "migrate", "--noinput")
    return values


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


class Celery:
    """``celery -A routerpanel <args>`` in the background, its output in a file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [CELERY, "-A", "routerpanel", *args], cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def wait_for(self, text: str, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text(errors="replace"):
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, self.log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[Celery]:
    args = ("worker", "--loglevel", "INFO", "--pool", "solo", "--without-gossip",
            "--without-mingle", "--without-heartbeat")  # fmt: skip
    proc = Celery(env, tmp_path / "worker.log", *args)
    proc.wait_for("ready.")
    yield proc
    proc.stop()


@pytest.fixture
async def router(redis_url: str) -> AsyncIterator[MemoryRouter]:
    from channels_redis.core import RedisChannelLayer

    # As in settings: a socket timeout above channels_redis's 5 s blocking pop (redis-py 8).
    layer = RedisChannelLayer(
        hosts=[{"address": redis_url, "socket_timeout": 30}],
        prefix=f"{settings.ROUTERPANEL_REDIS_PREFIX}:asgi:",  # the worker's, from settings
    )
    fake = await MemoryRouter(layer).start()
    fake.add("qwen")
    fake.history = ring(time.time() - 180, 180, used=4 << 30, rss=1 << 30)
    yield fake
    await fake.stop()
    await layer.flush()


RESERVATION = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from models_app.models import Reservation
now = timezone.now()
Reservation.objects.create(model="qwen", user=get_user_model().objects.create_user("alice"),
    starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1), created_by="user:admin")
"""


def query(database_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, params).fetchall()


async def eventually(check: Any, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.3)


async def test_a_real_worker_runs_every_job(
    env: dict[str, str], worker: Celery, router: MemoryRouter, tmp_path: Path, pg_database: str
) -> None:
    from celery import Celery as Client

    good = write_tiny_llama(
        tmp_path / "tiny.gguf", n_embd=32, n_layer=1, n_head=2, n_ff=64, vocab_path=None, seed=3
    )
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00 then nothing sensible")
    setup = SETUP.format(good=str(good), broken=str(broken))
    await asyncio.to_thread(manage, env, "shell", "-c", setup)

    def facts() -> dict[str, Any] | None:
        rows = dict(query(pg_database, "SELECT name, gguf_facts FROM models_app_preset"))
        return rows if all(rows.values()) and len(rows) == 2 else None

    found = await eventually(facts)  # queued on commit by the save, run by the worker
    assert found["tiny"]["architecture"] == "llama" and found["tiny"]["estimate"]["n_ctx"] == 256
    assert "malformed or truncated GGUF" in found["broken"]["error"]
    (estimate,) = query(
        pg_database, "SELECT gguf_estimate FROM models_app_preset WHERE name='tiny'"
    )
    assert estimate[0] == found["tiny"]["estimate"]["total"]

    client = Client(broker=env["REDIS_URL"])
    for name in ("retention_task", "memory_rollup_task"):
        client.send_task(f"models_app.tasks.{name}")
    client.send_task("models_app.tasks.preload_model", args=["qwen"])

    def retention() -> bool:
        models = {m for (m,) in query(pg_database, "SELECT model FROM models_app_auditevent")}
        return "old" not in models and "new" in models

    await eventually(retention)
    (row,) = query(
        pg_database, "SELECT details FROM models_app_auditevent WHERE kind = 'retention'"
    )
    assert row[0]["deleted"] == 1
    rollups = await eventually(
        lambda: query(pg_database, "SELECT scope, samples FROM models_app_memoryrollup")
    )
    assert {scope for scope, _ in rollups} == {"system", "model"}
    load = await router.wait_for("router.load", timeout=TIMEOUT)
    assert (load["model"], load["actor"]) == ("qwen", "schedule")
    await asyncio.to_thread(manage, env, "shell", "-c", RESERVATION)
    client.send_task("models_app.tasks.reservations_tick")  # issue 17.6, as beat sends it
    booked = await router.wait_for("router.reservations", timeout=TIMEOUT)
    assert (booked["reservations"], booked["actor"]) == ({"qwen": ["user:alice"]}, "schedule")
    started = await eventually(
        lambda: query(
            pg_database,
            "SELECT model, actor FROM models_app_auditevent WHERE kind = 'reservation_started'",
        )
    )
    assert started == [("qwen", "user:admin")]
    assert "succeeded" in worker.log.read_text()


async def test_beat_sends_a_scheduled_preload_to_the_router(
    env: dict[str, str], worker: Celery, router: MemoryRouter, tmp_path: Path, pg_database: str
) -> None:
    await asyncio.to_thread(manage, env, "shell", "-c", SCHEDULE)
    beat = Celery(
        env, tmp_path / "beat.log", "beat", "--loglevel", "INFO",
        "--scheduler", "django_celery_beat.schedulers:DatabaseScheduler",
        "--pidfile", str(tmp_path / "beat.pid"),
    )  # fmt: skip
    try:
        load = await router.wait_for("router.load", timeout=TIMEOUT)
        assert (load["model"], load["actor"]) == ("qwen", "schedule")
        names = {
            n for (n,) in query(pg_database, "SELECT name FROM django_celery_beat_periodictask")
        }
        assert {"audit-retention", "memory-rollup", "preload qwen"} <= names
    finally:
        await asyncio.to_thread(beat.stop)
