"""Fixtures of the services tier: a fresh PostgreSQL database and a Redis URL per test."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator

import pytest

from tests.tiers import missing

PG_ADMIN_URL = os.environ.get(
    "ROUTERPANEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("ROUTERPANEL_TEST_REDIS", "redis://127.0.0.1:6379/15")


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


@pytest.fixture
def redis_url() -> str:
    """A Redis database of its own (1-14), flushed, so tests never see each other's keys."""
    try:
        import redis
    except ImportError as exc:
        missing(f"redis (the Python client) is not installed (pip install -e '.[test]'): {exc}")
    url = REDIS_URL.rsplit("/", 1)[0] + f"/{random.randint(1, 14)}"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).flushdb()
    except Exception as exc:
        missing(f"Redis is not reachable at {url}: {exc}")
    return url
