"""Router metrics: counted on the router side from engine events, rendered as Prometheus text.

``RouterMetrics`` is a listener the router host registers (``RouterHost.add_listener``): it
counts loads, load durations, evictions and unloads by reason, force-kills, crashes, expired
leases and how long queue entries waited, from the engine's events, in the router's process.
``families(snapshot)`` adds the gauges of the moment (state, in-flight, queue, memory) from the
engine's snapshot and returns JSON-able metric families, which the router answers to the
``router.metrics`` call. The web side renders them with ``render()`` for
``GET /metrics`` (Prometheus text format 0.0.4) — no metrics library on either side.

Memory rollups for the history chart (``roll_up``) live here too: they fold the router's
one-hour ring of one-second samples into per-minute rows of ``MemoryRollup``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from routerpanel.router.catalogue import Event
from routerpanel.router.decisions import StopReason
from routerpanel.router.feed import EngineEvent
from routerpanel.router.states import ModelState

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
LOAD_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
STATES = tuple(state.value for state in ModelState)
SYSTEM_MEMORY = ("total", "available", "used", "swap_total", "swap_used", "wired")

Labels = tuple[tuple[str, str], ...]


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1


@dataclass(frozen=True)
class Family:
    """One metric: its name, type, help and samples ``(suffix, labels, value)``."""

    name: str
    type: str  # counter, gauge, histogram
    help: str
    samples: list[tuple[str, dict[str, str], float]]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "help": self.help, "samples": self.samples}


# Events that count nothing here: the rest of the catalogue has a handler (RouterMetrics).
IGNORED = frozenset(
    {Event.ROUTER_STARTED, Event.ROUTER_STOPPING, Event.MODEL_PROGRESS, Event.MODEL_LOG,
     Event.QUEUE_CANCELLED, Event.MEMORY_SAMPLE, Event.MEMORY_SETTLED, Event.PRESETS_RELOADED,
     Event.SETTINGS_CHANGED, Event.SERVICE_OUTAGE, Event.NODE_CHANGED}
)  # fmt: skip

COUNTERS = {
    "loads": "Child servers spawned to load a model.",
    "load_failures": "Loads that ended before the model was ready.",
    "evictions": "Models stopped to make room (reason: eviction = LRU victim, shrink = limit "
    "lowered).",
    "unloads": "Models the router stopped, by reason (eviction, shrink, ttl, unload, reload, "
    "removed, shutdown).",
    "force_kills": "Children SIGKILLed because they outlived their stop-timeout.",
    "crashes": "Children that exited on their own while serving, with a non-zero code.",
    "stuck": "Children whose process group survived SIGKILL.",
    "lease_expirations": "Leases not renewed in time (a web process went away).",
    "hung_kills": "Busy children killed by the watchdog: no byte and no progress for their "
    "hang-timeout.",
    "crash_backoffs": "Crash-loop back-offs begun (a ready child died unasked soon after start).",
    "expired_messages": "Messages from web processes dropped because their sender had stopped "
    "waiting (type: the message type).",
    "load_refusals": "Requests and loads refused at once because the model cannot start (its "
    "program or a file it names is missing); nobody was evicted for them.",
}


class RouterMetrics:
    """Count what the engine did, from its events (router side; owned by the router's loop)."""

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self.counters: dict[str, dict[Labels, float]] = {k: defaultdict(float) for k in COUNTERS}
        self.load_seconds: dict[Labels, Histogram] = {}
        self.queue_wait = Histogram(WAIT_BUCKETS)
        self._entries: dict[int, float] = {}  # queue ticket -> since (wall)
        self.events = 0

    # ---- counting (a listener: called with every event, must not block) ---------------------

    def observe(self, event: EngineEvent) -> None:
        self.events += 1
        handler = self._handlers.get(event.type)
        if handler is not None:
            handler(event.time, event.data)

    @property
    def _handlers(self) -> dict[Event, Callable[[float, Any], None]]:
        """What this reader counts, by event type (catalogue.py); IGNORED lists the rest."""
        return {
            Event.MODEL_STATE: self.model_state, Event.MODEL_EVICTED: self.model_evicted,
            Event.MODEL_EXITED: self.model_exited, Event.MODEL_STUCK: self.model_stuck,
            Event.MODEL_HUNG: self.model_hung, Event.MODEL_BACKOFF: self.model_backoff,
            Event.LEASE_EXPIRED: self.lease_expired, Event.QUEUE_CHANGED: self.queue_changed,
            Event.MESSAGE_EXPIRED: self.message_expired, Event.MODEL_REFUSED: self.model_refused,
        }  # fmt: skip

    def _inc(self, name: str, **labels: str) -> None:
        self.counters[name][tuple(sorted(labels.items()))] += 1

    def model_state(self, t: float, d: dict[str, Any]) -> None:
        model = d["model"]
        if d.get("to") == "loading" and d.get("action") == "spawn":
            self._inc("loads", model=model)
        elif d.get("to") == "loaded" and d.get("from") == "loading" and "load_seconds" in d:
            key = (("model", model),)
            self.load_seconds.setdefault(key, Histogram(LOAD_BUCKETS)).observe(d["load_seconds"])
        if d.get("stopping") and d.get("action") in ("stop", "kill") and d["from"] == d["to"]:
            reason = d.get("stop_reason")
            if reason:
                self._inc("unloads", model=model, reason=StopReason(reason).value)

    def model_evicted(self, t: float, d: dict[str, Any]) -> None:
        self._inc("evictions", model=d["victim"], reason=d["reason"])

    def model_exited(self, t: float, d: dict[str, Any]) -> None:
        model = d["model"]
        if d.get("force_killed") and d.get("expected") and d.get("was_ready"):
            self._inc("force_kills", model=model)
        if not d.get("expected") and not d.get("was_ready"):
            self._inc("load_failures", model=model)
        elif not d.get("expected") and not d.get("clean"):
            self._inc("crashes", model=model)

    def model_stuck(self, t: float, d: dict[str, Any]) -> None:
        self._inc("stuck", model=d["model"])

    def lease_expired(self, t: float, d: dict[str, Any]) -> None:
        self._inc("lease_expirations", model=d.get("model") or "")

    def model_hung(self, t: float, d: dict[str, Any]) -> None:
        self._inc("hung_kills", model=d.get("model") or "")

    def model_refused(self, t: float, d: dict[str, Any]) -> None:
        self._inc("load_refusals", model=d.get("model") or "")

    def model_backoff(self, t: float, d: dict[str, Any]) -> None:
        self._inc("crash_backoffs", model=d.get("model") or "")

    def message_expired(self, t: float, d: dict[str, Any]) -> None:
        for kind, n in (d.get("counts") or {}).items():
            self.counters["expired_messages"][(("type", str(kind)),)] += n

    def queue_changed(self, t: float, d: dict[str, Any]) -> None:
        """An entry that leaves the queue (served, or every waiter gone) waited since ``since``."""
        current = {e["ticket"]: e["since"] for e in d.get("entries") or []}
        for ticket, since in self._entries.items():
            if ticket not in current:
                self.queue_wait.observe(max(0.0, t - since))
        self._entries = current

    # ---- exporting --------------------------------------------------------------------------

    def families(self, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
        """Return every metric family, JSON-able: the counters plus the snapshot's gauges."""
        models = [m["name"] for m in snapshot.get("models") or []]
        out = [self._counter(name, models) for name in COUNTERS]
        out.append(self._load_histogram(models))
        waits: dict[Labels, Histogram] = {(): self.queue_wait}
        out.append(_histogram("queue_wait_seconds", "Time queue entries waited.", waits))
        out.extend(gauges(snapshot, self._clock()))
        seen: list[tuple[str, dict[str, str], float]] = [("", {}, float(self.events))]
        out.append(Family("router_events_total", "counter", "Engine events seen.", seen))
        return [family.as_json() for family in out]

    def _counter(self, name: str, models: list[str]) -> Family:
        values = dict(self.counters[name])
        if name not in ("evictions", "unloads", "expired_messages"):  # series at 0 for rate()
            for model in models:
                values.setdefault((("model", model),), 0.0)
        samples = [("", dict(labels), value) for labels, value in sorted(values.items())]
        return Family(f"{name}_total", "counter", COUNTERS[name], samples)

    def _load_histogram(self, models: list[str]) -> Family:
        histograms = dict(self.load_seconds)
        for model in models:
            histograms.setdefault((("model", model),), Histogram(LOAD_BUCKETS))
        return _histogram("load_duration_seconds", "Seconds from spawn to ready.", histograms)


def _histogram(name: str, text: str, histograms: dict[Labels, Histogram]) -> Family:
    samples: list[tuple[str, dict[str, str], float]] = []
    for labels, hist in sorted(histograms.items()):
        base = dict(labels)
        counts = hist.counts or [0] * len(hist.buckets)
        for bound, count in zip(hist.buckets, counts, strict=True):
            samples.append(("_bucket", base | {"le": _number(bound)}, count))
        samples.append(("_bucket", base | {"le": "+Inf"}, hist.count))
        samples.append(("_sum", base, hist.total))
        samples.append(("_count", base, hist.count))
    return Family(name, "histogram", text, samples)


def gauges(snapshot: dict[str, Any], now: float) -> list[Family]:
    """The gauges of the moment, from the engine's snapshot."""
    rows = snapshot.get("models") or []
    state, stopping, in_flight, waiters, memory = [], [], [], [], []
    for m in rows:
        labels = {"model": m["name"]}
        state += [("", labels | {"state": s}, float(m["state"] == s)) for s in STATES]
        stopping.append(("", labels, float(bool(m.get("stopping")))))
        in_flight.append(("", labels, m.get("in_flight") or 0))
        waiters.append(("", labels, m.get("queue_waiters") or 0))
        if m.get("memory") is not None:
            memory.append(("", labels, m["memory"]))
    queue = snapshot.get("queue") or []
    oldest = min((e["since"] for e in queue), default=None)
    system = snapshot.get("memory") or {}
    config = snapshot.get("config") or {}
    return [
        Family("model_state", "gauge", "1 for the model's current state.", state),
        Family("model_stopping", "gauge", "1 while the model's child is being stopped.", stopping),
        Family("model_in_flight", "gauge", "Requests the model is serving now.", in_flight),
        Family("model_queue_waiters", "gauge", "Requests waiting for the model.", waiters),
        Family("model_memory_bytes", "gauge", "RSS of the model's process tree.", memory),
        Family(
            "queue_depth", "gauge", "Requests waiting in the queue.",
            [("", {}, sum(e.get("waiters", 0) for e in queue))],
        ),
        Family(
            "queue_oldest_wait_seconds", "gauge", "How long the oldest queue entry has waited.",
            [("", {}, max(0.0, now - oldest) if oldest is not None else 0.0)],
        ),
        Family(
            "system_memory_bytes", "gauge", "System memory by kind (wired: macOS only).",
            [("", {"kind": k}, system[k]) for k in SYSTEM_MEMORY if system.get(k) is not None],
        ),
        Family("models_max", "gauge", "Max running models (0: no limit).",
               [("", {}, config.get("models_max", 0))]),
        Family("router_event_seq", "gauge", "Seq of the router's last event.",
               [("", {}, snapshot.get("seq", 0))]),
    ]  # fmt: skip


# ---- the web side: Prometheus text -------------------------------------------------------------

PREFIX = "routerpanel_"


def render(families: Iterable[dict[str, Any]]) -> bytes:
    """Render metric families as Prometheus text exposition format 0.0.4."""
    lines: list[str] = []
    for family in families:
        name = PREFIX + family["name"]
        lines.append(f"# HELP {name} {_escape_help(family['help'])}")
        lines.append(f"# TYPE {name} {family['type']}")
        for suffix, labels, value in family["samples"]:
            lines.append(f"{name}{suffix}{_labels(labels)} {_number(value)}")
    return ("\n".join(lines) + "\n").encode()


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape_label(str(value))}"' for key, value in labels.items())
    return "{" + inner + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if value == int(value) and abs(value) < 2**53 else repr(value)


# ---- memory rollups (the history chart) --------------------------------------------------------


ROLLUP_VALUES = [
    f"{name}_{part}"
    for name in ("used", "available", "swap_used")
    for part in ("min", "avg", "max")
]
ROLLUP_VALUES.append("samples")


@dataclass
class _Series:
    used: list[int] = field(default_factory=list)
    available: list[int] = field(default_factory=list)
    swap_used: list[int] = field(default_factory=list)


def fold_minutes(
    history: list[dict[str, Any]], now: float
) -> dict[tuple[datetime, str, str], _Series]:
    """Group the ring's samples by (minute, scope, model); the running minute waits for the next.

    The ring's oldest minute may be cut short by the ring's end; ``roll_up`` never lets such a
    fold replace one made from more samples.
    """
    current = int(now // 60) * 60
    series: dict[tuple[datetime, str, str], _Series] = defaultdict(_Series)
    for sample in history:
        start = int(sample["time"] // 60) * 60
        if start >= current:
            continue
        minute = datetime.fromtimestamp(start, tz=UTC)
        system = sample["system"]
        row = series[(minute, "system", "")]
        row.used.append(system["used"])
        row.available.append(system["available"])
        row.swap_used.append(system["swap_used"])
        for name, child in (sample.get("children") or {}).items():
            series[(minute, "model", name)].used.append(child["rss"])
    return series


def roll_up(history: list[dict[str, Any]], now: float | None = None, node: str = "") -> int:
    """Store per-minute min/avg/max of ``history``; return the rows written.

    Idempotent: a minute already stored from at least as many samples is left alone, so running
    twice (or two overlapping folds of the ring) changes nothing. Rows older than
    ``MemoryRollup.KEEP_DAYS`` are deleted. ``node``: whose machine (several hosts).
    """
    from models_app.models import MemoryRollup

    now = time.time() if now is None else now
    series = fold_minutes(history, now)
    existing = {
        (r.minute, r.scope, r.model): r.samples
        for r in MemoryRollup.objects.filter(minute__in={key[0] for key in series}, node=node)
    }
    rows = [
        _rollup_row(key, values, node)
        for key, values in series.items()
        if existing.get(key, 0) < len(values.used)
    ]
    MemoryRollup.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["minute", "scope", "model", "node"],
        update_fields=ROLLUP_VALUES,
    )
    cutoff = datetime.fromtimestamp(now, tz=UTC) - timedelta(days=MemoryRollup.KEEP_DAYS)
    MemoryRollup.objects.purge_older_than(cutoff)
    return len(rows)


def _rollup_row(key: tuple[datetime, str, str], values: _Series, node: str = "") -> Any:
    from models_app.models import MemoryRollup

    minute, scope, model = key
    row = MemoryRollup(minute=minute, scope=scope, model=model, samples=len(values.used), node=node)
    for name in ("used", "available", "swap_used"):
        data = getattr(values, name)
        if data:
            setattr(row, f"{name}_min", min(data))
            setattr(row, f"{name}_avg", round(sum(data) / len(data)))
            setattr(row, f"{name}_max", max(data))
    return row
