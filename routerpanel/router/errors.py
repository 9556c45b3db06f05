"""What the router answers callers: a ``Lease`` to proceed, or a ``RouterError`` to refuse.

Both cross from the engine to its callers (the HTTP side) unchanged. A leaf module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from routerpanel.router.address import LOOPBACK, ChildAddress
from routerpanel.router.decisions import Reject
from routerpanel.router.receipts import NO_RECEIPT, Receipt


class RouterError(Exception):
    """A request the router answers with an error; ``body()`` is llama.cpp's error shape.

    ``details`` holds the child's last log lines for a failed load (A10); ``body()`` leaves them
    out so the shape stays llama.cpp's, and the HTTP layer may show them.
    """

    status: int
    error_type: str
    message: str
    retry_after: float | None  # seconds, for a Retry-After header (A8)
    details: tuple[str, ...]

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        retry_after: float | None = None,
        details: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.retry_after = retry_after
        self.details = details

    @classmethod
    def from_reject(cls, d: Reject) -> RouterError:
        return cls(d.status, d.error_type, d.message, retry_after=d.retry_after, details=d.details)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "type": self.error_type}}

    def __repr__(self) -> str:
        return f"RouterError({self.status}, {self.error_type!r}, {self.message!r})"


def unavailable(message: str) -> RouterError:
    return RouterError(503, "unavailable_error", message)


@dataclass(frozen=True)
class Lease:
    """A granted request: send it to ``address`` (``host``, ``port`` and the child's ``key``, if
    it has one, issue 18); it counts as in flight until released. The key is left out of repr."""

    lease_id: str
    request_id: str
    model: str
    port: int
    expires_at: float  # engine clock time; renew() pushes it, the caller's copy is not updated
    actor: str = ""  # who asked (the audit's actor if the lease expires)
    receipt: Receipt = NO_RECEIPT  # what it waited through (issue 17.3)
    host: str = LOOPBACK
    key: str | None = field(default=None, repr=False)

    @property
    def address(self) -> ChildAddress:
        return ChildAddress(self.host, self.port, self.key)
