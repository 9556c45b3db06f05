"""Own the router's child processes: spawn, readiness, stop deadline -> SIGKILL, reap, logs.

The supervisor knows nothing about presets, queues or the scheduler (DESIGN §3). It is driven by
the engine, which is the single owner of router state, and it reports back only through the
``post`` callback given at construction. Everything runs on one asyncio loop; no locks.

API (rules S1-S8 of DESIGN §4 are cited where they apply)::

    sup = Supervisor(post, state_file=path)          # post(event) must not block
    pid = await sup.spawn(name, argv, env, child_protocol=True, load_timeout=600.0)
    sup.stop(name, stop_timeout=10.0)                # graceful, then SIGKILL at the deadline
    sup.kill(name)                                   # SIGKILL the group now
    sup.live() -> dict[str, ChildInfo]               # snapshot of running children
    sup.logs(name) -> list[LogLine]                  # per-name ring buffer (survives the exit)
    await sup.shutdown(stop_timeout)                 # stop everything, await the exits
    reap_leftovers(path) -> list[Leftover]           # at start, before the first spawn (S8)

Events, per ``spawn()`` call and in this order: ``ChildStarted`` (posted before ``spawn``
returns, and again with the new pid/port after each bind-failure retry, S2), any number of
``LogLine``/``ChildState``, at most one ``ChildReady`` (first readiness), maybe ``ChildStuck``,
and exactly one ``ChildExited``. ``post`` is also called synchronously from inside ``spawn``,
``stop`` and ``kill`` (router log lines), so it must only enqueue. State lines keep flowing
after a stop was requested; the engine's ``stopping`` flag is its own.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import signal
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs: types-psutil

log = logging.getLogger(__name__)

STATE_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = b"cmd_router_to_child:exit\n"
# llama.cpp tools/server/server-http.cpp prints the first; Python servers print the second.
BIND_FAILURE_MARKERS = ("couldn't bind HTTP server socket", "Address already in use")
# Variables that configure the router itself (DESIGN §8, ROUTER_SPEC §15.20). "X*" = prefix.
ROUTER_ONLY_ENV = (
    "LLAMA_ARG_MODELS_*",
    "LLAMA_API_KEY",
    "LLAMA_ARG_API_KEY*",
    "ROUTERPANEL_*",
    "LLAMA_ARG_HOST",
    "LLAMA_ARG_PORT",
    "LLAMA_SERVER_ROUTER_PORT",
    "LLAMA_SERVER_CHILD_MODE",
)
MAX_LINE_BYTES = 64 * 1024
LAST_LINES = 30

Stream = Literal["stdout", "stderr", "router"]
ChildStateName = Literal["loading", "ready", "sleeping", "downloading"]  # ROUTER_SPEC 4.9-4.10
_STATE_NAMES: dict[str, ChildStateName] = {
    "loading": "loading",
    "ready": "ready",
    "sleeping": "sleeping",
    "downloading": "downloading",
}
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
    argv: tuple[str, ...]
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


def pick_free_port(host: str = "127.0.0.1") -> int:
    """Return a port the OS considers free right now (check-then-use, hence S2's retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


async def probe_health(port: int, timeout: float = 2.0) -> int | None:
    """Return the status of ``GET /health`` on 127.0.0.1:``port``, or None if it did not answer.

    A bare HTTP/1.1 request on asyncio streams: cheaper than a client library at 10 Hz and it
    logs nothing.
    """
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(
                    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                status_line = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return None
    parts = status_line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def child_environment(base: Mapping[str, str], strip: Collection[str]) -> dict[str, str]:
    """Return ``base`` without the names in ``strip`` (a trailing ``*`` makes a prefix)."""
    exact = {p for p in strip if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in strip if p.endswith("*"))
    return {k: v for k, v in base.items() if k not in exact and not k.startswith(prefixes)}


class _LineSplitter:
    """Split a byte stream into text lines, keeping at most ``limit`` bytes of any line (S7)."""

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._truncated = False

    def feed(self, data: bytes) -> list[str]:
        *complete, partial = data.split(b"\n")
        lines = []
        for part in complete:
            self._append(part)
            lines.append(self._take())
        self._append(partial)
        return lines

    def finish(self) -> list[str]:
        return [self._take()] if self._buf or self._truncated else []

    def _append(self, part: bytes) -> None:
        room = self._limit - len(self._buf)
        if len(part) > room:
            self._truncated = True
            part = part[: max(room, 0)]
        self._buf += part

    def _take(self) -> str:
        text = self._buf.decode("utf-8", "replace").rstrip("\r")
        if self._truncated:
            text += " [line truncated]"
        self._buf.clear()
        self._truncated = False
        return text


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Stream the pipes as usual, and resolve ``exited`` when the leader process exits.

    On Python 3.11 ``Process.wait()`` also waits until every pipe is closed, so a grandchild
    that inherited them would hide the leader's exit; this future (fed by the loop's child
    watcher, not by polling) does not wait for the pipes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=MAX_LINE_BYTES, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


@dataclass(frozen=True, slots=True)
class _Launch:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    child_protocol: bool
    load_timeout: float | None


@dataclass(eq=False)
class _Child:
    launch: _Launch
    proc: asyncio.subprocess.Process
    transport: asyncio.SubprocessTransport
    exited_future: asyncio.Future[None]
    port: int
    argv: tuple[str, ...]
    attempt: int
    started: float
    create_time: float | None = None
    state: ChildStateName = "loading"
    ready_at: float | None = None
    stop_requested_at: float | None = None
    stop_deadline: float | None = None
    killed_at: float | None = None
    load_timed_out: bool = False
    bind_failed: bool = False
    cancel_retry: bool = False
    stuck: bool = False
    exited: bool = False
    lines: deque[LogLine] = field(default_factory=lambda: deque(maxlen=LAST_LINES))
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.launch.name

    @property
    def pid(self) -> int:
        return self.proc.pid

    def arm(self, key: str, when: float, callback: Callable[[], None]) -> None:
        if old := self.timers.pop(key, None):
            old.cancel()
        self.timers[key] = asyncio.get_running_loop().call_at(when, callback)

    def disarm(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()


class Supervisor:
    """Spawn and watch child servers; report what happens to them through ``post``."""

    def __init__(
        self,
        post: Callable[[SupervisorEvent], None],
        *,
        state_file: Path | None,
        log_lines: int = 500,
        health_interval: float = 0.1,
        kill_grace: float = 5.0,
        bind_retries: int = 3,
        strip_env: Collection[str] = (),
        router_port: int = 0,
        port_picker: Callable[[], int] = pick_free_port,
    ) -> None:
        self._post_cb = post
        self._state_file = state_file
        self._log_lines = log_lines
        self._health_interval = health_interval
        self._kill_grace = kill_grace
        self._bind_retries = bind_retries
        self._router_port = router_port
        self._pick_port = port_picker
        # Captured once, like llama.cpp (ROUTER_SPEC 4.6), but filtered (S1, §15.20).
        self._base_env = child_environment(os.environ, (*ROUTER_ONLY_ENV, *strip_env))
        self._children: dict[str, _Child] = {}
        self._reserved: set[str] = set()
        self._logs: dict[str, deque[LogLine]] = {}
        self._closed = False

    # ----------------------------------------------------------------- public API

    async def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        child_protocol: bool,
        load_timeout: float | None,
    ) -> int:
        """Start ``argv`` + ``--host 127.0.0.1 --port P`` in its own session; return its pid.

        Returns once the process exists; readiness arrives later as ``ChildReady``.
        """
        if self._closed:
            raise SpawnError("the supervisor is shut down")
        if not argv:
            raise ValueError("empty argv")
        if name in self._children or name in self._reserved:
            raise ValueError(f"model {name!r} already has a live process")
        launch = _Launch(name, tuple(argv), dict(env), child_protocol, load_timeout)
        self._reserved.add(name)
        try:
            child = await self._start(launch, attempt=1)
        finally:
            self._reserved.discard(name)
        if self._closed:  # shutdown() began while we were spawning
            self.kill(name)
        return child.pid

    def stop(self, name: str, stop_timeout: float) -> bool:
        """Ask ``name`` to exit; SIGKILL its group at now + ``stop_timeout`` (S4).

        A second stop can only move the deadline earlier. Returns False for an unknown name;
        True for a child whose exit is being processed (its ``ChildExited`` is coming).
        """
        child = self._children.get(name)
        if child is None:
            return False
        if child.exited:  # its ChildExited is coming; only make sure no bind retry follows
            child.cancel_retry = True
            return True
        now = self._now()
        if child.stop_requested_at is None:
            child.stop_requested_at = now
        if child.ready_at is None or stop_timeout <= 0:
            # S4: a loading child does not read stdin yet (ROUTER_SPEC 4.12): kill at once.
            why = "stopped while loading" if child.ready_at is None else "stop timeout 0"
            self._force_kill(child, why)
            return True
        deadline = now + stop_timeout
        if child.stop_deadline is not None and child.stop_deadline <= deadline:
            return True
        if child.stop_deadline is None:
            self._ask_to_exit(child)
        child.stop_deadline = deadline  # STYLE 4: deadlines are data
        child.arm("deadline", deadline, lambda: self._on_stop_deadline(child))
        return True

    def kill(self, name: str) -> bool:
        """SIGKILL the process group of ``name`` now (an expected stop)."""
        child = self._children.get(name)
        if child is None:
            return False
        if child.exited:  # its ChildExited is coming; only make sure no bind retry follows
            child.cancel_retry = True
            return True
        if child.stop_requested_at is None:
            child.stop_requested_at = self._now()
        self._force_kill(child, "kill requested")
        return True

    async def shutdown(self, stop_timeout: float | Mapping[str, float] = 10.0) -> None:
        """Stop every child and await the exits; refuse new spawns.

        ``stop_timeout`` may map names to timeouts (missing names get 10 s). Children that are
        stuck past their deadline + ``kill_grace`` are left running and stay in the state file.
        """
        self._closed = True
        timeouts = {c.name: self._timeout_for(c.name, stop_timeout) for c in self._live()}
        for name, timeout in timeouts.items():
            self.stop(name, timeout)
        tasks = [c.task for c in self._live() if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=max(timeouts.values()) + 2 * self._kill_grace + 1)

    def live(self) -> dict[str, ChildInfo]:
        """Return a snapshot of every child whose exit has not been posted yet."""
        return {c.name: self._info(c) for c in self._live()}

    def logs(self, name: str) -> list[LogLine]:
        """Return the ring buffer of ``name`` (kept after the exit, across restarts)."""
        return list(self._logs.get(name, ()))

    def forget_logs(self, name: str) -> None:
        """Drop the ring buffer of a removed model."""
        self._logs.pop(name, None)

    # ----------------------------------------------------------------- spawning

    async def _start(self, launch: _Launch, attempt: int) -> _Child:
        port = self._free_port()
        argv = (*launch.argv, "--host", "127.0.0.1", "--port", str(port))
        env = {**self._base_env, **launch.env}
        if launch.child_protocol:
            env["LLAMA_SERVER_ROUTER_PORT"] = str(self._router_port)  # S3
        self._note(launch.name, None, f"spawning (attempt {attempt}): {shlex.join(argv)}")
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(loop),
                *argv,  # S1: an argv list, never a shell
                stdin=asyncio.subprocess.PIPE,  # EOF on it makes a protocol child exit
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # own process group, for os.killpg (STYLE 5)
            )
        except OSError as exc:
            self._note(launch.name, None, f"failed to spawn server instance: {exc}")
            raise SpawnError(f"failed to spawn server instance: {exc}") from exc
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        child = _Child(launch, proc, transport, protocol.exited, port, argv, attempt, self._now())
        child.create_time = _create_time(proc.pid)
        self._children[launch.name] = child
        self._write_state()
        self._post(ChildStarted(launch.name, proc.pid, port, attempt))
        if launch.load_timeout is not None:
            when = child.started + launch.load_timeout
            child.arm("load", when, lambda: self._on_load_timeout(child))
        child.task = asyncio.create_task(self._run(child), name=f"supervise {launch.name}")
        return child

    def _free_port(self) -> int:
        taken = {c.port for c in self._children.values()}
        port = self._pick_port()
        for _ in range(10):
            if port not in taken:
                break
            port = self._pick_port()
        return port

    # ----------------------------------------------------------------- watching

    async def _run(self, child: _Child) -> None:
        assert child.proc.stdout is not None and child.proc.stderr is not None
        readers = [
            asyncio.create_task(self._read(child, child.proc.stdout, "stdout")),
            asyncio.create_task(self._read(child, child.proc.stderr, "stderr")),
        ]
        poller = None if child.launch.child_protocol else asyncio.create_task(self._poll(child))
        await child.exited_future  # S5: awaited, never polled
        exited_at = self._now()
        child.exited = True
        child.disarm()
        if poller is not None:
            poller.cancel()
        await self._drain(child, readers)
        child.transport.close()  # our pipe ends, even if a process outside the group holds theirs
        returncode = await child.proc.wait()  # at once: the exit status is known
        if self._should_retry(child):
            with contextlib.suppress(SpawnError):
                await self._retry(child)
                return
        self._children.pop(child.name, None)
        self._write_state()
        self._post(self._exit_event(child, returncode, exited_at))

    async def _retry(self, old: _Child) -> None:
        self._note(old.name, old, f"port {old.port} is taken; retrying on another port (S2)")
        new = await self._start(old.launch, old.attempt + 1)
        if old.cancel_retry:  # a stop arrived while we were respawning
            self.kill(new.name)

    def _should_retry(self, child: _Child) -> bool:
        return (
            child.bind_failed
            and child.ready_at is None
            and child.stop_requested_at is None
            and not child.cancel_retry
            and not child.load_timed_out
            and child.attempt <= self._bind_retries
            and not self._closed
        )

    async def _drain(self, child: _Child, readers: list[asyncio.Task[None]]) -> None:
        """Kill what is left of the group, then read the pipes to EOF (bounded)."""
        _killpg(child.pid, signal.SIGKILL)  # orphans of a wrapper go with it (STYLE 5)
        _, pending = await asyncio.wait(readers, timeout=self._kill_grace)
        if not pending:
            return
        if _group_alive(child.pid):
            self._mark_stuck(child, self._kill_grace)  # S6: members survive SIGKILL, hold pipes
            await asyncio.wait(pending)
            return
        self._note(child.name, child, "output pipes held open outside the process group")
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _read(self, child: _Child, reader: asyncio.StreamReader, stream: Stream) -> None:
        splitter = _LineSplitter()
        while chunk := await reader.read(65536):
            for text in splitter.feed(chunk):
                self._on_line(child, stream, text)
        for text in splitter.finish():
            self._on_line(child, stream, text)

    def _on_line(self, child: _Child, stream: Stream, text: str) -> None:
        if stream == "stdout" and child.launch.child_protocol and text.startswith(STATE_PREFIX):
            self._on_state_line(child, text[len(STATE_PREFIX) :])
            return
        self._log(child.name, child, LogLine(child.name, stream, text, time.time()))
        if child.ready_at is None and any(m in text for m in BIND_FAILURE_MARKERS):
            child.bind_failed = True

    def _on_state_line(self, child: _Child, raw: str) -> None:
        """Handle ROUTER_SPEC 4.11; bad lines are logged and ignored, never fatal (§15.16)."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
            message = None
        if not isinstance(message, dict):
            message = {}
        name, payload = message.get("state"), message.get("payload", {})
        if payload is None:  # b11434 sends "payload":null with sleeping and with a wake's ready
            payload = {}
        state = _STATE_NAMES.get(name) if isinstance(name, str) else None
        if state is None or not isinstance(payload, dict):
            self._note(child.name, child, f"ignored malformed state line: {raw[:200]}")
            return
        child.state = state
        if state == "ready" and child.ready_at is None:
            self._mark_ready(child, payload)
        else:
            self._post(ChildState(child.name, state, payload))

    async def _poll(self, child: _Child) -> None:
        """Poll /health until 200: the only polling, for children without the protocol (S3)."""
        while await probe_health(child.port) != 200:
            await asyncio.sleep(self._health_interval)
        child.state = "ready"
        self._mark_ready(child, {})

    def _mark_ready(self, child: _Child, info: JSONObject) -> None:
        child.ready_at = self._now()
        if handle := child.timers.pop("load", None):
            handle.cancel()
        self._post(ChildReady(child.name, child.port, info, child.ready_at - child.started))

    # ----------------------------------------------------------------- stopping

    def _ask_to_exit(self, child: _Child) -> None:
        if child.launch.child_protocol:
            assert child.proc.stdin is not None
            with contextlib.suppress(OSError, RuntimeError):  # already closing
                child.proc.stdin.write(EXIT_COMMAND)
            self._note(child.name, child, "sent the exit command")
        else:
            _killpg(child.pid, signal.SIGTERM)
            self._note(child.name, child, "sent SIGTERM to the process group")

    def _on_stop_deadline(self, child: _Child) -> None:
        self._force_kill(child, "force-killing after the stop timeout")

    def _on_load_timeout(self, child: _Child) -> None:
        if child.ready_at is None and not child.exited:
            child.load_timed_out = True
            self._force_kill(child, f"load timeout: not ready after {child.launch.load_timeout} s")

    def _force_kill(self, child: _Child, reason: str) -> None:
        if child.killed_at is not None or child.exited:
            return
        child.killed_at = self._now()
        self._note(child.name, child, f"SIGKILL to process group {child.pid}: {reason}")
        _killpg(child.pid, signal.SIGKILL)
        child.arm("stuck", child.killed_at + self._kill_grace, lambda: self._mark_stuck(child))

    def _mark_stuck(self, child: _Child, since: float | None = None) -> None:
        if child.stuck:
            return
        child.stuck = True
        if since is None:
            since = self._now() - (child.killed_at or child.started)
        self._note(child.name, child, f"still alive {since:.1f} s after SIGKILL (stuck)")
        log.warning("child %s (pid %d) survives SIGKILL", child.name, child.pid)
        self._post(ChildStuck(child.name, child.pid, since))

    # ----------------------------------------------------------------- reporting

    def _exit_event(self, child: _Child, returncode: int, exited_at: float) -> ChildExited:
        code, sig = (None, -returncode) if returncode < 0 else (returncode, None)
        requested = child.stop_requested_at
        return ChildExited(
            name=child.name,
            pid=child.pid,
            port=child.port,
            exit_code=code,
            signal=sig,
            duration=exited_at - child.started,
            expected=requested is not None,
            force_killed=child.killed_at is not None,
            was_ready=child.ready_at is not None,
            stop_seconds=None if requested is None else exited_at - requested,
            error=None if requested is not None else _exit_error(child, code, sig),
            last_lines=tuple(child.lines),
        )

    def _note(self, name: str, child: _Child | None, text: str) -> None:
        self._log(name, child, LogLine(name, "router", text, time.time()))

    def _log(self, name: str, child: _Child | None, line: LogLine) -> None:
        ring = self._logs.get(name)
        if ring is None:
            ring = self._logs[name] = deque(maxlen=self._log_lines)
        ring.append(line)
        if child is not None:
            child.lines.append(line)
        self._post(line)

    def _post(self, event: SupervisorEvent) -> None:
        try:
            self._post_cb(event)
        except Exception:  # a faulty consumer must not orphan a child
            log.exception("supervisor event consumer failed on %r", event)

    def _info(self, child: _Child) -> ChildInfo:
        return ChildInfo(
            name=child.name,
            pid=child.pid,
            port=child.port,
            argv=child.argv,
            state=child.state,
            ready=child.ready_at is not None,
            stopping=child.stop_requested_at is not None,
            stop_deadline=child.stop_deadline,
            stuck=child.stuck,
        )

    def _live(self) -> list[_Child]:
        return list(self._children.values())

    @staticmethod
    def _timeout_for(name: str, timeout: float | Mapping[str, float]) -> float:
        return timeout.get(name, 10.0) if isinstance(timeout, Mapping) else timeout

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _write_state(self) -> None:
        """Rewrite the state file atomically (S8): temp file in the same dir, then replace."""
        if self._state_file is None:
            return
        children = [
            {
                "name": c.name,
                "pid": c.pid,
                "pgid": c.pid,  # start_new_session: the child leads its own group
                "create_time": c.create_time,
                "argv": list(c.argv),
            }
            for c in self._children.values()
        ]
        data = json.dumps({"version": 1, "router_pid": os.getpid(), "children": children})
        _atomic_write(self._state_file, data)


# --------------------------------------------------------------------- helpers


def _exit_error(child: _Child, code: int | None, sig: int | None) -> str:
    if child.load_timed_out:
        return f"load timeout: not ready after {child.launch.load_timeout} s"
    if child.bind_failed and child.ready_at is None:
        return f"could not bind a port after {child.attempt} attempts"
    how = f"exited with code {code}" if sig is None else f"killed by {_signal_name(sig)}"
    return f"{how} {'after it was ready' if child.ready_at is not None else 'while loading'}"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _killpg(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # macOS: a group whose leader is a zombie
        with contextlib.suppress(OSError):
            os.kill(pgid, sig)
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _create_time(pid: int) -> float | None:
    try:
        created: float = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return created


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------- leftovers (S8)


def reap_leftovers(state_file: Path, *, wait: float = 5.0) -> list[Leftover]:
    """Kill the children a crashed router left behind, as recorded in ``state_file``.

    A recorded process is killed (SIGKILL to its group) only when it is alive AND its
    create_time matches, so a reused pid is never killed; if the leader is gone, surviving
    members of its group are killed. Blocks up to ``wait`` seconds for them to die (call it
    from a thread in async code). Consumes the file. Returns one ``Leftover`` per record,
    for the audit log.
    """
    found = [_reap_one(entry) for entry in _read_state(state_file)]
    deadline = time.monotonic() + wait
    result = [_await_death(leftover, deadline) for leftover in found]
    with contextlib.suppress(OSError):
        state_file.unlink()
    return result


def _read_state(state_file: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    children = data.get("children") if isinstance(data, dict) else None
    return [c for c in children or [] if isinstance(c, dict) and isinstance(c.get("pid"), int)]


def _reap_one(entry: dict[str, Any]) -> Leftover:
    pid: int = entry["pid"]
    pgid: int = entry["pgid"] if isinstance(entry.get("pgid"), int) else pid
    recorded = entry.get("create_time")
    created = float(recorded) if isinstance(recorded, int | float) else None

    def leftover(outcome: Literal["killed", "gone", "pid_reused"], pids: list[int]) -> Leftover:
        argv = tuple(str(a) for a in entry.get("argv") or ())
        return Leftover(str(entry.get("name", "")), pid, pgid, argv, created, outcome, tuple(pids))

    members = _group_members(pgid, created)
    try:
        actual = psutil.Process(pid).create_time()
    except psutil.Error:
        actual = None
    if actual is not None and (created is None or abs(actual - created) > 0.01):
        return leftover("pid_reused", [])
    if actual is not None and pid not in members:
        members.append(pid)  # it left its group; kill the recorded process itself
    for member in members:
        with contextlib.suppress(OSError):
            os.kill(member, signal.SIGKILL)
    return leftover("killed" if members else "gone", members)


def _group_members(pgid: int, created: float | None) -> list[int]:
    """Pids in group ``pgid`` born no earlier than the recorded leader."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != pgid:
                continue
            if created is None or proc.create_time() >= created - 0.01:
                members.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return members


def _await_death(leftover: Leftover, deadline: float) -> Leftover:
    """Wait for killed leftovers to die; zombies count as dead (their parent may be gone)."""
    for pid in leftover.killed_pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # one-off at start-up; these are not our children to await
        if _alive(pid):
            return dataclasses.replace(leftover, outcome="survived")
    return leftover


def _alive(pid: int) -> bool:
    try:
        status: str = psutil.Process(pid).status()
    except psutil.Error:
        return False
    return status != "zombie"  # psutil.STATUS_ZOMBIE
