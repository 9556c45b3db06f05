"""Render the router's snapshot as llama.cpp's ``GET /models`` body (ROUTER_SPEC §9.8).

Each entry has llama.cpp's keys in llama.cpp's order; then, while the model runs, the keys of the
child's ready payload that are not already there (``meta``); then our additions, as extra keys
only, so llama.cpp clients (which ignore unknown keys) keep working (§15.32): the engine state
(which shows ``quarantined`` and ``stuck``), ``stopping``, ``in_flight``, ``pid``, ``memory``
(RSS bytes), ``pinned``, ``queue_position`` and ``queue_depth`` (waiters for this model) and
``last_used``, ``backoff`` (a crash-looping model's next start, strikes and reason), and
``node`` / ``nodes`` (where it runs and where it may, with several hosts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any

from routerpanel.router import presets

RUNNING = frozenset({"loading", "loaded", "sleeping"})
TEXT_ONLY = {"input_modalities": ["text"], "output_modalities": ["text"]}


def render(models: Iterable[Mapping[str, Any]], now: float) -> dict[str, Any]:
    """Return ``{"data": [...], "object": "list"}``, hidden entries left out, in name order."""
    return _made.render(models, now)


class Entries:
    """Entries kept for the snapshot rows that come again: in the router's own process the
    engine hands out the same row objects while nothing changed (``facts.Rows``), so with ten
    thousand presets a listing makes only the entries of what changed. Rows from another
    process are new objects every time: everything is made, as before."""

    def __init__(self) -> None:
        self._by_row: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}

    def render(self, models: Iterable[Mapping[str, Any]], now: float) -> dict[str, Any]:
        created = int(now)  # one value for every entry of a response
        rows = [m for m in models if not m.get("hidden")]
        if any(a["name"].encode() > b["name"].encode() for a, b in pairwise(rows)):
            rows.sort(key=lambda m: m["name"].encode())
        kept, made = self._by_row, {}
        data = []
        for row in rows:
            found = kept.get(id(row))
            if found is not None and found[0] is row:
                made[id(row)] = found
                item = found[1]
                item["created"] = created
            else:
                item = entry(row, created)
                made[id(row)] = (row, item)  # the row is held: its id is not reused meanwhile
            data.append(item)
        self._by_row = made
        return {"data": data, "object": "list"}


_made = Entries()


def entry(model: Mapping[str, Any], created: int) -> dict[str, Any]:
    value = model.get("status") or "unloaded"
    source = model.get("source") or "preset"
    out: dict[str, Any] = {
        "id": model["name"],
        "aliases": sorted(model.get("aliases") or ()),
        "tags": sorted(model.get("tags") or ()),
        "object": "model",
        "owned_by": "llamacpp",
        "created": created,
        "status": status(model, value),
        "architecture": architecture(model),
        "source": source,
        "can_remove": source == "cache",
    }
    ours = extras(model)
    info = model.get("info")
    if value in RUNNING and isinstance(info, Mapping):
        for key, item in info.items():
            if key not in ours:
                out.setdefault(key, item)
    out.update(ours)
    return out


def status(model: Mapping[str, Any], value: str) -> dict[str, Any]:
    """``{value, args[, preset][, exit_code, failed]}``: exit code and flag only when failed."""
    args = model.get("args") or ()
    out: dict[str, Any] = {"value": value, "args": list(args)}
    if args:  # every entry has a preset here (no download entries): its options as INI, 11.17
        out["preset"] = presets.preset_text(model["name"], tuple(args))
    if model.get("failed"):
        code = model.get("exit_code")
        out["exit_code"] = code if isinstance(code, int) else 1  # a kill reports 1 (§3.5)
        out["failed"] = True
    return out


def architecture(model: Mapping[str, Any]) -> dict[str, Any]:
    """The stored one; else what the child reported in its ready payload; else text only."""
    for candidate in (model.get("architecture"), (model.get("info") or {}).get("architecture")):
        if isinstance(candidate, Mapping):
            return {
                "input_modalities": list(candidate.get("input_modalities") or ["text"]),
                "output_modalities": list(candidate.get("output_modalities") or ["text"]),
            }
    return {key: list(value) for key, value in TEXT_ONLY.items()}


def extras(model: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "state": model.get("state") or model.get("status") or "unloaded",
        "stopping": bool(model.get("stopping")),
        "in_flight": model.get("in_flight") or 0,
        "pid": model.get("pid"),
        "memory": model.get("memory"),
        "pinned": bool(model.get("pinned")),
        "queue_position": model.get("queue_position"),
        "queue_depth": model.get("queue_waiters") or 0,
        "last_used": model.get("last_used"),
        "backoff": model.get("backoff"),  # a crash loop: {until, strikes, reason} or None
        # Several hosts (issue 18): the node it runs on (None when down or one router) and
        # the nodes that may run it ([] with one router).
        "node": model.get("node"),
        "nodes": list(model.get("nodes") or ()),
    }
