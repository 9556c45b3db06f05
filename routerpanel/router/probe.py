"""Ask a busy child whether it still makes progress: ``GET /slots``, else ``GET /health``.

The watchdog's only I/O (watchdog.py judges what is read here). A bare HTTP/1.1 request on
asyncio streams, ``Connection: close``, the whole exchange under one deadline: a child that is
stopped (SIGSTOP, a wedged Metal queue) accepts the connection in the kernel and never answers,
which is exactly what the deadline turns into "no answer".
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from routerpanel.router.address import ChildAddress
from routerpanel.router.watchdog import Reading, slots_counters

MAX_BODY = 4 << 20  # a /slots answer of many slots with their prompts is still far below this


async def read_slots(address: ChildAddress, timeout: float) -> Reading | None:
    """Return the child's progress counters (or only its /health status), or None if it did
    not answer within ``timeout`` seconds. A keyed child's key goes along (/slots wants it)."""
    try:
        async with asyncio.timeout(timeout):
            status, body = await http_get(address, "/slots")
            if status == 501:  # started with --no-slots: /health is all there is
                status, _ = await http_get(address, "/health")
                return Reading(None, status)
    except (OSError, TimeoutError, ValueError):
        return None
    try:
        counters = slots_counters(json.loads(body))
    except ValueError:
        counters = None
    return Reading(counters, status)


async def http_get(address: ChildAddress, path: str) -> tuple[int, bytes]:
    """Send one GET and read the whole answer; raise OSError/ValueError on a broken one."""
    reader, writer = await asyncio.open_connection(address.host, address.port)
    try:
        writer.write(address.get(path))
        raw = await reader.read(MAX_BODY)
        while chunk := await reader.read(MAX_BODY):
            raw += chunk
            if len(raw) > MAX_BODY:
                raise ValueError("answer too large")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError("not an HTTP answer")
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return int(parts[1]), body


def _unchunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)
