"""An audit row as the mapper makes it: a plain dict of ``AuditEvent`` fields, keyed by the seq of
the event that started it, and the parts of a child's exit a row keeps."""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]

AUDIT_TAIL_LINES = 20  # of the supervisor's last lines (30), the ones an audit row keeps


def row(seq: int, t: float, kind: str, **fields: Any) -> Row:
    """A row of ``kind`` for the event ``seq`` at ``t``; ``details`` is always a dict."""
    made: Row = {"seq": seq, "time": t, "kind": str(kind)}
    made.update(fields)
    made.setdefault("details", {})
    return made


def requests_text(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


def exit_details(d: dict[str, Any]) -> dict[str, Any]:
    """What a row keeps of a ``model.exited`` event: the process, and its last lines."""
    keys = ("pid", "signal", "duration", "expected", "was_ready", "stop_seconds")
    return {k: d.get(k) for k in keys} | {
        "last_lines": (d.get("last_lines") or [])[-AUDIT_TAIL_LINES:]
    }
