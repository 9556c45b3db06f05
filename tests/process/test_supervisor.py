"""The supervisor against real processes (DESIGN S1-S8): the simulated llama-server, plus tiny
inline children only for misbehaviour the simserver cannot show (bad protocol lines, a
grandchild, a huge line, an environment dump).

Every wait is bounded (``Recorder.wait_for``) and every child is killed by the ``sup`` fixture.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.supervisor import (
    ChildExited,
    ChildReady,
    ChildStarted,
    ChildState,
    ChildStuck,
    SpawnError,
    Supervisor,
    pick_free_port,
    reap_leftovers,
)
from routerpanel.router.supervisor import core as supervisor_core
from routerpanel.router.supervisor import output as supervisor_module  # where _poll looks it up
from tests.support.supervisor import PROJECT, WAIT, Recorder, inline, sim


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    return tmp_path / "state" / "children.json"


@pytest.fixture
async def sup(recorder: Recorder, state_file: Path) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(recorder.post, state_file=state_file, kill_grace=2.0)
    yield supervisor
    await supervisor.shutdown(0)


@pytest.fixture(autouse=True)
def _run_from_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECT)  # children import routerpanel from the working directory


def dead(pid: int) -> bool:
    """True when ``pid`` is gone or a zombie (its parent may never reap it)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    """Wait for something outside our event stream (another process's fate)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.05)


class TestReadiness:
    async def test_a_protocol_child_is_ready_from_its_state_lines_without_any_health_request(
        self, sup: Supervisor, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        probes: list[int] = []

        async def probe(port: int, timeout: float = 2.0) -> int | None:
            probes.append(port)
            return None

        monkeypatch.setattr(supervisor_module, "probe_health", probe)
        pid = await sup.spawn(
            "m", sim("--sim-load-ms", "300"), {}, child_protocol=True, load_timeout=WAIT
        )
        _, started = await recorder.wait_for(ChildStarted, name="m")
        _, ready = await recorder.wait_for(ChildReady, name="m")
        assert started.pid == pid and ready.port == started.port
        assert ready.info["id"]
        assert ready.load_seconds >= 0.3
        assert recorder.find(ChildState, name="m", state="loading") is not None  # progress
        assert probes == []  # the same probe does make a plain child ready (next test)
        assert sup.live()["m"].ready

    async def test_the_load_time_counts_from_the_spawn_even_when_the_loop_resumes_late(
        self, sup: Supervisor, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A busy machine: the child runs while the spawning task waits to be resumed."""
        loop = asyncio.get_running_loop()
        spawn = loop.subprocess_exec

        async def slow_to_resume(*args: object, **kwargs: object) -> object:
            spawned = await spawn(*args, **kwargs)  # type: ignore[arg-type]
            time.sleep(0.4)  # the loop is held up: the child loads meanwhile
            return spawned

        monkeypatch.setattr(loop, "subprocess_exec", slow_to_resume)
        await sup.spawn(
            "m", sim("--sim-load-ms", "300"), {}, child_protocol=True, load_timeout=WAIT
        )
        _, ready = await recorder.wait_for(ChildReady, name="m")
        assert ready.load_seconds >= 0.3  # counted from the spawn's return: 0.002 s

    async def test_a_plain_child_is_ready_when_health_answers_200(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "plain", sim("--sim-load-ms", "500"), {}, child_protocol=False, load_timeout=WAIT
        )
        _, ready = await recorder.wait_for(ChildReady, name="plain")
        assert ready.info == {}
        assert ready.load_seconds >= 0.5
        assert recorder.of(ChildState) == []
        async with httpx.AsyncClient(trust_env=False) as client:
            health = await client.get(f"http://127.0.0.1:{ready.port}/health")
        assert health.status_code == 200

    async def test_sleep_and_wake_are_reported_as_child_states(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "dozy", sim("--sleep-idle-seconds", "1"), {}, child_protocol=True, load_timeout=WAIT
        )
        _, ready = await recorder.wait_for(ChildReady, name="dozy")
        await recorder.wait_for(ChildState, name="dozy", state="sleeping")
        assert sup.live()["dozy"].state == "sleeping"
        body = {"prompt": "hi", "n_predict": 1}
        async with httpx.AsyncClient(trust_env=False, timeout=WAIT) as client:
            reply = await client.post(f"http://127.0.0.1:{ready.port}/completion", json=body)
        assert reply.status_code == 200
        _, woken = await recorder.wait_for(ChildState, name="dozy", state="ready")
        assert woken.payload == {}
        states = [s.state for s in recorder.of(ChildState)]
        assert "loading" in states[states.index("sleeping") :]  # the wake-up reload
        assert sup.stop("dozy", 10.0)
        _, exited = await recorder.wait_for(ChildExited, name="dozy")
        assert exited.exit_code == 0 and not exited.force_killed

    async def test_it_appends_host_and_port_and_sets_the_router_port_variable(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        script = (
            "import os, sys; print(repr(sys.argv[1:]), file=sys.stderr);"
            "print('router port', os.environ.get('LLAMA_SERVER_ROUTER_PORT'), file=sys.stderr)"
        )
        await sup.spawn(
            "argv", inline(script, "-m", "x"), {}, child_protocol=True, load_timeout=WAIT
        )
        _, started = await recorder.wait_for(ChildStarted, name="argv")
        await recorder.wait_for(ChildExited, name="argv")
        texts = recorder.texts("stderr")
        assert repr(["-m", "x", "--host", "127.0.0.1", "--port", str(started.port)]) in texts
        assert "router port 0" in texts

    async def test_malformed_and_unknown_state_lines_are_logged_and_ignored(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        prefix = "cmd_child_to_router:state:"
        lines = [
            prefix + "{not json",
            prefix + json.dumps({"state": "exploding", "payload": {}}),
            prefix + json.dumps({"state": "ready", "payload": [1]}),
            prefix + "[]",
            prefix + json.dumps({"state": ["ready"], "payload": {}}),
            prefix + "[" * 100_000,
            "stray stdout",
            prefix + json.dumps({"state": "loading", "payload": {"value": 0.5}}),
            prefix + json.dumps({"state": "ready", "payload": {"id": "m"}}),
        ]
        script = (
            "import json, sys\n"
            "for raw in json.loads(sys.argv[1]): print(raw, flush=True)\n"
            "for line in sys.stdin:\n"
            "    if 'cmd_router_to_child:exit' in line: sys.exit(0)\n"
            "sys.exit(1)\n"
        )
        await sup.spawn(
            "bad", inline(script, json.dumps(lines)), {}, child_protocol=True, load_timeout=WAIT
        )
        _, ready = await recorder.wait_for(ChildReady, name="bad")
        assert ready.info == {"id": "m"}
        assert [(s.state, s.payload) for s in recorder.of(ChildState)] == [
            ("loading", {"value": 0.5})
        ]
        # The first is shown; the rest are counted (one note a second, never one per line).
        ignored = [t for t in recorder.texts("router") if t.startswith("ignored malformed")]
        assert ignored == ["ignored malformed state line: {not json"]
        assert "stray stdout" in recorder.texts("stdout")
        assert sup.stop("bad", 10.0)
        _, exited = await recorder.wait_for(ChildExited, name="bad")
        assert exited.exit_code == 0
        counted = [t for t in recorder.texts("router") if "more malformed state lines" in t]
        assert sum(int(t.split()[0]) for t in counted) == 5  # the other five: counted, said


class TestStopping:
    async def test_the_exit_command_gives_exit_code_0_and_an_expected_exit(
        self, sup: Supervisor, recorder: Recorder, state_file: Path
    ) -> None:
        await sup.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
        await recorder.wait_for(ChildReady, name="m")
        assert sup.stop("m", 10.0)
        assert sup.live()["m"].stopping
        _, exited = await recorder.wait_for(ChildExited, name="m")
        assert exited.exit_code == 0 and exited.signal is None
        assert exited.expected and not exited.force_killed and exited.was_ready
        assert exited.error is None
        assert exited.stop_seconds is not None and exited.stop_seconds < 10.0
        assert "m" not in sup.live()
        assert json.loads(state_file.read_text())["children"] == []

    async def test_a_lost_exit_command_is_sent_again_before_the_deadline(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        # As llama-server b11434 does when the command lands before its task loop starts.
        script = (
            "import sys\n"
            'print(\'cmd_child_to_router:state:{"state": "ready", "payload": {}}\', '
            "flush=True)\n"
            "seen = 0\n"
            "for line in sys.stdin:\n"
            "    if 'cmd_router_to_child:exit' in line:\n"
            "        seen += 1\n"
            "        if seen == 2:\n"
            "            sys.exit(0)\n"
        )
        await sup.spawn("lossy", inline(script), {}, child_protocol=True, load_timeout=WAIT)
        await recorder.wait_for(ChildReady, name="lossy")
        assert sup.stop("lossy", 30.0)
        _, exited = await recorder.wait_for(ChildExited, name="lossy")
        assert exited.exit_code == 0 and not exited.force_killed
        assert exited.stop_seconds is not None and 0.9 < exited.stop_seconds < 5.0
        assert "sent the exit command again" in recorder.texts("router")

    async def test_a_sigterm_ignoring_child_is_sigkilled_at_its_stop_timeout(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "deaf", sim("--sim-ignore-sigterm"), {}, child_protocol=False, load_timeout=WAIT
        )
        await recorder.wait_for(ChildReady, name="deaf")
        asked = time.monotonic()
        assert sup.stop("deaf", 2.0)
        exited_at, exited = await recorder.wait_for(ChildExited, name="deaf")
        elapsed = exited_at - asked
        print(f"SIGKILL observed {elapsed:.3f} s after stop(stop_timeout=2.0)")
        # Never before the deadline (now + 2.0 inside stop(), after ``asked``). How soon after
        # it depends on how busy the machine is (the SIGKILL is a loop.call_at at the stored
        # deadline); the upper bound only tells it from a later escalation (a shutdown).
        assert 2.0 <= elapsed < 2.0 + 10.0
        assert exited.signal == signal.SIGKILL and exited.exit_code is None
        assert exited.expected and exited.force_killed and exited.error is None

    async def test_a_loading_child_is_killed_at_once(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "slow", sim("--sim-load-ms", "120000"), {}, child_protocol=True, load_timeout=None
        )
        await recorder.wait_for(ChildStarted, name="slow")
        asked = time.monotonic()
        assert sup.stop("slow", 30.0)
        exited_at, exited = await recorder.wait_for(ChildExited, name="slow")
        assert exited_at - asked < 10.0  # nowhere near the 30 s stop timeout
        assert exited.signal == signal.SIGKILL
        assert exited.expected and exited.force_killed and not exited.was_ready

    async def test_a_stop_timeout_of_zero_kills_at_once(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "m", sim("--sim-ignore-sigterm"), {}, child_protocol=False, load_timeout=WAIT
        )
        await recorder.wait_for(ChildReady, name="m")
        assert sup.stop("m", 0)
        _, exited = await recorder.wait_for(ChildExited, name="m", timeout=10.0)
        assert exited.signal == signal.SIGKILL and exited.force_killed

    async def test_the_whole_process_group_dies_grandchild_included(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        wrapper = "\n".join(
            [
                "import os, subprocess, sys",
                "hold = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                " time.sleep(300)'",
                "g = subprocess.Popen([sys.executable, '-c', hold], stdin=subprocess.DEVNULL,",
                "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)",
                "print('grandchild', g.pid, file=sys.stderr, flush=True)",
                "os.execv(sys.executable, [sys.executable, '-m', 'routerpanel.router.simserver',"
                " *sys.argv[1:]])",
            ]
        )
        argv = inline(wrapper, "-m", "tiny.gguf", "--sim-ignore-sigterm")
        await sup.spawn("wrapped", argv, {}, child_protocol=False, load_timeout=WAIT)
        await recorder.wait_for(ChildReady, name="wrapped")
        line = next(t for t in recorder.texts("stderr") if t.startswith("grandchild"))
        grandchild = int(line.split()[1])
        assert not dead(grandchild)
        sup.stop("wrapped", 1.0)
        _, exited = await recorder.wait_for(ChildExited, name="wrapped")
        assert exited.force_killed
        await until(lambda: dead(grandchild), timeout=10.0)

    async def test_orphans_left_by_a_clean_exit_are_killed_with_their_group(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        script = "\n".join(
            [
                "import subprocess, sys",
                "g = subprocess.Popen(['sleep', '300'])  # inherits (holds) all three pipes",
                "print('grandchild', g.pid, file=sys.stderr, flush=True)",
            ]
        )
        await sup.spawn("quitter", inline(script), {}, child_protocol=True, load_timeout=WAIT)
        _, exited = await recorder.wait_for(ChildExited, name="quitter")
        assert exited.exit_code == 0 and not exited.expected
        line = next(t for t in recorder.texts("stderr") if t.startswith("grandchild"))
        await until(lambda: dead(int(line.split()[1])), timeout=10.0)

    async def test_a_group_that_survives_sigkill_is_reported_stuck_and_still_awaited(
        self, recorder: Recorder, state_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        real_killpg = os.killpg
        swallowed: list[int] = []

        def killpg_that_fails(pgid: int, sig: int) -> None:
            if sig == signal.SIGKILL:
                swallowed.append(pgid)  # as if the process were stuck in the kernel
                return
            real_killpg(pgid, sig)

        monkeypatch.setattr(os, "killpg", killpg_that_fails)
        supervisor = Supervisor(recorder.post, state_file=state_file, kill_grace=0.5)
        pid = await supervisor.spawn(
            "stuck",
            inline("import time; time.sleep(300)"),
            {},
            child_protocol=True,
            load_timeout=None,
        )
        try:
            assert supervisor.kill("stuck")
            _, stuck = await recorder.wait_for(ChildStuck, name="stuck", timeout=10.0)
            assert stuck.pid == pid and stuck.seconds_since_kill >= 0.5
            assert supervisor.live()["stuck"].stuck
            assert recorder.find(ChildExited) is None
        finally:
            os.kill(pid, signal.SIGKILL)  # it finally dies
        _, exited = await recorder.wait_for(ChildExited, name="stuck")
        assert exited.signal == signal.SIGKILL and exited.force_killed
        assert pid in swallowed
        assert supervisor.live() == {}

    async def test_stop_and_kill_of_an_unknown_name_do_nothing(self, sup: Supervisor) -> None:
        assert not sup.stop("nobody", 1.0)
        assert not sup.kill("nobody")


class TestFailures:
    async def test_a_failed_load_is_reported_with_the_last_log_lines(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "broken", sim("--sim-fail-load"), {}, child_protocol=True, load_timeout=WAIT
        )
        _, exited = await recorder.wait_for(ChildExited, name="broken")
        assert exited.exit_code not in (0, None)
        assert not exited.expected and not exited.was_ready and not exited.force_killed
        assert exited.error is not None and "while loading" in exited.error
        assert any(line.stream == "stderr" for line in exited.last_lines)
        assert sup.logs("broken")[-len(exited.last_lines) :] == list(exited.last_lines)

    async def test_a_crash_after_ready_is_reported_with_the_last_log_lines(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "crashy", sim("--sim-crash-after", "1"), {}, child_protocol=True, load_timeout=WAIT
        )
        _, ready = await recorder.wait_for(ChildReady, name="crashy")
        body = {"prompt": "hi", "n_predict": 1}
        async with httpx.AsyncClient(trust_env=False, timeout=WAIT) as client:
            for _ in range(2):
                try:
                    await client.post(f"http://127.0.0.1:{ready.port}/completion", json=body)
                except httpx.HTTPError:
                    break
        _, exited = await recorder.wait_for(ChildExited, name="crashy")
        assert not exited.expected and exited.was_ready
        assert exited.exit_code != 0
        assert exited.error is not None and "after it was ready" in exited.error
        assert exited.last_lines

    async def test_a_load_timeout_kills_the_child_and_fails_the_load(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        await sup.spawn(
            "slow", sim("--sim-load-ms", "120000"), {}, child_protocol=True, load_timeout=1.0
        )
        _, exited = await recorder.wait_for(ChildExited, name="slow")
        assert exited.force_killed and not exited.expected and not exited.was_ready
        assert exited.error is not None and exited.error.startswith("load timeout")
        assert 1.0 <= exited.duration < 20.0
        assert any("load timeout" in line.text for line in exited.last_lines)

    async def test_a_missing_binary_raises_and_posts_nothing_but_a_log_line(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        with pytest.raises(SpawnError, match="failed to spawn server instance"):
            await sup.spawn(
                "ghost", ["/nonexistent/llama-server"], {}, child_protocol=True, load_timeout=WAIT
            )
        assert recorder.of(ChildStarted) == []
        assert sup.live() == {}

    async def test_a_spawn_whose_bookkeeping_fails_kills_what_it_started(
        self, sup: Supervisor, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        started: list[int] = []

        def create_time(pid: int) -> float:
            started.append(pid)
            raise RuntimeError("the books are closed")

        monkeypatch.setattr(supervisor_core, "create_time", create_time)
        with pytest.raises(SpawnError, match="failed to watch the server instance"):
            await sup.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
        [pid] = started
        assert dead(pid)  # nothing it started runs on unwatched
        assert recorder.of(ChildStarted) == [] and sup.live() == {}

    async def test_a_state_file_that_cannot_be_written_leaves_the_child_watched(
        self, sup: Supervisor, recorder: Recorder, state_file: Path
    ) -> None:
        state_file.parent.mkdir(parents=True)
        state_file.mkdir()  # a directory in its place: every write fails (as on a full disk)
        await sup.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
        await recorder.wait_for(ChildReady, name="m")
        assert (
            sup.state_problem is not None and "could not write the state file" in sup.state_problem
        )
        pid = sup.live()["m"].pid
        os.kill(pid, signal.SIGKILL)
        _, exited = await recorder.wait_for(ChildExited, name="m")  # its exit is still seen
        assert exited.signal == signal.SIGKILL and sup.live() == {}
        state_file.rmdir()  # the disk takes writes again: the retry writes the file
        async with asyncio.timeout(WAIT):
            while not state_file.is_file():
                await asyncio.sleep(0.05)
        assert sup.state_problem is None and json.loads(state_file.read_text())["children"] == []

    async def test_a_live_name_cannot_be_spawned_twice(self, sup: Supervisor) -> None:
        await sup.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
        with pytest.raises(ValueError, match="already has a live process"):
            await sup.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


class TestPorts:
    async def test_a_bind_failure_is_retried_on_another_port(
        self, recorder: Recorder, state_file: Path, busy_port: int
    ) -> None:
        ports = iter([busy_port])
        supervisor = Supervisor(
            recorder.post,
            state_file=state_file,
            port_picker=lambda: next(ports, None) or pick_free_port(),
        )
        try:
            await supervisor.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
            _, ready = await recorder.wait_for(ChildReady, name="m")
            starts = recorder.of(ChildStarted)
            assert [(s.attempt, s.port == busy_port) for s in starts] == [(1, True), (2, False)]
            assert ready.port == starts[1].port
            assert recorder.find(ChildExited) is None  # the failed attempt is not an exit
            assert any("retrying on another port" in t for t in recorder.texts("router"))
        finally:
            await supervisor.shutdown(0)

    async def test_bind_retries_are_bounded(
        self, recorder: Recorder, state_file: Path, busy_port: int
    ) -> None:
        supervisor = Supervisor(
            recorder.post, state_file=state_file, bind_retries=2, port_picker=lambda: busy_port
        )
        try:
            await supervisor.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
            _, exited = await recorder.wait_for(ChildExited, name="m")
            assert [s.attempt for s in recorder.of(ChildStarted)] == [1, 2, 3]
            assert exited.error == "could not bind a port after 3 attempts"
            assert not exited.expected
        finally:
            await supervisor.shutdown(0)


class TestLogsAndEnvironment:
    async def test_lines_are_capped_and_kept_in_a_ring_buffer(
        self, recorder: Recorder, state_file: Path
    ) -> None:
        script = (
            "import sys\n"
            "for i in range(30): print('line', i, file=sys.stderr)\n"
            "print('x' * 200000, file=sys.stderr)\n"
            "print('end', end='', file=sys.stderr)\n"
        )
        supervisor = Supervisor(recorder.post, state_file=state_file, log_lines=10)
        await supervisor.spawn("noisy", inline(script), {}, child_protocol=False, load_timeout=WAIT)
        _, exited = await recorder.wait_for(ChildExited, name="noisy")
        logs = supervisor.logs("noisy")
        assert len(logs) == 10
        long_line = next(t for t in recorder.texts("stderr") if t.startswith("xxx"))
        assert len(long_line) == 64 * 1024 + len(" [line truncated]")
        assert long_line.endswith(" [line truncated]")
        assert recorder.texts("stderr")[-1] == "end"  # a final partial line is kept
        assert [line.text for line in logs][-2:] == [long_line, "end"]
        assert exited.last_lines[-1].text == "end"

    async def test_router_only_variables_do_not_reach_the_child(
        self, recorder: Recorder, state_file: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for name in (
            "LLAMA_API_KEY",
            "LLAMA_ARG_API_KEY_FILE",
            "LLAMA_ARG_MODELS_MAX",
            "ROUTERPANEL_SECRET_KEY",
            "EXTRA_SECRET",
            "KEEP_ME",
        ):
            monkeypatch.setenv(name, "1")
        supervisor = Supervisor(recorder.post, state_file=state_file, strip_env={"EXTRA_*"})
        script = "import os, sys; print(' '.join(sorted(os.environ)), file=sys.stderr)"
        await supervisor.spawn(
            "env", inline(script), {"PRESET_VAR": "2"}, child_protocol=False, load_timeout=WAIT
        )
        await recorder.wait_for(ChildExited, name="env")
        names = set(recorder.texts("stderr")[-1].split())
        assert {"KEEP_ME", "PRESET_VAR", "PATH"} <= names
        assert not names & {
            "LLAMA_API_KEY",
            "LLAMA_ARG_API_KEY_FILE",
            "LLAMA_ARG_MODELS_MAX",
            "ROUTERPANEL_SECRET_KEY",
            "EXTRA_SECRET",
            "LLAMA_SERVER_ROUTER_PORT",
        }


class TestStateFile:
    async def test_the_state_file_records_each_live_child(
        self, sup: Supervisor, recorder: Recorder, state_file: Path
    ) -> None:
        pid = await sup.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
        (entry,) = json.loads(state_file.read_text())["children"]
        assert entry["name"] == "m" and entry["pid"] == pid and entry["pgid"] == pid
        assert entry["create_time"] == psutil.Process(pid).create_time()
        assert entry["argv"][-4:-1] == ["--host", "127.0.0.1", "--port"]
        assert [p.name for p in state_file.parent.iterdir()] == ["children.json"]

    async def test_leftovers_of_a_crashed_router_are_reaped_but_a_reused_pid_is_not(
        self, recorder: Recorder, state_file: Path, tmp_path: Path
    ) -> None:
        crashed = Supervisor(recorder.post, state_file=state_file)
        pid = await crashed.spawn("left", sim(), {}, child_protocol=False, load_timeout=WAIT)
        await recorder.wait_for(ChildReady, name="left")
        # The router "crashes": nobody stops the child, and the file it left behind is all the
        # next router sees. (A copy: the dropped supervisor, still in this loop, would rewrite
        # its own file when the child dies.) Add a record whose pid now belongs to an
        # unrelated process (create_time differs): it must survive.
        left_behind = tmp_path / "left-behind.json"
        data = json.loads(state_file.read_text())
        bystander = subprocess.Popen(["sleep", "60"])
        try:
            data["children"].append(
                {
                    "name": "reused",
                    "pid": bystander.pid,
                    "pgid": bystander.pid,
                    "create_time": 12345.0,
                    "argv": ["llama-server"],
                }
            )
            left_behind.write_text(json.dumps(data))
            found = await asyncio.to_thread(reap_leftovers, left_behind)
            assert {(f.name, f.outcome) for f in found} == {
                ("left", "killed"),
                ("reused", "pid_reused"),
            }
            left = next(f for f in found if f.name == "left")
            assert left.pid == pid and pid in left.killed_pids
            assert dead(pid)
            assert bystander.poll() is None
            assert not left_behind.exists()  # consumed
            assert await asyncio.to_thread(reap_leftovers, left_behind) == []
        finally:
            bystander.kill()
            bystander.wait(timeout=10)
        _, exited = await recorder.wait_for(ChildExited, name="left")
        assert exited.signal == signal.SIGKILL and not exited.expected

    async def test_children_exit_when_the_router_dies(self, state_file: Path) -> None:
        router_script = "\n".join(
            [
                "import asyncio, sys",
                "from pathlib import Path",
                "from routerpanel.router.supervisor import ChildReady, Supervisor",
                "async def main():",
                "    ready = asyncio.Event()",
                "    def post(event):",
                "        if isinstance(event, ChildReady): ready.set()",
                "    sup = Supervisor(post, state_file=Path(sys.argv[1]))",
                "    argv = [sys.executable, '-m', 'routerpanel.router.simserver', '-m', 'x.gguf']",
                "    pid = await sup.spawn('m', argv, {}, child_protocol=True, load_timeout=60)",
                "    await ready.wait()",
                "    print(pid, flush=True)",
                "    await asyncio.sleep(3600)",
                "asyncio.run(main())",
            ]
        )
        router = await asyncio.create_subprocess_exec(
            sys.executable, "-c", router_script, str(state_file), stdout=subprocess.PIPE
        )
        try:
            assert router.stdout is not None
            child = int(await asyncio.wait_for(router.stdout.readline(), WAIT))
            assert not dead(child)
            router.kill()  # a router crash: the child's stdin reaches EOF
            await router.wait()
            await until(lambda: dead(child), timeout=30.0)
        finally:
            if router.returncode is None:
                router.kill()
                await router.wait()
            await asyncio.to_thread(reap_leftovers, state_file)
