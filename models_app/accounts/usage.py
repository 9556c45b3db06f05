"""Usage, measured (issue 17.2): what each proxied request cost, recorded off the request path.

The proxy hands a ``Usage`` to ``RECORDER.record()`` when an answer ends: a list append, nothing
else on the hot path. A timer flushes the batch every ``FLUSH_SECONDS`` (or sooner once
``BATCH`` rows wait) on a thread of its own (``sync_to_async(..., thread_sensitive=False)``,
``db.own_connection``): one transaction inserts the rows and adds them to the hourly rollups.
When the database is away the rows wait (at most ``MAX_PENDING``; the oldest are dropped, with
a warning) and go with the next flush: losing the database never breaks the API.

Tokens come from the child's own accounting, read off the tail of its answer only: the last
``usage`` / ``timings`` numbers in the last chunks (OpenAI ``prompt_tokens`` /
``completion_tokens``, Anthropic ``input_tokens`` / ``output_tokens``, llama.cpp
``prompt_n`` / ``predicted_n`` and ``tokens_evaluated`` / ``tokens_predicted``), streamed or
not. Nothing is parsed per chunk.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async

log = logging.getLogger(__name__)

TAIL_BYTES = 4096  # the end of an answer searched for token counts (theirs are in its last ~600)
FLUSH_SECONDS = 1.0
BATCH = 500
MAX_PENDING = 50_000

# The keys, quoted, that name the counts (the last one found wins), and the number after one.
_PROMPT = (b'"prompt_tokens"', b'"input_tokens"', b'"prompt_n"', b'"tokens_evaluated"')
_COMPLETION = (
    b'"completion_tokens"', b'"output_tokens"', b'"predicted_n"', b'"tokens_predicted"',
)  # fmt: skip
_NUMBER = re.compile(rb"\s*:\s*(\d+)")


def tokens_in(tail: bytes) -> tuple[int | None, int | None]:
    """The last prompt and completion token counts in the tail of an answer (None: absent).

    ``bytes.rfind`` per key name, from the end: about 15 µs on a 4 KiB tail without them
    (a regular expression with a look-behind took 1.8 ms on 16 KiB).
    """
    tail = tail[-TAIL_BYTES:]
    return _last(_PROMPT, tail), _last(_COMPLETION, tail)


def _last(names: tuple[bytes, ...], text: bytes) -> int | None:
    best, value = -1, None
    for name in names:
        end = len(text)
        while (at := text.rfind(name, 0, end)) > best:
            # a key, not text: not escaped (\"prompt_n\" inside a string) and a number follows
            found = _NUMBER.match(text, at + len(name)) if text[at - 1 : at] != b"\\" else None
            if found is not None:
                best, value = at, int(found.group(1))
                break
            end = at
    return value


def split_actor(actor: str) -> tuple[str, str]:
    """A request's actor → (who, key): ``key:alice/batch`` is alice's key ``alice/batch``; a
    static key ``key:api-key-1`` is its own actor; anybody else has no key."""
    if actor.startswith("key:"):
        label = actor[4:]
        owner, slash, _ = label.partition("/")
        return (owner if slash else actor), label
    return actor, ""


@dataclass(slots=True)
class Usage:
    """One proxied request's usage (times in seconds; ``arrived`` wall clock)."""

    actor: str
    model: str
    arrived: float
    path: str = ""
    request_id: str = ""
    status: int = 0
    queued: float = 0.0
    load: float = 0.0
    caused_load: bool = False
    evicted: tuple[str, ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    duration: float = 0.0


def _floats() -> defaultdict[tuple[str, str], float]:
    return defaultdict(float)


@dataclass
class ActorCounters:
    """Per-actor totals of this web process since it started (Prometheus counters)."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompt_tokens: Counter[tuple[str, str]] = field(default_factory=Counter)
    completion_tokens: Counter[tuple[str, str]] = field(default_factory=Counter)
    queue_seconds: defaultdict[tuple[str, str], float] = field(default_factory=_floats)
    loads_caused: Counter[tuple[str, str]] = field(default_factory=Counter)
    load_seconds_caused: defaultdict[tuple[str, str], float] = field(default_factory=_floats)
    model_seconds: defaultdict[tuple[str, str], float] = field(default_factory=_floats)

    HELP = {
        "requests": "Proxied requests answered, by actor and model (this web process).",
        "prompt_tokens": "Prompt tokens the children counted, by actor and model.",
        "completion_tokens": "Completion tokens the children counted, by actor and model.",
        "queue_seconds": "Seconds requests waited for their model (queue and load).",
        "loads_caused": "Model loads a request of this actor caused.",
        "load_seconds_caused": "Seconds of the loads this actor's requests caused.",
        "model_seconds": "Seconds this actor's requests held a model (grant to end).",
    }

    def families(self) -> list[dict[str, Any]]:
        """Prometheus counter families (``metrics.render``'s input), ``usage_*_total``."""
        out = []
        for name, help_text in self.HELP.items():
            counter: dict[tuple[str, str], float] = getattr(self, name)
            samples = [
                ("", {"actor": actor, "model": model}, float(value))
                for (actor, model), value in sorted(counter.items())
            ]
            out.append(
                {"name": f"usage_{name}_total", "type": "counter", "help": help_text,
                 "samples": samples}
            )  # fmt: skip
        return out

    def add(self, usage: Usage) -> None:
        who = (split_actor(usage.actor)[0], usage.model)
        self.requests[who] += 1
        self.prompt_tokens[who] += usage.prompt_tokens or 0
        self.completion_tokens[who] += usage.completion_tokens or 0
        self.queue_seconds[who] += usage.queued
        self.model_seconds[who] += usage.duration
        if usage.caused_load:
            self.loads_caused[who] += 1
            self.load_seconds_caused[who] += usage.load


class UsageRecorder:
    """Collect usage rows and write them in batches, off the request path (see module doc)."""

    def __init__(self, *, flush_seconds: float = FLUSH_SECONDS, max_pending: int = MAX_PENDING):
        self.flush_seconds = flush_seconds
        self.max_pending = max_pending
        self.pending: list[Usage] = []
        self.counters = ActorCounters()
        self.dropped = 0
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def record(self, usage: Usage) -> None:
        """Take one row (never blocks, never raises into the proxy)."""
        self.counters.add(usage)
        self.pending.append(usage)
        if len(self.pending) > self.max_pending:
            over = len(self.pending) - self.max_pending
            del self.pending[:over]
            self.dropped += over
            log.warning("usage: %d rows dropped (the database has been away too long)", over)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests; a restarted server): start afresh
            self._loop, self._timer, self._writing = loop, None, None
        if self._timer is None and self._writing is None:
            delay = 0.0 if len(self.pending) >= BATCH else self.flush_seconds
            self._timer = loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        self._timer = None
        if self._writing is None and self.pending:
            self._writing = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        batch, self.pending = self.pending[:BATCH], self.pending[BATCH:]
        try:
            await sync_to_async(write_batch, thread_sensitive=False)(batch)
        except Exception:  # the database may be away: keep the rows for the next try
            log.warning("could not write %d usage rows; will retry", len(batch), exc_info=True)
            self.pending[:0] = batch
            if len(self.pending) > self.max_pending:
                over = len(self.pending) - self.max_pending
                del self.pending[:over]
                self.dropped += over
        finally:
            self._writing = None
            if self.pending and self._timer is None:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(self.flush_seconds, self._flush)

    async def drain(self, deadline: float = 10.0) -> None:
        """Write what is pending now (tests, shutdown); stops at the first failed write or
        after ``deadline`` seconds."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self._writing is None:
                if not self.pending:
                    return
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                before = len(self.pending)
                self._flush()
            else:
                before = len(self.pending) + BATCH
            task = self._writing
            if task is None:
                return
            await asyncio.wait({task}, timeout=max(0.0, end - time.monotonic()))
            if not task.done() or len(self.pending) >= before:
                return  # too slow, or the database is away: the timer tries again


RECORDER = UsageRecorder()


# ---- the database side (threads of their own) -------------------------------------------------


def hour_of(t: datetime) -> datetime:
    """The start of ``t``'s hour (a ``UsageHour``'s ``hour``)."""
    return t.replace(minute=0, second=0, microsecond=0)


def write_batch(batch: Iterable[Usage]) -> int:
    """Insert the rows and add them to their hours' rollups, in one transaction.

    The rows go in with one ``executemany`` of a prepared INSERT rather than ``bulk_create``:
    the ORM compiles every field of every row (about 50 µs a row here), and this runs on a
    thread beside the event loop, holding the GIL the proxy needs (bench/README.md, the data
    plane). Values are adapted by the backend's own operations, so both SQLite and PostgreSQL
    get what they would from the ORM."""
    from django.db import connection, transaction
    from django.db.models import F

    from models_app.db import own_connection
    from models_app.models import UsageHour

    @own_connection
    def write() -> int:
        rows = []
        hours: dict[tuple[datetime, str, str, str], dict[str, float]] = {}
        value: float
        adapt = connection.ops.adapt_datetimefield_value
        for u in batch:
            when = datetime.fromtimestamp(u.arrived, UTC)
            actor, key = split_actor(u.actor)
            rows.append(
                (
                    adapt(when), actor[:200], key[:200], u.model[:200], u.path[:200],
                    u.request_id[:160], u.status, u.queued * 1000, u.load * 1000,
                    u.caused_load, ",".join(u.evicted)[:500], u.prompt_tokens,
                    u.completion_tokens, u.duration * 1000,
                )
            )  # fmt: skip
            sums = hours.setdefault((hour_of(when), actor[:200], key[:200], u.model[:200]), {})
            for name, value in (
                ("requests", 1), ("prompt_tokens", u.prompt_tokens or 0),
                ("completion_tokens", u.completion_tokens or 0), ("queue_seconds", u.queued),
                ("loads_caused", int(u.caused_load)),
                ("load_seconds_caused", u.load if u.caused_load else 0.0),
                ("model_seconds", u.duration),
            ):  # fmt: skip
                sums[name] = sums.get(name, 0) + value
        with transaction.atomic():
            if rows:
                with connection.cursor() as cursor:
                    cursor.executemany(_insert_sql(), rows)
            for (hour, actor, key, model), sums in hours.items():
                where = {"hour": hour, "actor": actor, "key": key, "model": model}
                changed = UsageHour.objects.filter(**where).update(
                    **{name: F(name) + value for name, value in sums.items()}
                )
                if not changed:
                    UsageHour.objects.create(**where, **sums)
        return len(rows)

    return write()


# The columns of a usage row, in the order write_batch builds its tuples.
_ROW_FIELDS = (
    "time", "actor", "key", "model", "path", "request_id", "status", "queue_ms", "load_ms",
    "caused_load", "evicted", "prompt_tokens", "completion_tokens", "duration_ms",
)  # fmt: skip


@functools.cache
def _insert_sql() -> str:
    from django.db import connection

    from models_app.models import UsageRecord

    quote = connection.ops.quote_name
    meta = UsageRecord._meta
    columns = ", ".join(quote(meta.get_field(name).column) for name in _ROW_FIELDS)
    marks = ", ".join(["%s"] * len(_ROW_FIELDS))
    return f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({marks})"


def purge_expired(now: datetime | None = None) -> int:
    """Delete usage rows and hours older than the audit retention setting (none: keep)."""
    from django.utils import timezone

    from models_app.models import RouterSettings, UsageHour, UsageRecord

    days = RouterSettings.load().audit_retention_days
    if not days:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted: int = UsageRecord.objects.filter(time__lt=cutoff).delete()[0]
    UsageHour.objects.filter(hour__lt=hour_of(cutoff)).delete()
    return deleted
