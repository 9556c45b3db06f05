"""The checks of a preset's stored values: its id, its ``[key, value]`` pairs (options and
environment), aliases, nodes and server binary. Migrations name several of them by their old
dotted path (``models_app.models.validate_model_id``); the package re-exports them for that.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError

from models_app.models.base import CONTROL_CHARS
from routerpanel.router import ini, options, presets

PAIR_RESERVED_KEYS = frozenset(presets.LLAMA_ROUTER_KEYS + presets.ROUTERPANEL_KEYS)


def validate_model_id(name: str) -> None:
    """Accept the ids llama.cpp accepts as preset names, in their canonical spelling."""
    problem = ini.check_section_name(name)
    if problem:
        raise ValidationError(problem[0].upper() + problem[1:] + ".", code="invalid")
    if name == ini.GLOBAL_SECTION:
        raise ValidationError("'*' is the global section, not a model id.", code="reserved")
    if CONTROL_CHARS.search(name):
        raise ValidationError("A model id cannot contain control characters.", code="invalid")
    canonical = ini.canonical_name(name)
    if canonical != name:
        raise ValidationError(
            "llama.cpp spells the tag after ':' in upper case: use '%(canonical)s'.",
            code="canonical",
            params={"canonical": canonical},
        )


def validate_pairs(value: Any, *, what: str = "option") -> list[tuple[str, str]]:
    """Check a list of ``[key, value]`` pairs: writable in the INI dialect, keys unique."""
    if not isinstance(value, list):
        raise ValidationError(f"Expected a list of [{what}, value] pairs.", code="invalid")
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for item in value:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise ValidationError(f"Each {what} must be a [key, value] pair.", code="invalid")
        key, val = item
        if not isinstance(key, str) or not isinstance(val, str):
            raise ValidationError(f"{what.capitalize()} keys and values are text.", code="invalid")
        problem = ini.check_key(key) or ini.check_value(val)
        if problem:
            raise ValidationError(f"{key}: {problem}.", code="invalid")
        if key in seen:
            raise ValidationError(f"{key} is given twice.", code="duplicate")
        seen.add(key)
        pairs.append((key, val))
    return pairs


def validate_args(value: Any, catalogue: options.Catalogue | None = None) -> list[str]:
    """Check preset args against what the preset's program accepts (default: b11434).

    Raise ValidationError for a key that program does not accept; return warnings for keys
    accepted unchecked (its options could not be read) or ignored (router flags, §11.15).
    """
    known = catalogue or options.builtin()
    warnings: list[ini.IniWarning] = []
    for key, val in validate_pairs(value):
        if key in PAIR_RESERVED_KEYS or key.startswith(presets.ENV_PREFIX):
            raise ValidationError(
                f"{key} has its own field; set it there instead of in the options.",
                code="own_field",
            )
        try:
            found = presets.check_option(key, "", known, 0, warnings)
        except ValueError:
            raise ValidationError(_unknown_option(key, known), code="unknown_option") from None
        if found is not None and found.key in ("alias", "model"):
            raise ValidationError(
                f"{key} has its own field ({found.key}); set it there.", code="own_field"
            )
        problem = options.value_problem(found, val) if found is not None else None
        if found is not None and problem:
            raise ValidationError(f"{key} = {val!r}: {found.key} {problem}.", code="bad_value")
    return [w.message for w in warnings]


def _unknown_option(key: str, catalogue: options.Catalogue) -> str:
    program = "llama-server"
    if isinstance(catalogue, options.OptionTable) and catalogue is not options.builtin():
        program = catalogue.origin
    example = "such as ctx-size, n-gpu-layers or temp" if "llama" in program else "from its --help"
    return f"{program} has no option '{key}'. Use an option name without dashes, {example}."


def validate_env(value: Any) -> None:
    for key, _ in validate_pairs(value, what="variable"):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValidationError(
                f"{key}: environment variable names use letters, digits and '_'.", code="invalid"
            )


def validate_nodes(value: str) -> None:
    try:
        presets.parse_nodes(value)
    except ValueError as exc:
        message = str(exc).partition(": ")[2] or str(exc)
        raise ValidationError(message[0].upper() + message[1:] + ".", code="invalid") from None


def validate_server_bin(value: str) -> None:
    try:
        presets.check_server_bin(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code="invalid") from None


def validate_aliases(value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValidationError("Aliases are a list of names.", code="invalid")
    for alias in value:
        if not alias.strip() or "," in alias or (ini.check_value(alias) is not None):
            raise ValidationError(f"Alias {alias!r} is empty or contains ',', ';' or '#'.")
