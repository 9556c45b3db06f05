"""Why a queue entry waits, and what would help, from the snapshot the dashboard already has.

The router's queue says only *that* an entry waits (``starting``, ``restart`` or neither); the
models say what holds the slots (state, stopping, requests in flight, pinned) and the config how
many slots there are (``models_max``, 0 = unlimited) and how long a request may wait
(``max_wait``, None = forever). ``static/panel/dashboard.js`` has the same rules (``reasonOf``)
for the live page; ``tests/app/test_panel_queue_reasons.py`` and the browser tier hold both to
the same words.
"""

from __future__ import annotations

from typing import Any

RUNNING = frozenset({"loading", "loaded", "sleeping"})


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def names(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _holder(m: dict[str, Any]) -> tuple[str, str]:
    """What a running model is doing with its slot, and the kind of hold (for the help)."""
    name, n = m["name"], int(m.get("in_flight") or 0)
    if m.get("stopping"):
        return f"{name} is stopping", "stopping"
    if m.get("pinned"):
        busy = f", busy ({plural(n, 'request')})" if n else ""
        return f"{name} is pinned{busy}", "pinned"
    if n:
        return f"{name} is busy ({plural(n, 'request')})", "busy"
    if m.get("state") == "loading":
        return f"{name} is loading", "loading"
    return f"{name} is idle (it will be stopped to make room)", "idle"


def reason(
    entry: dict[str, Any], models: list[dict[str, Any]], config: dict[str, Any]
) -> dict[str, str]:
    """``status`` (a word for the Status column), ``text`` (what it waits on and what would
    help) and ``limit`` (how long it may wait) of one queue entry."""
    by_name = {m["name"]: m for m in models}
    name = entry.get("model") or ""
    own = by_name.get(name) or {}
    max_wait = config.get("max_wait")
    limit = (
        "no max wait: it waits until it can start (Settings: Max wait)"
        if max_wait is None
        else f"gives up after {float(max_wait):g} s"
    )
    stopping = sorted(m["name"] for m in models if m.get("stopping") and m["name"] != name)
    if entry.get("restart"):
        return {
            "status": "restart",
            "text": f"restarting {name} with its changed preset",
            "limit": limit,
        }
    if entry.get("starting") or own.get("state") in RUNNING:
        if own.get("state") == "loading":
            return {"status": "loading", "text": f"loading {name}", "limit": limit}
        if own.get("state") in RUNNING:
            return {"status": "starting", "text": f"{name} is {own.get('state')}", "limit": limit}
        if stopping:
            return {
                "status": "stopping",
                "text": f"waiting for {names(stopping)} to stop",
                "limit": limit,
            }
        return {"status": "starting", "text": f"starting {name}", "limit": limit}
    backoff = own.get("backoff")
    if backoff:
        why = f" ({backoff['reason']})" if backoff.get("reason") else ""
        text = f"held back after a crash loop{why}; it starts again when the back-off ends"
        return {"status": "waiting", "text": text, "limit": limit}
    models_max = int(config.get("models_max") or 0)
    running = sorted(
        (m for m in models if m.get("state") in RUNNING and m["name"] != name),
        key=lambda m: str(m["name"]),
    )
    if models_max > 0 and len(running) >= models_max:
        holds = [_holder(m) for m in running]
        kinds = {kind for _, kind in holds}
        pinned = sum(1 for _, kind in holds if kind == "pinned")
        help_ = []
        if pinned:
            help_.append(f"unpin {'it' if pinned == 1 else 'them'}")
        if "busy" in kinds and not pinned:
            help_.append("wait for a request to finish")
        help_.append("raise Max running models")
        text = f"waiting for a slot: {', '.join(h for h, _ in holds)} — {' or '.join(help_)}"
        # Every slot pinned: nothing frees one until an operator acts, so no ETA is promised.
        status = "blocked" if pinned == len(holds) else "waiting"
        return {"status": status, "text": text, "limit": limit}
    ahead = int(entry.get("position") or 1) - 1
    if ahead > 0:
        text = f"waiting behind {ahead} earlier {'entry' if ahead == 1 else 'entries'}"
        return {"status": "waiting", "text": text, "limit": limit}
    if stopping:
        return {
            "status": "waiting",
            "text": f"waiting for {names(stopping)} to stop",
            "limit": limit,
        }
    if config.get("memory_budget"):
        text = "waiting for memory to settle under the memory budget"
        return {"status": "waiting", "text": text, "limit": limit}
    return {"status": "waiting", "text": "waiting for its turn", "limit": limit}


def reasons(snap: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    """Each queued model's reason, by model name."""
    snap = snap or {}
    models, config = snap.get("models") or [], snap.get("config") or {}
    return {e["model"]: reason(e, models, config) for e in snap.get("queue") or []}
