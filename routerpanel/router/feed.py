"""Publish the engine's events: numbered, to taps and to bounded subscriptions.

``Feed`` stamps each published event with the next ``seq`` (1, 2, 3, … with no gaps at the
source), calls every *tap* synchronously (the audit journal: on disk before the decision takes
effect), and pushes it into every ``Subscription``. A subscription is a bounded buffer: when its
reader falls behind, the OLDEST events are dropped, so the next event it reads shows a seq gap
and the reader asks for a snapshot (DESIGN §7, STYLE 14). Dropping the oldest rather than the
newest makes the gap visible at once instead of after a backlog of stale events. The types and
their data are the catalogue's (catalogue.py). Owned by the engine's loop; nothing here blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from routerpanel.router.catalogue import Event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineEvent:
    """One published fact; ``seq`` increases by exactly 1 per event, starting at 1."""

    seq: int
    type: Event  # catalogue.Event: its value is the wire name
    time: float  # wall clock (time.time())
    data: Mapping[str, Any]  # the type's TypedDict in catalogue.py


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

    def take(self, limit: int) -> list[EngineEvent]:
        """The events already waiting, oldest first, at most ``limit``; never waits (a reader
        that forwards events in batches takes what came while it sent the last one)."""
        items = self._items
        return [items.popleft() for _ in range(min(limit, len(items)))]

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

    # Events that change only what a running model's row says (its memory, its log, its load's
    # progress): they leave ``changes`` alone, so the rows of the others stay valid (facts.Rows).
    ONLY_RUNNING = frozenset({Event.MEMORY_SAMPLE, Event.MODEL_LOG, Event.MODEL_PROGRESS})

    def __init__(self) -> None:
        self.seq = 0
        self.changes = 0  # events that may change any model's row
        self._subscribers: set[Subscription] = set()
        self.taps: list[Callable[[EngineEvent], None]] = []

    def publish(self, type_: Event, data: Mapping[str, Any]) -> EngineEvent:
        self.seq += 1
        if type_ not in self.ONLY_RUNNING:
            self.changes += 1
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
