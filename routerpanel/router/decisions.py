"""What the scheduler returns: decisions to apply, events to publish, and read-only views.

Every scheduler input returns ``list[Decision]`` in the order things happened. *Decisions*
(``Grant``, ``Reject``, ``Spawn``, ``Stop``, ``Kill``) are orders the engine must carry out;
*events* (``StateChanged``, ``QueueChanged``, ``Settled``, ``BackedOff``, ``PresetsReloaded``)
are facts to publish and audit. The engine stamps each published event with its monotonically
increasing ``seq`` (DESIGN §3); the scheduler, being pure, does not number anything but queue
tickets.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from routerpanel.router.config import PresetSpec
from routerpanel.router.states import ApiStatus, ModelState, api_failed, api_status

SCHEDULER_ACTOR = "scheduler"
ROUTER_ACTOR = "router"  # the router itself, e.g. stopping its children at shutdown


class RequestKind(StrEnum):
    """A proxied request holds the model while it runs; a load only asks for it to start (A9)."""

    PROXY = "proxy"
    LOAD = "load"


class Priority(StrEnum):
    """An API key's priority class (issue 17.1), read by the ``fair`` queue policy (17.5)."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


_PRIORITIES: dict[str, Priority] = {p.value: p for p in Priority}


def priority_of(value: str) -> Priority:
    """``Priority(value)`` at the cost of a dict lookup (the enum's call is several Python
    calls, twice per request); ValueError for an unknown class, as the enum raises."""
    try:
        return _PRIORITIES[value]
    except (KeyError, TypeError):
        return Priority(value)


class StopReason(StrEnum):
    """Why a child is told to stop; the audit log's ``kind``."""

    EVICTION = "eviction"  # LRU victim for a queued model (A5)
    SHRINK = "shrink"  # models_max or the memory budget was lowered below what runs (A5)
    TTL = "ttl"  # idle longer than its preset's ttl (A11)
    UNLOAD = "unload"  # an operator or API client asked
    RELOAD = "reload"  # its command changed: restart (A14)
    REMOVED = "removed"  # its preset is gone (A14)
    SHUTDOWN = "shutdown"
    HUNG = "hung"  # busy, no byte out and no progress: the watchdog kills it at once


@dataclass(frozen=True, slots=True)
class Trigger:
    """Who and what caused a Spawn, Stop or Kill: the audit row's actor, trigger and depth."""

    actor: str
    model: str | None = None  # the model that needed the slot (evictions, spawns)
    request_id: str | None = None  # that entry's oldest waiter, if any
    queue_depth: int = 0  # waiters in the whole queue when decided


# ---- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    """Let the request proceed. A proxy grant holds the model until ``request_finished``."""

    request_id: str
    model: str
    kind: RequestKind


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer the request with an error in llama.cpp's shape; the request is forgotten."""

    request_id: str
    model: str
    status: int
    error_type: str
    message: str
    retry_after: int | None = None  # seconds, for a Retry-After header (A8)
    details: tuple[str, ...] = ()  # the child's last log lines (A10)


@dataclass(frozen=True, slots=True)
class Spawn:
    """Start a child for ``model`` with ``spec``; the model is already ``loading`` and counted."""

    model: str
    spec: PresetSpec
    ticket: int  # the queue entry it was claimed for (A4)
    trigger: Trigger


@dataclass(frozen=True, slots=True)
class Stop:
    """Ask a loaded or sleeping child to exit; SIGKILL its group after ``stop_timeout`` (S4)."""

    model: str
    reason: StopReason
    trigger: Trigger
    stop_timeout: float
    idle_for: float  # seconds since last_used
    in_flight: int


@dataclass(frozen=True, slots=True)
class Kill:
    """SIGKILL a loading child's group at once (S4)."""

    model: str
    reason: StopReason
    trigger: Trigger
    in_flight: int


# ---- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateChanged:
    """A model's state or stopping flag changed (exactly one per change, none otherwise)."""

    model: str
    from_state: ModelState
    to_state: ModelState
    stopping: bool
    reason: str

    @property
    def api_status(self) -> ApiStatus:
        return api_status(self.to_state)


@dataclass(frozen=True, slots=True)
class WaiterView:
    """One request waiting in a queue entry: what an operator sees before cancelling it."""

    request_id: str
    kind: RequestKind
    actor: str
    since: float
    priority: Priority = Priority.NORMAL
    patient: bool = False  # it asked to wait even when no slot can free up (blocked.py)


@dataclass(frozen=True, slots=True)
class QueueEntryView:
    """One queue entry: one model, the requests that wait for it (A2)."""

    ticket: int  # increasing in FIFO order; stable while the entry lives
    model: str
    position: int  # 1-based
    waiters: int
    since: float  # when its oldest current waiter arrived (or the entry was made)
    starting: bool  # its model is loading for it: no slot needed any more
    restart: bool  # held by a reload restart (A14), even with no waiters
    requests: tuple[WaiterView, ...] = ()  # the oldest waiters, at most QUEUE_VIEW_REQUESTS


@dataclass(frozen=True, slots=True)
class QueueChanged:
    """The queue's entries, positions or depths changed."""

    entries: tuple[QueueEntryView, ...]

    @property
    def depth(self) -> int:
        return sum(entry.waiters for entry in self.entries)


@dataclass(frozen=True, slots=True)
class Settled:
    """The settle gate opened (memory mode): audit how long the freed memory took to show up."""

    model: str  # the head it opened for
    waited: float
    by: Literal["memory", "timeout"]
    available: int | None  # the sample that opened it, if any


@dataclass(frozen=True, slots=True)
class BackedOff:
    """A ready child died unasked soon after it became ready: no respawn for ``seconds``."""

    model: str
    seconds: float
    strikes: int  # consecutive quick deaths
    reason: str  # the death, in words ("exit code 3", "killed: it stopped responding")


@dataclass(frozen=True, slots=True)
class PresetsReloaded:
    """A reload reconciled the presets (A14); ``restarted`` are the running ones it restarts."""

    actor: str
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    restarted: tuple[str, ...]


Decision = (
    Grant
    | Reject
    | Spawn
    | Stop
    | Kill
    | StateChanged
    | QueueChanged
    | Settled
    | BackedOff
    | PresetsReloaded
)


@dataclass(frozen=True, slots=True)
class ModelView:
    """A read-only snapshot of one model for ``/models`` and the dashboard."""

    name: str
    state: ModelState
    stopping: bool
    in_flight: int
    last_used: float
    failures: int  # consecutive failed loads
    pinned: bool
    log_tail: tuple[str, ...]  # from the last unexpected exit
    backoff_until: float | None = None  # no spawn before this (crash loop; scheduler clock)
    crash_strikes: int = 0
    backoff_reason: str = ""

    @property
    def api_status(self) -> ApiStatus:
        return api_status(self.state)

    @property
    def failed(self) -> bool:
        return api_failed(self.state)
