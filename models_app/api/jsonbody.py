"""Parse a request body as JSON, strictly: hostile input is a 400, never a 5xx (issue 13).

Python's ``json`` accepts what llama.cpp's parser (nlohmann) rejects or what breaks us later:
``NaN``/``Infinity`` and overflowing numbers (``1e999``), lone UTF-16 surrogates (``"\\ud800"``:
a ``str`` that cannot be encoded back, which made error bodies crash), bodies in UTF-16/32 (it
guesses the encoding), and nesting deep enough to exhaust the interpreter's recursion limit.
Duplicate keys are ambiguous — we might route by one ``model`` while the child reads another —
so they are refused too. ``parse`` is the only JSON parser of request bodies: the router's own
routes (``routes``) and the proxy (``proxy.body_fields``) both call it.

The checks cost little on the hot path: the depth scan only runs when the body holds more
brackets than the limit, and the surrogate walk only when an escaped surrogate appears.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from models_app.api.errors import ApiError

MAX_DEPTH = 128  # arrays and objects inside each other; a tool schema needs a few dozen at most

# A JSON string (unrolled: runs of plain characters at C speed), or one bracket.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse(body: bytes) -> Any:
    """Return the body's JSON value; ``ApiError(400)`` with the reason when it is not acceptable."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = f"request body is not valid UTF-8: {exc.reason} at byte {exc.start}"
        raise ApiError(400, reason) from None
    _check_depth(text)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_constant,
            parse_float=_finite_float,
        )
    except RecursionError:  # a backstop: _check_depth already refuses deep nesting
        raise ApiError(400, f"JSON nesting deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, our hooks' refusals, int digits past the limit
        raise ApiError(400, str(exc)) from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(value):
        raise ApiError(400, "JSON string holds a lone UTF-16 surrogate (not valid Unicode)")
    return value


def parse_object(body: bytes) -> dict[str, Any]:
    """``parse``, with anything but an object read as an empty one (llama.cpp's ``value()``)."""
    value = parse(body)
    return value if isinstance(value, dict) else {}


def _check_depth(text: str) -> None:
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return  # fewer brackets than the limit: no nesting can pass it
    depth = 0
    for token in _TOKENS.finditer(text):
        char = token.group()[0]
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ApiError(400, f"JSON nesting deeper than {MAX_DEPTH} levels")
        elif char in "]}":
            depth -= 1


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ValueError(f"duplicate key {_shown(_first_repeat(pairs))} in a JSON object")
    return value


def _first_repeat(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return ""


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    return any(not _encodable(text) for text in _strings(value))


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(key: str) -> str:
    """A key for an error message: quoted, shortened, and safe to encode."""
    return json.dumps(key[:60])
