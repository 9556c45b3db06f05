"""Faults on the dashboard (issue 11): a hung child and a crash loop, as an operator sees them.

This module's own server runs two simulated models: ``hang`` (hang-timeout 1 s, a slow stream)
and ``crash`` (exits after every completion). The test SIGSTOPs ``hang``'s child mid-stream and
watches its card say it was killed as hung and who lost requests; then it makes ``crash`` crash
and watches its card say it is held back, with the reason and a countdown.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.support.browser import ADMIN_PASSWORD, Console, PanelServer, screenshot, sign_in

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too

Page = tuple[Any, Console]
SIM = f"{sys.executable} -m routerpanel.router.simserver"
PRESETS = f"""
[hang]
server-bin = {SIM}
hang-timeout = 1
sim-token-ms = 50
sim-tokens = 400
stop-timeout = 2

[crash]
server-bin = {SIM}
sim-crash-after = 1
stop-timeout = 2
"""


@pytest.fixture(scope="module")
def fault_server(chromium_path: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    data = tmp_path_factory.mktemp("faults")
    ini = data / "faults.ini"
    ini.write_text(PRESETS)
    server = PanelServer(data, models_max=2, args=("--models-preset", str(ini))).start()
    yield server
    server.stop()


def stream(server: PanelServer, model: str) -> None:
    body = {"model": model, "stream": True, "max_tokens": 400,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    request = urllib.request.Request(
        f"{server.url}/v1/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def child_of(server: PanelServer, model: str) -> psutil.Process:
    assert server.proc is not None
    for proc in psutil.Process(server.proc.pid).children(recursive=True):
        cmd = proc.cmdline()
        if "--alias" in cmd and cmd[cmd.index("--alias") + 1] == model:
            return proc
    raise AssertionError(f"no child for {model}")


def test_a_hung_child_and_a_crash_loop_show_on_their_cards(
    new_page: Callable[..., Page], fault_server: PanelServer, tmp_path: Path
) -> None:
    page, console = new_page()
    sign_in(page, fault_server, "admin", ADMIN_PASSWORD)
    streamer = threading.Thread(target=stream, args=(fault_server, "hang"), daemon=True)
    streamer.start()
    hang = '.model-card[data-model="hang"]'
    page.wait_for_selector(f"{hang} [data-field=in_flight]:text-is('1')")
    os.kill(child_of(fault_server, "hang").pid, signal.SIGSTOP)
    note = page.locator(f"{hang} [data-field=lastline]")
    note.filter(has_text="Killed as hung").wait_for()
    text = note.inner_text()
    assert "no progress for" in text and "1 request in flight (anonymous)" in text
    streamer.join(30)

    crash = '.model-card[data-model="crash"]'
    held = page.locator(f"{crash} [data-field=backoff]").filter(
        has_text="Held back after a crash loop"
    )
    # The first crash holds the model back for 1 s only, a window a loaded machine can let
    # pass before the page looks; each further crash doubles it (1, 2, 4 s), so a few requests
    # make the card's line last long enough to be read. The first request must succeed.
    statuses, text = [], ""
    for _ in range(4):
        statuses.append(fault_server.post("/v1/chat/completions", {
            "model": "crash", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
        })[0])  # fmt: skip
        try:
            held.wait_for(timeout=4000)
            text = held.inner_text(timeout=1000)
            break
        except PlaywrightTimeout:
            continue
    assert statuses[0] == 200, statuses
    assert "exit code 3" in text and "next start in" in text, (statuses, text)
    screenshot(page, "panel-faults.png")
    # The row is written by the audit writer's thread in batches: reload the filtered log until
    # it is there (the crash requests above add rows too, so do not rely on the first page).
    hung_row = page.locator("table", has_text="hung child killed").first
    for _ in range(15):
        page.goto(f"{fault_server.url}/audit/?kind=hung")
        try:
            hung_row.wait_for(timeout=2000)
            break
        except PlaywrightTimeout:
            continue
    assert hung_row.is_visible(), page.content()[:2000]
    console.assert_clean()
