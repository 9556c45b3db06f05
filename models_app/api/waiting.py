"""Queue position in the client's stream (issue 17.7): SSE comments while a request waits.

Opt-in, per request (``X-RouterPanel-Queue-Comments: 1``; ``0`` turns a key's default off) or
per key (``ApiKey.queue_comments``), for a streamed (``"stream": true``) chat or completion.
When such a request has to wait for its model — queued behind other models, or its model
loading — the response head (200, ``text/event-stream``) goes out at once and the client reads
comment lines that SSE parsers, the OpenAI SDKs among them, skip::

    : queued 2 of 3, loading qwen-7b 40% (4 s)
    : loading qwen-7b ~60% (6 s)
    : routerpanel queue_ms=6012 load_ms=5890 evicted=small

A status line goes out about once a second, and at once when the queue or a model's state
changes (a ``queue.changed`` or ``model.state`` event) what it says; at most one per ``MIN_GAP``.
Its figures are the router's snapshot: the position of the model's queue entry among the
entries (one per model, shared by everyone waiting for it), the models loading and stopping, and
a percentage only with a basis — the child's own loading progress (exact: ``40%``), else the
time this model's previous load took (an estimate: ``~40%``, never above 99), else none. After
the grant, one line gives the receipt that can no longer go in headers, then the child's stream
follows unchanged. An error after the head (max wait, cancelled by an operator, a failed load,
a hung child) ends the stream with one ``data: {"error": ...}`` event (``sse.data_event``).

A request granted within ``GRACE`` (its model ready) never starts early, nor does one the router
shows not waiting (a ready model is granted without a queue entry): its answer is byte for byte
what it would be without the opt-in. The acquire stays in the handler's task, so a client that
leaves while queued leaves the queue exactly as before (A7); the comments run beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from models_app.api.request import Request
from routerpanel.router.blocked import WAIT_HEADER
from routerpanel.router.catalogue import Event
from routerpanel.router.receipts import Receipt

if TYPE_CHECKING:
    from models_app.api.context import ApiContext
    from models_app.routing.wire import Grant

log = logging.getLogger(__name__)

HEADER = b"x-routerpanel-queue-comments"
# Streamed answers that are SSE of ``data:`` lines ending with ``data: [DONE]`` or not at all.
PATHS = frozenset(
    {"/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions"}
)
GRACE = 0.15  # seconds: a request granted sooner sends nothing early
INTERVAL = 1.0  # seconds between status lines when nothing changes
MIN_GAP = 0.25  # seconds: at most one line this often, however busy the router is
_ON = frozenset({b"1", b"true", b"yes", b"on"})
_OFF = frozenset({b"0", b"false", b"no", b"off"})
_WAKES = frozenset({Event.QUEUE_CHANGED, Event.MODEL_STATE})  # progress: on the next tick
SSE_HEADERS = ((b"content-type", b"text/event-stream"), (b"x-accel-buffering", b"no"))


def wanted(request: Request, streamed: bool) -> bool:
    """Whether this request asked for queue comments (its header, else its key's setting)."""
    if not streamed or request.path not in PATHS:
        return False
    value = request.headers.get(HEADER, b"").strip().lower()
    if value in _ON:
        return True
    return value not in _OFF and request.caller.queue_comments


def patient(request: Request, streamed: bool) -> bool:
    """Whether this request waits even when no slot can free up while nothing changes (all held
    by pinned models): ``X-RouterPanel-Wait: 1``, or it asked for queue comments (it watches the
    wait). Otherwise such a request is answered 503 at once with the reason (blocked.py)."""
    value = request.headers.get(WAIT_HEADER.encode(), b"").strip().lower()
    return value in _ON or wanted(request, streamed)


def comment(text: str) -> bytes:
    """One SSE comment line (a line break in ``text`` would end it: none is let through)."""
    return b": " + " ".join(text.split()).encode() + b"\n\n"


def receipt_line(receipt: Receipt) -> bytes:
    """The receipt's headers (issue 17.3) as one comment, for a head that went out before it."""
    queued, load = round(receipt.queued * 1000), round(receipt.load * 1000)
    text = f"routerpanel queue_ms={queued} load_ms={load}"
    if receipt.evicted:
        text += " evicted=" + ",".join(receipt.evicted)
    return comment(text)


def status_line(snapshot: Mapping[str, Any], model: str, now: float) -> str | None:
    """What the router's ``snapshot`` says of a request for ``model`` (name or alias); None
    when it does not wait (its model is ready, or the router does not know it)."""
    models: Sequence[Mapping[str, Any]] = snapshot.get("models") or ()
    mine = next((m for m in models if model == m["name"] or model in m["aliases"]), None)
    if mine is None:
        return None
    if mine["state"] == "loading":
        return "loading " + loading(mine, now)
    queue: Sequence[Mapping[str, Any]] = snapshot.get("queue") or ()
    entry = next((e for e in queue if e["model"] == mine["name"]), None)
    if entry is None:
        return None
    parts = [f"queued {entry['position']} of {len(queue)}"]
    parts += ["loading " + loading(m, now) for m in models if m["state"] == "loading"]
    parts += [f"stopping {m['name']}" for m in models if m.get("stopping")]
    return ", ".join(parts)


def loading(model: Mapping[str, Any], now: float) -> str:
    """``qwen-7b 40% (4 s)``: a loading model, its progress when there is a basis, its time."""
    since = model.get("state_since")
    elapsed = max(0.0, now - since) if isinstance(since, int | float) else None
    text = str(model["name"])
    share = progress(model.get("progress"))
    if share is None and elapsed is not None:
        share = estimate(elapsed, model.get("load_seconds"), model.get("loaded_at"))
    if share is not None:
        text += " " + share
    if elapsed is not None:
        text += f" ({elapsed:.0f} s)"
    return text


def progress(payload: object) -> str | None:
    """The child's own loading progress (ROUTER_SPEC 4.9): ``40%``, with the stage's name when
    there are several stages (each goes 0 → 1: their sum would be a guess)."""
    if not isinstance(payload, Mapping):
        return None
    value = payload.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
        return None
    percent = f"{int(value * 100)}%"
    stages = payload.get("stages")
    current = payload.get("current")
    if isinstance(stages, list) and len(stages) > 1 and isinstance(current, str):
        return f"{current} {percent}"
    return percent


def estimate(elapsed: float, previous: object, loaded_at: object) -> str | None:
    """``~40%``: the time loading so far over this model's previous load (none for a first
    load, or for a wake from sleep — a model still loaded — which takes its own time)."""
    if loaded_at is not None or not isinstance(previous, int | float) or previous <= 0:
        return None
    return f"~{min(99, int(elapsed / previous * 100))}%"


class Comments:
    """Tell one waiting streamed request's client where it stands (see module doc)."""

    def __init__(self, api: ApiContext, request: Request, model: str) -> None:
        self.api = api
        self.request = request
        self.model = model
        self.last = ""
        self._said = 0.0  # monotonic time of the last line
        self._stopping = False
        self._writing = False
        self._changed = asyncio.Event()

    @property
    def started(self) -> bool:
        """Whether the head went out early (the answer is now an SSE stream of ours)."""
        return self.request.event_stream

    async def acquire(self, acquiring: Awaitable[Grant]) -> Grant:
        """Await the grant (in this task: leaving the queue works as before) while a task
        beside it writes the comments; after an early head, the receipt's line."""
        talker = asyncio.ensure_future(self._talk())
        try:
            grant = await acquiring
        finally:
            await self._stop(talker)
        if self.started:
            await self.request.write(receipt_line(grant.receipt))
        return grant

    async def _stop(self, talker: asyncio.Task[None]) -> None:
        """End the talker, letting a write under way finish (never half a line)."""
        self._stopping = True
        if not self._writing:
            talker.cancel()
        self._changed.set()
        await asyncio.gather(talker, return_exceptions=True)

    async def _talk(self) -> None:
        await asyncio.sleep(GRACE)
        pump = asyncio.ensure_future(self._pump())
        try:
            while not self._stopping:
                self._changed.clear()  # a change from here on is news for the next line
                line = await self._line()
                if line is not None and not self._stopping and (line != self.last or self._due()):
                    await self._say(line)
                if not self._stopping:
                    await self._pause()
        finally:
            pump.cancel()

    def _due(self) -> bool:
        return time.monotonic() - self._said >= INTERVAL - MIN_GAP

    async def _pause(self) -> None:
        """Until the next tick or a change (one during the sleep counts), at least MIN_GAP."""
        await asyncio.sleep(MIN_GAP)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(INTERVAL - MIN_GAP):
                await self._changed.wait()

    async def _line(self) -> str | None:
        try:
            snapshot = await self.api.router.snapshot()
        except Exception as exc:  # the comments are a courtesy: never the request's failure
            log.debug("no snapshot for queue comments: %s", exc)
            return None
        return status_line(snapshot, self.model, time.time())

    async def _say(self, line: str) -> None:
        self._writing = True
        try:
            if not self.started:
                self.request.event_stream = True
                await self.request.start(200, list(SSE_HEADERS))
            await self.request.write(comment(line))
        finally:
            self._writing = False
        self.last, self._said = line, time.monotonic()

    async def _pump(self) -> None:
        """Wake the talker on the router events that can change its line."""
        try:
            async for event in self.api.router.events():
                if event.get("type") in _WAKES:
                    self._changed.set()
        except Exception as exc:
            log.debug("no router events for queue comments: %s", exc)
