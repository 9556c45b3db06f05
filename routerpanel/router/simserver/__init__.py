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

Modules: ``options`` (command line), ``tokens`` (tokens, text and vectors), ``protocol`` (child
protocol state lines), ``model`` (weights, load/sleep/wake, slots), ``completions`` (plans and
reply shapes), ``stats`` (/metrics), ``replies`` (request and reply values), ``app`` (routes and
lifecycle), ``http`` (the HTTP/1.1 handler), ``process`` (signals, logging, ``main``) and
``common`` (what they all share).
"""

from __future__ import annotations

from routerpanel.router.simserver.app import SimServer
from routerpanel.router.simserver.common import ApiError, compact, hard_exit
from routerpanel.router.simserver.http import SimHandler, SimHTTPServer
from routerpanel.router.simserver.options import (
    CRASH_EXIT_CODE,
    FLAGS,
    HelpRequested,
    SimOptions,
    UsageError,
    parse_args,
    usage,
)
from routerpanel.router.simserver.process import main
from routerpanel.router.simserver.protocol import (
    EXIT_COMMAND,
    ROUTER_PORT_ENV,
    STATE_PREFIX,
    Reporter,
)
from routerpanel.router.simserver.replies import Reply, Request

__all__ = [
    "CRASH_EXIT_CODE",
    "EXIT_COMMAND",
    "FLAGS",
    "ROUTER_PORT_ENV",
    "STATE_PREFIX",
    "ApiError",
    "HelpRequested",
    "Reply",
    "Reporter",
    "Request",
    "SimHTTPServer",
    "SimHandler",
    "SimOptions",
    "SimServer",
    "UsageError",
    "compact",
    "hard_exit",
    "main",
    "parse_args",
    "usage",
]
