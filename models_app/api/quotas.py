"""Quotas (issue 17.4): tokens per day and requests per minute, per user or per key.

A key's caller carries the limits that bind it (``Limit``: its own quota and its owner's), read
with the key table. ``QuotaBook.check`` runs before a request is queued and answers ``429`` with
``Retry-After`` and a message naming the quota when one is used up:

* **requests per minute** are counted by this web process, in a sliding 60 s window (in team
  mode each ``serve --no-router`` counts its own, as with a key's concurrency);
* **tokens per day** (prompt + completion, per UTC day) are the usage rollups' (issue 17.2), read
  from the database in the background, never on the request path: when a subject is first seen
  (or a new UTC day starts), then ``refresh_seconds`` after each of its requests. A quota is seen
  as used up a few seconds after the request that used it up ended (the usage writer's 1 s batch
  plus the refresh). An answer under way is never cut off.

A refused request is not counted against the requests-per-minute window.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async

from models_app.api.errors import ApiError
from models_app.db import own_connection
from models_app.panel.wording import counted

log = logging.getLogger(__name__)

REFRESH_SECONDS = 5.0
WINDOW = 60.0  # seconds of the requests-per-minute window


@dataclass(frozen=True, slots=True)
class Limit:
    """One quota row as the web side uses it. ``user`` counts every key of ``owner``; ``key``
    only the key ``owner/name`` (``label``)."""

    kind: str  # "user" or "key"
    label: str  # "alice" or "alice/laptop": how usage rows name the subject
    tokens_per_day: int | None = None
    requests_per_minute: int | None = None

    @property
    def subject(self) -> str:
        return f"{'user' if self.kind == 'user' else 'API key'} {self.label}"

    @property
    def ident(self) -> tuple[str, str]:
        """Whom it binds, whatever its figures (a changed quota keeps its window and count)."""
        return self.kind, self.label


def day_start(now: float) -> datetime:
    """The start of the UTC day ``now`` (epoch seconds) falls in."""
    return datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@own_connection
def tokens_today_in_database(
    limits: Iterable[Limit], since: datetime
) -> dict[tuple[str, str], int]:
    """Tokens each subject used since ``since``, from the hourly usage rollups."""
    from django.db.models import F, Q, Sum

    from models_app.models import UsageHour

    limits = list(limits)
    users = {limit.label for limit in limits if limit.kind == "user"}
    keys = {limit.label for limit in limits if limit.kind == "key"}
    rows = (
        UsageHour.objects.filter(hour__gte=since)
        .filter(Q(actor__in=users) | Q(key__in=keys))
        .values_list("actor", "key")
        .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
    )
    by_user: dict[str, int] = {}
    by_key: dict[str, int] = {}
    for actor, key, tokens in rows:
        by_user[actor] = by_user.get(actor, 0) + int(tokens or 0)
        if key:
            by_key[key] = by_key.get(key, 0) + int(tokens or 0)
    return {
        limit.ident: (by_user if limit.kind == "user" else by_key).get(limit.label, 0)
        for limit in limits
    }


Reader = Callable[[Iterable[Limit], datetime], dict[tuple[str, str], int]]


class QuotaBook:
    """The quotas' state in one web process (see the module doc)."""

    def __init__(
        self,
        read: Reader = tokens_today_in_database,
        *,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.time,
        on_refusal: Callable[[Any, str, Any], None] | None = None,
    ) -> None:
        self._read = read
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._on_refusal = on_refusal
        self._recent: dict[tuple[str, str], deque[float]] = {}  # requests-per-minute windows
        self._watched: dict[tuple[str, str], Limit] = {}  # subjects with tokens per day
        self._tokens: dict[tuple[str, str], int] = {}  # tokens used today, as last read
        self._day: datetime | None = None
        self._reading: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def check(self, caller: Any, model: str, request: Any = None) -> None:
        """Raise 429 if a quota binding ``caller`` is used up; else count the request."""
        limits: tuple[Limit, ...] = caller.quotas
        if not limits:
            return
        now = self._clock()
        for limit in limits:
            if limit.requests_per_minute:
                self._check_rate(limit, now, caller, model, request)
            if limit.tokens_per_day:
                self._check_tokens(limit, now, caller, model, request)
        for limit in limits:
            if limit.requests_per_minute:
                self._recent.setdefault(limit.ident, deque()).append(now)

    def _check_rate(self, limit: Limit, now: float, caller: Any, model: str, request: Any) -> None:
        assert limit.requests_per_minute is not None
        window = self._recent.get(limit.ident)
        if window is None:
            return
        while window and window[0] <= now - WINDOW:
            window.popleft()
        if len(window) >= limit.requests_per_minute:
            wait = max(1, math.ceil(window[0] + WINDOW - now))
            self._refuse(
                caller, model, request, wait,
                f"{limit.subject} is over its quota of "
                f"{counted(limit.requests_per_minute, 'request')} per minute; retry in {wait} s",
            )  # fmt: skip

    def _check_tokens(
        self, limit: Limit, now: float, caller: Any, model: str, request: Any
    ) -> None:
        assert limit.tokens_per_day is not None
        self._watch(limit, now)
        used = self._tokens.get(limit.ident, 0)
        if used >= limit.tokens_per_day:
            assert self._day is not None
            wait = max(1, math.ceil((self._day + timedelta(days=1)).timestamp() - now))
            self._refuse(
                caller, model, request, wait,
                f"{limit.subject} is over its quota of "
                f"{counted(limit.tokens_per_day, 'token')} per day "
                f"({used:,} used today); it resets at 00:00 UTC, in {wait} s",
            )  # fmt: skip

    def _refuse(self, caller: Any, model: str, request: Any, wait: int, message: str) -> None:
        if self._on_refusal is not None:
            self._on_refusal(caller, model, request)
        raise ApiError(
            429, message, "rate_limit_error", headers=((b"retry-after", str(wait).encode()),)
        )

    def _watch(self, limit: Limit, now: float) -> None:
        """Keep ``limit``'s figure fresh: read a new subject (or a new day) at once, and read
        again ``refresh_seconds`` after a request, when its tokens will have been counted."""
        today = day_start(now)
        new = limit.ident not in self._watched or today != self._day
        if today != self._day:  # a new day: yesterday's tokens no longer count
            self._day, self._tokens = today, {}
        self._watched[limit.ident] = limit
        if new:
            self._read_soon(0.0)
        elif self._timer is None:
            self._read_soon(self.refresh_seconds)

    def _read_soon(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._start_read)

    def _start_read(self) -> None:
        self._timer = None
        if self._reading is None:
            self._reading = asyncio.ensure_future(self.refresh())
        else:  # a read is under way: read once more after it
            self._read_soon(self.refresh_seconds)

    async def refresh(self) -> None:
        """Read today's tokens of every watched subject (in a thread; failures are logged and
        the last figures kept: a database outage must not refuse or admit everyone)."""
        try:
            limits, since = list(self._watched.values()), self._day or day_start(self._clock())
            read = sync_to_async(self._read, thread_sensitive=False)
            tokens = await read(limits, since)
            if since == self._day or self._day is None:
                self._tokens.update(tokens)
        except Exception:
            log.warning("could not read today's token use for quotas", exc_info=True)
        finally:
            self._reading = None

    def tokens_used(self, limit: Limit) -> int | None:
        """Tokens used today by ``limit``'s subject as last read (None: not read yet)."""
        return self._tokens.get(limit.ident)
