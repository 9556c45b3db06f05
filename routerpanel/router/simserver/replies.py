"""Define the request and reply values passed between the HTTP handler and the app, and the
replies llama-server's middleware sends before routing (preflight, loading, API key, 404).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from routerpanel.router.simserver.common import JSON, ApiError, compact

JSON_TYPE = "application/json; charset=utf-8"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> JSON:
        """Parse the body as a JSON object; refuse anything else with llama.cpp's 400."""
        try:
            value = json.loads(self.body)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
            raise ApiError(
                400, f"[json.exception.parse_error.101] parse error at {where}"
            ) from None
        except UnicodeDecodeError as exc:
            raise ApiError(400, f"[json.exception.parse_error.101] parse error: {exc}") from None
        if not isinstance(value, dict):
            raise ApiError(
                400, "[json.exception.type_error.304] the request body must be an object"
            )
        return value


@dataclass(frozen=True)
class Reply:
    """One response: a body, or ``chunks`` to send with chunked transfer encoding."""

    status: int
    body: bytes = b""
    content_type: str = JSON_TYPE
    headers: tuple[tuple[str, str], ...] = ()
    chunks: Generator[bytes, None, None] | None = None


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, compact(value).encode())


def middleware_error(code: int, message: str) -> Reply:
    """Errors raised before routing use the key order message, type, code (Appendix A)."""
    body = {"error": {"message": message, "type": ApiError.TYPES[code], "code": code}}
    return json_reply(body, code)


LOADING = middleware_error(503, "Loading model")
UNAUTHORIZED = middleware_error(401, "Invalid API Key")
NOT_FOUND = middleware_error(404, "File Not Found")
PREFLIGHT = Reply(
    200,
    content_type="text/html",
    headers=(
        ("Access-Control-Allow-Credentials", "true"),
        ("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
        ("Access-Control-Allow-Headers", "*"),
    ),
)
