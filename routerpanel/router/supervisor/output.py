"""Read a child's output: log lines, the child protocol's state lines, readiness (S3, S7).

Both pipes are read to EOF in chunks. Lines go to the log ring and out as ``LogLine`` within the
child's log budget (flood.py); past it they are only counted, yet state lines are still found.
A child without the child protocol is ready when its /health answers 200.
"""

from __future__ import annotations

import asyncio
import json
import time

from routerpanel.router.supervisor.child import Child, now
from routerpanel.router.supervisor.flood import FLOOD_PAUSE, STATE_MARKER, holds_marker, last_line
from routerpanel.router.supervisor.protocol import (
    BIND_FAILURE_MARKERS,
    STATE_NAMES,
    STATE_PREFIX,
    LineSplitter,
    probe_health,
)
from routerpanel.router.supervisor.reporter import Reporter
from routerpanel.router.supervisor.reports import (
    ChildReady,
    ChildState,
    JSONObject,
    LogLine,
    Stream,
)


class Output:
    """Turn a child's pipes into log lines, state reports and its first readiness."""

    def __init__(self, reporter: Reporter, health_interval: float) -> None:
        self._reporter = reporter
        self._note = reporter.note  # a line of the supervisor's own about a child
        self._health_interval = health_interval  # between two /health polls (S3)

    async def read(self, child: Child, reader: asyncio.StreamReader, stream: Stream) -> None:
        """Read one pipe to EOF; past the child's log budget only count lines (flood.py)."""
        splitter = LineSplitter()
        budget, marker = child.budget, STATE_MARKER if child.launch.child_protocol else None
        states = child.state_budget
        while chunk := await reader.read(65536):
            at = now()
            state_room = marker is not None and not states.over(at)
            if budget.over(at) and not (
                state_room and holds_marker(marker, splitter.pending, chunk)
            ):
                budget.count(chunk.count(b"\n"))
                if (tail := last_line(chunk)) is not None:  # the end stays in the ring
                    self._reporter.keep(child, LogLine(child.name, stream, tail, time.time()))
                splitter.skip(chunk)
                await asyncio.sleep(FLOOD_PAUSE)  # cap the reading: the pipe holds the rest
            else:
                for text in splitter.feed(chunk):
                    if marker and text.startswith(STATE_PREFIX):
                        budget.allow(at)  # a state line counts too, and takes a token if any
                        if states.allow(at):
                            self._on_line(child, stream, text)
                        else:
                            budget.count(1)
                    elif budget.allow(at):
                        self._on_line(child, stream, text)
                    else:
                        budget.count(1)
            if (dropped := budget.report(at)) is not None:
                rate = f"{budget.rate:g}"
                self._note(child.name, child, f"{dropped} lines not shown (over {rate} a second)")
            if (bad := child.malformed.report(at)) is not None:
                self._note(child.name, child, f"{bad} more malformed state lines ignored")
        for text in splitter.finish():
            self._on_line(child, stream, text)
        if (bad := child.malformed.flush()) is not None:  # the pipe ended: say the rest now
            self._note(child.name, child, f"{bad} more malformed state lines ignored")

    def _on_line(self, child: Child, stream: Stream, text: str) -> None:
        if stream == "stdout" and child.launch.child_protocol and text.startswith(STATE_PREFIX):
            self._on_state_line(child, text[len(STATE_PREFIX) :])
            return
        self._reporter.log(child.name, child, LogLine(child.name, stream, text, time.time()))
        if child.ready_at is None and any(m in text for m in BIND_FAILURE_MARKERS):
            child.bind_failed = True

    def _on_state_line(self, child: Child, raw: str) -> None:
        """Handle ROUTER_SPEC 4.11; bad lines are logged and ignored, never fatal (§15.16)."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
            message = None
        if not isinstance(message, dict):
            message = {}
        name, payload = message.get("state"), message.get("payload", {})
        if payload is None:  # b11434 sends "payload":null with sleeping and with a wake's ready
            payload = {}
        state = STATE_NAMES.get(name) if isinstance(name, str) else None
        if state is None or not isinstance(payload, dict):
            if child.malformed.allow(now()):  # one noted a second; the rest counted
                self._note(child.name, child, f"ignored malformed state line: {raw[:200]}")
            else:
                child.malformed.count(1)
            return
        child.state = state
        if state == "ready" and child.ready_at is None:
            self._mark_ready(child, payload)
        else:
            self._reporter.post(ChildState(child.name, state, payload))

    async def poll(self, child: Child) -> None:
        """Poll /health until 200: the only polling, for children without the protocol (S3)."""
        while await probe_health(child.address) != 200:
            await asyncio.sleep(self._health_interval)
        child.state = "ready"
        self._mark_ready(child, {})

    def _mark_ready(self, child: Child, info: JSONObject) -> None:
        child.ready_at = now()
        if handle := child.timers.pop("load", None):
            handle.cancel()
        self._reporter.post(
            ChildReady(child.name, child.port, info, child.ready_at - child.started)
        )
