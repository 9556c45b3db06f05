"""Stop a child (S4): ask it to exit, keep the deadline as data, SIGKILL the group at it.

A child that was never ready does not read stdin yet (ROUTER_SPEC 4.12) and is killed at once.
One that was ready gets the exit command (child protocol) or SIGTERM to its group, and SIGKILL
when its deadline passes; a group that survives SIGKILL for ``kill_grace`` is stuck (S6).
"""

from __future__ import annotations

import contextlib
import signal

from routerpanel.router.supervisor.child import Child, now
from routerpanel.router.supervisor.processes import killpg
from routerpanel.router.supervisor.protocol import EXIT_COMMAND
from routerpanel.router.supervisor.reporter import Reporter, log
from routerpanel.router.supervisor.reports import ChildStuck

EXIT_RESEND = 1.0  # seconds after the exit command before it is sent once more


class Stopping:
    """Stop and kill children; mark the ones that survive SIGKILL as stuck."""

    def __init__(self, reporter: Reporter, kill_grace: float) -> None:
        self._reporter = reporter
        self._note = reporter.note  # a line of the supervisor's own about a child
        self._kill_grace = kill_grace  # after SIGKILL, before a live group is stuck (S6)

    def stop(self, child: Child, stop_timeout: float) -> None:
        """Ask ``child`` to exit; SIGKILL its group at now + ``stop_timeout`` (S4).

        A second stop can only move the deadline earlier. A child whose exit is being
        processed (its ``ChildExited`` is coming) only gets no bind retry.
        """
        if child.exited:  # its ChildExited is coming; only make sure no bind retry follows
            child.cancel_retry = True
            return
        at = now()
        if child.stop_requested_at is None:
            child.stop_requested_at = at
        if child.ready_at is None or stop_timeout <= 0:
            # S4: a loading child does not read stdin yet (ROUTER_SPEC 4.12): kill at once.
            why = "stopped while loading" if child.ready_at is None else "stop timeout 0"
            self._force_kill(child, why)
            return
        deadline = at + stop_timeout
        if child.stop_deadline is not None and child.stop_deadline <= deadline:
            return
        if child.stop_deadline is None:
            self._ask_to_exit(child)
        child.stop_deadline = deadline  # STYLE 4: deadlines are data
        child.arm("deadline", deadline, lambda: self._on_stop_deadline(child))

    def kill(self, child: Child) -> None:
        """SIGKILL the process group of ``child`` now (an expected stop)."""
        if child.exited:  # its ChildExited is coming; only make sure no bind retry follows
            child.cancel_retry = True
            return
        if child.stop_requested_at is None:
            child.stop_requested_at = now()
        self._force_kill(child, "kill requested")

    def _ask_to_exit(self, child: Child, *, again: bool = False) -> None:
        if child.launch.child_protocol:
            assert child.proc.stdin is not None
            with contextlib.suppress(OSError, RuntimeError):  # already closing
                child.proc.stdin.write(EXIT_COMMAND)
            self._note(child.name, child, "sent the exit command" + (" again" if again else ""))
            if not again:
                # llama-server b11434 loses an exit command that arrives between its `ready` line
                # and the start of its task loop (start_loop() sets running = true after
                # terminate() set it false): say it once more a moment later.
                when = now() + EXIT_RESEND
                child.arm("resend", when, lambda: self._ask_to_exit(child, again=True))
        else:
            killpg(child.pid, signal.SIGTERM)
            self._note(child.name, child, "sent SIGTERM to the process group")

    def _on_stop_deadline(self, child: Child) -> None:
        self._force_kill(child, "force-killing after the stop timeout")

    def on_load_timeout(self, child: Child) -> None:
        if child.ready_at is None and not child.exited:
            child.load_timed_out = True
            self._force_kill(child, f"load timeout: not ready after {child.launch.load_timeout} s")

    def _force_kill(self, child: Child, reason: str) -> None:
        if child.killed_at is not None or child.exited:
            return
        child.killed_at = now()
        self._note(child.name, child, f"SIGKILL to process group {child.pid}: {reason}")
        killpg(child.pid, signal.SIGKILL)
        child.arm("stuck", child.killed_at + self._kill_grace, lambda: self.mark_stuck(child))

    def mark_stuck(self, child: Child, since: float | None = None) -> None:
        if child.stuck:
            return
        child.stuck = True
        if since is None:
            since = now() - (child.killed_at or child.started)
        self._note(child.name, child, f"still alive {since:.1f} s after SIGKILL (stuck)")
        log.warning("child %s (pid %d) survives SIGKILL", child.name, child.pid)
        self._reporter.post(ChildStuck(child.name, child.pid, since))
