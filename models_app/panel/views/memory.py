"""Memory history for the dashboard chart: the router's one-hour ring and the per-minute rollups.

The last hour comes from the router (the ``router.memory`` call) and is turned into
columns here, so the browser gets a few arrays instead of 3600 nested objects. The 24 h / 7 d
views read ``MemoryRollup`` rows (per minute: min/avg/max of the system's used memory, its
available and swap, and each model's RSS). While there are none the range answers
``available: false`` with the reason, and the chart says so.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import models
from django.utils import timezone

RANGES = {"24h": (timedelta(hours=24), 60), "7d": (timedelta(days=7), 600)}  # span, bucket (s)


def columns(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Turn ``memory_history()`` rows into aligned columns (None where a model was not running)."""
    names = sorted({name for s in samples for name in (s.get("children") or {})})
    keys = ("time", "used", "available", "swap_used", "wired")
    out: dict[str, Any] = {key: [] for key in keys} | {"models": {name: [] for name in names}}
    for sample in samples:
        system = sample.get("system") or {}
        out["time"].append(sample.get("time"))
        for key in ("used", "available", "swap_used", "wired"):
            out[key].append(system.get(key))
        children = sample.get("children") or {}
        for name in names:
            child = children.get(name)
            out["models"][name].append(child.get("rss") if child else None)
    return out


def rollup_model() -> type[models.Model] | None:
    """``MemoryRollup`` if this build has it (it arrived with issue 4's jobs)."""
    try:
        model: type[models.Model] = apps.get_model("models_app", "MemoryRollup")
    except LookupError:
        return None
    return model


def rollups(range_name: str, node: str = "") -> dict[str, Any]:
    """Return the 24 h or 7 d history as columns: the system's used/available/swap averages
    (and used max), each model's average RSS, averaged again into ``bucket``-second steps."""
    if range_name not in RANGES:
        return {"available": False, "reason": f"unknown range {range_name!r}"}
    model = rollup_model()
    if model is None:
        return {"available": False, "reason": "memory rollups are not recorded by this build"}
    span, bucket = RANGES[range_name]
    fields = ("minute", "scope", "model", "used_avg", "used_max", "available_avg", "swap_used_avg")
    now = timezone.now()
    since = now - span
    rows = (
        model.objects.filter(minute__gte=since, node=node).order_by("minute").values_list(*fields)
    )  # several hosts: ``node``'s machine
    out = with_gaps(_bucketed(rows, bucket), bucket)
    window = [since.timestamp(), now.timestamp()]  # the x-axis spans it, however few points
    if not out["time"]:
        reason = "no rollups yet (the memory-rollup job folds the router's ring every minute)"
        return {"available": False, "reason": reason, "window": window}
    return {"available": True, "bucket": bucket, "window": window, **out}


def with_gaps(out: dict[str, Any], bucket: int) -> dict[str, Any]:
    """Put a point of nulls into every stretch without rollups (the router was down), so the
    chart draws a gap there instead of a line across it; a model not loaded in a bucket is
    already null there."""
    times = out["time"]
    keep: list[int | None] = []  # index into the columns, or None for a gap point
    for i, t in enumerate(times):
        if i and t - times[i - 1] > bucket:
            keep.append(None)
        keep.append(i)

    def pick(column: list[Any]) -> list[Any]:
        return [None if i is None else column[i] for i in keep]

    gap_times: list[float] = []
    for k in keep:  # a gap point sits one bucket after the point before it
        gap_times.append(times[k] if k is not None else gap_times[-1] + bucket)
    return {
        "time": gap_times,
        "system": {key: pick(column) for key, column in out["system"].items()},
        "models": {name: pick(column) for name, column in out["models"].items()},
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _bucketed(rows: Any, bucket: int) -> dict[str, Any]:
    """Average per ``bucket`` seconds (the maximum for ``used_max``)."""
    system: dict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    per_model: dict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for minute, scope, name, used_avg, used_max, available, swap in rows:
        t = minute.timestamp() // bucket * bucket
        if scope == "system":
            values = {"used": used_avg, "used_max": used_max, "available": available}
            for key, value in (values | {"swap_used": swap}).items():
                if value is not None:
                    system[t][key].append(float(value))
        else:
            per_model[t][name].append(float(used_avg))
    times = sorted(set(system) | set(per_model))
    names = sorted({n for per in per_model.values() for n in per})
    columns: dict[str, list[float | None]] = {
        "used": [_mean(system[t]["used"]) for t in times],
        "used_max": [max(system[t]["used_max"], default=None) for t in times],
        "available": [_mean(system[t]["available"]) for t in times],
        "swap_used": [_mean(system[t]["swap_used"]) for t in times],
    }
    models_out = {n: [_mean(per_model[t].get(n, [])) for t in times] for n in names}
    return {"time": times, "system": columns, "models": models_out}
