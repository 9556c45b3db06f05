"""Read children the way llama.cpp's router does: the child protocol's state lines and exit
command (ROUTER_SPEC §4), bind-failure markers, bounded line splitting (S7) and the
``/health`` probe for children without the protocol (S3).
"""

from __future__ import annotations

import asyncio
import contextlib

from routerpanel.router.address import ChildAddress
from routerpanel.router.supervisor.reports import ChildStateName

STATE_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = b"cmd_router_to_child:exit\n"
# llama.cpp tools/server/server-http.cpp prints the first; Python servers print the second.
BIND_FAILURE_MARKERS = ("couldn't bind HTTP server socket", "Address already in use")
MAX_LINE_BYTES = 64 * 1024
STATE_NAMES: dict[str, ChildStateName] = {
    "loading": "loading",
    "ready": "ready",
    "sleeping": "sleeping",
    "downloading": "downloading",
}


async def probe_health(address: ChildAddress, timeout: float = 2.0) -> int | None:
    """Return the status of ``GET /health`` on the child, or None if it did not answer.

    A bare HTTP/1.1 request on asyncio streams: cheaper than a client library at 10 Hz and it
    logs nothing. llama-server leaves /health public; the key goes along all the same, for a
    server binary that protects it.
    """
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(address.host, address.port)
            try:
                writer.write(address.get("/health"))
                status_line = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return None
    parts = status_line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


class LineSplitter:
    """Split a byte stream into text lines, keeping at most ``limit`` bytes of any line (S7)."""

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._truncated = False

    def feed(self, data: bytes) -> list[str]:
        *complete, partial = data.split(b"\n")
        lines = []
        for part in complete:
            self._append(part)
            lines.append(self._take())
        self._append(partial)
        return lines

    def skip(self, data: bytes) -> None:
        """Drop the complete lines of ``data`` (a flood, counted elsewhere); keep its last,
        unfinished one as the start of the next line."""
        end = data.rfind(b"\n")
        if end >= 0:
            self._buf.clear()
            self._truncated = False
            data = data[end + 1 :]
        self._append(data)

    def pending(self, size: int) -> bytes:
        """The last ``size`` bytes of the unfinished line (a marker may span two chunks)."""
        return bytes(self._buf[-size:]) if size > 0 else b""

    def finish(self) -> list[str]:
        return [self._take()] if self._buf or self._truncated else []

    def _append(self, part: bytes) -> None:
        room = self._limit - len(self._buf)
        if len(part) > room:
            self._truncated = True
            part = part[: max(room, 0)]
        self._buf += part

    def _take(self) -> str:
        text = self._buf.decode("utf-8", "replace").rstrip("\r")
        if self._truncated:
            text += " [line truncated]"
        self._buf.clear()
        self._truncated = False
        return text
