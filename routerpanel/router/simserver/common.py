"""Hold what every simserver module shares: the logger, JSON values and their compact form,
the build identity, llama.cpp's error body (``ApiError``) and the hard exit.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import suppress
from typing import Any, NoReturn

log = logging.getLogger("simserver")

JSON = dict[str, Any]

BUILD_INFO = "b11434-simserver"


def compact(value: Any) -> str:
    """Serialise like llama.cpp: compact separators, UTF-8 kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ApiError(Exception):
    """A handler error that becomes llama.cpp's ``{"error": {code, message, type}}`` body."""

    TYPES = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        500: "server_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_json(self) -> JSON:
        return {
            "error": {"code": self.code, "message": self.message, "type": self.TYPES[self.code]}
        }


def hard_exit(code: int) -> NoReturn:
    """Leave now without unwinding other threads (crash, stdin EOF, second signal)."""
    for stream in (sys.stderr, sys.stdout):
        with suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
