"""Generate routerpanel/router/llama_options.json: the options llama-server accepts.

Usage::

    python tools/gen_llama_options.py LLAMA_CPP_SOURCE_DIR [--output PATH] [--build LABEL]
                                      [--check-help PATH_TO_LLAMA_SERVER]

The table is read from ``common/arg.cpp`` of the given llama.cpp source tree. It holds exactly
the options that ``common_params_parser_init(params, LLAMA_EXAMPLE_SERVER, ...)`` keeps
(ROUTER_SPEC rule 11.10): an option is kept when its examples set (default
``{LLAMA_EXAMPLE_COMMON}``, replaced by ``set_examples``) contains ``LLAMA_EXAMPLE_SERVER`` or
``LLAMA_EXAMPLE_COMMON`` and its ``set_excludes`` set does not contain ``LLAMA_EXAMPLE_SERVER``.
``if (ex == LLAMA_EXAMPLE_...)`` branches around ``add_opt`` calls are evaluated for the server.

The C++ is read with a small scanner, not a compiler: comments and literals are masked first,
then calls are split on balanced brackets. Anything the scanner does not understand around an
``add_opt`` call (a loop, an unknown condition, an unknown setter, a constructor shape that does
not match its handler) stops the generator with an error instead of guessing.

``--check-help`` runs ``BINARY --help`` in a scrubbed environment and compares every help entry
with the table: spellings (both directions, and their order), env names and value hints. The
exit status is 1 when anything differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXAMPLE = "LLAMA_EXAMPLE_SERVER"
COMMON = "LLAMA_EXAMPLE_COMMON"
ARG_CPP = "common/arg.cpp"
ARG_H = "common/arg.h"
PARSER_FUNC = "common_params_parser_init"
PRESET_FUNC = "common_params_add_preset_options"
DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "routerpanel/router/llama_options.json"
ENV_NEG_RULE = (
    "For an option with negative spellings and an env name, the negative env name is the env "
    "name with every 'LLAMA_ARG_' replaced by 'LLAMA_ARG_NO_' (common_arg::get_env). An env "
    "name without 'LLAMA_ARG_' therefore maps to itself."
)

EXPR_PREFIX = "<expr> "
IDENT = re.compile(r"[A-Za-z_]\w*")
CALL_ADD_OPT = re.compile(r"\badd_opt\s*\(")
OPENERS = {"(": ")", "[": "]", "{": "}"}
CLOSERS = {")", "]", "}"}


class SourceError(Exception):
    """The C++ source has a shape this generator does not understand."""


# --------------------------------------------------------------------------------------------
# Masking: comments become spaces, literal contents become spaces (delimiters kept).
# --------------------------------------------------------------------------------------------


def mask_cpp(text: str) -> str:
    """Return ``text`` with comments and literal contents blanked, offsets unchanged."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        j = _skip_masked(text, i)
        if j == i:
            i += 1
            continue
        keep_quotes = text[i] in "\"'R"
        for k in range(i, j):
            if out[k] != "\n" and not (keep_quotes and k in (i, j - 1)):
                out[k] = " "
        i = j
    return "".join(out)


def _skip_masked(text: str, i: int) -> int:
    """Return the end of the comment or literal starting at ``i`` (``i`` when there is none)."""
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if text.startswith("/*", i):
        return text.index("*/", i + 2) + 2
    raw = re.compile(r'R"([^()\\ ]{0,16})\(').match(text, i)
    if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
        return text.index(")" + raw.group(1) + '"', raw.end()) + len(raw.group(1)) + 2
    if text[i] in "\"'" and not (text[i] == "'" and i > 0 and text[i - 1].isalnum()):
        j = i + 1
        while text[j] != text[i]:
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


# --------------------------------------------------------------------------------------------
# Scanning helpers over masked text
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Source:
    """One C++ file: original text for literals, masked text for structure."""

    text: str
    masked: str

    @classmethod
    def read(cls, path: Path) -> Source:
        text = path.read_text(encoding="utf-8")
        return cls(text, mask_cpp(text))

    def line_of(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def skip_ws(self, i: int) -> int:
        while i < len(self.masked) and self.masked[i].isspace():
            i += 1
        return i

    def match_close(self, i: int) -> int:
        """Return the index just past the bracket that closes the one at ``i``."""
        stack = [OPENERS[self.masked[i]]]
        j = i + 1
        while stack:
            c = self.masked[j]
            if c in OPENERS:
                stack.append(OPENERS[c])
            elif c in CLOSERS and c != stack.pop():
                raise SourceError(f"unbalanced {c!r} at line {self.line_of(j)}")
            j += 1
        return j

    def statement_end(self, i: int) -> int:
        """Return the index just past the ``;`` ending the statement that starts at ``i``."""
        start = i
        while i < len(self.masked) and self.masked[i] != ";":
            i = self.match_close(i) if self.masked[i] in OPENERS else i + 1
        if i >= len(self.masked):
            raise SourceError(f"statement without ';' at line {self.line_of(start)}")
        return i + 1

    def split_top(self, start: int, end: int) -> list[tuple[int, int]]:
        """Split ``[start, end)`` at commas outside brackets; return stripped spans."""
        spans: list[tuple[int, int]] = []
        i = piece = start
        while i < end:
            c = self.masked[i]
            if c in OPENERS:
                i = self.match_close(i)
                continue
            if c == ",":
                spans.append(self.strip(piece, i))
                piece = i + 1
            i += 1
        spans.append(self.strip(piece, end))
        return [s for s in spans if s[0] < s[1]]

    def strip(self, start: int, end: int) -> tuple[int, int]:
        while start < end and self.masked[start].isspace():
            start += 1
        while end > start and self.masked[end - 1].isspace():
            end -= 1
        return start, end

    def function_body(self, name: str) -> tuple[int, int]:
        """Return the span inside the braces of the definition of function ``name``."""
        for m in re.finditer(rf"\b{name}\s*\(", self.masked):
            after = self.skip_ws(self.match_close(m.end() - 1))
            if self.masked[after] == "{":
                return after + 1, self.match_close(after) - 1
        raise SourceError(f"definition of {name}() not found")


# --------------------------------------------------------------------------------------------
# Literals
# --------------------------------------------------------------------------------------------

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def string_literal(src: Source, start: int, end: int) -> str:
    """Evaluate ``[start, end)``: one or more adjacent plain string literals."""
    pieces: list[str] = []
    i = src.skip_ws(start)
    while i < end:
        if src.text[i] != '"':
            raise SourceError(f"expected a string literal at line {src.line_of(i)}")
        close = src.masked.index('"', i + 1)
        pieces.append(re.sub(r"\\(.)", lambda m: _ESCAPES[m.group(1)], src.text[i + 1 : close]))
        i = src.skip_ws(close + 1)
    if not pieces:
        raise SourceError(f"empty literal at line {src.line_of(start)}")
    return "".join(pieces)


def value_hint(src: Source, start: int, end: int) -> str | None:
    """Evaluate a value hint: a literal, ``nullptr``, or any other ``const char *`` expression.

    An expression (``common_speculative_all_types_str()``) is computed at run time and is never
    null, so it is stored as ``EXPR_PREFIX + expression``; it still means "takes a value".
    """
    word = " ".join(src.masked[start:end].split())
    if word in ("nullptr", "NULL"):
        return None
    if src.masked[start] == '"':
        return string_literal(src, start, end)
    return EXPR_PREFIX + word


def literal_list(src: Source, start: int, end: int) -> list[str]:
    """Evaluate ``{ "a", "b" }``."""
    if src.masked[start] != "{" or src.match_close(start) != end:
        raise SourceError(f"expected a braced list at line {src.line_of(start)}")
    return [string_literal(src, a, b) for a, b in src.split_top(start + 1, end - 1)]


def ident_list(src: Source, start: int, end: int, named: dict[str, list[str]]) -> list[str]:
    """Evaluate ``{ A, B }`` or the name of a static initializer list."""
    word = src.masked[start:end].strip()
    if word in named:
        return named[word]
    if src.masked[start] != "{":
        raise SourceError(f"unknown example list {word!r} at line {src.line_of(start)}")
    items = [src.masked[a:b] for a, b in src.split_top(start + 1, end - 1)]
    if not all(IDENT.fullmatch(item) for item in items):
        raise SourceError(f"unexpected example list at line {src.line_of(start)}")
    return items


def named_example_lists(src: Source) -> dict[str, list[str]]:
    """Find ``static std::initializer_list<enum llama_example> NAME = {...};``."""
    pattern = re.compile(
        r"std::initializer_list\s*<\s*(?:enum\s+)?llama_example\s*>\s*(\w+)\s*=\s*"
    )
    named: dict[str, list[str]] = {}
    for m in pattern.finditer(src.masked):
        named[m.group(1)] = ident_list(src, m.end(), src.match_close(m.end()), {})
    return named


def string_defines(*sources: Source) -> dict[str, str]:
    """Find ``#define NAME "literal"`` (used for the preset-only pseudo env names)."""
    found: dict[str, str] = {}
    for src in sources:
        for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+(\"[^\n]*\")", src.text, re.M):
            found[m.group(1)] = json.loads(m.group(2))
    return found


# --------------------------------------------------------------------------------------------
# One common_arg(...) expression with its setter chain
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Arg:
    """What the generator keeps of one ``common_arg``."""

    line: int
    args: list[str]
    args_neg: list[str]
    value_hint: str | None
    value_hint_2: str | None
    handler: str
    env: str | None = None
    examples: list[str] = dataclasses.field(default_factory=lambda: [COMMON])
    excludes: list[str] = dataclasses.field(default_factory=list)
    is_sampling: bool = False
    is_spec: bool = False
    is_preset_only: bool = False

    def kept_for(self, example: str) -> bool:
        """Apply add_opt's filter (inherit_common is true for every example but DOWNLOAD)."""
        wanted = example in self.examples or COMMON in self.examples
        return wanted and example not in self.excludes


# Constructor shapes of common_arg (arg.h): handler kind -> positional roles after `args`.
SHAPES = {
    "void": ("help",),
    "string": ("value_hint", "help"),
    "int": ("value_hint", "help"),
    "bool": ("args_neg", "help"),
    "str_str": ("value_hint", "value_hint_2", "help"),
}
PARAM = re.compile(r"(const\s+std::string\s*&|int|bool)(?:\s*\w+)?")
PARAM_KINDS = {"int": "int", "bool": "bool"}
HANDLERS = {(): "void", ("str",): "string", ("int",): "int", ("bool",): "bool"}
HANDLERS[("str", "str")] = "str_str"


def handler_kind(src: Source, start: int, end: int) -> str:
    """Classify the handler lambda at ``[start, end)`` by its parameter types."""
    if src.masked[start] != "[":
        raise SourceError(f"handler is not a lambda at line {src.line_of(start)}")
    params_at = src.skip_ws(src.match_close(start))
    params = src.split_top(params_at + 1, src.match_close(params_at) - 1)
    if not params or not src.masked[params[0][0] :].startswith("common_params"):
        raise SourceError(f"handler does not take common_params at line {src.line_of(start)}")
    kinds: list[str] = []
    for a, b in params[1:]:
        decl = PARAM.fullmatch(" ".join(src.masked[a:b].split()))
        if not decl:
            raise SourceError(f"unknown handler parameter at line {src.line_of(a)}")
        kinds.append(PARAM_KINDS.get(decl.group(1), "str"))
    if tuple(kinds) not in HANDLERS:
        raise SourceError(f"unknown handler signature at line {src.line_of(start)}")
    return HANDLERS[tuple(kinds)]


def parse_common_arg(src: Source, start: int, end: int, ctx: ParseContext) -> Arg:
    """Parse ``common_arg(...)[.set_xxx(...)]*`` spanning ``[start, end)``."""
    head = re.compile(r"common_arg\s*\(").match(src.masked, start)
    if not head:
        raise SourceError(f"expected common_arg(...) at line {src.line_of(start)}")
    close = src.match_close(head.end() - 1)
    arg = _constructor(src, head.end(), close - 1)
    i = src.skip_ws(close)
    while i < end:
        setter = re.compile(r"\.\s*(\w+)\s*\(").match(src.masked, i)
        if not setter:
            raise SourceError(f"unexpected text after common_arg at line {src.line_of(i)}")
        call_end = src.match_close(setter.end() - 1)
        _apply_setter(src, arg, setter.group(1), (setter.end(), call_end - 1), ctx)
        i = src.skip_ws(call_end)
    return arg


def _constructor(src: Source, start: int, end: int) -> Arg:
    spans = src.split_top(start, end)
    kind = handler_kind(src, *spans[-1])
    roles = SHAPES[kind]
    if len(spans) != len(roles) + 2:
        raise SourceError(f"common_arg shape does not match a {kind} handler: {src.line_of(start)}")
    fields: dict[str, Any] = {"args_neg": [], "value_hint": None, "value_hint_2": None}
    for role, span in zip(roles, spans[1:-1], strict=True):
        if role == "args_neg":
            fields[role] = literal_list(src, *span)
        elif role != "help":
            fields[role] = value_hint(src, *span)
    args = literal_list(src, *spans[0])
    return Arg(line=src.line_of(start), args=args, handler=kind, **fields)


def _apply_setter(
    src: Source, arg: Arg, name: str, span: tuple[int, int], ctx: ParseContext
) -> None:
    start, end = src.strip(*span)
    if name in ("set_sampling", "set_spec", "set_preset_only") and start == end:
        setattr(arg, "is_" + name.removeprefix("set_"), True)
    elif name == "set_env":
        word = src.masked[start:end].strip()
        env = ctx.defines.get(word) if IDENT.fullmatch(word) else string_literal(src, start, end)
        if env is None:
            raise SourceError(f"unknown env macro {word!r} at line {src.line_of(start)}")
        arg.env = env
    elif name in ("set_examples", "set_excludes"):
        # Both setters assign (they do not add), so a later call replaces an earlier one.
        items = ident_list(src, start, end, ctx.named)
        setattr(arg, name.removeprefix("set_"), items)
    else:
        raise SourceError(f"unknown setter .{name}() at line {src.line_of(start)}")


# --------------------------------------------------------------------------------------------
# Walking the body of common_params_parser_init
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ParseContext:
    """Values resolved once per source tree."""

    named: dict[str, list[str]]
    defines: dict[str, str]
    example: str = EXAMPLE


class BodyWalker:
    """Find the ``add_opt(...)`` calls that run for ``ctx.example``, in declared order."""

    def __init__(self, src: Source, ctx: ParseContext) -> None:
        self.src = src
        self.ctx = ctx
        self.calls: list[tuple[int, int]] = []

    def walk(self, start: int, end: int, active: bool) -> None:
        i = self.src.skip_ws(start)
        while i < end:
            word_m = IDENT.match(self.src.masked, i)
            word = word_m.group() if word_m else ""
            if word == "if":
                i = self._if_chain(i, active)
            elif word in ("for", "while", "switch"):
                paren = self.src.skip_ws(i + len(word))
                i = self._branch(self.src.match_close(paren), False, True)
            elif word in ("do", "else"):
                raise SourceError(f"unexpected '{word}' at line {self.src.line_of(i)}")
            elif word == "add_opt" and CALL_ADD_OPT.match(self.src.masked, i):
                i = self._add_opt(i, active)
            else:
                stop = self.src.statement_end(i)
                self._refuse_hidden_calls(i, stop)
                i = stop
            i = self.src.skip_ws(i)

    def _add_opt(self, i: int, active: bool) -> int:
        open_at = self.src.masked.index("(", i)
        close = self.src.match_close(open_at)
        if self.src.masked[self.src.skip_ws(close)] != ";":
            raise SourceError(f"add_opt(...) not a statement at line {self.src.line_of(i)}")
        if active:
            self.calls.append((self.src.skip_ws(open_at + 1), close - 1))
        return self.src.skip_ws(close) + 1

    def _if_chain(self, i: int, active: bool) -> int:
        taken = False
        while True:
            cond_at = self.src.skip_ws(i + 2)
            if self.src.masked[cond_at] != "(":
                raise SourceError(f"unexpected 'if' at line {self.src.line_of(i)}")
            cond_end = self.src.match_close(cond_at)
            value = self._condition(cond_at + 1, cond_end - 1)
            i = self._branch(cond_end, active and not taken and value is True, value is None)
            taken = taken or value is True
            after = self.src.skip_ws(i)
            if not re.compile(r"else\b").match(self.src.masked, after):
                return i
            nxt = self.src.skip_ws(after + 4)
            if not self.src.masked.startswith("if", nxt):
                return self._branch(after + 4, active and not taken, False)
            i = nxt

    def _branch(self, i: int, active: bool, unknown: bool) -> int:
        i = self.src.skip_ws(i)
        if self.src.masked[i] != "{":
            stop = self.src.statement_end(i)
            self._refuse_hidden_calls(i, stop)
            return stop
        end = self.src.match_close(i)
        if unknown:
            self._refuse_hidden_calls(i, end)
        else:
            self.walk(i + 1, end - 1, active)
        return end

    def _condition(self, start: int, end: int) -> bool | None:
        """Evaluate ``ex == X`` / ``ex != X`` joined by ``||``; None when it is anything else."""
        text = " ".join(self.src.masked[start:end].split())
        terms = [t.strip() for t in text.split("||")]
        results = []
        for term in terms:
            m = re.fullmatch(r"ex\s*(==|!=)\s*(LLAMA_EXAMPLE_\w+)", term)
            if not m:
                return None
            results.append((m.group(2) == self.ctx.example) == (m.group(1) == "=="))
        return any(results)

    def _refuse_hidden_calls(self, start: int, end: int) -> None:
        hidden = CALL_ADD_OPT.search(self.src.masked, start, end)
        if hidden:
            line = self.src.line_of(hidden.start())
            raise SourceError(f"add_opt() inside code this walker cannot follow, line {line}")


def server_options(src: Source, ctx: ParseContext) -> tuple[list[Arg], int]:
    """Return (options kept for the server in declared order, number of add_opt calls seen)."""
    start, end = src.function_body(PARSER_FUNC)
    directive = re.compile(r"^[ \t]*#", re.M).search(src.masked, start, end)
    if directive:
        raise SourceError(
            f"preprocessor directive in {PARSER_FUNC}: {src.line_of(directive.start())}"
        )
    walker = BodyWalker(src, ctx)
    walker.walk(start, end, True)
    total = len(CALL_ADD_OPT.findall(src.masked, start, end))
    parsed = [parse_common_arg(src, a, b, ctx) for a, b in walker.calls]
    return [arg for arg in parsed if arg.kept_for(ctx.example)], total


def preset_only_options(src: Source, ctx: ParseContext) -> list[Arg]:
    """Return the preset-only pseudo options of common_params_add_preset_options()."""
    start, end = src.function_body(PRESET_FUNC)
    found: list[Arg] = []
    for m in re.compile(r"\bargs\s*\.\s*push_back\s*\(").finditer(src.masked, start, end):
        close = src.match_close(m.end() - 1)
        found.append(parse_common_arg(src, *src.strip(m.end(), close - 1), ctx))
    return found


# --------------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------------


def env_neg(arg: Arg) -> str | None:
    """Derive the negative env name the way common_arg::get_env() does."""
    if arg.env is None or not arg.args_neg:
        return None
    return arg.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")


def validate(options: list[Arg]) -> None:
    """Refuse a table that the router's std::map<common_arg> could not hold."""
    firsts: dict[str, int] = {}
    for arg in options:
        if not arg.args:
            raise SourceError(f"option without spellings at line {arg.line}")
        if arg.args[0] in firsts:
            raise SourceError(f"two options share first spelling {arg.args[0]!r}")
        firsts[arg.args[0]] = arg.line
        if arg.handler == "bool" and not arg.args_neg:
            raise SourceError(f"bool option without negative spelling at line {arg.line}")


def key_collisions(options: list[Arg]) -> dict[str, list[str]]:
    """Return INI keys that name more than one option (later option wins, like get_map_key_opt)."""
    owners: dict[str, list[str]] = {}
    for arg in options:
        keys = [e for e in (arg.env, env_neg(arg)) if e] + [
            s.lstrip("-") for s in arg.args + arg.args_neg
        ]
        for key in dict.fromkeys(keys):
            owners.setdefault(key, []).append(arg.args[0])
    return {key: firsts for key, firsts in sorted(owners.items()) if len(firsts) > 1}


def option_record(index: int, order: int, arg: Arg) -> dict[str, Any]:
    return {
        "index": index,
        "order": order,
        "args": arg.args,
        "args_neg": arg.args_neg,
        "env": arg.env,
        "env_neg": env_neg(arg),
        "value_hint": arg.value_hint,
        "value_hint_2": arg.value_hint_2,
        "takes_value": arg.value_hint is not None,
        "takes_two_values": arg.value_hint is not None and arg.value_hint_2 is not None,
        "handler": arg.handler,
        "is_sampling": arg.is_sampling,
        "is_spec": arg.is_spec,
        "source_line": arg.line,
    }


def build_table(source_dir: Path, build: str) -> dict[str, Any]:
    """Read the source tree and return the JSON document."""
    arg_cpp = Source.read(source_dir / ARG_CPP)
    arg_h = Source.read(source_dir / ARG_H)
    ctx = ParseContext(named_example_lists(arg_cpp), string_defines(arg_h, arg_cpp))
    options, total = server_options(arg_cpp, ctx)
    validate(options)
    by_first = sorted(range(len(options)), key=lambda k: options[k].args[0].encode())
    order = {k: rank for rank, k in enumerate(by_first)}
    preset_only = preset_only_options(arg_cpp, ctx)
    return {
        "generator": "tools/gen_llama_options.py",
        "build": build,
        "source": {
            "file": ARG_CPP,
            "sha256": hashlib.sha256((source_dir / ARG_CPP).read_bytes()).hexdigest(),
            "function": f"{PARSER_FUNC}(params, {EXAMPLE}, ...)",
            "add_opt_calls": total,
        },
        "env_neg_rule": ENV_NEG_RULE,
        "order_rule": "'order' ranks options by their first spelling compared as bytes (11.16)",
        "count": len(options),
        "key_collisions": key_collisions(options),
        "options": [option_record(i, order[i], arg) for i, arg in enumerate(options)],
        "preset_only": [
            {"args": a.args, "env": a.env, "value_hint": a.value_hint} for a in preset_only
        ],
    }


def dump_table(table: dict[str, Any]) -> str:
    """Return the JSON text with one line per option, so a rebuild diffs line by line."""
    head = {k: v for k, v in table.items() if k not in ("options", "preset_only")}
    lines = json.dumps(head, indent=1).removesuffix("\n}") + ","
    for name in ("options", "preset_only"):
        rows = ",\n".join("  " + json.dumps(row) for row in table[name])
        lines += f'\n "{name}": [\n{rows}\n ],'
    return lines.rstrip(",") + "\n}\n"


def build_label(source_dir: Path) -> str:
    """Guess the build label from the sdist's PKG-INFO next to the tree ("b11434")."""
    pkg_info = source_dir.parent / "PKG-INFO"
    if pkg_info.is_file():
        m = re.search(r"^Version:\s*(\d+)", pkg_info.read_text(encoding="utf-8"), re.M)
        if m:
            return "b" + m.group(1)
    return "unknown"


# --------------------------------------------------------------------------------------------
# --check-help
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class HelpEntry:
    """One option as printed by ``llama-server --help``."""

    spellings: list[str]
    hint: str
    env: str | None


SPELLING = r"-{1,2}[A-Za-z0-9][^\s,]*"
HELP_HEAD = re.compile(rf"^({SPELLING}(?:,\s*{SPELLING})*)(?: (\S.*?))?(?:\s{{2,}}|$)")


def parse_help(text: str) -> list[HelpEntry]:
    """Parse the option entries of common_params_print_usage() output."""
    entries: list[HelpEntry] = []
    for line in text.splitlines():
        head = HELP_HEAD.match(line)
        if head:
            spellings = [s.strip() for s in head.group(1).split(",")]
            entries.append(HelpEntry(spellings, (head.group(2) or "").strip(), None))
        env = re.search(r"\(env: ([^)]+)\)", line)
        if env and entries:
            entries[-1].env = env.group(1)
    return entries


def run_help(binary: Path) -> str:
    """Run ``binary --help`` with no LLAMA_* variables and an empty config directory."""
    drop = ("LLAMA_", "HF_", "MTMD_", "XDG_CONFIG_HOME")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    with tempfile.TemporaryDirectory() as home:
        env.update(HOME=home, XDG_CONFIG_HOME=home)
        done = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, env=env, timeout=120
        )
    if done.returncode != 0:
        raise SystemExit(f"--help exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def compare_with_help(table: dict[str, Any], entries: list[HelpEntry]) -> list[str]:
    """Return human-readable differences between the table and the help entries."""
    problems: list[str] = []
    by_first = {opt["args"][0]: opt for opt in table["options"]}
    table_spellings = {s for opt in table["options"] for s in opt["args"] + opt["args_neg"]}
    help_spellings = {s for e in entries for s in e.spellings}
    for s in sorted(help_spellings - table_spellings):
        problems.append(f"in --help but not in the table: {s}")
    for s in sorted(table_spellings - help_spellings):
        problems.append(f"in the table but not in --help: {s}")
    for entry in entries:
        opt = by_first.get(entry.spellings[0])
        if opt is not None:
            problems.extend(_entry_problems(opt, entry))
    if len(entries) != len(table["options"]):
        problems.append(f"--help has {len(entries)} entries, the table {len(table['options'])}")
    return problems


def _entry_problems(opt: dict[str, Any], entry: HelpEntry) -> Iterator[str]:
    first = entry.spellings[0]
    if entry.spellings != opt["args"] + opt["args_neg"]:
        yield f"{first}: spellings {entry.spellings} != {opt['args'] + opt['args_neg']}"
    hints = [h for h in (opt["value_hint"], opt["value_hint_2"]) if h is not None]
    if any(h.startswith(EXPR_PREFIX) for h in hints):
        # Computed at run time (--spec-type): only require that some hint is printed.
        if not entry.hint:
            yield f"{first}: --help prints no value hint"
    elif entry.hint != " ".join(hints):
        yield f"{first}: value hint {entry.hint!r} != {' '.join(hints)!r}"
    if entry.env != opt["env"]:
        yield f"{first}: env {entry.env!r} != {opt['env']!r}"


def _spelling_count(table: dict[str, Any]) -> int:
    return sum(len(opt["args"]) + len(opt["args_neg"]) for opt in table["options"])


def check_help(table: dict[str, Any], binary: Path) -> int:
    """Print the cross-check summary; return the process exit status."""
    entries = parse_help(run_help(binary))
    problems = compare_with_help(table, entries)
    spellings = sum(len(e.spellings) for e in entries)
    envs = sum(1 for e in entries if e.env)
    print(f"--help: {len(entries)} entries, {spellings} spellings, {envs} env names")
    print(f"table:  {table['count']} options, {_spelling_count(table)} spellings")
    for problem in problems:
        print("  DIFF", problem)
    print("cross-check:", "OK" if not problems else f"{len(problems)} difference(s)")
    return 0 if not problems else 1


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source_dir", type=Path, help="llama.cpp source tree (has common/arg.cpp)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--build", help="build label stored in the table (default: from PKG-INFO)")
    parser.add_argument("--check-help", type=Path, metavar="PATH_TO_BINARY")
    ns = parser.parse_args(argv)
    try:
        table = build_table(ns.source_dir, ns.build or build_label(ns.source_dir))
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ns.output.write_text(dump_table(table), encoding="utf-8")
    print(f"wrote {table['count']} options ({table['source']['add_opt_calls']} add_opt calls)")
    for key, firsts in table["key_collisions"].items():
        print(f"  shared key {key}: {', '.join(firsts)} (the last one wins)")
    return check_help(table, ns.check_help) if ns.check_help else 0


if __name__ == "__main__":
    sys.exit(main())
