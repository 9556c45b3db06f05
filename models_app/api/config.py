"""Tunables of the HTTP surface; the defaults are what ``serve`` runs with."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class ApiConfig:
    """Limits and timeouts of the router API and the proxy (tests shrink the intervals)."""

    # Request bodies are read whole (the model is inside the JSON, §8.4); beyond this: 413.
    max_body_bytes: int = 32 * MIB
    # Toward children: llama.cpp uses --timeout (3600 s) for connect, read and write (§8.12).
    upstream_timeout: float = 3600.0
    connect_timeout: float = 30.0
    # Idle pooled connections are dropped before llama-server's own 5 s keep-alive timeout, so
    # the common "closed while idle" race does not even start (the retry covers the rest).
    keepalive_expiry: float = 4.0
    # A child's answer framed by Content-Length up to this size is read whole and goes out with
    # the child's Content-Length (not re-chunked); a bigger one streams through chunked.
    whole_answer_bytes: int = 1 * MIB
    # SSE comment interval so that proxies in front of us do not time the stream out.
    sse_keepalive: float = 15.0
    # The default of ?autoload= (serve --no-models-autoload, ROUTER_SPEC §8.5).
    autoload: bool = True
    # /props build_info: "b<build>-<commit>"; clients only check the "b" prefix (§9.7).
    build_info: str = "b11434-routerpanel"
