"""Define what the supervisor reports: the events it posts, the ``live()`` snapshot, the
leftovers ``reap_leftovers`` found (S8) and ``SpawnError``. Plain frozen values, no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

Stream = Literal["stdout", "stderr", "router"]
ChildStateName = Literal["loading", "ready", "sleeping", "downloading"]  # ROUTER_SPEC 4.9-4.10
JSONObject: TypeAlias = dict[str, Any]


@dataclass(frozen=True, slots=True)
class LogLine:
    name: str
    stream: Stream
    text: str
    time: float  # wall clock (time.time())


@dataclass(frozen=True, slots=True)
class ChildStarted:
    name: str
    pid: int
    port: int
    attempt: int  # 1, then 2.. after bind-failure retries (S2)
    host: str = "127.0.0.1"  # where it listens
    key: str | None = field(default=None, repr=False)  # its API key (issue 18), never shown


@dataclass(frozen=True, slots=True)
class ChildState:
    """A child-protocol state line other than the first ``ready`` (ROUTER_SPEC 4.9)."""

    name: str
    state: ChildStateName  # "ready" here means woken from sleep (payload {})
    payload: JSONObject


@dataclass(frozen=True, slots=True)
class ChildReady:
    name: str
    port: int
    info: JSONObject  # the child's /v1/models object (child protocol), {} after /health
    load_seconds: float


@dataclass(frozen=True, slots=True)
class ChildStuck:
    name: str
    pid: int
    seconds_since_kill: float


@dataclass(frozen=True, slots=True)
class ChildExited:
    name: str
    pid: int
    port: int
    exit_code: int | None  # None when a signal ended it
    signal: int | None
    duration: float  # seconds from spawn to exit (this attempt)
    expected: bool  # stop()/kill()/shutdown() asked for it
    force_killed: bool  # the supervisor sent SIGKILL
    was_ready: bool
    stop_seconds: float | None  # from the first stop request to the exit
    error: str | None  # None for an expected exit; otherwise what went wrong
    last_lines: tuple[LogLine, ...]


SupervisorEvent: TypeAlias = (
    LogLine | ChildStarted | ChildState | ChildReady | ChildStuck | ChildExited
)


@dataclass(frozen=True, slots=True)
class ChildInfo:
    name: str
    pid: int
    port: int
    argv: tuple[str, ...]  # as spawned, any key masked
    state: ChildStateName  # last reported
    ready: bool  # has been ready at least once
    stopping: bool
    stop_deadline: float | None  # loop.time() based
    stuck: bool


@dataclass(frozen=True, slots=True)
class Leftover:
    name: str
    pid: int
    pgid: int
    argv: tuple[str, ...]
    create_time: float | None
    outcome: Literal["killed", "gone", "pid_reused", "survived"]
    killed_pids: tuple[int, ...]


class SpawnError(RuntimeError):
    """The child process could not be started (ROUTER_SPEC 4.7)."""
