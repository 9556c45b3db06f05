"""Own the router's child processes: spawn, readiness, stop deadline -> SIGKILL, reap, logs.

The supervisor knows nothing about presets, queues or the scheduler (DESIGN §3). It is driven by
the engine, which is the single owner of router state, and it reports back only through the
``post`` callback given at construction. Everything runs on one asyncio loop; no locks.

API (rules S1-S8 of DESIGN §4 are cited where they apply)::

    sup = Supervisor(post, state_file=path)          # post(event) must not block
    pid = await sup.spawn(name, argv, env, child_protocol=True, load_timeout=600.0,
                          host="127.0.0.1", keyed=False)  # keyed: a fresh key (issue 18)
    sup.stop(name, stop_timeout=10.0)                # graceful, then SIGKILL at the deadline
    sup.kill(name)                                   # SIGKILL the group now
    sup.live() -> dict[str, ChildInfo]               # snapshot of running children
    sup.logs(name) -> list[LogLine]                  # per-name ring buffer (survives the exit)
    await sup.shutdown(stop_timeout)                 # stop everything, await the exits
    reap_leftovers(path) -> list[Leftover]           # at start, before the first spawn (S8)

Events, per ``spawn()`` call and in this order: ``ChildStarted`` (posted before ``spawn``
returns, and again with the new pid/port after each bind-failure retry, S2), any number of
``LogLine``/``ChildState``, at most one ``ChildReady`` (first readiness), maybe ``ChildStuck``,
and exactly one ``ChildExited``. A keyed spawn's ``ChildStarted`` carries its key (left out of
repr); the child reads it from a 0600 file beside the state file, removed after the exit, and
every command line the supervisor shows (log lines, ``live()``, the state file) is masked.
``post`` is also called synchronously from inside ``spawn``, ``stop`` and ``kill`` (router log
lines), so it must only enqueue. State lines keep flowing after a stop was requested; the
engine's ``stopping`` flag is its own.

Errors: ``spawn`` raises ``SpawnError`` when the process cannot be started (only a LogLine is
posted) and ``ValueError`` while the name is live: a name is free again once its
``ChildExited`` has been posted. ``stop``/``kill`` on an unknown name return False. A stop or
kill makes the exit ``expected``; a load timeout kills with ``expected=False`` and an ``error``.

Stopping (S4): a child that has never been ready (it does not read stdin yet, ROUTER_SPEC 4.12)
is SIGKILLed at once. A child that was ready once gets the exit command (child protocol) or
SIGTERM to its group; this includes a child re-loading after sleep, which llama.cpp kills
(ROUTER_SPEC §15.15) although it reads stdin by then. The deadline is stored; when it passes,
the whole group gets SIGKILL. The leader's exit is awaited through the loop's child watcher
(S5; on Python 3.11 ``Process.wait()`` would also wait for pipes a grandchild may hold); then
the rest of its group is SIGKILLed, so wrappers leave no orphans, and the pipes are drained.

Modules: ``core`` (the ``Supervisor``: spawn, watch, reap, shutdown), which owns the children
and composes its parts, each with its own state: ``reporter`` (the ``post`` callback and the
log rings, which the others report through), ``output`` (reading a child's pipes, state lines,
readiness), ``stopping`` (S4, S6), ``statefile`` (the state file's writer, and leftovers, S8)
and ``keys`` (the child keys' files); beside them ``reports`` (what it reports), ``child``
(one child's record), ``protocol`` (state lines, line splitting, the /health probe), ``flood``
(the log budget) and ``processes`` (ports, environment, process groups).
"""

from __future__ import annotations

from routerpanel.router.supervisor.child import LAST_LINES
from routerpanel.router.supervisor.core import Supervisor
from routerpanel.router.supervisor.processes import (
    ROUTER_ONLY_ENV,
    child_environment,
    pick_free_port,
)
from routerpanel.router.supervisor.protocol import (
    BIND_FAILURE_MARKERS,
    EXIT_COMMAND,
    MAX_LINE_BYTES,
    STATE_PREFIX,
    probe_health,
)
from routerpanel.router.supervisor.reports import (
    ChildExited,
    ChildInfo,
    ChildReady,
    ChildStarted,
    ChildState,
    ChildStateName,
    ChildStuck,
    JSONObject,
    Leftover,
    LogLine,
    SpawnError,
    Stream,
    SupervisorEvent,
)
from routerpanel.router.supervisor.statefile import reap_leftovers

__all__ = [
    "BIND_FAILURE_MARKERS",
    "EXIT_COMMAND",
    "LAST_LINES",
    "MAX_LINE_BYTES",
    "ROUTER_ONLY_ENV",
    "STATE_PREFIX",
    "ChildExited",
    "ChildInfo",
    "ChildReady",
    "ChildStarted",
    "ChildState",
    "ChildStateName",
    "ChildStuck",
    "JSONObject",
    "Leftover",
    "LogLine",
    "SpawnError",
    "Stream",
    "Supervisor",
    "SupervisorEvent",
    "child_environment",
    "pick_free_port",
    "probe_health",
    "reap_leftovers",
]
