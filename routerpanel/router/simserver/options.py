"""Parse llama-server's command line: the flags the simulation knows, the --help text, and the
unknown flags it only warns about.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CRASH_EXIT_CODE = 3


class UsageError(Exception):
    """The command line cannot be used; main() prints it and exits 1 like llama-server."""


class HelpRequested(Exception):
    """-h or --help was given."""


@dataclass(frozen=True)
class SimOptions:
    """Everything the command line sets. Defaults match llama-server where it has the flag."""

    host: str = "127.0.0.1"
    port: int = 8080
    model: str = ""
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    ctx_size: int = 4096
    parallel: int = 4
    sleep_idle_seconds: int = -1
    metrics: bool = False
    props: bool = False
    slots: bool = True
    embeddings: bool = False
    api_keys: tuple[str, ...] = ()
    load_ms: int = 0
    rss_mb: int = 0
    token_ms: int = 0
    prefill_ms: int = 0
    flood: bool = False
    tokens: int = 16
    ignore_sigterm: bool = False
    crash_after: int = 0
    fail_load: bool = False
    tag: str = ""
    ignored: tuple[str, ...] = ()

    @property
    def model_id(self) -> str:
        """Name the model as llama-server does: first alias (sorted), else the file name."""
        if self.aliases:
            return self.aliases[0]
        return os.path.basename(self.model.rstrip("/")) or "simulated-model"


@dataclass(frozen=True)
class Flag:
    """One known flag; ``convert`` None makes it a switch that stores ``const``."""

    names: tuple[str, ...]
    dest: str
    help: str
    convert: Callable[[str], Any] | None = None
    const: bool = True
    many: bool = False  # comma-separated and repeatable, kept as a sorted set (--alias, --tags)


def _int_at_least(low: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(f"must be >= {low}")
        return value

    return convert


def _key_file(path: str) -> tuple[str, ...]:
    """llama-server's --api-key-file: one key a line, read at parse time; empty lines and lines
    starting with ``#`` are skipped (ROUTER_SPEC 9.1)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = [line.rstrip("\r\n") for line in file]
    except OSError:
        raise ValueError(f"error: failed to open file '{path}'") from None
    return tuple(line for line in lines if line and not line.startswith("#"))


def _idle_seconds(text: str) -> int:
    value = int(text)
    if value == 0 or value < -1:
        raise ValueError("invalid value: cannot be 0 or less than -1")  # llama.cpp's wording
    return value


FLAGS: tuple[Flag, ...] = (
    Flag(("--host",), "host", "address to listen on (default 127.0.0.1)", str),
    Flag(
        ("--port",),
        "port",
        "port to listen on; 0 picks a free one (default 8080)",
        _int_at_least(0),
    ),
    Flag(("-m", "--model"), "model", "model path; never read, its file name is the model id", str),
    Flag(
        ("-a", "--alias"),
        "aliases",
        "aliases, comma-separated; the first sorted is the id",
        str,
        many=True,
    ),
    Flag(("--tags",), "tags", "informational tags, comma-separated", str, many=True),
    Flag(
        ("-c", "--ctx-size"),
        "ctx_size",
        "context size shown in /props and /slots (4096)",
        _int_at_least(0),
    ),
    Flag(
        ("-np", "--parallel"),
        "parallel",
        "slots: concurrent requests, more wait (4)",
        _int_at_least(-1),
    ),
    Flag(
        ("--sleep-idle-seconds",),
        "sleep_idle_seconds",
        "sleep after N idle seconds; -1 never",
        _idle_seconds,
    ),
    Flag(("--metrics",), "metrics", "enable GET /metrics (off, as in llama-server)"),
    Flag(("--props",), "props", "enable POST /props"),
    Flag(("--slots",), "slots", "enable GET /slots (the default)"),
    Flag(("--no-slots",), "slots", "disable GET /slots", const=False),
    Flag(("--embedding", "--embeddings"), "embeddings", "enable the embeddings routes"),
    Flag(
        ("--api-key",), "api_keys", "API keys, comma-separated (else LLAMA_API_KEY)", str, many=True
    ),
    Flag(("--api-key-file",), "api_keys", "a file of API keys, one a line", _key_file, many=True),
    Flag(("--sim-load-ms",), "load_ms", "time spent loading, 0 = instant (0)", _int_at_least(0)),
    Flag(
        ("--sim-rss-mb",),
        "rss_mb",
        "hold this much real resident memory while loaded (0)",
        _int_at_least(0),
    ),
    Flag(("--sim-token-ms",), "token_ms", "delay per generated token (0)", _int_at_least(0)),
    Flag(
        ("--sim-prefill-ms",),
        "prefill_ms",
        "prompt processing per completion: /slots counters move, nothing is sent (0)",
        _int_at_least(0),
    ),
    Flag(("--sim-flood",), "flood", "once ready, write log lines to stderr without pause"),
    Flag(
        ("--sim-tokens",),
        "tokens",
        "tokens per completion before the simulated EOS (16)",
        _int_at_least(0),
    ),
    Flag(("--sim-ignore-sigterm",), "ignore_sigterm", "log and ignore SIGTERM and SIGINT"),
    Flag(
        ("--sim-crash-after",),
        "crash_after",
        f"exit {CRASH_EXIT_CODE} after N completions",
        _int_at_least(0),
    ),
    Flag(("--sim-fail-load",), "fail_load", "fail halfway through loading and exit 1"),
    Flag(("--sim-tag",), "tag", "a label, otherwise unused: tells children apart in ps", str),
)
FLAGS_BY_NAME = {name: flag for flag in FLAGS for name in flag.names}


def usage() -> str:
    """Return the --help text."""
    lines = ["usage: python -m routerpanel.router.simserver [flags]", ""]
    lines.append("A simulated llama-server. Unknown llama-server flags are ignored with a warning.")
    lines.append("")
    for flag in FLAGS:
        names = ", ".join(flag.names) + ("" if flag.convert is None else " VALUE")
        lines.append(f"  {names:<30} {flag.help}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> SimOptions:
    """Parse llama-server style flags; collect unknown ones in ``ignored`` instead of refusing."""
    values: dict[str, Any] = {}
    ignored: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        if args[i] in ("-h", "--help"):
            raise HelpRequested
        name, sep, inline = (
            args[i].partition("=") if args[i].startswith("--") else (args[i], "", "")
        )
        flag = FLAGS_BY_NAME.get(name)
        if flag is None:
            i = _skip_unknown(args, i, bool(sep), ignored)
        elif flag.convert is None:
            values[flag.dest] = flag.const
            i += 1
        else:
            if not sep and i + 1 >= len(args):
                raise UsageError(f'error while handling argument "{name}": expected a value')
            raw = inline if sep else args[i + 1]
            i += 1 if sep else 2
            _store(values, flag, name, raw)
    for dest in ("aliases", "tags", "api_keys"):
        values[dest] = tuple(sorted(set(values.get(dest, []))))
    if not values["api_keys"] and environ.get("LLAMA_API_KEY"):
        values["api_keys"] = tuple(
            k.strip() for k in environ["LLAMA_API_KEY"].split(",") if k.strip()
        )
    return SimOptions(**values, ignored=tuple(ignored))


def _store(values: dict[str, Any], flag: Flag, name: str, raw: str) -> None:
    assert flag.convert is not None
    try:
        value = flag.convert(raw)
    except ValueError as exc:
        raise UsageError(f'error while handling argument "{name}": {exc}') from None
    if flag.many and isinstance(value, tuple):  # already a list (a key file's lines)
        values.setdefault(flag.dest, []).extend(value)
    elif flag.many:
        values.setdefault(flag.dest, []).extend(p.strip() for p in value.split(",") if p.strip())
    else:
        values[flag.dest] = value


def _skip_unknown(args: list[str], i: int, has_inline: bool, ignored: list[str]) -> int:
    """Record the unknown flag at ``args[i]`` and the value it takes; return the next index.

    The router renders preset keys as ``--key value`` (ROUTER_SPEC 11.16), so a following token
    that is neither ``--something`` nor a known flag is taken as the unknown flag's value.
    """
    end = i + 1
    takes_value = args[i].startswith("-") and not has_inline and end < len(args)
    if takes_value and not args[end].startswith("--") and args[end] not in FLAGS_BY_NAME:
        end += 1
    ignored.append(" ".join(args[i:end]))
    return end
