"""Fair share (issue 17.5): who used the machine recently, and the ``fair`` queue order.

``RecentUse`` keeps, per owner, the model-seconds their requests held (grant to finish, counted
while they run) plus the seconds of the loads they caused (spawn to ready or exit), over a
sliding window of ``WINDOW`` seconds in ``BUCKETS`` buckets: ``usage(owner, now)`` is exactly
the use since the start of the bucket ``BUCKETS - 1`` before the current one. Pure: time is
passed in, as everywhere in the scheduler; one owner calls it.

An *owner* is the person behind an actor: a personal key ``key:<user>/<name>`` belongs to
``user:<user>`` (so one person's keys and panel sessions share one account); any other actor
(``user:<name>``, a static key ``key:api-key-<n>``, ``anonymous``) is its own owner.

``fair_keys`` orders the queue entries under ``queue_policy = fair``; see its docstring.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from routerpanel.router.decisions import Priority

WINDOW = 900.0  # seconds of use that count (15 minutes)
BUCKETS = 15  # the window slides one bucket (a minute) at a time
URGENT_AFTER = 120.0  # an entry older than this is served in arrival order (no max_wait set)
RANK = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2}


@lru_cache(maxsize=4096)
def owner_of(actor: str) -> str:
    """Return the owner of an actor: ``key:alice/laptop`` -> ``user:alice`` (see module doc)."""
    if actor.startswith("key:"):
        user, slash, _ = actor[4:].partition("/")
        if slash and user:
            return f"user:{user}"
    return actor


def urgent_after(max_wait: float | None) -> float:
    """How long an entry waits before it is served in arrival order: half of ``max_wait``, so
    the entries ahead have the other half to load, and at most ``URGENT_AFTER``."""
    return URGENT_AFTER if max_wait is None else min(URGENT_AFTER, max_wait / 2)


@dataclass(slots=True)
class _Account:
    held: int = 0  # requests in flight now
    since: float = 0.0  # their time is counted up to here
    total: float = 0.0  # sum of the buckets
    buckets: deque[list[float]] = field(default_factory=deque)  # [bucket index, seconds]


class RecentUse:
    """Per-owner use of the machine over a sliding window (see module doc)."""

    def __init__(self, window: float = WINDOW, buckets: int = BUCKETS) -> None:
        if window <= 0 or buckets < 1:
            raise ValueError("the window and its buckets must be positive")
        self.window = window
        self._width = window / buckets
        self._buckets = buckets
        self._accounts: dict[str, _Account] = {}

    def hold(self, owner: str, now: float) -> None:
        """One of ``owner``'s requests starts holding a model."""
        account = self._accrue(owner, now)
        account.held += 1

    def release(self, owner: str, now: float) -> None:
        """One of ``owner``'s requests stopped holding its model."""
        account = self._accrue(owner, now)
        account.held = max(0, account.held - 1)

    def charge(self, owner: str, start: float, end: float) -> None:
        """Add the span ``start``..``end`` once (a load ``owner`` caused)."""
        self._add(self._account(owner), start, end, 1)

    def usage(self, owner: str, now: float) -> float:
        """Return ``owner``'s model-seconds in the window ending at ``now``."""
        account = self._accounts.get(owner)
        if account is None:
            return 0.0
        if account.held:
            self._accrue(owner, now)
        first = math.floor(now / self._width) - self._buckets + 1
        buckets = account.buckets
        while buckets and buckets[0][0] < first:
            account.total -= buckets.popleft()[1]
        if not buckets:
            account.total = 0.0  # no float drift left over
            if not account.held:
                del self._accounts[owner]
        return max(0.0, account.total)

    def snapshot(self, now: float) -> dict[str, float]:
        """Every owner with use in the window, most first."""
        use = {owner: self.usage(owner, now) for owner in list(self._accounts)}
        return dict(sorted(((o, u) for o, u in use.items() if u > 0), key=lambda x: -x[1]))

    def _account(self, owner: str) -> _Account:
        account = self._accounts.get(owner)
        if account is None:
            account = self._accounts[owner] = _Account()
        return account

    def _accrue(self, owner: str, now: float) -> _Account:
        account = self._account(owner)
        if account.held and now > account.since:
            self._add(account, account.since, now, account.held)
        account.since = max(account.since, now)
        return account

    def _add(self, account: _Account, start: float, end: float, times: int) -> None:
        """Spread ``times`` × the span over the buckets it covers (older than the window: cut)."""
        start = max(start, (math.floor(end / self._width) - self._buckets + 1) * self._width)
        buckets = account.buckets
        while end > start:
            index = math.floor(start / self._width)
            stop = min(end, (index + 1) * self._width)
            seconds = (stop - start) * times
            if buckets and buckets[-1][0] == index:
                buckets[-1][1] += seconds
            elif not buckets or buckets[-1][0] < index:
                buckets.append([index, seconds])
            else:  # an older bucket (a load charged after later use): find it
                for bucket in buckets:
                    if bucket[0] == index:
                        bucket[1] += seconds
                        break
                else:
                    at = next(i for i, b in enumerate(buckets) if b[0] > index)
                    buckets.insert(at, [index, seconds])
            account.total += seconds
            start = stop


def fair_keys(
    entries: Iterable[tuple[str, int, float, bool]],
    waiting: Mapping[tuple[str, Priority], Iterable[str]],
    use: RecentUse,
    now: float,
    max_wait: float | None,
) -> dict[str, tuple[int, float, float, int]]:
    """Return each entry's sort key under ``fair`` (smaller first).

    ``entries``: (model, ticket, since of its oldest waiter, held by a restart); ``waiting``:
    (owner, priority) -> the models whose entries they wait in. In order:

    1. *Urgent* entries — the oldest waiter has waited ``urgent_after(max_wait)`` — come first,
       oldest first: no entry waits behind newer ones for ever, nor past ``max_wait`` because
       of them (no starvation).
    2. Then by the best waiter of the entry: highest priority class first, then the least recent
       use of the machine by its owner (model-seconds held plus load seconds caused, over the
       window), so a light user is not stuck behind a heavy user's backlog; a restart held for a
       reload (A14) counts as a normal-priority owner with no use.
    3. Ties: arrival order of the entries (ticket).

    Cost: one usage look-up per (owner, priority) that waits, a sort of those, then each entry
    keyed once — the per-owner sets are walked best first and stop when every entry has a key.
    """
    cutoff = now - urgent_after(max_wait)
    keys: dict[str, tuple[int, float, float, int]] = {}
    tickets: dict[str, int] = {}
    held: list[str] = []
    for model, ticket, since, restart in entries:
        if since <= cutoff:
            keys[model] = (0, since, 0.0, ticket)
        else:
            tickets[model] = ticket
            if restart:
                held.append(model)
    left = len(tickets)
    if left:
        ranked = sorted(
            ((-RANK[priority], use.usage(owner, now), models)
             for (owner, priority), models in waiting.items()),
            key=lambda x: (x[0], x[1]),
        )  # fmt: skip
        for rank, usage, models in ranked:
            for model in models:
                number = tickets.get(model)
                if number is not None and model not in keys:
                    keys[model] = (1, rank, usage, number)
                    left -= 1
            if not left:
                break
        normal = -RANK[Priority.NORMAL]
        for model in held:
            key = (1, normal, 0.0, tickets[model])
            if model not in keys or key < keys[model]:
                keys[model] = key
    return keys
