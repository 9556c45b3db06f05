"""Supervisor test helpers: the simulated server's argv, inline children, an event recorder."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

from routerpanel.router.supervisor import LogLine, SupervisorEvent

E = TypeVar("E", bound=SupervisorEvent)
WAIT = 60.0  # generous: the machine is small and busy
PROJECT = Path(__file__).resolve().parents[2]  # children import routerpanel from here


def sim(*flags: str) -> list[str]:
    return [sys.executable, "-m", "routerpanel.router.simserver", "-m", "tiny.gguf", *flags]


def inline(script: str, *args: str) -> list[str]:
    return [sys.executable, "-c", script, *args]


class Recorder:
    """Collect posted events with the monotonic time they arrived."""

    def __init__(self) -> None:
        self.events: list[tuple[float, SupervisorEvent]] = []
        self._changed = asyncio.Event()

    def post(self, event: SupervisorEvent) -> None:
        self.events.append((time.monotonic(), event))
        self._changed.set()

    def of(self, kind: type[E]) -> list[E]:
        return [e for _, e in self.events if isinstance(e, kind)]

    def find(self, kind: type[E], **fields: Any) -> tuple[float, E] | None:
        for at, event in self.events:
            if isinstance(event, kind) and all(getattr(event, k) == v for k, v in fields.items()):
                return at, event
        return None

    async def wait_for(
        self, kind: type[E], timeout: float = WAIT, **fields: Any
    ) -> tuple[float, E]:
        async with asyncio.timeout(timeout):
            while (found := self.find(kind, **fields)) is None:
                self._changed.clear()
                await self._changed.wait()
        return found

    def texts(self, stream: str | None = None) -> list[str]:
        return [e.text for e in self.of(LogLine) if stream is None or e.stream == stream]
