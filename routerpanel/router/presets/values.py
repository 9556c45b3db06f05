"""Read and write the values of the router's own keys (stop-timeout, ttl, memory, server-bin...).

Each reader raises ``ValueError`` with the key and what it expected; ``stop-timeout`` is read
the way llama.cpp does (C's ``stoi``) and only warns.
"""

from __future__ import annotations

import functools
import math
import re
import shlex

from routerpanel.router import ini, options
from routerpanel.router.config import DEFAULT_STOP_TIMEOUT, node_names_problem

_DECIMAL = re.compile(r"\d+(?:\.\d+)?")
_LEADING_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?\d+)")
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_stop_timeout(value: str, line: int, warnings: list[ini.IniWarning]) -> int:
    """Read ``stop-timeout`` like C's ``stoi`` (ROUTER_SPEC 2.12), warning where it guesses."""
    match = _LEADING_INT.match(value)
    if match is None:
        warnings.append(
            ini.IniWarning(
                line, f"stop-timeout = {value!r} is not a number; using {DEFAULT_STOP_TIMEOUT}"
            )
        )
        return DEFAULT_STOP_TIMEOUT
    number = int(match.group(1))
    if match.end() != len(value):
        warnings.append(ini.IniWarning(line, f"stop-timeout = {value!r} read as {number}"))
    if number < 0:
        warnings.append(ini.IniWarning(line, f"stop-timeout = {number} means 0 (kill at once)"))
        return 0
    return number


def parse_bool(key: str, value: str) -> bool:
    if options.is_truthy(value):
        return True
    if options.is_falsey(value):
        return False
    raise ValueError(f"{key} = {value!r}: use true or false (also on/off, 1/0)")


def parse_seconds(key: str, value: str) -> int:
    if not value.isdigit():
        raise ValueError(f"{key} = {value!r}: expected a whole number of seconds (0 or more)")
    return int(value)


def parse_duration(key: str, value: str) -> float:
    """Read a non-negative number of seconds (``60``, ``2.5``); 0 means "off"."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not math.isfinite(number) or number < 0 or not _DECIMAL.fullmatch(value.strip()):
        raise ValueError(f"{key} = {value!r}: expected a number of seconds (0 or more; 0 = off)")
    return number


def format_duration(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def parse_size(value: str) -> int:
    """Read a byte size such as ``8589934592``, ``8G``, ``512MiB`` or ``1.5GB`` (binary units)."""
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"memory = {value!r}: expected a size such as 8G, 512M or 1073741824")
    return int(float(match.group("number")) * _UNITS[match.group("unit").upper()])


def format_size(size: int) -> str:
    """Write a byte size with the largest binary unit that divides it exactly."""
    for unit in ("T", "G", "M", "K"):
        if size and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


def check_server_bin(value: str) -> str:
    """Check that ``value`` splits like a shell command line; it is never run through a shell."""
    try:
        words = _split(value)
    except ValueError as exc:
        raise ValueError(f"server-bin = {value!r}: {exc}") from None
    if not words:
        raise ValueError("server-bin is empty")
    return value


@functools.lru_cache(maxsize=256)
def _split(value: str) -> tuple[str, ...]:
    """Split once per command line (a file of ten thousand presets names a handful)."""
    return tuple(shlex.split(value))


def split_list(value: str) -> tuple[str, ...]:
    """Split ``a, b,,c`` into a sorted set, as llama.cpp reads aliases (ROUTER_SPEC 2.7)."""
    return tuple(sorted({part.strip() for part in value.split(",") if part.strip()}))


def parse_nodes(value: str) -> tuple[str, ...]:
    """Read ``node = studio-1, studio-2`` (the nodes a preset may run on; empty: any node) into
    sorted names. A bad name, an empty one between commas or a repeated one is refused."""
    if not value.strip():
        return ()
    names = [part.strip() for part in value.split(",")]
    if "" in names:
        raise ValueError(f"node = {value!r}: a node name is empty (between two commas)")
    problem = node_names_problem(names)
    if problem:
        raise ValueError(f"node = {value!r}: {problem}")
    return tuple(sorted(names))


def format_nodes(nodes: tuple[str, ...]) -> str:
    return ",".join(nodes)
