"""The events that make their row at once: one event, one row, nothing remembered.

Each builder takes the event (seq, time, data) and returns its row, or None where the event
records nothing (a start without leftovers, a queue change that adds no entry). What a builder
needs of the mapper's state (memory used, a stop's actor) it is given as an argument.
"""

from __future__ import annotations

from typing import Any

from models_app.audit.rows import Row, row
from models_app.models import AuditKind

# Why a lease ended without its release (the engine's ``why``), in the audit row's words.
LEASE_GONE = {
    "not renewed": "lease not renewed in time: the web process serving it is gone",
    "disconnected": "the web process holding it closed its connection to the router "
    "(it exited or was killed): the lease ended at once",
}


def model_backoff(seq: int, t: float, d: dict[str, Any]) -> Row:
    n = d.get("strikes") or 1
    times = "once" if n == 1 else f"{n} times in a row"
    return row(
        seq, t, AuditKind.CRASH_BACKOFF, model=d.get("model") or "", actor="router",
        reason=f"died soon after it started, {times} (last: {d.get('reason')}); "
        f"no new start for {d.get('seconds', 0):g} s",
        details={k: d.get(k) for k in ("seconds", "strikes", "reason", "until")},
    )  # fmt: skip


def message_expired(seq: int, t: float, d: dict[str, Any]) -> Row:
    counts = d.get("counts") or {}
    what = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    return row(
        seq, t, AuditKind.MESSAGE_EXPIRED, actor="router",
        reason=f"dropped {d.get('total', 0)} messages whose senders had stopped waiting "
        f"({what}): nothing they asked for was done",
        details={"counts": counts},
    )  # fmt: skip


def service_outage(seq: int, t: float, d: dict[str, Any]) -> Row:
    return row(
        seq, t, AuditKind.OUTAGE, actor="router",
        reason=f"{d.get('service')} {d.get('how') or 'was unreachable'} for "
        f"{d.get('seconds', 0):.1f} s; "
        f"{d.get('effect') or 'the router kept serving'}",
        details=dict(d),
    )  # fmt: skip


def node_changed(seq: int, t: float, d: dict[str, Any]) -> Row:
    node, models = d.get("node") or "", ", ".join(d.get("models") or ()) or "none"
    if d.get("change") == "lost":
        kind = AuditKind.NODE_LOST
        reason = (
            f"node {node} on {d.get('host') or '?'} stopped beating "
            f"{d.get('silent_for') or 0:.0f} s ago; its models are shown as lost and "
            f"requests go to other eligible nodes; it was running: {models}"
        )
    else:
        kind = AuditKind.NODE_JOINED
        back = d.get("lost_for")
        reason = (
            f"node {node} on {d.get('host') or '?'} "
            + (f"returned after {back:.0f} s" if back is not None else "joined")
            + f"; it may run: {models}"
        )
    return row(seq, t, kind, actor="router", reason=reason, node=node, details=dict(d))


def model_refused(seq: int, t: float, d: dict[str, Any]) -> Row:
    """A load that could not start, refused before anyone was evicted for it."""
    return row(
        seq, t, AuditKind.LOAD_REFUSED, model=d["model"], actor=d.get("actor") or "",
        reason=f"cannot start, nobody evicted: {d['reason']}",
        trigger_model=d["model"], trigger_request=d.get("request_id") or "",
        details={"kind": d.get("kind")},
    )  # fmt: skip


def model_stuck(seq: int, t: float, d: dict[str, Any], *, actor: str) -> Row:
    """A process group still alive after SIGKILL; ``actor``: who asked for the stop, if known."""
    secs = d.get("seconds_since_kill") or 0.0
    return row(
        seq,
        t,
        AuditKind.STUCK,
        model=d["model"],
        actor=actor,
        from_state=d.get("from_state") or "",
        to_state="stuck",
        reason=f"process group still alive {secs:.1f} s after SIGKILL",
        details={"pid": d.get("pid"), "seconds_since_kill": secs},
    )


def lease_expired(seq: int, t: float, d: dict[str, Any]) -> Row:
    return row(
        seq,
        t,
        AuditKind.LEASE_EXPIRED,
        model=d.get("model") or "",
        actor=d.get("actor") or "",
        trigger_request=d.get("request_id") or "",
        reason=LEASE_GONE.get(d.get("why") or "", LEASE_GONE["not renewed"]),
        details={"lease_id": d.get("lease_id"), "why": d.get("why") or "not renewed"},
    )


def queue_cancelled(seq: int, t: float, d: dict[str, Any]) -> Row:
    ids = d.get("request_ids") or []
    what = "every queued request" if d.get("by_model") else "a queued request"
    return row(
        seq,
        t,
        AuditKind.QUEUE_CANCELLED,
        model=d.get("model") or "",
        actor=d.get("actor") or "",
        trigger_request=ids[0] if len(ids) == 1 else "",
        queue_depth=len(ids),
        reason=f"{what} cancelled by an operator ({len(ids)} answered 499)",
        details={"request_ids": ids, "by_model": bool(d.get("by_model"))},
    )


def router_started(seq: int, t: float, d: dict[str, Any]) -> Row | None:
    """The children of an earlier router it killed; None when there were none."""
    leftovers = d.get("leftovers") or []
    if not leftovers:
        return None
    names = ", ".join(sorted({x.get("name", "?") for x in leftovers}))
    outcomes = ", ".join(f"{x.get('name')}: {x.get('outcome')}" for x in leftovers)
    return row(
        seq,
        t,
        AuditKind.LEFTOVER_KILLED,
        model=names,
        actor="router",
        reason=f"children of an earlier router ({outcomes})",
        details={"leftovers": leftovers},
    )


def queue_changed(
    seq: int, t: float, d: dict[str, Any], *, memory_before: int | None
) -> Row | None:
    """The first entry the change added (a load asked for); None when it added none."""
    entries = d.get("entries") or []
    added = set(d.get("added") or ())
    new = [e for e in entries if e["ticket"] in added]
    if not new:
        return None
    first = new[0]
    waiter = (first.get("requests") or [{}])[0]  # who made the entry: its oldest waiter
    return row(
        seq,
        t,
        AuditKind.LOAD_REQUESTED,
        model=first["model"],
        actor=waiter.get("actor") or "",
        trigger_request=waiter.get("request_id") or "",
        queue_depth=d.get("depth"),
        memory_before=memory_before,
        reason=(
            "loading at once: a slot was free"
            if first.get("starting")
            else f"queued at position {first['position']} until a slot is free"
        ),
        details={
            "ticket": first["ticket"],
            "position": first["position"],
            "waiters": first["waiters"],
            "also": [e["model"] for e in new[1:]],
        },
    )
