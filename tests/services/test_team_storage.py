"""Team mode against the real services: PostgreSQL for presets, Redis for the channel layer.

PostgreSQL (127.0.0.1:5432, trust auth, a database of the test's own) and a ``redis-server`` of
the worker's own (tests/support/databases.py); without them these tests skip, or fail under
CI=true.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get(
    "ROUTERPANEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def manage(database_url: str, data_dir: Path, *args: str, stdin: str | None = None) -> str:
    env = {**os.environ, "DATABASE_URL": database_url, "ROUTERPANEL_DATA_DIR": str(data_dir)}
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_presets_round_trip_through_postgresql(pg_database: str, tmp_path: Path) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text(
        "[*]\nc = 4096\n[org/m:q4_k_m]\nmodel = /m.gguf\nno-warmup = 1\n[b]\nttl = 9\n"
    )
    manage(pg_database, tmp_path, "migrate", "--noinput")
    assert "2 created" in manage(pg_database, tmp_path, "import_presets", str(preset))
    exported = manage(pg_database, tmp_path, "export_presets")
    assert "[org/m:Q4_K_M]" in exported
    again = manage(pg_database, tmp_path, "import_presets", "-", stdin=exported)
    assert "0 created, 0 updated, 2 unchanged" in again


def test_the_redis_channel_layer_carries_a_message(redis_url: str) -> None:
    from channels_redis.core import RedisChannelLayer

    async def round_trip() -> dict[str, object]:
        layer = RedisChannelLayer(hosts=[{"address": redis_url, "socket_timeout": 30}])
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "router.ping", "n": 1})
        message = await asyncio.wait_for(layer.receive(channel), timeout=5)
        await layer.flush()
        return message

    assert asyncio.run(round_trip()) == {"type": "router.ping", "n": 1}


def test_redis_url_switches_settings_to_team_mode(tmp_path: Path, redis_url: str) -> None:
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.CHANNEL_LAYERS['default']['BACKEND'], s.CELERY_TASK_ALWAYS_EAGER, "
        "s.CELERY_BROKER_URL)"
    )
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "ROUTERPANEL_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "routerpanel.settings",
    }
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out == ["models_app.routing.layers.ResilientRedisLayer", "False", redis_url]
