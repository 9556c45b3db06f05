"""Simulate llama.cpp's llama-server for demos and tests (standard library only).

``python -m routerpanel.router.simserver -m demo.gguf --port 8081 --sim-load-ms 2000`` listens at
once, answers 503 ``Loading model`` while it "loads", then serves llama-server's routes in
llama-server's response shapes (build b11434). Nothing here is a model: generated text cycles
through the words of "simulated response from <model id>", and a token is one UTF-8 byte, so
/tokenize and /detokenize round-trip exactly.

It is the fake upstream with misbehaviour switches of STYLE item 10: ``--sim-load-ms``,
``--sim-rss-mb`` (real resident memory), ``--sim-token-ms``, ``--sim-tokens``,
``--sim-ignore-sigterm``, ``--sim-crash-after`` and ``--sim-fail-load``. With
``LLAMA_SERVER_ROUTER_PORT`` set it speaks the child protocol of ROUTER_SPEC §4 (state lines on the
real stdout, every log line on stderr, exit command or EOF on stdin) and it sleeps as in §13.

Threads: the HTTP server runs one daemon thread per connection. The main thread loads the model
and then waits for an exit request (signal or exit command). ``SimModel`` owns the
load/sleep/wake state behind one condition variable; ``SlotPool`` and ``Stats`` guard their own
counters. Nothing else is shared.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import mmap
import os
import random
import signal
import socket
import socketserver
import string
import struct
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import Enum
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, NoReturn, TextIO
from urllib.parse import parse_qsl, urlsplit

log = logging.getLogger("simserver")

JSON = dict[str, Any]

BUILD_INFO = "b11434-simserver"
ROUTER_PORT_ENV = "LLAMA_SERVER_ROUTER_PORT"
STATE_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = b"cmd_router_to_child:exit"
JSON_TYPE = "application/json; charset=utf-8"
MIB = 1 << 20
CRASH_EXIT_CODE = 3
FAIL_LOAD_AT = 0.5  # --sim-fail-load gives up halfway through the simulated load
LOAD_STEP_S = 0.05
PROGRESS_EVERY_S = 0.2  # llama.cpp throttles loading progress to one line per 200 ms (§4.9)
KEEP_ALIVE_S = 5.0  # cpp-httplib closes an idle keep-alive connection after 5 s ...
KEEP_ALIVE_MAX = 100  # ... or after 100 requests
IO_TIMEOUT_S = 600.0  # llama-server's --timeout default for reads and writes
PROMPT_MS_PER_TOKEN = 0.05
N_EMBD = 64  # one SHA-512 digest, one byte per dimension
FTYPE = "simulated"
CHAT_TEMPLATE = "{# simulated chat template: <|role|>content per message #}"
GENERATION_SETTINGS: JSON = {
    "seed": 4294967295,
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "max_tokens": -1,
    "n_predict": -1,
    "stream": False,
}


def compact(value: Any) -> str:
    """Serialise like llama.cpp: compact separators, UTF-8 kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --- command line ------------------------------------------------------------------------------


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
    tokens: int = 16
    ignore_sigterm: bool = False
    crash_after: int = 0
    fail_load: bool = False
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
    Flag(("--sim-load-ms",), "load_ms", "time spent loading, 0 = instant (0)", _int_at_least(0)),
    Flag(
        ("--sim-rss-mb",),
        "rss_mb",
        "hold this much real resident memory while loaded (0)",
        _int_at_least(0),
    ),
    Flag(("--sim-token-ms",), "token_ms", "delay per generated token (0)", _int_at_least(0)),
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
    if flag.many:
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


# --- tokens, text and vectors --------------------------------------------------------------------

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL_PIECES = {UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
N_SPECIAL = len(SPECIAL_PIECES)
N_VOCAB = N_SPECIAL + 256


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


def tokenize(text: str, add_special: bool = False) -> list[int]:
    """Tokenize as one token per UTF-8 byte (ids 3..258), after BOS if ``add_special``."""
    ids = [N_SPECIAL + byte for byte in text.encode("utf-8", "replace")]
    return [BOS_ID, *ids] if add_special else ids


def token_bytes(token: int) -> bytes:
    """Return the bytes of one token; special tokens render as their text, like llama.cpp."""
    if N_SPECIAL <= token < N_VOCAB:
        return bytes([token - N_SPECIAL])
    if token in SPECIAL_PIECES:
        return SPECIAL_PIECES[token].encode()
    raise ApiError(400, f"token id {token} is out of range [0, {N_VOCAB})")


def detokenize(tokens: Sequence[int]) -> str:
    """Invert tokenize(); bytes that are not valid UTF-8 become U+FFFD."""
    return b"".join(token_bytes(t) for t in tokens).decode("utf-8", "replace")


def tokenize_mixed(content: Any, add_special: bool) -> list[int]:
    """Tokenize a string, or a list mixing strings and token ids (llama.cpp's tokenize_mixed)."""
    if isinstance(content, str):
        return tokenize(content, add_special)
    if not isinstance(content, list):
        raise ApiError(400, '"content" must be a string or an array of strings and token ids')
    tokens = [BOS_ID] if add_special else []
    for item in content:
        if isinstance(item, str):
            tokens.extend(tokenize(item))
        elif isinstance(item, int) and not isinstance(item, bool):
            tokens.append(item)
        else:
            raise ApiError(400, '"content" must be a string or an array of strings and token ids')
    return tokens


def token_ids(value: Any) -> list[int]:
    """Return ``value`` as a list of token ids, or refuse it with a 400."""
    if isinstance(value, list) and all(type(t) is int for t in value):
        return list(value)
    raise ApiError(400, "[json.exception.type_error.302] type must be an array of numbers")


def sim_piece(model_id: str, index: int) -> str:
    """Return generated token ``index``: the words of "simulated response from <id>", cycling."""
    words = f"simulated response from {model_id}".split()
    word = words[index % len(words)]
    return word if index == 0 else " " + word


def embed(text: str) -> list[float]:
    """Return a deterministic L2-normalised vector for ``text``: a hash, not a meaning."""
    raw = [byte - 127.5 for byte in hashlib.sha512(text.encode("utf-8", "replace")).digest()]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [round(v / norm, 6) for v in raw]


def piece_json(token: int) -> Any:
    """Return a token's piece as text, or as its byte values when it is not valid UTF-8."""
    data = token_bytes(token)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


# --- the child protocol and the simulated weights ------------------------------------------------


class Reporter:
    """Write child-protocol state lines (ROUTER_SPEC §4.B) to the reserved stdout, or nowhere."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> Reporter:
        """Reserve stdout for state lines when started by a router, as llama-server does."""
        if ROUTER_PORT_ENV not in os.environ:
            return cls(None)
        sys.stdout.flush()
        reserved = os.dup(1)  # not inherited (PEP 446), like llama.cpp's F_DUPFD_CLOEXEC
        os.dup2(2, 1)  # from now on anything printed to stdout lands on stderr
        return cls(os.fdopen(reserved, "w", encoding="utf-8", errors="replace"))

    @property
    def is_child(self) -> bool:
        return self._out is not None

    def send(self, state: str, payload: JSON) -> None:
        """Write one compact, flushed ``cmd_child_to_router:state:{...}`` line."""
        if self._out is None:
            return
        line = STATE_PREFIX + compact({"state": state, "payload": payload}) + "\n"
        with self._lock:
            try:
                self._out.write(line)
                self._out.flush()
            except OSError:  # the router is gone; stdin EOF will end us
                pass

    def progress(self, value: float) -> None:
        """Send one ``loading`` line for the text model."""
        payload = {"stages": ["text_model"], "current": "text_model", "value": value}
        self.send("loading", payload)


class Weights:
    """Hold real resident memory standing in for model weights (--sim-rss-mb).

    Anonymous mmaps, every page written, so the memory shows up in RSS and returns to the OS
    when released. Used by one thread at a time: SimModel's states serialise load, sleep and wake.
    """

    CHUNK = 8 * MIB

    def __init__(self, total_bytes: int) -> None:
        self._total = total_bytes
        self._chunks: list[mmap.mmap] = []
        self._held = 0

    def grow_to(self, fraction: float) -> None:
        target = int(self._total * min(fraction, 1.0))
        while self._held < target:
            size = min(self.CHUNK, self._total - self._held)
            chunk = mmap.mmap(-1, size)
            chunk[:: mmap.PAGESIZE] = b"\x01" * len(range(0, size, mmap.PAGESIZE))
            self._chunks.append(chunk)
            self._held += size

    def release(self) -> None:
        for chunk in self._chunks:
            chunk.close()
        self._chunks.clear()
        self._held = 0


class LoadFailed(Exception):
    """--sim-fail-load: the simulated model file cannot be loaded."""


class State(Enum):
    LOADING = "loading"  # first load; HTTP answers 503
    READY = "ready"
    SLEEPING = "sleeping"
    WAKING = "waking"  # reloading after sleep; requests that need the model wait


class SimModel:
    """Own the simulated weights and the load → ready ⇄ sleeping cycle (ROUTER_SPEC §13).

    All state sits behind one condition variable. ``busy()`` wraps each request that needs the
    model: it wakes a sleeping model first (blocking the caller meanwhile), and while any such
    request is in flight the idle clock does not run.
    """

    def __init__(self, opts: SimOptions, reporter: Reporter, stopping: threading.Event) -> None:
        self._opts = opts
        self._reporter = reporter
        self._stopping = stopping
        self._weights = Weights(opts.rss_mb * MIB)
        self._cond = threading.Condition()
        self._state = State.LOADING
        self._in_flight = 0
        self._last_active = time.monotonic()

    @property
    def loaded(self) -> bool:
        """True once the first load finished, sleeping included (llama-server's is_ready)."""
        return self._state is not State.LOADING

    @property
    def sleeping(self) -> bool:
        return self._state in (State.SLEEPING, State.WAKING)

    def load(self) -> bool:
        """Run the first load on the calling thread; False if an exit was requested meanwhile.

        Raises LoadFailed with --sim-fail-load.
        """
        if not self._run_load(self._opts.fail_load):
            return False
        with self._cond:
            self._state = State.READY
            self._last_active = time.monotonic()
            self._cond.notify_all()
        return True

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Hold the model awake for one request, waking it first if it sleeps."""
        if self._enter():
            self._wake()
        try:
            yield
        finally:
            with self._cond:
                self._in_flight -= 1
                self._last_active = time.monotonic()
                self._cond.notify_all()

    def watch_idle(self, idle_s: float) -> None:
        """Put the model to sleep after ``idle_s`` seconds without requests (own thread)."""
        with self._cond:
            while not self._stopping.is_set():
                if self._state is not State.READY or self._in_flight:
                    self._cond.wait()
                    continue
                remaining = self._last_active + idle_s - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                # ready -> sleeping: tell the router first, then free (llama.cpp's order, §13.2)
                self._state = State.SLEEPING
                self._reporter.send("sleeping", {})
                self._weights.release()
                log.info("server is entering sleeping state")

    def _enter(self) -> bool:
        """Count one request in; return True if this caller must wake the model."""
        with self._cond:
            while self._state is State.WAKING:
                self._cond.wait()
            self._in_flight += 1
            if self._state is not State.SLEEPING:
                return False
            self._state = State.WAKING
            return True

    def _wake(self) -> None:
        log.info("server is exiting sleeping state")
        self._run_load(fail=False)
        self._reporter.send("ready", {})  # payload {} after a wake-up (ROUTER_SPEC 4.9)
        with self._cond:
            self._state = State.READY
            self._cond.notify_all()

    def _run_load(self, fail: bool) -> bool:
        """Grow the weights over --sim-load-ms with throttled progress; False if told to stop."""
        duration = self._opts.load_ms / 1000
        started = last_report = time.monotonic()
        self._reporter.progress(0.0)
        while True:
            elapsed = time.monotonic() - started
            fraction = 1.0 if duration <= 0 else min(elapsed / duration, 1.0)
            if fail and fraction >= FAIL_LOAD_AT:
                raise LoadFailed(f"failed to load model, '{self._opts.model}'")
            self._weights.grow_to(fraction)
            if fraction >= 1.0:
                break
            if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                self._reporter.progress(round(fraction, 3))
                last_report = time.monotonic()
            if self._stopping.wait(min(LOAD_STEP_S, duration - elapsed)):
                return False
        self._reporter.progress(1.0)
        return True


class SlotPool:
    """Hand out llama.cpp's parallel slots; a request waits (is deferred) while all are busy."""

    def __init__(self, count: int, n_ctx: int) -> None:
        self._cond = threading.Condition()
        self._busy = [False] * count
        self._deferred = 0
        self._n_ctx = n_ctx

    @property
    def count(self) -> int:
        return len(self._busy)

    @contextmanager
    def hold(self) -> Iterator[int]:
        with self._cond:
            self._deferred += 1
            while all(self._busy):
                self._cond.wait()
            self._deferred -= 1
            slot = self._busy.index(False)
            self._busy[slot] = True
        try:
            yield slot
        finally:
            with self._cond:
                self._busy[slot] = False
                self._cond.notify()

    def counts(self) -> tuple[int, int]:
        """Return (processing, deferred)."""
        with self._cond:
            return sum(self._busy), self._deferred

    def to_json(self) -> list[JSON]:
        with self._cond:
            busy = list(self._busy)
        return [
            {"id": i, "n_ctx": self._n_ctx, "speculative": False, "is_processing": b}
            for i, b in enumerate(busy)
        ]


# --- completions ---------------------------------------------------------------------------------


class Style(Enum):
    NATIVE = "native"  # /completion: llama.cpp's own shape, streams end without [DONE]
    TEXT = "text"  # /v1/completions
    CHAT = "chat"  # /v1/chat/completions


@dataclass(frozen=True)
class Plan:
    """What one completion request will produce, decided before generating."""

    style: Style
    stream: bool
    prompt: str
    prompt_n: int
    n_predict: int  # tokens to generate
    limited: bool  # stopped by the request's n_predict rather than by the simulated EOS
    include_usage: bool
    id: str
    created: int
    model: str


@dataclass(frozen=True)
class Run:
    """One finished generation."""

    plan: Plan
    slot: int
    text: str
    n_generated: int
    predicted_ms: float

    @property
    def finish_reason(self) -> str:
        return "length" if self.plan.limited else "stop"

    def usage(self) -> JSON:
        prompt_n, n = self.plan.prompt_n, self.n_generated
        return {
            "completion_tokens": n,
            "prompt_tokens": prompt_n,
            "total_tokens": n + prompt_n,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    def timings(self) -> JSON:
        prompt_n, prompt_ms = self.plan.prompt_n, self.plan.prompt_n * PROMPT_MS_PER_TOKEN
        n, ms = self.n_generated, self.predicted_ms
        return {
            "cache_n": 0,
            "prompt_n": prompt_n,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
            "prompt_per_second": round(1000 * prompt_n / prompt_ms, 3) if prompt_ms else 0.0,
            "predicted_n": n,
            "predicted_ms": round(ms, 3),
            "predicted_per_token_ms": round(ms / n, 3) if n else 0.0,
            "predicted_per_second": round(1000 * n / ms, 3) if ms > 0 else 0.0,
        }


def make_plan(style: Style, body: JSON, model_id: str, sim_tokens: int) -> Plan:
    """Validate a completion request body and decide what it will produce."""
    prompt = chat_prompt(body) if style is Style.CHAT else completion_prompt(body)
    requested = requested_tokens(body)
    options = body.get("stream_options")
    return Plan(
        style=style,
        stream=body.get("stream") is True,
        prompt=prompt,
        prompt_n=len(tokenize(prompt, add_special=True)),
        n_predict=sim_tokens if requested < 0 else min(requested, sim_tokens),
        limited=0 <= requested < sim_tokens,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        id="chatcmpl-" + "".join(random.choices(string.ascii_letters + string.digits, k=32)),
        created=int(time.time()),
        model=model_id,
    )


def requested_tokens(body: JSON) -> int:
    """Return n_predict (or its aliases max_tokens, max_completion_tokens); -1 if absent."""
    for key in ("n_predict", "max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if type(value) is not int or value < -1:
            raise ApiError(400, f'"{key}" must be an integer >= -1')
        return value
    return -1


def completion_prompt(body: JSON) -> str:
    if "prompt" not in body:
        raise ApiError(400, "[json.exception.out_of_range.403] key 'prompt' not found")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(type(t) is int for t in prompt):
        return detokenize(prompt)
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)  # llama.cpp would answer one result per prompt; one is enough here
    raise ApiError(400, '"prompt" must be a string, an array of strings or of token ids')


def chat_prompt(body: JSON) -> str:
    """Render the messages with a simulated template (``<|role|>content`` each)."""
    if "messages" not in body:
        raise ApiError(400, "'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise ApiError(400, "Expected 'messages' to be an array")
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            raise ApiError(400, "Expected 'messages' to be an array of objects")
        parts.append(f"<|{message.get('role', '')}|>{message_text(message.get('content'))}\n")
    return "".join(parts) + "<|assistant|>"


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
    return ""


def _oai_chunk(plan: Plan, obj: str) -> JSON:
    return {
        "created": plan.created,
        "id": plan.id,
        "model": plan.model,
        "system_fingerprint": BUILD_INFO,
        "object": obj,
    }


def chat_chunk(plan: Plan, delta: JSON, finish_reason: str | None = None) -> JSON:
    choice = {"finish_reason": finish_reason, "index": 0, "delta": delta}
    return {"choices": [choice], **_oai_chunk(plan, "chat.completion.chunk")}


def text_result(plan: Plan, text: str, finish_reason: str | None) -> JSON:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    return {
        "choices": [choice],
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": BUILD_INFO,
        "object": "text_completion",
        "id": plan.id,
    }


def partial_events(plan: Plan, slot: int, piece: str, n_decoded: int) -> list[JSON]:
    """Return the stream events for one generated token, in llama-server's shapes."""
    if plan.style is Style.NATIVE:
        return [
            {
                "index": 0,
                "content": piece,
                "tokens": [],
                "stop": False,
                "id_slot": slot,
                "tokens_predicted": n_decoded,
                "tokens_evaluated": plan.prompt_n,
            }
        ]
    if plan.style is Style.TEXT:
        return [text_result(plan, piece, None)]
    first = [chat_chunk(plan, {"role": "assistant", "content": None})] if n_decoded == 1 else []
    return [*first, chat_chunk(plan, {"content": piece})]


def native_result(run: Run, content: str) -> JSON:
    plan = run.plan
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": run.slot,
        "stop": True,
        "model": plan.model,
        "tokens_predicted": run.n_generated,
        "tokens_evaluated": plan.prompt_n,
        "generation_settings": {**GENERATION_SETTINGS, "n_predict": plan.n_predict},
        "prompt": plan.prompt,
        "has_new_line": "\n" in run.text,
        "truncated": False,
        "stop_type": "limit" if plan.limited else "eos",
        "stopping_word": "",
        "tokens_cached": plan.prompt_n + run.n_generated,
        "timings": run.timings(),
    }


def final_events(run: Run) -> list[JSON]:
    """Return the events that close a stream (usage and timings go on the last)."""
    plan = run.plan
    if plan.style is Style.NATIVE:
        return [native_result(run, "")]
    if plan.style is Style.TEXT:
        result = text_result(plan, "", run.finish_reason)
        return [{**result, "usage": run.usage(), "timings": run.timings()}]
    events = [chat_chunk(plan, {}, run.finish_reason)]
    if plan.include_usage:  # OpenAI: the usage chunk has empty choices
        events.append({"choices": [], **_oai_chunk(plan, "chat.completion.chunk")})
        events[-1]["usage"] = run.usage()
    events[-1]["timings"] = run.timings()
    return events


def final_result(run: Run) -> JSON:
    """Return the body of a non-streamed completion."""
    plan = run.plan
    if plan.style is Style.NATIVE:
        return native_result(run, run.text)
    if plan.style is Style.TEXT:
        return {
            **text_result(plan, run.text, run.finish_reason),
            "usage": run.usage(),
            "timings": run.timings(),
        }
    message = {"role": "assistant", "content": run.text}
    choice = {"finish_reason": run.finish_reason, "index": 0, "message": message}
    return {
        "choices": [choice],
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": BUILD_INFO,
        "object": "chat.completion",
        "usage": run.usage(),
        "id": plan.id,
        "timings": run.timings(),
    }


def sse(events: Sequence[JSON]) -> bytes:
    return "".join(f"data: {compact(event)}\n\n" for event in events).encode()


# --- metrics -------------------------------------------------------------------------------------


class Stats:
    """Count what /metrics reports, under llama.cpp's metric names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = int(time.time())
        self._prompt_tokens = 0
        self._prompt_s = 0.0
        self._predicted_tokens = 0
        self._predicted_s = 0.0
        self._decodes = 0
        self._tokens_max = 0

    def record(self, run: Run) -> None:
        with self._lock:
            self._prompt_tokens += run.plan.prompt_n
            self._prompt_s += run.plan.prompt_n * PROMPT_MS_PER_TOKEN / 1000
            self._predicted_tokens += run.n_generated
            self._predicted_s += run.predicted_ms / 1000
            self._decodes += 1 + run.n_generated
            self._tokens_max = max(self._tokens_max, run.plan.prompt_n + run.n_generated)

    def render(self, processing: int, deferred: int) -> str:
        """Render Prometheus text like llama.cpp's ``to_metrics()``."""
        with self._lock:
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed", self._prompt_tokens),
                ("prompt_seconds_total", "Total time spent processing prompts", self._prompt_s),
                (
                    "tokens_predicted_total",
                    "Number of generation tokens processed",
                    self._predicted_tokens,
                ),
                (
                    "tokens_predicted_seconds_total",
                    "Total time spent generating tokens",
                    self._predicted_s,
                ),
                ("n_decode_total", "Total number of llama_decode() calls", self._decodes),
                ("n_tokens_max", "Largest observed sequence length", self._tokens_max),
            ]
            gauges = [
                (
                    "prompt_tokens_seconds",
                    "Average prompt throughput in tokens/s",
                    _rate(self._prompt_tokens, self._prompt_s),
                ),
                (
                    "predicted_tokens_seconds",
                    "Average generation throughput in tokens/s",
                    _rate(self._predicted_tokens, self._predicted_s),
                ),
                ("requests_processing", "Number of requests processing", processing),
                ("requests_deferred", "Number of requests deferred", deferred),
            ]
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, text, value in items:
                lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}"]
                lines.append(f"llamacpp:{name} {value:g}")
        return "\n".join(lines) + "\n"


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


# --- requests, replies and routes ----------------------------------------------------------------


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
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# llama-server routes the simulation does not implement: 501 rather than a misleading 404
NOT_SIMULATED = (
    "/infill", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/responses",
    "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/apply-template",
    "/audio/transcriptions", "/v1/audio/transcriptions", "/lora-adapters", "/v1/systemone",
    "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens",
    "/responses/input_tokens", "/v1/responses/input_tokens", "/v1/chat/completions/control",
)  # fmt: skip


@dataclass(frozen=True)
class Route:
    handler: Callable[[Request], Reply]
    wakes: bool = False  # needs the model: waits while it wakes from sleep (ROUTER_SPEC 13.4)
    completion: bool = False  # counts toward --sim-crash-after


class SimServer:
    """The simulated llama-server: routes, completions and the process lifecycle."""

    def __init__(self, opts: SimOptions, reporter: Reporter) -> None:
        self.opts = opts
        self.reporter = reporter
        self.stopping = threading.Event()
        self.model = SimModel(opts, reporter, self.stopping)
        self.slots = SlotPool(opts.parallel if opts.parallel > 0 else 4, opts.ctx_size or 4096)
        self.stats = Stats()
        self._served = 0
        self._served_lock = threading.Lock()
        self._routes = self._build_routes()

    def _build_routes(self) -> dict[tuple[str, str], Route]:
        native, text, chat = (partial(self._complete, s) for s in Style)
        routes = {
            ("GET", "/health"): Route(self._health),
            ("GET", "/v1/health"): Route(self._health),
            ("GET", "/models"): Route(self._models),
            ("GET", "/v1/models"): Route(self._models),
            ("GET", "/props"): Route(self._props),
            ("GET", "/metrics"): Route(self._metrics),
            ("POST", "/props"): Route(self._post_props, wakes=True),
            ("GET", "/slots"): Route(self._slots, wakes=True),
            ("POST", "/tokenize"): Route(self._tokenize, wakes=True),
            ("POST", "/detokenize"): Route(self._detokenize, wakes=True),
            ("POST", "/embedding"): Route(partial(self._embeddings, False), wakes=True),
            ("POST", "/embeddings"): Route(partial(self._embeddings, False), wakes=True),
            ("POST", "/v1/embeddings"): Route(partial(self._embeddings, True), wakes=True),
            ("POST", "/completion"): Route(native, wakes=True, completion=True),
            ("POST", "/completions"): Route(native, wakes=True, completion=True),
            ("POST", "/v1/completions"): Route(text, wakes=True, completion=True),
            ("POST", "/chat/completions"): Route(chat, wakes=True, completion=True),
            ("POST", "/v1/chat/completions"): Route(chat, wakes=True, completion=True),
        }
        for path in NOT_SIMULATED:
            routes[("POST", path)] = Route(self._not_simulated)
        routes[("GET", "/lora-adapters")] = Route(self._not_simulated)
        return routes

    # lifecycle

    def run(self) -> int:
        """Load, announce readiness, then wait for an exit request (main thread)."""
        log.info("loading model '%s' (simulated: nothing is read)", self.opts.model)
        try:
            if not self.model.load():
                return 0  # exit requested while loading
        except LoadFailed as exc:
            log.error("simulated load failure (--sim-fail-load): %s", exc)
            log.error("exiting due to model loading error")
            return 1
        log.info("model loaded: id '%s'", self.opts.model_id)
        self.reporter.send("ready", self.model_info())
        if self.reporter.is_child:
            threading.Thread(target=self._watch_stdin, name="stdin", daemon=True).start()
        if self.opts.sleep_idle_seconds > 0:
            watcher = partial(self.model.watch_idle, float(self.opts.sleep_idle_seconds))
            threading.Thread(target=watcher, name="idle", daemon=True).start()
        self.stopping.wait()
        log.info("shutting down")
        return 0

    def request_exit(self, reason: str) -> None:
        """Ask the main thread for a graceful exit 0; a second request exits 1 at once (§1.7)."""
        if self.stopping.is_set():
            log.error("Received second interrupt, terminating immediately.")
            hard_exit(1)
        log.info("%s, exiting gracefully", reason)
        self.stopping.set()

    def _watch_stdin(self) -> None:
        """Exit on the router's exit command; exit 1 at once on EOF (ROUTER_SPEC 4.12)."""
        for line in sys.stdin.buffer:
            if EXIT_COMMAND in line:
                self.request_exit("exit command received")
                return
        log.info("EOF on stdin detected, forcing shutdown...")
        hard_exit(1)

    def _count_completion(self) -> None:
        with self._served_lock:
            self._served += 1
            served = self._served
        if self.opts.crash_after and served >= self.opts.crash_after:
            log.error("simulated crash after %d completion requests (--sim-crash-after)", served)
            hard_exit(CRASH_EXIT_CODE)

    # dispatch

    def respond(self, request: Request, send: Callable[[Reply], None]) -> None:
        """Answer one request in llama-server's order: preflight, loading, API key, route."""
        route = self._routes.get((request.method, request.path))
        if request.method == "OPTIONS":
            send(PREFLIGHT)
        elif not self.model.loaded:
            send(LOADING)
        elif not self._authorized(request):
            send(UNAUTHORIZED)
        elif route is None:
            send(NOT_FOUND)
        elif not route.wakes:
            send(self._call(route, request))
        else:
            with self.model.busy():
                reply = self._call(route, request)
                send(reply)
            if route.completion and reply.status == 200:
                self._count_completion()

    def _authorized(self, request: Request) -> bool:
        if not self.opts.api_keys or request.path in PUBLIC_PATHS:
            return True
        key = request.headers.get("authorization") or request.headers.get("x-api-key", "")
        return key.removeprefix("Bearer ") in self.opts.api_keys

    def _call(self, route: Route, request: Request) -> Reply:
        try:
            return route.handler(request)
        except ApiError as exc:
            return json_reply(exc.to_json(), exc.code)
        except Exception as exc:  # llama.cpp's ex_wrapper: anything else is a 500
            log.exception("handler failed")
            return json_reply(ApiError(500, str(exc)).to_json(), 500)

    # routes

    def model_info(self) -> JSON:
        """Return the /v1/models entry, also the payload of the first ``ready`` line."""
        size = self.opts.rss_mb * MIB
        n_ctx = self.opts.ctx_size or 4096
        return {
            "id": self.opts.model_id,
            "aliases": list(self.opts.aliases),
            "tags": list(self.opts.tags),
            "object": "model",
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "created": int(time.time()),
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": 2,
                "n_vocab": N_VOCAB,
                "n_ctx": n_ctx,
                "n_ctx_train": n_ctx,
                "n_embd": N_EMBD,
                "n_params": size * 2,  # as if 4 bits per parameter
                "size": size,
                "ftype": FTYPE,
            },
        }

    def _health(self, request: Request) -> Reply:
        return json_reply({"status": "ok"})

    def _models(self, request: Request) -> Reply:
        model_id = self.opts.model_id
        ollama = {
            "name": model_id,
            "model": model_id,
            "modified_at": "",
            "size": "",
            "digest": "",
            "type": "model",
            "description": "",
            "tags": [""],
            "capabilities": ["completion"],
            "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }  # fmt: skip
        return json_reply({"models": [ollama], "object": "list", "data": [self.model_info()]})

    def _props(self, request: Request) -> Reply:
        o = self.opts
        return json_reply(
            {
                "default_generation_settings": {
                    "params": GENERATION_SETTINGS,
                    "n_ctx": o.ctx_size or 4096,
                },
                "total_slots": self.slots.count,
                "model_alias": o.model_id,
                "model_ftype": FTYPE,
                "model_path": o.model,
                "modalities": {"vision": False, "video": False, "audio": False},
                "media_marker": "<__media__>",
                "endpoint_slots": o.slots,
                "endpoint_props": o.props,
                "endpoint_metrics": o.metrics,
                "ui": False,
                "ui_settings": {},
                "chat_template": CHAT_TEMPLATE,
                "chat_template_caps": {},
                "bos_token": SPECIAL_PIECES[BOS_ID],
                "eos_token": SPECIAL_PIECES[EOS_ID],
                "build_info": BUILD_INFO,
                "is_sleeping": self.model.sleeping,
                "cors_proxy_enabled": False,
            }
        )

    def _post_props(self, request: Request) -> Reply:
        if not self.opts.props:
            raise ApiError(
                501,
                "This server does not support changing global properties. Start it with `--props`",
            )
        request.json()
        return json_reply({"success": True})

    def _metrics(self, request: Request) -> Reply:
        if not self.opts.metrics:
            raise ApiError(
                501, "This server does not support metrics endpoint. Start it with `--metrics`"
            )
        text = self.stats.render(*self.slots.counts())
        start = ("Process-Start-Time-Unix", str(self.stats.started))
        return Reply(200, text.encode(), "text/plain; version=0.0.4", (start,))

    def _slots(self, request: Request) -> Reply:
        if not self.opts.slots:
            raise ApiError(
                501, "This server does not support slots endpoint. Start it with `--slots`"
            )
        slots = self.slots.to_json()
        if request.query.get("fail_on_no_slot") and all(s["is_processing"] for s in slots):
            raise ApiError(503, "no slot available")
        return json_reply(slots)

    def _tokenize(self, request: Request) -> Reply:
        body = request.json()
        if "content" not in body:
            return json_reply({"tokens": []})
        tokens = tokenize_mixed(body["content"], body.get("add_special") is True)
        if body.get("with_pieces") is True:
            return json_reply({"tokens": [{"id": t, "piece": piece_json(t)} for t in tokens]})
        return json_reply({"tokens": tokens})

    def _detokenize(self, request: Request) -> Reply:
        body = request.json()
        tokens = token_ids(body["tokens"]) if "tokens" in body else []
        return json_reply({"content": detokenize(tokens)})

    def _embeddings(self, oai: bool, request: Request) -> Reply:
        if not self.opts.embeddings:
            raise ApiError(
                501, "This server does not support embeddings. Start it with `--embeddings`"
            )
        body = request.json()
        if "input" in body:
            texts = embedding_inputs(body["input"])
        elif "content" in body:
            oai, texts = (
                False,
                embedding_inputs(body["content"]),
            )  # "content" is not OAI (llama.cpp)
        else:
            raise ApiError(400, '"input" or "content" must be provided')
        if not oai:
            return json_reply([{"index": i, "embedding": [embed(t)]} for i, t in enumerate(texts)])
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise ApiError(
                400, "The format to return the embeddings in. Can be either float or base64"
            )
        data = [embedding_object(i, embed(t), encoding == "base64") for i, t in enumerate(texts)]
        n_tokens = sum(len(tokenize(t, add_special=True)) for t in texts)
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        model = body.get("model", self.opts.model_id)
        return json_reply({"model": model, "object": "list", "usage": usage, "data": data})

    def _not_simulated(self, request: Request) -> Reply:
        raise ApiError(501, f"{request.method} {request.path} is not simulated by simserver")

    def _complete(self, style: Style, request: Request) -> Reply:
        plan = make_plan(style, request.json(), self.opts.model_id, self.opts.tokens)
        if plan.stream:
            return Reply(200, content_type="text/event-stream", chunks=self._stream(plan))
        with self.slots.hold() as slot:
            started = time.monotonic()
            pieces = list(self._generate(plan))
            run = Run(plan, slot, "".join(pieces), len(pieces), (time.monotonic() - started) * 1000)
        self.stats.record(run)
        return json_reply(final_result(run))

    def _stream(self, plan: Plan) -> Generator[bytes, None, None]:
        """Yield SSE events as tokens come; a slot is held only once the stream is consumed."""
        with self.slots.hold() as slot:
            started = time.monotonic()
            pieces: list[str] = []
            for piece in self._generate(plan):
                pieces.append(piece)
                yield sse(partial_events(plan, slot, piece, len(pieces)))
            run = Run(plan, slot, "".join(pieces), len(pieces), (time.monotonic() - started) * 1000)
        self.stats.record(run)
        yield sse(final_events(run))
        if plan.style is not Style.NATIVE:
            yield b"data: [DONE]\n\n"

    def _generate(self, plan: Plan) -> Iterator[str]:
        """Yield the simulated tokens, one per --sim-token-ms; stop early on shutdown."""
        for index in range(plan.n_predict):
            if self.stopping.wait(self.opts.token_ms / 1000):
                return
            yield sim_piece(plan.model, index)


def embedding_inputs(value: Any) -> list[str]:
    """Return the texts to embed: a string, token ids, or a list of either."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(type(t) is int for t in value):
        return [detokenize(value)]
    if isinstance(value, list) and value:
        return [item if isinstance(item, str) else detokenize(token_ids(item)) for item in value]
    raise ApiError(400, '"input" must not be empty')


def embedding_object(index: int, vector: list[float], as_base64: bool) -> JSON:
    if not as_base64:
        return {"embedding": vector, "index": index, "object": "embedding"}
    packed = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return {"embedding": packed, "index": index, "object": "embedding", "encoding_format": "base64"}


# --- HTTP ----------------------------------------------------------------------------------------


class SimHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that binds fast (no reverse DNS) and takes IPv6 hosts."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: SimServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.app = app
        super().__init__(address, SimHandler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # HTTPServer's version calls socket.getfqdn()
        self.server_name, self.server_port = (
            str(self.server_address[0]),
            int(self.server_address[1]),
        )


class SimHandler(BaseHTTPRequestHandler):
    """Translate HTTP/1.1 (keep-alive, chunked bodies both ways) to Request and Reply."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without TCP_NODELAY, Nagle's algorithm
        # and the client's delayed ACK stall every reused connection by ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._requests_on_connection = 0

    @property
    def _app(self) -> SimServer:
        assert isinstance(self.server, SimHTTPServer)
        return self.server.app

    def version_string(self) -> str:
        return "llama.cpp"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def handle_one_request(self) -> None:
        self.connection.settimeout(KEEP_ALIVE_S)  # idle keep-alive connections close after 5 s
        super().handle_one_request()

    def _dispatch(self) -> None:
        """Read one request, let the app answer it; a vanished client only ends the connection."""
        self.connection.settimeout(IO_TIMEOUT_S)
        self._requests_on_connection += 1
        try:
            request = self._read_request()
        except ApiError as exc:
            self._send(json_reply(exc.to_json(), exc.code))
            return
        try:
            self._app.respond(request, self._send)
        except OSError as exc:  # the client went away mid-response
            log.debug("connection lost: %s", exc)
            self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_OPTIONS = _dispatch

    def _read_request(self) -> Request:
        url = urlsplit(self.path)
        headers = {name.lower(): value for name, value in self.headers.items()}
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._read_chunked()
        else:
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                raise ApiError(400, "invalid Content-Length") from None
            body = self.rfile.read(length) if length > 0 else b""
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        return Request(self.command, url.path, query, headers, body)

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ApiError(400, "malformed chunked request body") from None
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline(8)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        if origin := self.headers.get("Origin"):
            self.send_header("Access-Control-Allow-Origin", origin)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.status >= 400 or self._requests_on_connection >= KEEP_ALIVE_MAX:
            self.close_connection = True  # cpp-httplib closes after every error response
        if self.close_connection:
            self.send_header("Connection", "close")
        else:
            self.send_header("Keep-Alive", f"timeout={KEEP_ALIVE_S:g}, max={KEEP_ALIVE_MAX}")
        if reply.chunks is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in reply.chunks:
                self.wfile.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        finally:
            reply.chunks.close()  # frees the slot if the client left mid-stream


# --- process -------------------------------------------------------------------------------------


def hard_exit(code: int) -> NoReturn:
    """Leave now without unwinding other threads (crash, stdin EOF, second signal)."""
    for stream in (sys.stderr, sys.stdout):
        with suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def install_signal_handlers(app: SimServer) -> None:
    """SIGTERM and SIGINT exit gracefully, or are logged and ignored with --sim-ignore-sigterm."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if app.opts.ignore_sigterm:
            log.warning("received %s, ignoring it (--sim-ignore-sigterm)", name)
        else:
            app.request_exit(f"received {name}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s.%(msecs)03d simserver %(levelname)s: %(message)s", "%H:%M:%S"
        )
    )
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulated llama-server until it is told to exit; return the exit status."""
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
    except HelpRequested:
        print(usage())
        return 0
    except UsageError as exc:
        print(f"{exc}\n\n{usage()}", file=sys.stderr)
        return 1
    reporter = Reporter.from_environment()
    configure_logging()
    for item in opts.ignored:
        log.warning("ignoring unknown llama-server flag: %s", item)
    app = SimServer(opts, reporter)
    try:
        server = SimHTTPServer((opts.host, opts.port), app)
    except OSError as exc:
        log.error(
            "couldn't bind HTTP server socket, hostname: %s, port: %d: %s",
            opts.host,
            opts.port,
            exc,
        )
        return 1
    install_signal_handlers(app)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info(
        "simulated llama-server (no real model) listening on http://%s:%d",
        opts.host,
        server.server_port,
    )
    return app.run()


if __name__ == "__main__":
    sys.exit(main())
