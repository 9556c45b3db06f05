"""Read settings from the environment, failing loudly on values that do not parse (STYLE 11).

A typo in a deployment variable must stop the process at start-up with a message that names the
variable, never silently fall back to a default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar, overload

TRUE_WORDS = frozenset({"1", "true", "yes", "on", "enabled"})  # llama.cpp's words too
FALSE_WORDS = frozenset({"0", "false", "no", "off", "disabled"})


N = TypeVar("N", int, float)


class EnvError(ValueError):
    """A variable is set but its value cannot be used."""


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def envstr(name: str, default: str = "", environ: Mapping[str, str] | None = None) -> str:
    value = _raw(name, environ)
    return default if value is None else value


def envbool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Return a boolean: only true/false (and 1/0, yes/no, on/off) are accepted."""
    value = _raw(name, environ)
    if value is None:
        return default
    word = value.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvError(f"{name}={value!r} is not a boolean; use true or false")


def envchoice(
    name: str, choices: tuple[str, ...], default: str, environ: Mapping[str, str] | None = None
) -> str:
    """Return one of ``choices`` (case-insensitive), or ``default`` when unset."""
    value = _raw(name, environ)
    if value is None:
        return default
    if value.lower() not in choices:
        raise EnvError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value.lower()


@overload
def envint(
    name: str, default: int, environ: Mapping[str, str] | None = None, *, minimum: int | None = None
) -> int: ...
@overload
def envint(
    name: str,
    default: None,
    environ: Mapping[str, str] | None = None,
    *,
    minimum: int | None = None,
) -> int | None: ...
def envint(
    name: str,
    default: int | None,
    environ: Mapping[str, str] | None = None,
    *,
    minimum: int | None = None,
) -> int | None:
    """Return an integer (or ``default`` when unset); junk or a value below ``minimum`` raises."""
    number = _number(name, environ, int, "an integer", minimum)
    return default if number is None else number


def envfloat(
    name: str, default: float, environ: Mapping[str, str] | None = None, *, minimum: float = 0.0
) -> float:
    """Return a finite number of at least ``minimum`` (default 0); junk raises."""
    number = _number(name, environ, float, "a number", minimum)
    return default if number is None else number


def _number(
    name: str,
    environ: Mapping[str, str] | None,
    parse: Callable[[str], N],
    what: str,
    minimum: N | None,
) -> N | None:
    value = _raw(name, environ)
    if value is None:
        return None
    try:
        number = parse(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not {what}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise EnvError(f"{name}={value!r} is not {what}")
    if minimum is not None and number < minimum:
        raise EnvError(f"{name}={number} must be at least {minimum}")
    return number


def envlist(name: str, default: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Return a comma-separated list with blanks dropped."""
    value = _raw(name, environ)
    return list(default) if value is None else split_list(value)


def split_list(value: str | None) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]`` (also for command-line values like ``--api-key``)."""
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def envpath(name: str, default: Path, environ: Mapping[str, str] | None = None) -> Path:
    value = _raw(name, environ)
    return (Path(value) if value is not None else default).expanduser().resolve()


def secret_key_from(data_dir: Path, environ: Mapping[str, str] | None = None) -> str:
    """Return SECRET_KEY, or a key generated once and kept in the data dir (mode 0600)."""
    given = _raw("SECRET_KEY", environ)
    if given is not None:
        return given
    path = data_dir / "secret_key"
    if path.exists():
        key = path.read_text().strip()
        if key:
            return key
    import secrets

    key = secrets.token_urlsafe(50)
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key
