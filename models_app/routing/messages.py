"""The router protocol's messages, one TypedDict each (DESIGN §5, STYLE 13).

The web side sends the requests and reads the answers (the transports of this package); the
router host reads the requests and sends the answers (``worker.RouterHost``). Both ship together:
a message's ``type`` is its name on the channel layer, and the handler that answers it is named
after it. docs/architecture.md tells the protocol (deadlines, boots, what is dropped when).

Web → router (channel ``router``); every one is ``Stamped``:

* ``AcquireMessage``, ``WaitingMessage``: a lease for a request, answered by an
  ``AcquireAnswer`` (queued, then granted or rejected).
* ``RenewMessage``, ``ReleaseMessage``, ``CancelMessage``: giving back; never answered, applied
  however late.
* a ``Call`` (``LoadCall`` … ``LeaseCall``) with the ``Addressed`` fields added (a
  ``CallMessage``): answered by a ``CallAnswer`` (accepted, then a result whose ``body`` is the
  call's answer below). In embedded mode the ``Call`` itself goes to the router host in
  process, and the answer comes back directly.

Router → the events group: ``EventMessage``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, get_args, get_type_hints

from routerpanel.router.errors import ErrorBody

# ---- web → router: the envelope -----------------------------------------------------------------


class Stamped(TypedDict):
    """What every message to the router carries: when it was sent, and when its sender stops
    waiting for it (wall clock). The router drops an expired request unheard."""

    sent: float
    expires: float


class Addressed(Stamped):
    """A message that wants an answer: its id, where to answer, and the router boot its sender
    believes alive (None: it knows none yet); the router drops it when the boot is not its own."""

    request_id: str
    reply_channel: str
    boot: str | None


# ---- web → router: a lease ----------------------------------------------------------------------


class AcquireMessage(Addressed):
    """A lease on ``model``, waiting in its queue as long as it takes."""

    type: Literal["router.acquire"]
    model: str
    actor: str
    autoload: bool
    priority: NotRequired[str]  # the key's class (fair queue policy); absent: normal
    patient: NotRequired[bool]  # wait even when no slot can free up (blocked.py); absent: no


class WaitingMessage(Addressed):
    """Still queued? Asked after a silence; answered queued, granted or rejected again."""

    type: Literal["router.waiting"]
    model: str


class RenewMessage(Stamped):
    type: Literal["router.renew"]
    lease_id: str
    idle: float | None  # seconds since the last byte of the answer went out


class ReleaseMessage(Stamped):
    type: Literal["router.release"]
    lease_id: str


class CancelMessage(Stamped):
    """The web side gave up on an acquire (its client left, or it answered 503)."""

    type: Literal["router.cancel"]
    request_id: str


# ---- web → router: calls ----------------------------------------------------------------------


class LoadCall(TypedDict):
    type: Literal["router.load"]
    model: str
    actor: str


class UnloadCall(TypedDict):
    type: Literal["router.unload"]
    model: str
    actor: str


class CancelQueuedCall(TypedDict):
    """Reject queued requests with 499: every one waiting for ``model``, or the one with the
    request id ``queued_request`` (one of the two is given)."""

    type: Literal["router.cancel_queued"]
    actor: str
    model: NotRequired[str]
    queued_request: NotRequired[str]


class ReloadCall(TypedDict):
    """Reconcile with the stored presets; with ``sources``, re-read --models-preset and
    --models-dir into them first (the API's ``?reload``), as llama.cpp re-reads its sources."""

    type: Literal["router.reload"]
    actor: str
    sources: NotRequired[bool]


class SettingsCall(TypedDict):
    """Apply the stored router settings."""

    type: Literal["router.settings"]
    actor: str


class ReservationsCall(TypedDict):
    """The models reserved now -> the owners (``user:<name>``) each is for: the whole set
    (issue 17.6, the ``reservations_tick`` task)."""

    type: Literal["router.reservations"]
    actor: str
    reservations: dict[str, list[str]]


class SnapshotCall(TypedDict):
    """The engine's whole state."""

    type: Literal["router.snapshot"]


class ReadyCall(TypedDict):
    """``GET /ready``: a cheap summary, no snapshot."""

    type: Literal["router.ready"]


class MemoryCall(TypedDict):
    """The one-hour ring of memory samples."""

    type: Literal["router.memory"]


class MetricsCall(TypedDict):
    """The router's metric families, for ``GET /metrics``."""

    type: Literal["router.metrics"]


class LogsCall(TypedDict):
    """A model's log ring."""

    type: Literal["router.logs"]
    model: str


class LeaseCall(TypedDict):
    """Why did the router end this lease (its child was killed as hung)?"""

    type: Literal["router.lease"]
    lease_id: str


Call = (
    LoadCall
    | UnloadCall
    | CancelQueuedCall
    | ReloadCall
    | SettingsCall
    | ReservationsCall
    | SnapshotCall
    | ReadyCall
    | MemoryCall
    | MetricsCall
    | LogsCall
    | LeaseCall
)

# On channel ``router`` a call travels with the ``Addressed`` fields added:


class LoadMessage(Addressed, LoadCall): ...


class UnloadMessage(Addressed, UnloadCall): ...


class CancelQueuedMessage(Addressed, CancelQueuedCall): ...


class ReloadMessage(Addressed, ReloadCall): ...


class SettingsMessage(Addressed, SettingsCall): ...


class ReservationsMessage(Addressed, ReservationsCall): ...


class SnapshotMessage(Addressed, SnapshotCall): ...


class ReadyMessage(Addressed, ReadyCall): ...


class MemoryMessage(Addressed, MemoryCall): ...


class MetricsMessage(Addressed, MetricsCall): ...


class LogsMessage(Addressed, LogsCall): ...


class LeaseMessage(Addressed, LeaseCall): ...


CallMessage = (
    LoadMessage
    | UnloadMessage
    | CancelQueuedMessage
    | ReloadMessage
    | SettingsMessage
    | ReservationsMessage
    | SnapshotMessage
    | ReadyMessage
    | MemoryMessage
    | MetricsMessage
    | LogsMessage
    | LeaseMessage
)

# Every call's message type, read off ``Call`` (so the two cannot disagree): RouterHost.call
# answers these.
CALL_TYPES = frozenset(get_args(get_type_hints(call)["type"])[0] for call in get_args(Call))

# Messages that only give something back: always applied, however late (an unknown lease or
# request is ignored). Every other message asks for work and is dropped when stale.
GIVING_BACK = frozenset({"router.release", "router.renew", "router.cancel"})


# ---- the calls' answers (a result's body) -------------------------------------------------------


class SuccessAnswer(TypedDict):
    """load, unload, settings: the work has started (load, unload) or is done (settings)."""

    success: bool


class CancelledAnswer(TypedDict):
    success: bool
    cancelled: list[str]  # the request ids rejected


# reload: the preset names {"added", "removed", "changed", "restarted"} (Engine.reload).
ReloadAnswer = dict[str, list[str]]
# reservations: {"reserved", "loading", "unknown"} model names (Engine.set_reservations).
ReservationsAnswer = dict[str, list[str]]
# snapshot: the engine's snapshot (routerpanel.router.facts) plus this router's "boot".
SnapshotAnswer = dict[str, Any]
# ready: the engine's status ({"models", "running", "queued"}) plus this router's "boot".
ReadyAnswer = dict[str, Any]


class MemoryAnswer(TypedDict):
    memory: list[dict[str, Any]]  # samples, oldest first (payloads.sample_data)


class MetricsAnswer(TypedDict):
    metrics: list[dict[str, Any]]  # metric families (metrics.Family.as_json)


class LogsAnswer(TypedDict):
    logs: list[dict[str, Any]]  # {"time", "stream", "text"}, oldest first


class LeaseAnswer(TypedDict):
    """``error`` None: the router did not end the lease; else why, as a refusal's JSON."""

    error: ErrorBody | None
    retry_after: NotRequired[float | None]


AnswerBody = (
    SuccessAnswer
    | CancelledAnswer
    | ReloadAnswer
    | SnapshotAnswer
    | MemoryAnswer
    | MetricsAnswer
    | LogsAnswer
    | LeaseAnswer
)


# ---- router → web (the request's reply channel) --------------------------------------------------


class QueuedMessage(TypedDict):
    type: Literal["router.queued"]
    request_id: str
    position: int
    boot: str


class GrantedMessage(TypedDict):
    """A lease, and the request's receipt (issue 17.3): milliseconds queued, the load it waited
    for (0: the model was loaded), the models evicted for that load, and whether its entry
    caused it. The receipt's keys may be missing (a router of an earlier version). ``host`` is
    where the child listens (absent: loopback) and ``key`` the child's per-spawn API key, present
    only for a protected child (issue 18): it goes to the web side and nowhere else."""

    type: Literal["router.granted"]
    request_id: str
    lease_id: str
    model: str
    port: int
    lease_ttl: float
    boot: str
    queue_ms: NotRequired[float]
    load_ms: NotRequired[float]
    evicted: NotRequired[list[str]]
    caused_load: NotRequired[bool]
    host: NotRequired[str]
    key: NotRequired[str]


class RejectedMessage(TypedDict):
    type: Literal["router.rejected"]
    request_id: str
    status: int
    error: ErrorBody
    retry_after: float | None
    boot: str


class AcceptedMessage(TypedDict):
    """A call is under way; its result follows (it may take minutes: a reload waits for stops)."""

    type: Literal["router.accepted"]
    request_id: str
    boot: str


class ResultMessage(TypedDict):
    """A call's outcome: ``body`` is its answer when ``ok``, ``{"error": ErrorBody}`` when not."""

    type: Literal["router.result"]
    request_id: str
    ok: bool
    status: int
    body: Mapping[str, Any]
    boot: str


AcquireAnswer = QueuedMessage | GrantedMessage | RejectedMessage
CallAnswer = AcceptedMessage | ResultMessage


# ---- router → the events group -------------------------------------------------------------------


class EventPayload(TypedDict):
    """One engine event (routerpanel.router.feed.EngineEvent), JSON-able."""

    seq: int
    type: str  # a routerpanel.router.catalogue.Event value
    time: float
    data: Mapping[str, Any]  # the type's TypedDict in the catalogue
    node: NotRequired[str]  # several hosts (issue 18): the node whose router sent it


class EventMessage(TypedDict):
    type: Literal["router.event"]
    event: EventPayload


class EventsMessage(TypedDict):
    """Several engine events in order, in one group message: what the router publishes when
    events come faster than it sends them (a child's log lines, a burst of requests)."""

    type: Literal["router.events"]
    events: list[EventPayload]
