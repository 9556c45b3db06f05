"""How the proxy's client says a child failed: ``UpstreamError`` with cpp-httplib's wording
(§8.14), which is what a client of the proxy sees, and ``Stale``, the failure the pool may send
again (upstream.py). Raised by relay.py.
"""

from __future__ import annotations

CONNECT_FAILED = "Could not establish connection"
CONNECT_TIMEOUT = "Connection timed out"
READ_TIMEOUT = "Read timeout"
READ_FAILED = "Failed to read connection"


class UpstreamError(Exception):
    """The child could not be reached or broke off; ``text`` is cpp-httplib's wording."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class Stale(UpstreamError):
    """The connection ended before any byte of the answer and within ``relay.STALE_WINDOW`` of
    the request: the child never read it (on a kept-alive connection: it had closed it first; the
    pool sends it again)."""
