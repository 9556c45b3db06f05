"""The router link's framing, shared by both ends (docs/architecture.md, "The router link").

Team mode's data path is one persistent connection per web process to its router: acquire,
renew, release and cancel go over it instead of the channel layer (link_client.py, web side;
link_server.py, router side). Addresses are ``unix:PATH`` (in the router's data dir, mode 0600)
or ``tcp:HOST:PORT`` (other hosts; the first line then proves the installation's key, derived
from ``SECRET_KEY``). One JSON object per line, at most ``LINE_LIMIT`` bytes, written and read
with ``orjson``; the router speaks first (``link.hello``). Each end hands a message on as its
bytes arrive, in order, with no reader task.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

log = logging.getLogger(__name__)

PROTOCOL = 1
HELLO = "link.hello"
AUTH = "link.auth"
READY = "link.ready"
LINE_LIMIT = 1 << 20  # bytes in one line (a message); a longer one closes the connection
SOCKET_NAME = "router.sock"
UNIX_PATH_MAX = 100  # sun_path is 104 (macOS) or 108 (Linux) bytes, the final NUL included
CONNECT_TIMEOUT = 2.0  # seconds to connect and hear the router's hello
FIRST_BACKOFF = 0.1  # seconds before trying again after a failed connect; doubles up to
MAX_BACKOFF = 2.0
FIRST_POLL_WAIT = 2.0  # seconds a web process's first request waits to learn the address
DISCONNECTED = "disconnected"  # the engine's ``why`` for a lease whose connection closed


@dataclass(frozen=True)
class Address:
    """Where a router listens: ``unix:PATH`` or ``tcp:HOST:PORT``."""

    kind: str
    path: str = ""
    host: str = ""
    port: int = 0

    @classmethod
    def parse(cls, text: str) -> Address | None:
        kind, _, rest = text.partition(":")
        if kind == "unix" and rest:
            return cls("unix", path=rest)
        if kind == "tcp":
            host, _, port = rest.rpartition(":")
            if host and port.isdigit():
                return cls("tcp", host=host.strip("[]"), port=int(port))
        return None

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp:{host}:{self.port}"


def link_key(secret: str | None = None) -> bytes:
    """The key a TCP connection proves it knows: derived from ``SECRET_KEY`` (module doc)."""
    if secret is None:
        from django.conf import settings

        secret = settings.SECRET_KEY
    return hmac.new(secret.encode(), b"routerpanel router link", hashlib.sha256).digest()


def proof(key: bytes, nonce: str) -> str:
    return hmac.new(key, nonce.encode(), hashlib.sha256).hexdigest()


def socket_path(data_dir: Path) -> Path:
    """The router's socket: in its data dir, or (a path too long for a socket) in the temp dir
    under a name derived from the data dir, so it is still one per data dir."""
    path = Path(data_dir).resolve() / SOCKET_NAME
    if len(os.fsencode(path)) <= UNIX_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(path)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"routerpanel-{digest}.sock"


def encode(message: Mapping[str, Any]) -> bytes:
    """One line. Raises TypeError for what JSON cannot say. The messages carry finite numbers
    only (times, ttls, ports, milliseconds): ``orjson`` writes an inf or a nan as null."""
    return orjson.dumps(message) + b"\n"


def decode(line: bytes) -> dict[str, Any] | None:
    """A message, or None for a line that is not a JSON object (or not UTF-8)."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) and isinstance(message.get("type"), str) else None


class Lines:
    """A stream's bytes, cut into its messages (framing in the module doc)."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""  # the start of a line whose end has not come yet

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """The messages ``data`` completes. A line that is not a message is skipped; one longer
        than LINE_LIMIT raises ValueError (the connection is not to be trusted). A partial last
        line at the end of the stream is no message."""
        if self._rest:
            data = self._rest + data
        *lines, self._rest = data.split(b"\n")
        if len(self._rest) > LINE_LIMIT:
            raise ValueError("message longer than the line limit")
        messages = []
        for line in lines:
            if len(line) > LINE_LIMIT:
                raise ValueError("message longer than the line limit")
            message = decode(line)
            if message is None:
                log.warning("router link: skipped a line that is not a message: %.80r", line)
            else:
                messages.append(message)
        return messages


class LineProtocol(asyncio.Protocol):
    """One end of a link: each message is handed on in ``data_received``, as it arrives.

    No reader task: asyncio's streams wake a task per read, one loop turn more per message on
    each end than handing the message on from the protocol.
    """

    transport: asyncio.Transport

    def __init__(self) -> None:
        self._lines = Lines()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._lines.feed(data)
        except ValueError as exc:
            log.info("router link: closing a connection: %s", exc)
            self.failed(f"the connection to the router failed: {exc}")
            self.transport.abort()
            return
        for message in messages:
            if self.transport.is_closing():
                return  # closed by an earlier message (a refused proof): read nothing more
            self.received(message)

    def received(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    def failed(self, why: str) -> None:
        """The connection is about to close for ``why`` (a message over the limit)."""
