"""Children off loopback are protected (issue 18): a keyed spawn, against real processes.

The supervisor gives every keyed spawn a fresh key in a 0600 file (``--api-key-file``, so the key
is not on the command line ``ps`` shows) and removes the file once the child has exited. The
simulated llama-server enforces the key as llama-server does: 401 in llama.cpp's error shape on
protected routes, ``/health`` public. The supervisor's own probes send the key where it is
needed; every command line it shows is masked.
"""

from __future__ import annotations

import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from routerpanel.router.address import LOOPBACK, ChildAddress
from routerpanel.router.config import RouterConfig
from routerpanel.router.engine import Engine
from routerpanel.router.probe import read_slots
from routerpanel.router.supervisor import ChildExited, ChildReady, ChildStarted, Supervisor
from tests.support.supervisor import PROJECT, WAIT, Recorder, sim

INVALID_KEY = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}


@pytest.fixture(autouse=True)
def _run_from_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECT)  # children import routerpanel from the working directory


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def sup(recorder: Recorder, data_dir: Path) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(recorder.post, state_file=data_dir / "children.json", kill_grace=2.0)
    yield supervisor
    await supervisor.shutdown(0)


async def spawn_keyed(
    sup: Supervisor, recorder: Recorder, name: str, *, protocol: bool = True
) -> tuple[ChildStarted, ChildReady]:
    await sup.spawn(
        name, sim("--metrics"), {}, child_protocol=protocol, load_timeout=WAIT, keyed=True
    )
    _, started = await recorder.wait_for(ChildStarted, name=name)
    _, ready = await recorder.wait_for(ChildReady, name=name)
    return started, ready


def address(started: ChildStarted) -> ChildAddress:
    return ChildAddress(started.host, started.port, started.key)


def key_files(data_dir: Path) -> list[Path]:
    return sorted(data_dir.glob("child-key-*"))


class TestKeyedChild:
    async def test_it_refuses_a_request_without_the_key_and_takes_the_routers(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        started, _ = await spawn_keyed(sup, recorder, "m")
        child = address(started)
        assert child.key and child.host == LOOPBACK
        body = {"content": "hello"}
        async with httpx.AsyncClient(base_url=child.url, trust_env=False, timeout=WAIT) as client:
            bare = await client.post("/tokenize", json=body)
            wrong = await client.post("/tokenize", json=body, headers={"X-Api-Key": "nope"})
            keyed = await client.post("/tokenize", json=body, headers=child.headers())
            health = await client.get("/health")
            v1_health = await client.get("/v1/health")
            models = await client.get("/v1/models")
        assert (bare.status_code, bare.json()) == (401, INVALID_KEY)
        assert (wrong.status_code, wrong.json()) == (401, INVALID_KEY)
        assert keyed.status_code == 200 and keyed.json()["tokens"]
        assert health.status_code == v1_health.status_code == 200  # public, as in llama-server
        assert models.status_code == 401  # b11434 protects it (ROUTER_SPEC 9.1)

    async def test_every_spawn_gets_a_new_key(self, sup: Supervisor, recorder: Recorder) -> None:
        first, _ = await spawn_keyed(sup, recorder, "a")
        second, _ = await spawn_keyed(sup, recorder, "b")
        assert sup.stop("a", 5.0)
        await recorder.wait_for(ChildExited, name="a")
        recorder.events.clear()
        again, _ = await spawn_keyed(sup, recorder, "a")
        keys = {first.key, second.key, again.key}
        assert len(keys) == 3 and None not in keys
        url = f"{address(again).url}/slots"
        async with httpx.AsyncClient(trust_env=False, timeout=WAIT) as client:
            stale = await client.get(url, headers=address(first).headers())
            fresh = await client.get(url, headers=address(again).headers())
        assert (stale.status_code, fresh.status_code) == (401, 200)

    async def test_no_command_line_shows_the_key(
        self, sup: Supervisor, recorder: Recorder, data_dir: Path
    ) -> None:
        started, _ = await spawn_keyed(sup, recorder, "m")
        key = started.key
        assert key is not None
        cmdline = psutil.Process(started.pid).cmdline()
        assert "--api-key-file" in cmdline and "--api-key" not in cmdline
        assert key not in " ".join(cmdline)  # what ps shows
        info = sup.live()["m"]
        assert info.argv[-2:] == ("--api-key-file", cmdline[-1])
        assert key not in " ".join(info.argv)
        assert key not in (data_dir / "children.json").read_text()
        assert any("--api-key-file" in text for text in recorder.texts("router"))
        assert not any(key in text for text in recorder.texts())
        assert key not in repr(started) and key not in repr(recorder.events)

    async def test_the_key_file_is_private_and_gone_after_the_exit(
        self, sup: Supervisor, recorder: Recorder, data_dir: Path
    ) -> None:
        started, _ = await spawn_keyed(sup, recorder, "m")
        (path,) = key_files(data_dir)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().strip() == started.key
        assert sup.stop("m", 5.0)
        await recorder.wait_for(ChildExited, name="m")
        assert key_files(data_dir) == []
        assert json.loads((data_dir / "children.json").read_text())["children"] == []

    async def test_the_key_file_goes_when_the_child_is_killed(
        self, sup: Supervisor, recorder: Recorder, data_dir: Path
    ) -> None:
        await spawn_keyed(sup, recorder, "m")
        assert len(key_files(data_dir)) == 1
        assert sup.kill("m")
        await recorder.wait_for(ChildExited, name="m")
        assert key_files(data_dir) == []

    async def test_an_unkeyed_spawn_gets_no_key(
        self, sup: Supervisor, recorder: Recorder, data_dir: Path
    ) -> None:
        await sup.spawn("m", sim(), {}, child_protocol=True, load_timeout=WAIT)
        _, started = await recorder.wait_for(ChildStarted, name="m")
        await recorder.wait_for(ChildReady, name="m")
        assert started.key is None and key_files(data_dir) == []
        assert "--api-key-file" not in sup.live()["m"].argv


class TestProbes:
    async def test_a_plain_keyed_child_is_ready_through_its_health(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        started, ready = await spawn_keyed(sup, recorder, "plain", protocol=False)
        assert ready.info == {} and started.key  # readiness came from the /health probe

    async def test_the_hang_probe_reads_slots_with_the_key(
        self, sup: Supervisor, recorder: Recorder
    ) -> None:
        started, _ = await spawn_keyed(sup, recorder, "m")
        keyed = await read_slots(address(started), 5.0)
        unkeyed = await read_slots(ChildAddress(started.host, started.port), 5.0)
        assert keyed is not None and keyed.counters is not None  # /slots answered
        assert unkeyed is not None and (unkeyed.counters, unkeyed.status) == (None, 401)


class TestLeftovers:
    async def test_a_killed_routers_key_files_go_and_a_live_childs_stays(
        self, sup: Supervisor, recorder: Recorder, data_dir: Path
    ) -> None:
        await spawn_keyed(sup, recorder, "m")
        (live,) = key_files(data_dir)
        stale = data_dir / "child-key-old-0123456789ab"
        stale.write_text("left by a router killed with -9\n")
        assert sup.remove_stale_keys() == 1
        assert key_files(data_dir) == [live]

    async def test_an_engine_removes_them_at_start(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True)
        stale = data_dir / "child-key-old-0123456789ab"
        stale.write_text("left by a router killed with -9\n")
        engine = Engine(RouterConfig(child_keys=True), [], state_file=data_dir / "children.json")
        await engine.start()
        try:
            assert not stale.exists()
        finally:
            await engine.shutdown()
