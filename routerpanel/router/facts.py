"""What the engine knows beside the scheduler's table, and the snapshot made from both.

``Facts`` keeps each model's process facts — pid, port, ready payload, loading progress, last
exit, when its state last changed, who its child was spawned for — and the one-hour memory ring
(S9). ``snapshot`` renders the whole state, JSON-able, for ``/models``, the dashboard and
``/ready``; times in it are wall-clock seconds. Owned by the engine's loop.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from routerpanel.router.address import LOOPBACK, ChildAddress, shown
from routerpanel.router.catalogue import ModelExitedData
from routerpanel.router.config import PresetSpec, RouterConfig
from routerpanel.router.decisions import ModelView, QueueEntryView
from routerpanel.router.memory import MemorySample
from routerpanel.router.payloads import exit_data, queue_data, system_data
from routerpanel.router.supervisor import ChildExited, ChildReady, ChildStarted


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
    last_exit: ModelExitedData | None = None
    load_seconds: float | None = None  # how long its last load took: a queued entry's ETA
    spawned_for: str = ""  # the actor whose request spawned the current child
    host: str = LOOPBACK  # where the current child listens
    key: str | None = field(default=None, repr=False)  # its API key (issue 18): never shown

    @property
    def address(self) -> ChildAddress:
        return ChildAddress(self.host, self.port or 0, self.key)


class Facts:
    """Keep the per-model process facts and the memory ring for snapshot() (engine-owned)."""

    def __init__(self, ring: int) -> None:
        self._children: dict[str, ChildFacts] = {}
        self.memory: deque[MemorySample] = deque(maxlen=ring)
        self.since = time.time()  # every model is unloaded since the engine was made
        self._rows = Rows()

    def child(self, name: str) -> ChildFacts:
        if (child := self._children.get(name)) is None:
            child = self._children[name] = ChildFacts(self.since)
        return child

    def spawning(self, name: str, argv: tuple[str, ...]) -> None:
        child = self.child(name)
        child.argv, child.pid, child.port, child.info, child.progress = argv, None, None, {}, None
        child.key = None

    def started(self, ev: ChildStarted) -> None:
        child = self.child(ev.name)
        child.pid, child.port = ev.pid, ev.port  # again after a bind-failure retry (S2)
        child.host, child.key = ev.host, ev.key  # a new key with every spawn
        child.last_port = ev.port

    def ready(self, ev: ChildReady) -> None:
        child = self.child(ev.name)
        child.port, child.info, child.progress = ev.port, ev.info, None
        child.loaded_at, child.load_seconds = time.time(), ev.load_seconds

    def exited(self, ev: ChildExited, state: str | None, before: str | None) -> ModelExitedData:
        """Record the exit; return the ``model.exited`` data."""
        data = exit_data(ev, state, before)
        child = self.child(ev.name)
        child.pid = child.port = child.loaded_at = child.key = None
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
        changes: int,
        views: Callable[[], Iterable[ModelView]],
        view_of: Callable[[str], ModelView],
        queue: tuple[QueueEntryView, ...],
        spec_of: Callable[[str], PresetSpec | None],
        holders: dict[str, dict[str, int]],
        config: RouterConfig,
        wall: Callable[[float], float],
    ) -> dict[str, Any]:
        """The whole state. ``changes``: the feed's count of events that may change any row;
        while it stands, the rows of models that do not run are the ones made last time."""
        entries, latest = {e.model: e for e in queue}, self.latest

        def row(v: ModelView) -> dict[str, Any]:
            child = self._children.get(v.name) or ChildFacts(self.since)
            data = model_data(v, spec_of(v.name), child, entries.get(v.name), latest, wall)
            return data | {"holders": holders.get(v.name, {})}

        if self._rows.version == changes:
            models = self._rows.fresh(lambda name: row(view_of(name)))
        else:
            models = [row(v) for v in views()]
            self._rows.keep(changes, models)
        return {
            "seq": seq,
            "models": models,
            "queue": queue_data(queue, wall)["entries"],
            "memory": None if latest is None else system_data(latest.system),
            "config": dataclasses.asdict(config),
        }


class Rows:
    """The snapshot's model rows, kept between changes: with ten thousand presets, building every
    row is most of a snapshot's cost (and of ``/models``). Valid while the feed's ``changes``
    stands; the rows of models that run, stop, wait in the queue, hold a lease or back off
    (``live``) are built again every time, as memory samples, logs and progress change them
    without counting as changes. Readers get the same row objects: they copy, never mutate."""

    def __init__(self) -> None:
        self.version = -1
        self._rows: list[dict[str, Any]] = []
        self._live: dict[int, str] = {}  # index -> name

    def keep(self, version: int, rows: list[dict[str, Any]]) -> None:
        self.version, self._rows = version, rows
        self._live = {i: r["name"] for i, r in enumerate(rows) if live(r)}

    def fresh(self, build: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
        out = list(self._rows)
        for i, name in self._live.items():
            out[i] = build(name)
        return out


def live(row: dict[str, Any]) -> bool:
    """Whether a row can change without a counted event (see ``Rows``)."""
    return bool(
        row["pid"] is not None or row["state"] not in IDLE or row["stopping"] or row["in_flight"]
        or row["queue_position"] is not None or row["holders"] or row["backoff"]
        or row["progress"] is not None
    )  # fmt: skip


IDLE = frozenset({"unloaded", "failed", "quarantined"})


def child_args(argv: Iterable[str], port: int, host: str = LOOPBACK) -> list[str]:
    """The argv as spawned: the supervisor adds the host and the port (S2); a model never
    spawned shows ``--port 0``, as llama.cpp does (ROUTER_SPEC 4.3). A keyed child's key file
    is left out, and any key is masked."""
    argv = shown(argv)
    return [*argv, "--host", host, "--port", str(port)] if argv else []


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
        "nodes": list(spec.nodes) if spec else [],  # where it may run (issue 18); []: any node
        "backoff": backoff,  # a crash loop holds its next start back until ``until`` (wall)
        "exit_code": child.exit_code,
        "last_exit": child.last_exit,
        "args": child_args(
            child.argv or (spec.argv if spec else ()), child.port or child.last_port, child.host
        ),
        "info": child.info,
        "progress": child.progress,
    }
