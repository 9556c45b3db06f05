"""Where a child listens and the key it wants (issue 18: children off loopback are protected).

A router that advertises a non-loopback address starts each child with a random per-spawn API
key that only the router and the web processes know. ``ChildAddress`` is what a caller needs to
reach one child: host, port and that key (None for an unprotected child). The key never goes
into a log line, an event, a snapshot or an audit row: ``shown`` masks it in a command line, and
``repr`` leaves it out. A leaf module.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"
MASK = "***"
# The flags whose value is a key (llama-server's ``--api-key``; a file path is no secret).
KEY_FLAGS = ("--api-key",)


@dataclass(frozen=True, slots=True)
class ChildAddress:
    """One child as a caller reaches it; equal addresses share a connection pool."""

    host: str
    port: int
    key: str | None = field(default=None, repr=False)

    @property
    def netloc(self) -> str:
        """``host:port``, an IPv6 host in brackets (also the ``Host`` header's value)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """``http://host:port``, an IPv6 host in brackets."""
        return f"http://{self.netloc}"

    def headers(self) -> dict[str, str]:
        """What every request to the child carries: its key, if it has one."""
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def get(self, path: str) -> bytes:
        """A bare HTTP/1.1 ``GET path`` for this child, ``Connection: close`` (the probes)."""
        lines = [f"GET {path} HTTP/1.1", f"Host: {self.netloc}"]
        lines += [f"{name}: {value}" for name, value in self.headers().items()]
        return ("\r\n".join([*lines, "Connection: close", "", ""])).encode()


def new_key() -> str:
    """A fresh random key for one spawn (URL-safe, 256 bits)."""
    return secrets.token_urlsafe(32)


def shown(argv: Iterable[str]) -> list[str]:
    """The command line with every key's value masked, for logs, the UI and the audit."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        name, sep, _ = arg.partition("=")
        if name in KEY_FLAGS:
            if sep:
                out.append(f"{name}={MASK}")
            else:
                out.append(arg)
                mask_next = True
            continue
        out.append(arg)
    return out
