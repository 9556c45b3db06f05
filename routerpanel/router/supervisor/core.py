"""Run the ``Supervisor``: spawn children on free ports, watch their output and readiness, stop
them with a deadline and SIGKILL (S4), reap them (S5) and post every event to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from routerpanel.router.supervisor.child import _Child, _exit_error, _Launch
from routerpanel.router.supervisor.flood import FLOOD_PAUSE, STATE_MARKER, holds_marker, last_line
from routerpanel.router.supervisor.processes import (
    ROUTER_ONLY_ENV,
    _create_time,
    _ExitProtocol,
    _group_alive,
    _killpg,
    child_environment,
    pick_free_port,
)
from routerpanel.router.supervisor.protocol import (
    _STATE_NAMES,
    BIND_FAILURE_MARKERS,
    EXIT_COMMAND,
    STATE_PREFIX,
    _LineSplitter,
    probe_health,
)
from routerpanel.router.supervisor.reports import (
    ChildExited,
    ChildInfo,
    ChildReady,
    ChildStarted,
    ChildState,
    ChildStuck,
    JSONObject,
    LogLine,
    SpawnError,
    Stream,
    SupervisorEvent,
)
from routerpanel.router.supervisor.statefile import _atomic_write

EXIT_RESEND = 1.0  # seconds after the exit command before it is sent once more
log = logging.getLogger("routerpanel.router.supervisor")  # the package's name, as before the split


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
        """Read one pipe to EOF; past the child's log budget only count lines (flood.py)."""
        splitter = _LineSplitter()
        budget, marker = child.budget, STATE_MARKER if child.launch.child_protocol else None
        while chunk := await reader.read(65536):
            now = self._now()
            if budget.over(now) and not holds_marker(marker, splitter.pending, chunk):
                budget.count(chunk.count(b"\n"))
                if (tail := last_line(chunk)) is not None:  # the end stays in the ring
                    self._keep(child, LogLine(child.name, stream, tail, time.time()))
                splitter.skip(chunk)
                await asyncio.sleep(FLOOD_PAUSE)  # cap the reading: the pipe holds the rest
            else:
                for text in splitter.feed(chunk):
                    if budget.allow(now) or (marker and text.startswith(STATE_PREFIX)):
                        self._on_line(child, stream, text)
                    else:
                        budget.count(1)
            if (dropped := budget.report(now)) is not None:
                rate = f"{budget.rate:g}"
                self._note(child.name, child, f"{dropped} lines not shown (over {rate} a second)")
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

    def _ask_to_exit(self, child: _Child, *, again: bool = False) -> None:
        if child.launch.child_protocol:
            assert child.proc.stdin is not None
            with contextlib.suppress(OSError, RuntimeError):  # already closing
                child.proc.stdin.write(EXIT_COMMAND)
            self._note(child.name, child, "sent the exit command" + (" again" if again else ""))
            if not again:
                # llama-server b11434 loses an exit command that arrives between its `ready` line
                # and the start of its task loop (start_loop() sets running = true after
                # terminate() set it false): say it once more a moment later.
                when = self._now() + EXIT_RESEND
                child.arm("resend", when, lambda: self._ask_to_exit(child, again=True))
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
        self._keep(child, line, name)
        self._post(line)

    def _keep(self, child: _Child | None, line: LogLine, name: str | None = None) -> None:
        """Put a line in the ring buffer and the child's last lines, without streaming it."""
        name = name or line.name
        ring = self._logs.get(name)
        if ring is None:
            ring = self._logs[name] = deque(maxlen=self._log_lines)
        ring.append(line)
        if child is not None:
            child.lines.append(line)

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
