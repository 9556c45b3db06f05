"""Read the options a server program accepts from the text its ``--help`` prints.

A preset's keys are checked against the program that will run it (ROUTER_SPEC 11.10 checks them
against the router's own ``llama-server``, which is also the child's), so a newer build or a
fork can be given the options it knows. Pure: the caller runs the program and passes its output
(``models_app.presets.server_options`` does, cached by path and mtime).

Understood: llama.cpp's ``common_params_print_usage`` layout, one entry per option starting in
column 0 (``-c,    --ctx-size N   text``, ``(env: LLAMA_ARG_CTX_SIZE)`` somewhere in its
description), and the same layout indented by up to four spaces (argparse-like programs such as
the simulated server). Description lines are indented further and never start an entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from routerpanel.router.options import LlamaOption, OptionTable

_SPELLING = r"-{1,2}[A-Za-z0-9][^\s,]*"
# Spellings, then an optional value hint, then two blanks (the description) or the line's end.
_ENTRY = re.compile(rf"^ {{0,4}}({_SPELLING}(?:,\s*{_SPELLING})*)(?: (\S.*?))?(?:\s{{2,}}|$)")
_ENV = re.compile(r"\(env: ([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class _Entry:
    spellings: list[str]
    hint: str
    env: str | None = None


def parse_help(text: str, origin: str) -> OptionTable | None:
    """Return the options listed in ``text``, or None when it lists none (not a help text)."""
    entries: list[_Entry] = []
    for line in text.splitlines():
        head = _ENTRY.match(line)
        if head:
            spellings = [s.strip() for s in head.group(1).split(",")]
            entries.append(_Entry(spellings, (head.group(2) or "").strip()))
        env = _ENV.search(line)
        if env and entries and entries[-1].env is None:
            entries[-1].env = env.group(1)
    if not entries:
        return None
    return OptionTable.of((_option(entry) for entry in entries), origin)


def _option(entry: _Entry) -> LlamaOption:
    args, args_neg = split_negatives(entry.spellings)
    hints = entry.hint.split()
    return LlamaOption(
        args=tuple(args),
        args_neg=tuple(args_neg),
        env=entry.env,
        takes_value=bool(hints),
        takes_two_values=len(hints) == 2,
    )


def split_negatives(spellings: list[str]) -> tuple[list[str], list[str]]:
    """Split an entry's spellings into positive and negative ones.

    llama.cpp prints an option's negative spellings after its positive ones
    (``-kvo, --kv-offload, -nkvo, --no-kv-offload``). The negatives start after the last long
    spelling ``--x`` whose ``--no-x`` is also listed; an entry with no such pair has none
    (``--no-host`` alone is a positive flag).
    """
    listed = set(spellings)
    last_positive = -1
    for index, spelling in enumerate(spellings):
        if spelling.startswith("--") and f"--no-{spelling[2:]}" in listed:
            last_positive = index
    if last_positive < 0:
        return list(spellings), []
    return spellings[: last_positive + 1], spellings[last_positive + 1 :]
