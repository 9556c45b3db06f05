"""A child that floods its output does not flood the router (flood.py), and the simulated
server's /slots counters move like llama-server's while a prompt is processed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from routerpanel.router.address import LOOPBACK, ChildAddress
from routerpanel.router.probe import read_slots
from routerpanel.router.supervisor import ChildReady, LogLine, Supervisor
from routerpanel.router.supervisor.flood import BURST, RATE
from tests.support.supervisor import PROJECT, Recorder, inline, sim
from tests.support.waits import settled


@pytest.fixture(autouse=True)
def _run_from_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(PROJECT)


@pytest.fixture
async def flooding() -> AsyncIterator[tuple[Supervisor, Recorder]]:
    recorder = Recorder()
    sup = Supervisor(recorder.post, state_file=None, kill_grace=2.0)
    yield sup, recorder
    await sup.shutdown(0)


async def test_a_flooding_child_is_read_but_only_a_budget_of_lines_is_streamed(
    flooding: tuple[Supervisor, Recorder],
) -> None:
    sup, recorder = flooding
    await sup.spawn("f", sim("--sim-flood"), {}, child_protocol=True, load_timeout=60)
    await recorder.wait_for(ChildReady, name="f")
    started = time.monotonic()
    ticks, lag = 0, 0.0
    while time.monotonic() - started < 3.0:  # the loop must stay responsive meanwhile
        before = time.monotonic()
        await asyncio.sleep(0.01)
        lag = max(lag, time.monotonic() - before - 0.01)
        ticks += 1
    elapsed = time.monotonic() - started
    flood_lines = [e for e in recorder.of(LogLine) if "simserver flood" in e.text]
    notes = [e.text for e in recorder.of(LogLine) if "lines not shown" in e.text]
    assert len(flood_lines) <= BURST + RATE * (elapsed + 1)
    assert len(flood_lines) >= RATE  # it is still shown, at the budget's rate
    assert notes, "the dropped lines are reported"
    assert sum(int(n.split()[0]) for n in notes) > 10 * len(flood_lines)  # it really flooded
    assert lag < 0.5, f"the event loop stalled for {lag:.3f} s"
    assert "simserver flood" in sup.logs("f")[-1].text or notes  # the ring keeps the end


async def test_the_simulated_slots_show_prompt_progress_then_decoding(
    flooding: tuple[Supervisor, Recorder],
) -> None:
    sup, recorder = flooding
    flags = ("--sim-prefill-ms", "1500", "--sim-token-ms", "50", "--sim-tokens", "20")
    await sup.spawn("s", sim(*flags), {}, child_protocol=True, load_timeout=60)
    _, ready = await recorder.wait_for(ChildReady, name="s")
    body = {"prompt": "one two three four five six seven eight", "n_predict": 20}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ready.port}", timeout=30) as c:
        request = asyncio.create_task(c.post("/completion", json=body))
        readings = []
        for _ in range(8):
            await asyncio.sleep(0.3)
            readings.append(await read_slots(ChildAddress(LOOPBACK, ready.port), 5.0))
        assert (await settled(request)).status_code == 200
    counters = [r.counters for r in readings if r is not None and r.counters]
    assert len(counters) >= 5
    assert len(set(counters)) >= 4, f"counters should move: {counters}"
    tokens = [c[0][2] for c in counters]
    assert tokens == sorted(tokens)


async def test_lines_that_only_look_like_state_lines_count_against_the_budget_too(
    flooding: tuple[Supervisor, Recorder],
) -> None:
    """A child of the protocol writing ``cmd_child_to_router:state:garbage`` as fast as its pipe
    takes it: those lines used to pass the budget and each became a note; now they are counted,
    and what reaches the router stays within the budgets (log lines and state lines)."""
    sup, recorder = flooding
    script = (
        "import sys\n"
        "line = b'cmd_child_to_router:state:garbage\\n' * 1000\n"
        "while True: sys.stdout.buffer.write(line)\n"
    )
    await sup.spawn("g", inline(script), {}, child_protocol=True, load_timeout=None)
    started = time.monotonic()
    ticks, lag = 0, 0.0
    while time.monotonic() - started < 3.0:
        before = time.monotonic()
        await asyncio.sleep(0.01)
        lag = max(lag, time.monotonic() - before - 0.01)
        ticks += 1
    elapsed = time.monotonic() - started
    router = [e.text for e in recorder.of(LogLine) if e.stream == "router" and e.name == "g"]
    noted = [t for t in router if t.startswith("ignored malformed")]
    counted = [t for t in router if "more malformed state lines" in t or "lines not shown" in t]
    assert len(noted) <= elapsed + 2, len(noted)  # one a second, not one a line
    assert sum(int(t.split()[0]) for t in counted) > 10_000  # it really flooded: counted
    assert len(router) <= 3 * (elapsed + 2) + 2  # a few lines a second in all
    assert lag < 0.5, f"the event loop stalled for {lag:.3f} s"
