"""What a granted request waited through: its receipt (issue 17.3).

Per request the book keeps when it arrived (engine clock) and an arrival number; per model the
load in progress: which request's entry it was spawned for and which models were evicted to make
room for it. When the child is ready, the load is stamped with the last arrival number, so a
grant can tell whether its request arrived before that load finished (it waited for it) or
after (the model was already loaded). Owned by the engine's loop, like ``callers``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Receipt:
    """What the request waited through: queue seconds, the load (0 when none) and who was
    evicted for it; ``caused_load``: this request's entry made the load happen."""

    queued: float = 0.0
    load: float = 0.0
    evicted: tuple[str, ...] = ()
    caused_load: bool = False


NO_RECEIPT = Receipt()


@dataclass(slots=True)
class _Load:
    trigger: str | None  # the request whose entry the spawn was for
    evicted: tuple[str, ...]
    seconds: float | None = None
    ready_after: int = -1  # arrivals numbered up to here came before the child was ready


@dataclass(slots=True)
class Receipts:
    """The receipts' book (see module doc)."""

    _arrived: dict[str, tuple[float, int]] = field(default_factory=dict)
    _evictions: dict[str, list[str]] = field(default_factory=dict)  # trigger request -> victims
    _loads: dict[str, _Load] = field(default_factory=dict)  # model -> its latest load
    _numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _last: int = 0

    def arrived(self, request_id: str, now: float) -> None:
        self._last = next(self._numbers)
        self._arrived[request_id] = (now, self._last)

    def evicting(self, victim: str, for_request: str | None) -> None:
        if for_request is not None:
            self._evictions.setdefault(for_request, []).append(victim)

    def spawning(self, model: str, trigger: str | None) -> None:
        evicted = tuple(self._evictions.pop(trigger, ())) if trigger is not None else ()
        self._loads[model] = _Load(trigger, evicted)

    def ready(self, model: str, seconds: float) -> None:
        load = self._loads.get(model)
        if load is not None:
            load.seconds, load.ready_after = seconds, self._last

    def granted(self, request_id: str, model: str, now: float) -> Receipt:
        arrived = self._forget(request_id)
        if arrived is None:
            return NO_RECEIPT
        since, number = arrived
        queued = max(0.0, now - since)
        load = self._loads.get(model)
        if load is None or load.seconds is None or number > load.ready_after:
            return Receipt(queued)
        return Receipt(queued, load.seconds, load.evicted, load.trigger == request_id)

    def forget(self, request_id: str) -> None:
        self._forget(request_id)

    def _forget(self, request_id: str) -> tuple[float, int] | None:
        self._evictions.pop(request_id, None)
        return self._arrived.pop(request_id, None)
