"""Tell a hung child from a slow one: probe busy children that send nothing (DESIGN §10).

A child with requests in flight that has sent no byte on any of them for its preset's
``hang_timeout`` is *suspect*, not hung: a long prompt is processed without output. So the engine
asks the child itself, with a deadline, through ``GET /slots`` (``probe.read_slots``): a child
that does not answer in time is hung; one that answers twice, ``gap`` seconds apart, with the same
progress counters (each busy slot's task id, prompt tokens processed and tokens decoded) is hung
too. Any change of the counters, or a byte on any request, is progress and clears the suspicion.
A child started with ``--no-slots`` answers 501 there; then ``/health`` is asked instead, which
can only tell a dead process from a live one.

``Watchdog`` is pure (time passed in, no I/O): it says which models are due a probe and judges
each reading. The engine owns it, runs the probes as tasks and kills what it calls hung.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

MIN_GAP = 1.0
MAX_GAP = 15.0


def probe_gap(hang_timeout: float) -> float:
    """Seconds a probe may take, and between the two probes of one suspicion."""
    return min(max(hang_timeout / 4, MIN_GAP), MAX_GAP)


@dataclass(frozen=True, slots=True)
class Reading:
    """What one probe saw. ``counters`` is None when only ``/health`` could be asked."""

    counters: tuple[tuple[int, int, int], ...] | None  # (slot id, task id, tokens) per busy slot
    status: int = 200


class Verdict(StrEnum):
    PROGRESS = "progress"  # it moved: not hung
    AGAIN = "again"  # first reading: probe once more after the gap
    HUNG = "hung"


class Busy(NamedTuple):
    """A model with requests in flight, as the engine sees it (built for every input the
    engine handles: a tuple is the cheapest immutable record to make)."""

    model: str
    hang_timeout: float
    last_progress: float  # the last byte on any of its requests (or its first grant)
    instance: int  # the child instance (pid): a new child is a new watch


@dataclass(slots=True)
class _Suspicion:
    instance: int
    started: float  # when the first probe went out
    probing: bool = True
    baseline: Reading | None = None
    next_probe: float | None = None  # when the second probe is due


class Watchdog:
    """Decide which busy models to probe and judge their readings (see the module doc)."""

    def __init__(self) -> None:
        self._suspects: dict[str, _Suspicion] = {}

    def due(self, busy: list[Busy], now: float) -> list[str]:
        """Return the models to probe now, and forget suspicions that progress has cleared."""
        out: list[str] = []
        current = {b.model: b for b in busy}
        for name in [n for n, s in self._suspects.items() if n not in current]:
            del self._suspects[name]  # no request in flight any more
        for b in busy:
            s = self._suspects.get(b.model)
            if s is not None and (s.instance != b.instance or b.last_progress > s.started):
                del self._suspects[b.model]  # a byte arrived, or the child is a new one
                s = None
            if s is None:
                if now - b.last_progress >= b.hang_timeout:
                    self._suspects[b.model] = _Suspicion(b.instance, now)
                    out.append(b.model)
            elif not s.probing and s.next_probe is not None and now >= s.next_probe:
                s.probing, s.next_probe = True, None
                out.append(b.model)
        return out

    def next_deadline(self, busy: list[Busy]) -> float | None:
        """When ``due`` has work next (never poll)."""
        times: list[float] = []
        for b in busy:
            s = self._suspects.get(b.model)
            if s is None:
                times.append(b.last_progress + b.hang_timeout)
            elif not s.probing and s.next_probe is not None:
                times.append(s.next_probe)
        return min(times, default=None)

    def judge(
        self, model: str, instance: int, reading: Reading | None, now: float, hang_timeout: float
    ) -> Verdict | None:
        """Judge one probe's reading; None when it is stale (the suspicion has ended).

        While no byte flows the suspicion stays: each reading is compared with the one before
        it, ``gap`` seconds apart, so a long prompt keeps showing progress and a child that
        stops mid-prompt is caught by the next pair. A ``/health``-only reading cannot show
        progress; it is taken again after another whole ``hang_timeout``.
        """
        s = self._suspects.get(model)
        if s is None or s.instance != instance or not s.probing:
            return None
        s.probing = False
        if reading is None:
            del self._suspects[model]
            return Verdict.HUNG  # no answer within the deadline
        if reading.counters is None:  # /health only: alive is all it can say
            s.baseline, s.next_probe = None, now + hang_timeout
            return Verdict.PROGRESS
        previous, s.baseline = s.baseline, reading
        s.next_probe = now + probe_gap(hang_timeout)
        if previous is None:
            return Verdict.AGAIN
        if reading.counters != previous.counters:
            return Verdict.PROGRESS
        del self._suspects[model]
        return Verdict.HUNG

    def probing(self, model: str) -> bool:
        s = self._suspects.get(model)
        return s is not None and s.probing


def slots_counters(slots: object) -> tuple[tuple[int, int, int], ...] | None:
    """Reduce llama-server's ``GET /slots`` answer to its busy slots' progress counters.

    Per slot: ``id``, ``id_task`` and ``n_prompt_tokens_processed`` + ``next_token[0].n_decoded``
    (build b11434's names). Returns None when the answer has no such shape.
    """
    if not isinstance(slots, list):
        return None
    out = []
    for slot in slots:
        if not isinstance(slot, dict):
            return None
        if not slot.get("is_processing"):
            continue
        tokens = _int(slot.get("n_prompt_tokens_processed"))
        nxt = slot.get("next_token")
        if isinstance(nxt, list) and nxt and isinstance(nxt[0], dict):
            tokens += _int(nxt[0].get("n_decoded"))
        out.append((_int(slot.get("id")), _int(slot.get("id_task")), tokens))
    return tuple(sorted(out))


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
