"""Publish what the engine knows: numbered events, subscriptions, and the snapshot's facts.

``Feed`` stamps each published event with the next ``seq`` (1, 2, 3, … with no gaps at the
source) and pushes it into every ``Subscription``. A subscription is a bounded buffer: when its
reader falls behind, the OLDEST events are dropped, so the next event it reads shows a seq gap
and the reader asks for a snapshot (DESIGN §7, STYLE 14). Dropping the oldest rather than the
newest makes the gap visible at once instead of after a backlog of stale events.

``Facts`` is the read side the engine keeps beside the scheduler's table: each model's pid, port,
ready payload, progress and last exit, and the one-hour memory ring (S9). The rest are pure
helpers that shape scheduler and supervisor values into JSON-able event ``data``, snapshot rows
included; times in them are wall-clock seconds (``time.time()``). The engine's loop owns all of
it; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from routerpanel.router.config import PresetSpec, RouterConfig
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
from routerpanel.router.supervisor import ChildExited, ChildReady, ChildStarted, LogLine

log = logging.getLogger(__name__)


@dataclass
class ChildFacts:
    """What the engine knows of a model's process beyond the scheduler's table."""

    state_since: float | None = None  # wall clock of its last state or stopping change
    argv: tuple[str, ...] = ()
    pid: int | None = None
    port: int | None = None
    last_port: int = 0  # the most recent spawn's port, kept after the exit (ROUTER_SPEC 4.3)
    loaded_at: float | None = None  # wall clock
    info: dict[str, Any] = field(default_factory=dict)  # the child's ready payload
    progress: dict[str, Any] | None = None  # the last loading line's payload
    exit_code: int | None = None
    last_exit: dict[str, Any] | None = None
    load_seconds: float | None = None  # how long its last load took: a queued entry's ETA


class Facts:
    """Keep the per-model process facts and the memory ring for snapshot() (engine-owned)."""

    def __init__(self, ring: int) -> None:
        self._children: dict[str, ChildFacts] = {}
        self.memory: deque[MemorySample] = deque(maxlen=ring)
        self.since = time.time()  # every model is unloaded since the engine was made

    def child(self, name: str) -> ChildFacts:
        if (child := self._children.get(name)) is None:
            child = self._children[name] = ChildFacts(self.since)
        return child

    def spawning(self, name: str, argv: tuple[str, ...]) -> None:
        child = self.child(name)
        child.argv, child.pid, child.port, child.info, child.progress = argv, None, None, {}, None

    def started(self, ev: ChildStarted) -> None:
        child = self.child(ev.name)
        child.pid, child.port = ev.pid, ev.port  # again after a bind-failure retry (S2)
        child.last_port = ev.port

    def ready(self, ev: ChildReady) -> None:
        child = self.child(ev.name)
        child.port, child.info, child.progress = ev.port, ev.info, None
        child.loaded_at, child.load_seconds = time.time(), ev.load_seconds

    def exited(self, ev: ChildExited, state: str | None) -> dict[str, Any]:
        """Record the exit; return the ``model.exited`` data."""
        data = exit_data(ev, state)
        child = self.child(ev.name)
        child.pid = child.port = child.loaded_at = None
        child.exit_code, child.last_exit = ev.exit_code, data
        return data

    def forget(self, name: str) -> None:
        self._children.pop(name, None)

    @property
    def latest(self) -> MemorySample | None:
        return self.memory[-1] if self.memory else None

    def snapshot(
        self,
        seq: int,
        views: Iterable[ModelView],
        queue: tuple[QueueEntryView, ...],
        spec_of: Callable[[str], PresetSpec | None],
        holders: dict[str, dict[str, int]],
        config: RouterConfig,
        wall: Callable[[float], float],
    ) -> dict[str, Any]:
        entries, latest = {e.model: e for e in queue}, self.latest
        models = [
            model_data(v, spec_of(v.name), self._children.get(v.name) or ChildFacts(self.since),
                       entries.get(v.name), latest, wall) | {"holders": holders.get(v.name, {})}
            for v in views
        ]  # fmt: skip
        return {
            "seq": seq,
            "models": models,
            "queue": queue_data(queue, wall)["entries"],
            "memory": None if latest is None else system_data(latest.system),
            "config": dataclasses.asdict(config),
        }


@dataclass(frozen=True)
class EngineEvent:
    """One published fact; ``seq`` increases by exactly 1 per event, starting at 1."""

    seq: int
    type: str  # dotted: "model.state", "queue.changed", …
    time: float  # wall clock (time.time())
    data: dict[str, Any]


class Subscription:
    """Iterate the engine's events in order; a slow reader loses the oldest ones (a seq gap).

    ``async for event in sub`` ends when the engine shuts down or ``close()`` is called. Use it
    as an async context manager to unsubscribe on exit.
    """

    def __init__(self, maxsize: int, on_close: Callable[[Subscription], None]) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be >= 1")
        self._items: deque[EngineEvent] = deque(maxlen=maxsize)
        self._ready = asyncio.Event()
        self._on_close = on_close
        self._closed = False
        self.dropped = 0  # events this reader never saw

    def push(self, event: EngineEvent) -> None:
        """Append ``event``; drop the oldest when full. Never blocks (called by the engine)."""
        if self._closed:
            return
        if len(self._items) == self._items.maxlen:
            self.dropped += 1
        self._items.append(event)
        self._ready.set()

    def close(self) -> None:
        """Stop receiving; a reader gets what is buffered, then the iteration ends."""
        if not self._closed:
            self._closed = True
            self._on_close(self)
            self._ready.set()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> EngineEvent:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Feed:
    """Own the seq counter, the taps and the subscribers; used only from the engine's loop.

    A *tap* is called synchronously with every event as it is published, before the decision
    that follows it is carried out (the audit journal: a row on disk before its effect). It
    must be quick and must not raise; an exception is logged and the engine goes on.
    """

    def __init__(self) -> None:
        self.seq = 0
        self._subscribers: set[Subscription] = set()
        self.taps: list[Callable[[EngineEvent], None]] = []

    def publish(self, type_: str, data: dict[str, Any]) -> EngineEvent:
        self.seq += 1
        event = EngineEvent(self.seq, type_, time.time(), data)
        for tap in self.taps:
            try:
                tap(event)
            except Exception:
                log.exception("an event tap failed on event %d (%s)", event.seq, type_)
        for sub in list(self._subscribers):
            sub.push(event)
        return event

    def subscribe(self, maxsize: int) -> Subscription:
        sub = Subscription(maxsize, self._subscribers.discard)
        self._subscribers.add(sub)
        return sub

    def close(self) -> None:
        for sub in list(self._subscribers):
            sub.close()


# ---- event data ---------------------------------------------------------------------------


def trigger_data(trigger: Trigger | None) -> dict[str, Any] | None:
    if trigger is None:
        return None
    return {
        "actor": trigger.actor,
        "model": trigger.model,
        "request_id": trigger.request_id,
        "queue_depth": trigger.queue_depth,
    }


def state_data(change: StateChanged, nxt: Decision | None) -> dict[str, Any]:
    """``model.state``; ``nxt`` (the decision after it) is its spawn/stop/kill, if it names it.

    The scheduler emits the change and then the Spawn/Stop/Kill that caused it, which carries
    the trigger (who, for which model and request) that the audit log wants on the change.
    """
    action, trigger, stop_timeout, stop_reason = None, None, None, None
    if isinstance(nxt, Spawn | Stop | Kill) and nxt.model == change.model:
        action, trigger = type(nxt).__name__.lower(), nxt.trigger
        stop_timeout = nxt.stop_timeout if isinstance(nxt, Stop) else None
        stop_reason = nxt.reason.value if isinstance(nxt, Stop | Kill) else None
    return {
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
) -> dict[str, Any]:
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
    return {"entries": rows, "depth": sum(row["waiters"] for row in rows)}


def exit_data(exited: ChildExited, state: str | None) -> dict[str, Any]:
    """``model.exited``: ``clean`` follows the scheduler (an exit we asked for is an unload)."""
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
        "last_lines": [line.text for line in exited.last_lines],
    }


def spawn_failure(model: str, error: str) -> ChildExited:
    """Return the exit of a child that was never started (exit code None, A10)."""
    line = LogLine(model, "router", error, time.time())
    return ChildExited(model, 0, 0, None, None, 0.0, False, False, False, None, error, (line,))


def reload_data(done: PresetsReloaded) -> dict[str, Any]:
    lists = {"added": done.added, "removed": done.removed, "changed": done.changed}
    return {"actor": done.actor, "restarted": list(done.restarted)} | {
        k: list(v) for k, v in lists.items()
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


def eviction_data(decision: Stop | Kill, latest: MemorySample | None) -> dict[str, Any]:
    """``model.evicted``: who was stopped for whom, and the memory just before."""
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
    }


def child_args(argv: Iterable[str], port: int) -> list[str]:
    """The argv as spawned: the supervisor adds the loopback host and the port (S2); a model
    never spawned shows ``--port 0``, as llama.cpp does (ROUTER_SPEC 4.3)."""
    argv = list(argv)
    return [*argv, "--host", "127.0.0.1", "--port", str(port)] if argv else []


def model_data(
    view: ModelView,
    spec: PresetSpec | None,
    child: ChildFacts,
    entry: QueueEntryView | None,
    latest: MemorySample | None,
    wall: Callable[[float], float],
) -> dict[str, Any]:
    """One model of the snapshot; ``status`` is llama.cpp's value, ``state`` ours."""
    mem = latest.child(view.name) if latest is not None and child.pid is not None else None
    backoff = None
    if view.backoff_until is not None and (until := wall(view.backoff_until)) > time.time():
        backoff = {"until": until, "strikes": view.crash_strikes, "reason": view.backoff_reason}
    return {
        "name": view.name,
        "aliases": list(spec.aliases) if spec else [],
        "state": view.state.value,
        "state_since": child.state_since,
        "status": view.api_status,
        "failed": view.failed,
        "stopping": view.stopping,
        "pid": child.pid,
        "port": child.port,
        "in_flight": view.in_flight,
        "last_used": wall(view.last_used) if view.last_used else None,
        "loaded_at": child.loaded_at,
        "load_seconds": child.load_seconds,
        "queue_position": entry.position if entry else None,
        "queue_waiters": entry.waiters if entry else 0,
        "memory": mem.rss if mem is not None else None,
        "pinned": view.pinned,
        "stop_timeout": spec.stop_timeout if spec else None,
        "hang_timeout": spec.hang_timeout if spec else None,
        "backoff": backoff,  # a crash loop holds its next start back until ``until`` (wall)
        "exit_code": child.exit_code,
        "last_exit": child.last_exit,
        "args": child_args(
            child.argv or (spec.argv if spec else ()), child.port or child.last_port
        ),
        "info": child.info,
        "progress": child.progress,
    }
