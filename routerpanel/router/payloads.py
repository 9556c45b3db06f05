"""Shape scheduler and supervisor values into the data of the catalogue's events.

Pure helpers: each returns the JSON-able ``data`` of one event type (catalogue.py), times in
wall-clock seconds. ``RequestRows`` makes each queued request's row once, so that a queue event
at hundreds of entries costs less than the scheduler's decision that caused it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from routerpanel.router.catalogue import (
    ModelEvictedData,
    ModelExitedData,
    ModelStateData,
    ModelStuckData,
    PresetsReloadedData,
    QueueChangedData,
    TriggerData,
)
from routerpanel.router.decisions import (
    Decision,
    Kill,
    ModelView,
    PresetsReloaded,
    QueueEntryView,
    Spawn,
    StateChanged,
    Stop,
    Trigger,
    WaiterView,
)
from routerpanel.router.memory import MemorySample, SystemMemory
from routerpanel.router.supervisor import ChildExited, ChildStuck, LogLine


def trigger_data(trigger: Trigger | None) -> TriggerData | None:
    if trigger is None:
        return None
    return {
        "actor": trigger.actor,
        "model": trigger.model,
        "request_id": trigger.request_id,
        "queue_depth": trigger.queue_depth,
    }


def state_data(change: StateChanged, nxt: Decision | None) -> ModelStateData:
    """``model.state``; ``nxt`` (the decision after it) is its spawn/stop/kill, if it names it.

    The scheduler emits the change and then the Spawn/Stop/Kill that caused it, which carries
    the trigger (who, for which model and request) that the audit log wants on the change.
    """
    action, trigger, stop_timeout, stop_reason = None, None, None, None
    if isinstance(nxt, Spawn | Stop | Kill) and nxt.model == change.model:
        action, trigger = type(nxt).__name__.lower(), nxt.trigger
        stop_timeout = nxt.stop_timeout if isinstance(nxt, Stop) else None
        stop_reason = nxt.reason.value if isinstance(nxt, Stop | Kill) else None
    data: ModelStateData = {
        "model": change.model,
        "from": change.from_state.value,
        "to": change.to_state.value,
        "status": change.api_status,
        "stopping": change.stopping,
        "reason": change.reason,
        "action": action,
        "trigger": trigger_data(trigger),
        "stop_timeout": stop_timeout,
        "stop_reason": stop_reason,  # a StopReason value when the change is a stop
    }
    if isinstance(nxt, Stop) and nxt.model == change.model:
        data["idle_for"] = nxt.idle_for  # how long it had been idle when it was stopped
    return data


class RequestRows:
    """Make each queued request's JSON row once (engine-owned; rows are shared and read-only).

    A queue event lists every entry with its oldest requests; at hundreds of entries, building
    those rows anew for every join or leave cost more than the scheduler's decision. The
    scheduler keeps the very same immutable waiter objects while they wait, so a row is keyed by
    the object and rows of waiters no longer listed are dropped.
    """

    def __init__(self) -> None:
        self._rows: dict[int, tuple[WaiterView, dict[str, Any]]] = {}

    def rows(self, entries: Iterable[QueueEntryView], wall: Callable[[float], float]) -> list[Any]:
        """Return, per entry, the list of its requests' rows."""
        used: dict[int, tuple[WaiterView, dict[str, Any]]] = {}
        out = []
        for e in entries:
            rows = []
            for w in e.requests:
                hit = self._rows.get(id(w))
                if hit is None or hit[0] is not w:  # a new waiter (or a reused id)
                    hit = (w, request_row(w, wall))
                used[id(w)] = hit
                rows.append(hit[1])
            out.append(rows)
        self._rows = used
        return out


def request_row(w: WaiterView, wall: Callable[[float], float]) -> dict[str, Any]:
    return {
        "request_id": w.request_id,
        "kind": w.kind.value,
        "actor": w.actor,
        "since": wall(w.since),
    }


def queue_data(
    entries: Iterable[QueueEntryView],
    wall: Callable[[float], float],
    requests: RequestRows | None = None,
) -> QueueChangedData:
    """``queue.changed`` (``added`` is the engine's to fill: it knows the previous entries)."""
    entries = tuple(entries)
    listed = (requests or RequestRows()).rows(entries, wall)
    rows = [
        {
            "ticket": e.ticket,
            "model": e.model,
            "position": e.position,
            "waiters": e.waiters,
            "since": wall(e.since),
            "starting": e.starting,
            "restart": e.restart,
            "requests": shown,
        }
        for e, shown in zip(entries, listed, strict=True)
    ]
    return {"entries": rows, "depth": sum(row["waiters"] for row in rows), "added": []}


def exit_data(exited: ChildExited, state: str | None, before: str | None) -> ModelExitedData:
    """``model.exited``: ``clean`` follows the scheduler (an exit we asked for is an unload);
    ``state`` is the model's state after it, ``state_before`` before it."""
    return {
        "model": exited.name,
        "pid": exited.pid,
        "exit_code": exited.exit_code,
        "signal": exited.signal,
        "duration": exited.duration,
        "expected": exited.expected,
        "clean": exited.expected or exited.exit_code == 0,
        "force_killed": exited.force_killed,
        "was_ready": exited.was_ready,
        "stop_seconds": exited.stop_seconds,
        "error": exited.error,
        "state": state,
        "state_before": before,
        "last_lines": [line.text for line in exited.last_lines],
    }


def stuck_data(stuck: ChildStuck, state: str) -> ModelStuckData:
    """``model.stuck``: the group survived SIGKILL (S6); ``from_state`` before it went stuck."""
    return {"model": stuck.name, "pid": stuck.pid, "seconds_since_kill": stuck.seconds_since_kill,
            "from_state": state}  # fmt: skip


def spawn_failure(model: str, error: str) -> ChildExited:
    """Return the exit of a child that was never started (exit code None, A10)."""
    line = LogLine(model, "router", error, time.time())
    return ChildExited(model, 0, 0, None, None, 0.0, False, False, False, None, error, (line,))


def reload_data(done: PresetsReloaded) -> PresetsReloadedData:
    return {
        "actor": done.actor,
        "added": list(done.added),
        "removed": list(done.removed),
        "changed": list(done.changed),
        "restarted": list(done.restarted),
    }


def system_data(system: SystemMemory) -> dict[str, Any]:
    return dataclasses.asdict(system)


def sample_data(sample: MemorySample) -> dict[str, Any]:
    """``memory.sample`` and one row of memory_history(); the engine stamps wall-clock time."""
    return {
        "time": sample.time,
        "system": system_data(sample.system),
        "children": {c.name: {"pid": c.pid, "rss": c.rss} for c in sample.children},
    }


def busy_data(
    views: Iterable[ModelView], holders: dict[str, dict[str, int]]
) -> dict[str, dict[str, Any]]:
    """The models with requests in flight and who sent them, sent with every memory sample."""
    return {v.name: {"n": v.in_flight, "by": holders.get(v.name, {})} for v in views if v.in_flight}


def eviction_data(
    decision: Stop | Kill, latest: MemorySample | None, from_state: str
) -> ModelEvictedData:
    """``model.evicted``: who was stopped for whom, how, and the memory just before."""
    before = None
    if latest is not None:
        mem = latest.child(decision.model)
        before = system_data(latest.system) | {"victim_rss": mem.rss if mem else None}
    return {
        "victim": decision.model,
        "reason": decision.reason.value,
        "idle_for": decision.idle_for if isinstance(decision, Stop) else 0.0,
        "in_flight": decision.in_flight,
        "trigger": trigger_data(decision.trigger),
        "queue_depth": decision.trigger.queue_depth,
        "memory_before": before,
        "from_state": from_state,
        "action": "stop" if isinstance(decision, Stop) else "kill",
        "stop_timeout": decision.stop_timeout if isinstance(decision, Stop) else None,
    }
