"""Read a served process's audit log straight from its database: the embedded SQLite file
(read-only), or PostgreSQL in team mode (``pg_audit_rows``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tests.support.serving import wait_until


def audit_rows(data_dir: Path, sql: str = "", *params: Any) -> list[dict[str, Any]]:
    """Read the embedded SQLite audit table directly (read-only), newest last."""
    db = sqlite3.connect(f"file:{data_dir / 'routerpanel.sqlite3'}?mode=ro", uri=True, timeout=30)
    db.row_factory = sqlite3.Row
    try:
        query = "SELECT * FROM models_app_auditevent " + (sql or "") + " ORDER BY id"
        return [dict(row) for row in db.execute(query, params)]
    finally:
        db.close()


def wait_for_rows(data_dir: Path, kind: str, count: int = 1, timeout: float = 30) -> list[Any]:
    """The rows of ``kind`` once there are at least ``count`` of them."""
    wait_until(
        lambda: len(audit_rows(data_dir, "WHERE kind = ?", kind)) >= count, timeout, f"{kind} rows"
    )
    return audit_rows(data_dir, "WHERE kind = ?", kind)


def pg_audit_rows(database: str, kind: str) -> list[dict[str, Any]]:
    """The audit rows of ``kind`` in a PostgreSQL database (team mode), oldest first; none
    while the database refuses connections."""
    import psycopg
    from psycopg.rows import dict_row

    try:
        with psycopg.connect(database, row_factory=dict_row, connect_timeout=3) as conn:
            sql = "SELECT * FROM models_app_auditevent WHERE kind = %s ORDER BY id"
            return list(conn.execute(sql, (kind,)).fetchall())
    except psycopg.OperationalError:
        return []
