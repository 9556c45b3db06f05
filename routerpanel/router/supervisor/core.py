"""The ``Supervisor``: start a child in its own session, watch it, reap it, report its exit.

``spawn`` starts ``argv --host H --port P`` without a shell (S1) and retries on another port
when the bind fails (S2); ``_run`` awaits the leader's exit (S5), kills what is left of its group
and drains the pipes, then posts exactly one ``ChildExited``. ``shutdown`` stops everyone.
A keyed spawn (issue 18) gets a fresh API key in a 0600 file (``--api-key-file``, so the key is
not on the command line ``ps`` shows), removed once the child has exited.
The ``Supervisor`` owns the children by name and composes its parts, each with its own state:
a ``Reporter`` (reporter.py: the ``post`` callback and the log rings) that the others report
through, an ``Output`` (output.py: reading a child's pipes), a ``Stopping`` (stopping.py: S4,
S6), a ``StateWriter`` (statefile.py: S8) and ``KeyFiles`` (keys.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from routerpanel.router.address import LOOPBACK, new_key, shown
from routerpanel.router.config import DEFAULT_STOP_TIMEOUT
from routerpanel.router.supervisor import keys
from routerpanel.router.supervisor.child import Child, Launch, exit_error, now
from routerpanel.router.supervisor.output import Output
from routerpanel.router.supervisor.processes import (
    ROUTER_ONLY_ENV,
    ExitProtocol,
    child_environment,
    create_time,
    group_alive,
    killpg,
    pick_free_port,
)
from routerpanel.router.supervisor.reporter import Reporter
from routerpanel.router.supervisor.reports import (
    ChildExited,
    ChildInfo,
    ChildStarted,
    LogLine,
    SpawnError,
    SupervisorEvent,
)
from routerpanel.router.supervisor.statefile import StateWriter
from routerpanel.router.supervisor.stopping import Stopping


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
        key_dir: Path | None = None,
    ) -> None:
        self._reporter = Reporter(post, log_lines)
        self._note = self._reporter.note  # a line of the supervisor's own about a child
        self._output = Output(self._reporter, health_interval)
        self._stopping = Stopping(self._reporter, kill_grace)
        self._state = StateWriter(state_file, self._records)
        # Keyed children's key files: beside the state file (the data dir) unless told.
        self._keys = keys.KeyFiles(key_dir or (state_file.parent if state_file else None))
        self._kill_grace = kill_grace
        self._bind_retries = bind_retries
        self._router_port = router_port
        self._pick_port = port_picker
        # Captured once, like llama.cpp (ROUTER_SPEC 4.6), but filtered (S1, §15.20).
        self._base_env = child_environment(os.environ, (*ROUTER_ONLY_ENV, *strip_env))
        self._children: dict[str, Child] = {}
        self._reserved: set[str] = set()
        self._closed = False

    @property
    def state_problem(self) -> str | None:
        """Why the state file cannot be written now (it is tried again), or None."""
        return self._state.problem

    def live(self) -> dict[str, ChildInfo]:
        """Return a snapshot of every child whose exit has not been posted yet."""
        return {c.name: self._info(c) for c in self._live()}

    def logs(self, name: str) -> list[LogLine]:
        """Return the ring buffer of ``name`` (kept after the exit, across restarts)."""
        return self._reporter.lines(name)

    def forget_logs(self, name: str) -> None:
        """Drop the ring buffer of a removed model."""
        self._reporter.forget(name)

    def remove_stale_keys(self) -> int:
        """Remove the key files a killed router left behind (one router per data dir); return
        how many. A child reads its key when it starts, so no live child needs an old file."""
        return self._keys.remove_stale({c.key_file for c in self._children.values()})

    def stop(self, name: str, stop_timeout: float) -> bool:
        """Ask ``name`` to exit; SIGKILL its group at now + ``stop_timeout`` (S4).

        A second stop can only move the deadline earlier. Returns False for an unknown name;
        True for a child whose exit is being processed (its ``ChildExited`` is coming).
        """
        child = self._children.get(name)
        if child is None:
            return False
        self._stopping.stop(child, stop_timeout)
        return True

    def kill(self, name: str) -> bool:
        """SIGKILL the process group of ``name`` now (an expected stop)."""
        child = self._children.get(name)
        if child is None:
            return False
        self._stopping.kill(child)
        return True

    async def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        child_protocol: bool,
        load_timeout: float | None,
        host: str = LOOPBACK,
        keyed: bool = False,
    ) -> int:
        """Start ``argv`` + ``--host H --port P`` in its own session; return its pid.

        With ``keyed`` the child also gets ``--api-key-file F``: a new key for each spawn,
        reported in ``ChildStarted.key``. Returns once the process exists; readiness arrives
        later as ``ChildReady``.
        """
        if self._closed:
            raise SpawnError("the supervisor is shut down")
        if not argv:
            raise ValueError("empty argv")
        if name in self._children or name in self._reserved:
            raise ValueError(f"model {name!r} already has a live process")
        launch = Launch(name, tuple(argv), dict(env), child_protocol, load_timeout, host, keyed)
        self._reserved.add(name)
        try:
            child = await self._start(launch, attempt=1)
        finally:
            self._reserved.discard(name)
        if self._closed:  # shutdown() began while we were spawning
            self.kill(name)
        return child.pid

    async def shutdown(
        self, stop_timeout: float | Mapping[str, float] = float(DEFAULT_STOP_TIMEOUT)
    ) -> None:
        """Stop every child and await the exits; refuse new spawns.

        ``stop_timeout`` may map names to timeouts (missing names get the default). Children
        that are stuck past their deadline + ``kill_grace`` are left running and stay in the
        state file.
        """
        self._closed = True
        timeouts = {c.name: self._timeout_for(c.name, stop_timeout) for c in self._live()}
        for name, timeout in timeouts.items():
            self.stop(name, timeout)
        tasks = [c.task for c in self._live() if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=max(timeouts.values()) + 2 * self._kill_grace + 1)

    # ----------------------------------------------------------------- spawning and reaping

    async def _start(self, launch: Launch, attempt: int) -> Child:
        port = self._free_port()
        argv = (*launch.argv, "--host", launch.host, "--port", str(port))
        key = new_key() if launch.keyed else None
        key_file = None
        if key is not None:
            try:
                key_file = self._keys.write(launch.name, key)
            except OSError as exc:
                self._note(launch.name, None, f"failed to write the child's key file: {exc}")
                raise SpawnError(f"failed to write the child's key file: {exc}") from exc
            argv = (*argv, "--api-key-file", str(key_file))
        env = {**self._base_env, **launch.env}
        if launch.child_protocol:
            env["LLAMA_SERVER_ROUTER_PORT"] = str(self._router_port)  # S3
        self._note(launch.name, None, f"spawning (attempt {attempt}): {shlex.join(shown(argv))}")
        loop = asyncio.get_running_loop()
        # Its clock starts when it is asked for: the child runs while this task waits for the
        # spawn to return, and may wait a while for a busy loop (its load time is measured from
        # here, and was once measured 0.16 s short of the child's own load).
        asked = now()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: ExitProtocol(loop),
                *argv,  # S1: an argv list, never a shell
                stdin=asyncio.subprocess.PIPE,  # EOF on it makes a protocol child exit
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # own process group, for os.killpg (STYLE 5)
            )
        except OSError as exc:
            keys.remove(key_file)
            self._note(launch.name, None, f"failed to spawn server instance: {exc}")
            raise SpawnError(f"failed to spawn server instance: {exc}") from exc
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        child = Child(launch, proc, transport, protocol.exited, port, argv, attempt, asked)
        child.key, child.key_file = key, key_file
        try:
            child.create_time = create_time(proc.pid)
            self._children[launch.name] = child
            child.task = asyncio.create_task(self._run(child), name=f"supervise {launch.name}")
        except BaseException as exc:  # what it started must not outlive failed bookkeeping
            await self._abandon(child, exc)
            raise SpawnError(f"failed to watch the server instance: {exc}") from exc
        self._state.write()  # never raises: a child is watched whether or not it is recorded
        self._reporter.post(ChildStarted(launch.name, proc.pid, port, attempt, launch.host, key))
        if launch.load_timeout is not None:
            when = child.started + launch.load_timeout
            child.arm("load", when, lambda: self._stopping.on_load_timeout(child))
        return child

    async def _abandon(self, child: Child, why: BaseException) -> None:
        """Kill a child whose spawn could not be completed, and reap it (bounded)."""
        self._children.pop(child.name, None)
        self._note(child.name, None, f"spawned but not watched ({why}): killed")
        killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._kill_grace):
                await child.proc.wait()
        child.transport.close()
        keys.remove(child.key_file)

    async def _run(self, child: Child) -> None:
        assert child.proc.stdout is not None and child.proc.stderr is not None
        readers = [
            asyncio.create_task(self._output.read(child, child.proc.stdout, "stdout")),
            asyncio.create_task(self._output.read(child, child.proc.stderr, "stderr")),
        ]
        poller = (
            None if child.launch.child_protocol else asyncio.create_task(self._output.poll(child))
        )
        await child.exited_future  # S5: awaited, never polled
        exited_at = now()
        child.exited = True
        child.disarm()
        if poller is not None:
            poller.cancel()
        await self._drain(child, readers)
        child.transport.close()  # our pipe ends, even if a process outside the group holds theirs
        returncode = await child.proc.wait()  # at once: the exit status is known
        keys.remove(child.key_file)
        if self._should_retry(child):
            with contextlib.suppress(SpawnError):
                await self._retry(child)
                return
        self._children.pop(child.name, None)
        self._state.write()
        self._reporter.post(self._exit_event(child, returncode, exited_at))

    async def _retry(self, old: Child) -> None:
        self._note(old.name, old, f"port {old.port} is taken; retrying on another port (S2)")
        new = await self._start(old.launch, old.attempt + 1)
        if old.cancel_retry:  # a stop arrived while we were respawning
            self.kill(new.name)

    def _should_retry(self, child: Child) -> bool:
        return (
            child.bind_failed
            and child.ready_at is None
            and child.stop_requested_at is None
            and not child.cancel_retry
            and not child.load_timed_out
            and child.attempt <= self._bind_retries
            and not self._closed
        )

    async def _drain(self, child: Child, readers: list[asyncio.Task[None]]) -> None:
        """Kill what is left of the group, then read the pipes to EOF (bounded)."""
        killpg(child.pid, signal.SIGKILL)  # orphans of a wrapper go with it (STYLE 5)
        _, pending = await asyncio.wait(readers, timeout=self._kill_grace)
        if not pending:
            return
        if group_alive(child.pid):
            self._stopping.mark_stuck(
                child, self._kill_grace
            )  # S6: members survive SIGKILL, hold pipes
            await asyncio.wait(pending)
            return
        self._note(child.name, child, "output pipes held open outside the process group")
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _exit_event(self, child: Child, returncode: int, exited_at: float) -> ChildExited:
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
            error=None if requested is not None else exit_error(child, code, sig),
            last_lines=tuple(child.lines),
        )

    # ----------------------------------------------------------------- bookkeeping

    def _info(self, child: Child) -> ChildInfo:
        return ChildInfo(
            name=child.name,
            pid=child.pid,
            port=child.port,
            argv=tuple(shown(child.argv)),
            state=child.state,
            ready=child.ready_at is not None,
            stopping=child.stop_requested_at is not None,
            stop_deadline=child.stop_deadline,
            stuck=child.stuck,
        )

    def _live(self) -> list[Child]:
        return list(self._children.values())

    def _records(self) -> list[dict[str, Any]]:
        """The children as the state file lists them (S8)."""
        return [
            {
                "name": c.name,
                "pid": c.pid,
                "pgid": c.pid,  # start_new_session: the child leads its own group
                "create_time": c.create_time,
                "argv": shown(c.argv),
            }
            for c in self._children.values()
        ]

    def _free_port(self) -> int:
        taken = {c.port for c in self._children.values()}
        port = self._pick_port()
        for _ in range(10):
            if port not in taken:
                break
            port = self._pick_port()
        return port

    @staticmethod
    def _timeout_for(name: str, timeout: float | Mapping[str, float]) -> float:
        return (
            timeout.get(name, float(DEFAULT_STOP_TIMEOUT))
            if isinstance(timeout, Mapping)
            else timeout
        )
