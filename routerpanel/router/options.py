"""Look up llama-server's command-line options by preset key and render them as argv.

Standard library only, so the INI parser, the engine and the tests can use it without Django.
The built-in table (``llama_options.json``) is generated from llama.cpp's ``common/arg.cpp`` by
``tools/gen_llama_options.py`` and lists exactly the options of ``llama-server`` b11434 (rule
11.10). Another build or a fork has a table of its own, read from its ``--help`` by
``helptext.parse_help``; both are ``OptionTable``s. Preset-only keys (``load-on-startup``,
``stop-timeout``, ``dedup-cache-models``, rule 11.14) are not options and are unknown here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

PACKAGE = __name__.rpartition(".")[0]
TABLE_FILE = "llama_options.json"
TRUTHY = frozenset({"on", "enabled", "true", "1"})
FALSEY = frozenset({"off", "disabled", "false", "0"})


@dataclass(frozen=True)
class LlamaOption:
    """One ``llama-server`` option, with its spellings in declared order."""

    args: tuple[str, ...]
    args_neg: tuple[str, ...]
    env: str | None
    takes_value: bool
    takes_two_values: bool
    value_hint: str | None = None  # "N", "<0|1>", "{none,linear,yarn}", ... (built-in table)
    handler: str | None = None  # how llama.cpp reads the value: "int", "string", ...

    @property
    def key(self) -> str:
        """Return the last declared spelling without dashes: the name ``to_ini`` writes (11.17)."""
        return self.args[-1].lstrip("-")

    @property
    def sort_key(self) -> bytes:
        """Return the first declared spelling, dashes included, as bytes (11.16 step 1)."""
        return self.args[0].encode()

    @property
    def env_neg(self) -> str | None:
        """Return the derived ``LLAMA_ARG_NO_<X>`` name, or None without env or negative form.

        Like ``common_arg::get_env``, every ``LLAMA_ARG_`` is replaced, so an env name without
        that prefix would derive to itself (no option of this build has that shape).
        """
        if self.env is None or not self.args_neg:
            return None
        return self.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")


@dataclass(frozen=True)
class OptionTable:
    """The options one server program accepts, and where the list came from."""

    options: tuple[LlamaOption, ...]
    by_key: Mapping[str, tuple[LlamaOption, bool]]
    origin: str  # "llama-server b11434 (built in)", or the command whose --help was read

    @classmethod
    def of(cls, options: Iterable[LlamaOption], origin: str) -> OptionTable:
        listed = tuple(options)
        return cls(listed, MappingProxyType(_index(listed)), origin)

    def lookup(self, key: str) -> tuple[LlamaOption, bool] | None:
        """Return the option a preset key names and whether the key is a negative spelling.

        ``key`` is any spelling without its leading dashes (short, long or negative), the env
        name, or the derived ``LLAMA_ARG_NO_<X>`` name; matching is case-sensitive. The flag is
        True only for a negative spelling (rule 11.12 inverts its value); the ``LLAMA_ARG_NO_``
        env form gives False because llama.cpp stores it without inversion (quirk 11.12). None
        when unknown.
        """
        return self.by_key.get(key)


@dataclass(frozen=True)
class Unreadable:
    """A program whose options could not be read: its preset keys are accepted unchecked."""

    program: str
    reason: str


# What a preset's keys are checked against: the options of the program that will run it.
Catalogue = OptionTable | Unreadable


def lookup(key: str) -> tuple[LlamaOption, bool] | None:
    """Look ``key`` up in the built-in b11434 table (see ``OptionTable.lookup``)."""
    return builtin().lookup(key)


def is_truthy(value: str) -> bool:
    """Return True for exactly ``on``, ``enabled``, ``true`` or ``1`` (rule 11.13)."""
    return value in TRUTHY


def is_falsey(value: str) -> bool:
    """Return True for exactly ``off``, ``disabled``, ``false`` or ``0`` (rule 11.13)."""
    return value in FALSEY


def stored_value(option: LlamaOption, negative: bool, value: str) -> str:
    """Return the value a preset stores for ``key = value`` (rule 11.12).

    A negative spelling stores ``"false"`` for a truthy value and ``"true"`` for anything else
    (so ``no-warmup = yes`` means warmup on); every other key stores the value as written.
    """
    if negative and option.args_neg:
        return "false" if is_truthy(value) else "true"
    return value


def render(option: LlamaOption, value: str) -> list[str]:
    """Return the argv items for one stored option (rule 11.16 steps 3-5 and 7).

    Raises ValueError for an option that takes two values, as ``common_preset::to_args`` does.
    """
    if option.takes_two_values:
        raise ValueError(f"option '{option.args[-1]}' has two values, which is not supported yet")
    if option.takes_value:
        return [option.args[-1], value]
    if not is_falsey(value):
        return [option.args[-1]]
    if option.args_neg:
        return [option.args_neg[-1]]
    return []


def all_options() -> tuple[LlamaOption, ...]:
    """Return every option of ``llama-server`` b11434 in declared order."""
    return builtin().options


@cache
def builtin() -> OptionTable:
    """Return the table of ``llama-server`` b11434, shipped with RouterPanel."""
    text = resources.files(PACKAGE).joinpath(TABLE_FILE).read_text(encoding="utf-8")
    table = json.loads(text)
    options = (_option(record) for record in table["options"])
    return OptionTable.of(options, f"llama-server {table['build']} (built in)")


def _option(record: dict[str, Any]) -> LlamaOption:
    return LlamaOption(
        args=tuple(record["args"]),
        args_neg=tuple(record["args_neg"]),
        env=record["env"],
        takes_value=bool(record["takes_value"]),
        takes_two_values=bool(record["takes_two_values"]),
        value_hint=record.get("value_hint"),
        handler=record.get("handler"),
    )


_INT = re.compile(r"[+-]?[0-9]+")
# Options whose value llama.cpp reads as text but takes as a number of layers, or auto/all.
LAYER_KEYS = frozenset({"n-gpu-layers", "n-gpu-layers-draft"})
AUTO = frozenset({"auto", "-1"})


def value_problem(option: LlamaOption, value: str) -> str | None:
    """Return why ``value`` is not a value of ``option`` (by its handler and value hint in
    llama-server's table), or None if it is one or the table says nothing checkable. An option
    of a table read from ``--help`` carries no handler: it is checked as b11434's option of the
    same name and shape, if there is one."""
    if option.handler is None:
        twin = builtin().lookup(option.key)
        if twin is None or twin[0].key != option.key or twin[0].takes_value != option.takes_value:
            return None
        option = twin[0]
    if not option.takes_value or option.takes_two_values or option.handler is None:
        return None
    hint, text = option.value_hint or "", value.strip()
    if option.key in LAYER_KEYS:
        if _INT.fullmatch(text) or text in ("auto", "all"):
            return None
        return "expects a number of layers, auto or all"
    if hint == "<0|1>":
        return None if text in ("0", "1") else "expects 0 or 1"
    if hint == "<0...100>":
        ok = _INT.fullmatch(text) and 0 <= int(text) <= 100
        return None if ok else "expects a whole number from 0 to 100"
    if hint.startswith("{") and hint.endswith("}") and "<" not in hint:
        choices = hint[1:-1].split(",")
        return None if text in choices else f"expects one of {', '.join(choices)}"
    if hint in ("[on|off|auto]", "[on|off]"):
        allowed = TRUTHY | FALSEY | (AUTO if "auto" in hint else frozenset())
        return None if text in allowed else f"expects {hint[1:-1].replace('|', ', ')}"
    if option.handler == "int":
        return None if _INT.fullmatch(text) else "expects a whole number"
    if option.handler == "string" and hint == "N":
        try:
            float(text)
        except ValueError:
            return "expects a number"
    return None


def _index(options: Iterable[LlamaOption]) -> dict[str, tuple[LlamaOption, bool]]:
    """Map every key to its option, later options overwriting earlier ones (get_map_key_opt)."""
    by_key: dict[str, tuple[LlamaOption, bool]] = {}
    for option in options:
        for env in (option.env, option.env_neg):
            if env is not None:
                by_key[env] = (option, False)
        for spelling in option.args:
            by_key[spelling.lstrip("-")] = (option, False)
        for spelling in option.args_neg:
            by_key[spelling.lstrip("-")] = (option, True)
    return by_key
