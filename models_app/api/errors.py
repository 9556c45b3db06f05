"""Error bodies in llama.cpp's shapes and the exception that carries one (ROUTER_SPEC Appendix A).

Handlers raise ``ApiError``; the dispatcher turns it into the response (and a ``RouterError``,
the router's refusal, through ``ApiError.from_rejection``). Bodies are built as bytes here, in
the key orders llama.cpp emits: ``code, message, type`` for handler errors, and
``message, type, code`` for the three bodies its HTTP middleware writes (401, the 404 of an
unknown route, the 503 of a loading child). Every 404, whoever produced it, is answered with the
generic ``File Not Found`` body (§9.3a, §15.29 keep), with one exception that is not llama.cpp's
route: ``GET /v1/models/{id}`` of an id it does not list answers OpenAI's ``model_not_found``
(``Request.respond(own_404=True)``), as OpenAI SDKs expect.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from routerpanel.router.errors import RouterError, error_body

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def dumps(value: Any) -> bytes:
    """Serialise compactly, UTF-8 unescaped, as llama.cpp's JSON ``dump()`` does.

    Text that UTF-8 cannot hold (a lone surrogate echoed from a request) is written escaped
    (``\\ud800``) instead of failing: an error body must never be the error.
    """
    try:
        return orjson.dumps(value)  # the same text, several times faster (a listing: 8 MB)
    except (TypeError, orjson.JSONEncodeError):  # what only json takes: a lone surrogate,
        pass  # an integer past 64 bits, a key that is not a string
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def encoded_error(status: int, message: str, error_type: str | None = None) -> bytes:
    """A handler error, encoded: ``{"error": {"code", "message", "type"}}``."""
    kind = error_type or ERROR_TYPES.get(status, "server_error")
    return dumps({"error": error_body(status, message, kind)})


def middleware_body(status: int, message: str) -> bytes:
    """A middleware error: ``{"error": {"message", "type", "code"}}`` (Appendix A, last note)."""
    return dumps({"error": {"message": message, "type": ERROR_TYPES[status], "code": status}})


NOT_FOUND = middleware_body(404, "File Not Found")
UNAUTHORIZED = middleware_body(401, "Invalid API Key")
# /tools and /cors-proxy (§9.19): no code, its own type.
FEATURE_DISABLED = dumps(
    {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}
)


class ApiError(Exception):
    """Answer the request with ``status`` and an error body (already encoded)."""

    def __init__(
        self,
        status: int,
        message: str = "",
        error_type: str | None = None,
        *,
        body: bytes | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body if body is not None else encoded_error(status, message, error_type)
        self.headers = headers

    @classmethod
    def from_rejection(cls, rejected: RouterError) -> ApiError:
        """The router said no: its status and error, in llama.cpp's key order."""
        headers: tuple[tuple[bytes, bytes], ...] = ()
        if rejected.retry_after is not None:  # A8: queue limits answer 503 with Retry-After
            headers = ((b"retry-after", str(max(1, round(rejected.retry_after))).encode()),)
        body = dumps(rejected.body())
        return cls(rejected.status, rejected.message, body=body, headers=headers)
