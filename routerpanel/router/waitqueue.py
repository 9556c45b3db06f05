"""The scheduler's queue: one entry per model, its waiters in arrival order (A2, A4, A7).

``WaitQueue`` keeps the entries in service order — FIFO, unless the scheduler ``reorder``s them
(the ``fair`` policy) — and indexes them by model, by request id and by (owner, priority): which
entries each owner waits in at each priority, with how many waiters, so that the fair order is
computed per owner, never per waiter. A join, a leave or a cancel costs O(1) at 10,000 waiters.
It decides nothing: the scheduler (scheduler.py) says who joins, who is served, which entries go
and in what order; this only keeps the book straight. Pure and owned by the scheduler.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from routerpanel.router.decisions import Priority, WaiterView
from routerpanel.router.fairshare import owner_of

Waiting = dict[tuple[str, Priority], dict[str, int]]  # (owner, priority) -> model -> waiters


@dataclass(slots=True)
class Entry:
    """One model's place in the queue; ``waiters`` are in arrival order, so oldest first."""

    ticket: int  # increasing in FIFO order; stable while the entry lives
    model: str
    since: float
    waiters: list[WaiterView] = field(default_factory=list)  # immutable: views share them
    restart_by: str | None = None  # a reload restart holds the entry without waiters (A14)


class WaitQueue:
    """The entries, head first, with their indexes (see module doc)."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._by_model: dict[str, Entry] = {}
        self._by_request: dict[str, Entry] = {}
        self._waiting: Waiting = {}
        self._tickets = itertools.count(1)
        self.made = 0  # entries made so far: a new one has no place in a fair order yet

    def __iter__(self) -> Iterator[Entry]:
        """The entries head first; a copy, so a caller may remove entries as it goes."""
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, request_id: str) -> bool:
        return request_id in self._by_request

    def entry_for(self, model: str) -> Entry | None:
        return self._by_model.get(model)

    def entry_of(self, request_id: str) -> Entry | None:
        return self._by_request.get(request_id)

    def models(self) -> set[str]:
        return set(self._by_model)

    def waiting(self) -> Waiting:
        """(owner, priority) -> the models they wait for -> their waiters there (read only)."""
        return self._waiting

    def reorder(self, key: dict[str, tuple[int, float, float, int]]) -> None:
        """Put the entries in the order of ``key`` (by model), smallest first."""
        self._entries.sort(key=lambda e: key[e.model])

    def fifo(self) -> None:
        """Put the entries back in arrival order (tickets)."""
        self._entries.sort(key=lambda e: e.ticket)

    def depth(self) -> int:
        """Waiters in the whole queue."""
        return len(self._by_request)

    def join(self, w: WaiterView, model: str, now: float) -> Entry:
        """Add ``w`` to its model's entry, made at the tail if there is none (A2)."""
        entry = self._entry_at_tail(model, now)
        entry.waiters.append(w)
        self._by_request[w.request_id] = entry
        self._count(w, model, 1)
        return entry

    def hold(self, model: str, now: float, by: str) -> Entry:
        """Keep the model's entry even with no waiters: a reload restart (A14)."""
        entry = self._entry_at_tail(model, now)
        entry.restart_by = by
        return entry

    def take(self, entry: Entry, served: list[WaiterView], left: list[WaiterView]) -> None:
        """The scheduler served ``served``; ``left`` keep waiting. An empty entry goes."""
        for w in served:
            del self._by_request[w.request_id]
            self._count(w, entry.model, -1)
        entry.waiters = left
        entry.restart_by = None
        if not left:
            self._drop(entry)

    def leave(self, request_id: str) -> WaiterView | None:
        """A waiter's client went away (A7); an entry left without waiters goes, unless held."""
        entry = self._by_request.pop(request_id, None)
        if entry is None:
            return None
        gone = next(w for w in entry.waiters if w.request_id == request_id)
        self._count(gone, entry.model, -1)
        entry.waiters = [w for w in entry.waiters if w.request_id != request_id]
        if not entry.waiters and entry.restart_by is None:
            self._drop(entry)
        return gone

    def remove(self, model: str) -> list[WaiterView]:
        """Drop the model's entry (held or not); return its waiters, oldest first."""
        entry = self._by_model.get(model)
        if entry is None:
            return []
        for w in entry.waiters:
            del self._by_request[w.request_id]
            self._count(w, model, -1)
        self._drop(entry)
        return entry.waiters

    def _entry_at_tail(self, model: str, now: float) -> Entry:
        entry = self._by_model.get(model)
        if entry is None:
            entry = Entry(next(self._tickets), model, now)
            self.made += 1
            self._entries.append(entry)
            self._by_model[model] = entry
        return entry

    def _count(self, w: WaiterView, model: str, change: int) -> None:
        pair = (owner_of(w.actor), w.priority)
        models = self._waiting.get(pair)
        if models is None:
            models = self._waiting[pair] = {}
        n = models.get(model, 0) + change
        if n > 0:
            models[model] = n
        else:
            del models[model]
            if not models:
                del self._waiting[pair]

    def _drop(self, entry: Entry) -> None:
        self._entries.remove(entry)
        del self._by_model[entry.model]
