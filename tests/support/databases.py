"""Fixtures for real services: a fresh PostgreSQL database and an empty Redis per test.

A pytest plugin, registered once from tests/conftest.py: the services, browser and chaos tiers
ask for ``pg_database`` and ``redis_url`` by name. A test skips (or fails under CI=true) when
the service is not there.

PostgreSQL is the machine's (a database of the test's own, dropped after it); Redis is never the
machine's: each pytest worker starts a ``redis-server`` of its own on a port of its own, and
empties it before each test that asks for it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisServer, redis_server_available
from tests.support.tiers import missing

PG_ADMIN_URL = os.environ.get(
    "ROUTERPANEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture
def pg_database() -> Iterator[str]:
    try:
        import psycopg
    except ImportError as exc:  # importorskip would skip even under CI=true
        missing(f"psycopg is not installed (pip install -e '.[test]'): {exc}")
    name = f"rp_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        missing(f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def worker_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """This worker's own ``redis-server``, for the whole run."""
    if not redis_server_available():
        missing("redis-server is not installed (Debian package redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(worker_redis: RedisServer) -> str:
    """An empty Redis (the worker's own server, flushed), so tests never see each other's keys."""
    try:
        import redis
    except ImportError as exc:
        missing(f"redis (the Python client) is not installed (pip install -e '.[test]'): {exc}")
    with redis.Redis.from_url(worker_redis.url, socket_connect_timeout=2) as client:
        client.flushall()
    return worker_redis.url
