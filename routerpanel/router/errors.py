"""What the router answers callers: a ``Lease`` to proceed, or a ``RouterError`` to refuse.

Both cross from the engine to its callers (the HTTP side) unchanged: in process as they are,
between processes as the wire's ``router.granted`` and ``router.rejected`` (the web side's
``models_app.routing.wire`` makes one from the other; ``to_wire``/``from_wire`` here). The one
error type on every side of the router: the engine raises it, the transports carry it, the API
answers it. A leaf module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from routerpanel.router.address import LOOPBACK, ChildAddress
from routerpanel.router.decisions import Reject
from routerpanel.router.receipts import NO_RECEIPT, Receipt


class ErrorBody(TypedDict):
    """llama.cpp's error object: ``{"error": ErrorBody}`` is every refusal's JSON."""

    code: int
    message: str
    type: str


def error_body(status: int, message: str, error_type: str) -> ErrorBody:
    return {"code": status, "message": message, "type": error_type}


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

    @property
    def error(self) -> ErrorBody:
        return error_body(self.status, self.message, self.error_type)

    def body(self) -> dict[str, Any]:
        return {"error": self.error}

    def to_wire(self) -> tuple[int, ErrorBody, float | None]:
        """Status, error object and Retry-After seconds: what a ``router.rejected`` carries."""
        return self.status, self.error, self.retry_after

    @classmethod
    def from_wire(cls, status: int, error: Any, retry_after: float | None = None) -> RouterError:
        """The error a ``router.rejected`` (or a failed call's body) carries; fields missing
        from a malformed answer take the status's defaults."""
        error = error if isinstance(error, dict) else {}
        status = int(error.get("code") or status or 503)
        message = str(error.get("message") or "router error")
        return cls(status, str(error.get("type") or "server_error"), message, retry_after)

    def __repr__(self) -> str:
        return f"RouterError({self.status}, {self.error_type!r}, {self.message!r})"


def unavailable(message: str, retry_after: float | None = None) -> RouterError:
    return RouterError(503, "unavailable_error", message, retry_after)


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
