"""Every event the router publishes, defined once: its name and the shape of its data.

The engine publishes ``EngineEvent(seq, type, time, data)`` (feed.py) with ``type`` one of
``Event`` and ``data`` the matching TypedDict below; adapters publish three facts of their
own through ``Engine.note`` (``MESSAGE_EXPIRED``, ``SERVICE_OUTAGE``, ``NODE_CHANGED``). Every
reader — the audit mapper, the metrics, the SSE translation, the dashboard consumer and the
browser's scripts — dispatches on these names through an explicit table, never on a string
typed again: rename an event here and every reader that forgot it fails its tests. The browser
gets the names as JSON (``names()``, rendered into each page).

Times in data are wall-clock seconds (``time.time()``). A leaf module: stdlib only.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, TypedDict


class Event(StrEnum):
    """The event types, by their wire names (dotted: area, then what happened)."""

    ROUTER_STARTED = "router.started"
    ROUTER_STOPPING = "router.stopping"
    MODEL_STATE = "model.state"
    MODEL_PROGRESS = "model.progress"
    MODEL_LOG = "model.log"
    MODEL_EVICTED = "model.evicted"
    MODEL_HUNG = "model.hung"
    MODEL_EXITED = "model.exited"
    MODEL_STUCK = "model.stuck"
    MODEL_BACKOFF = "model.backoff"
    MODEL_REFUSED = "model.refused"  # a load that cannot start was refused before any eviction
    QUEUE_CHANGED = "queue.changed"
    QUEUE_CANCELLED = "queue.cancelled"
    LEASE_EXPIRED = "lease.expired"
    MEMORY_SAMPLE = "memory.sample"
    MEMORY_SETTLED = "memory.settled"
    PRESETS_RELOADED = "presets.reloaded"
    SETTINGS_CHANGED = "settings.changed"
    MESSAGE_EXPIRED = "message.expired"  # an adapter's: messages dropped, their senders gone
    SERVICE_OUTAGE = "service.outage"  # an adapter's: Redis or the database came back
    NODE_CHANGED = "node.changed"  # an adapter's: a node of several hosts joined or was lost


# Events that change nothing on a card or in the audit log: readers may skip them quickly.
QUIET = frozenset({Event.MEMORY_SAMPLE, Event.MODEL_LOG})


def names() -> dict[str, str]:
    """The catalogue for the browser: ``{"MODEL_STATE": "model.state", …}``."""
    return {event.name: event.value for event in Event}


class TriggerData(TypedDict):
    """Who and what caused a spawn or stop (``decisions.Trigger``)."""

    actor: str
    model: str | None
    request_id: str | None
    queue_depth: int


class RouterStartedData(TypedDict):
    models: list[str]
    leftovers: list[dict[str, Any]]  # children of an earlier router killed at start (S8)


class RouterStoppingData(TypedDict):
    actor: str


ModelStateData = TypedDict(
    "ModelStateData",
    {
        "model": str,
        "from": str,
        "to": str,
        "status": str,  # llama.cpp's value
        "stopping": bool,
        "reason": str,
        "action": str | None,  # "spawn", "stop", "kill": what made the change
        "trigger": TriggerData | None,
        "stop_timeout": float | None,
        "stop_reason": str | None,  # a decisions.StopReason value
        "idle_for": float,  # a stop: seconds it had been idle (an eviction's, a ttl's)
        "load_seconds": float,  # loading -> loaded
        "info": dict[str, Any],  # the child's /v1/models object, with its first ready
        "loaded_for": str,  # loading -> loaded: the actor whose request spawned the child
        "log_tail": list[str],  # -> quarantined: the failed child's last lines
    },
    total=False,
)
"""A model's state or stopping flag changed (exactly one event per change)."""


class ModelProgressData(TypedDict):
    model: str
    progress: dict[str, Any]


class ModelLogData(TypedDict):
    model: str
    stream: str
    text: str
    time: float


class ModelEvictedData(TypedDict):
    """An LRU victim (or a shrink) is being stopped; ``from``/``action``/``stop_timeout`` as on
    its ``model.state`` event, so a reader needs no memory of that."""

    victim: str
    reason: str
    idle_for: float
    in_flight: int
    trigger: TriggerData | None
    queue_depth: int
    memory_before: dict[str, Any] | None
    from_state: str
    action: str
    stop_timeout: float | None


class ModelHungData(TypedDict, total=False):
    model: str
    pid: int | None
    port: int | None
    idle_seconds: float
    in_flight: int
    holders: dict[str, int]
    probe: str
    from_state: str
    action: str


class ModelExitedData(TypedDict):
    model: str
    pid: int
    exit_code: int | None
    signal: int | None
    duration: float
    expected: bool
    clean: bool
    force_killed: bool
    was_ready: bool
    stop_seconds: float | None
    error: str | None
    state: str | None  # the scheduler's state after the exit
    state_before: str | None  # and before it
    last_lines: list[str]


class ModelStuckData(TypedDict):
    model: str
    pid: int
    seconds_since_kill: float
    from_state: str


class ModelBackoffData(TypedDict):
    model: str
    seconds: float
    strikes: int
    reason: str
    until: float


class QueueChangedData(TypedDict):
    entries: list[dict[str, Any]]
    depth: int
    added: list[int]  # tickets of entries new in this change (not a reload's restart)


class QueueCancelledData(TypedDict):
    model: str
    request_ids: list[str]
    actor: str
    by_model: bool


class LeaseExpiredData(TypedDict):
    lease_id: str
    request_id: str
    model: str
    actor: str
    why: str  # "not renewed" (its TTL passed) or "disconnected" (its router connection closed)


class MemorySampleData(TypedDict):
    time: float
    system: dict[str, Any]
    children: dict[str, dict[str, Any]]
    in_flight: dict[str, dict[str, Any]]


class MemorySettledData(TypedDict):
    model: str
    waited: float
    by: str
    available: int | None


class ModelRefusedData(TypedDict):
    """A request or load for a model that cannot start (preflight.py) was answered 503 at once:
    nobody was evicted for it."""

    model: str
    reason: str  # what is missing, naming it and the preset
    actor: str
    request_id: str
    kind: str  # "request" or "load"


class PresetsReloadedData(TypedDict):
    actor: str
    added: list[str]
    removed: list[str]
    changed: list[str]
    restarted: list[str]


class SettingsChangedData(TypedDict):
    actor: str
    config: dict[str, Any]


class MessageExpiredData(TypedDict):
    counts: dict[str, int]
    total: int


class ServiceOutageData(TypedDict, total=False):
    service: str
    seconds: float
    effect: str
    how: str  # "was unreachable" when absent; "refused writes" for a full data disk


class NodeChangedData(TypedDict):
    """A node of several hosts (issue 18): ``joined`` (it started; ``lost_for`` set when it
    returns after being lost) or ``lost`` (no heartbeat for ``silent_for`` seconds; told by
    another node)."""

    node: str
    change: str  # "joined" or "lost"
    host: str
    models: list[str]  # lost: the models it was running; joined: the presets it may run
    silent_for: float | None
    lost_for: float | None
