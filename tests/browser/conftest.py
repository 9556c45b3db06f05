"""The browser tier: headless Chromium (Debian's, driven by Playwright) against a real
``manage.py serve --demo`` on a free port with a temporary data dir (DESIGN §9).

``PanelServer`` is that subprocess: it can be stopped and started again on the same port and
data dir (the WebSocket reconnect test). ``panel`` signs a page in as admin, ``new_page`` gives
more pages (other users) in fresh contexts. Every page records console errors and uncaught
exceptions; a test ends by asserting there were none (issue 6: no console errors).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving import llama_server_stand_in
from tests.tiers import missing

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ADMIN_PASSWORD = "admin-pw-for-browser-tests"
START_TIMEOUT = 90.0  # seconds: migrations on a busy 2-core machine
WAIT = 30_000  # ms: Playwright's default wait for a condition
DOCS = REPO / "docs"
# Screenshots go to test-artifacts/ on every run (CI keeps the tree clean); set
# ROUTERPANEL_UPDATE_SCREENSHOTS=1 to refresh the committed ones under docs/.
SHOTS = DOCS if os.environ.get("ROUTERPANEL_UPDATE_SCREENSHOTS") == "1" else REPO / "test-artifacts"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PanelServer:
    """``manage.py serve --demo`` in its own process group."""

    def __init__(
        self,
        data_dir: Path,
        *,
        models_max: int = 2,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = ("--demo",),
    ) -> None:
        self.data_dir = data_dir
        self.env = env or {}
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.models_max = models_max
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "serve.log"

    def start(self) -> PanelServer:
        # Preset keys are checked against llama-server b11434 (a stand-in that prints its help).
        bin_dir = self.data_dir / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        llama_server_stand_in(bin_dir)
        env = os.environ | {
            "ROUTERPANEL_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "ROUTERPANEL_DATA_DIR": str(self.data_dir),
            "DEBUG": "false",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            **self.env,
        }
        env.pop("REDIS_URL", None)
        env.pop("DATABASE_URL", None)
        argv = [sys.executable, "manage.py", "serve", *self.args, "--port", str(self.port),
                "--models-max", str(self.models_max), "--data-dir", str(self.data_dir)]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited:\n{self.log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                if self.get("/health")[0] == 200:
                    return self
            time.sleep(0.2)
        raise RuntimeError(f"serve did not answer:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM, as an operator's Ctrl-C: the router stops its children first."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    # ---- the router API, as a client would use it ---------------------------------------------

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def models(self) -> dict[str, dict[str, Any]]:
        return {m["id"]: m for m in self.get("/v1/models")[1]["data"]}

    def wait_for(self, what: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; models: {self.models()}")
            time.sleep(0.1)

    def unload_all(self) -> None:
        """Start each test from a quiet router: nothing running, nothing queued."""
        for name, model in self.models().items():
            if model["state"] in ("loading", "loaded", "sleeping") and not model["stopping"]:
                self.post("/models/unload", {"model": name})
        running = ("loading", "loaded", "sleeping")  # a failed load is not running either
        self.wait_for(lambda: all(m["state"] not in running for m in self.models().values()))


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    return CHROMIUM


# Package scope, not session: Playwright's sync API keeps an event loop running in the main
# thread while it is open, and every later tier that starts a loop (asyncio.run, pytest-asyncio)
# would fail with "cannot be called from a running event loop". Close it when the tier ends.
@pytest.fixture(scope="package")
def browser(chromium_path: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(chromium_path), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="package")
def server(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PanelServer]:
    panel = PanelServer(tmp_path_factory.mktemp("panel")).start()
    yield panel
    panel.stop()


@pytest.fixture
def quiet(server: PanelServer) -> PanelServer:
    server.unload_all()
    return server


class Console:
    """Console errors and uncaught exceptions of a page; ``allow`` lists expected texts."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def assert_clean(self, *allow: str) -> None:
        unexpected = [e for e in self.errors if not any(a in e for a in allow)]
        assert unexpected == [], unexpected


@pytest.fixture
def new_page(browser: Any) -> Iterator[Callable[..., tuple[Any, Console]]]:
    contexts: list[Any] = []

    def make(width: int = 1366, height: int = 900, **options: Any) -> tuple[Any, Console]:
        """A page in a fresh context; ``options`` go to it (``color_scheme="dark"``…)."""
        context = browser.new_context(viewport={"width": width, "height": height}, **options)
        context.set_default_timeout(WAIT)
        contexts.append(context)
        page = context.new_page()
        return page, Console(page)

    yield make
    for context in contexts:
        context.close()


def sign_in(page: Any, server: PanelServer, username: str, password: str) -> None:
    page.goto(f"{server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server.url}/")
    wait_live(page)


def wait_live(page: Any) -> None:
    page.wait_for_function("document.body.dataset.connection === 'live'")
    page.wait_for_function("window.panelLive && window.panelLive.snapshots > 0")


@pytest.fixture
def panel(new_page: Callable[..., tuple[Any, Console]], quiet: PanelServer) -> tuple[Any, Console]:
    """A page signed in as the admin, on the live dashboard."""
    page, console = new_page()
    sign_in(page, quiet, "admin", ADMIN_PASSWORD)
    return page, console


def add_user(page: Any, server: PanelServer, username: str, role: str) -> str:
    """Create a user through the admin's Users page; return the password."""
    password = f"{username}-pw-for-browser-tests"
    page.goto(f"{server.url}/users/")
    if page.locator("#users-table td", has_text=username).count():
        return password
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.select_option("#id_role", role)
    page.click("#user-form button[type=submit]")
    page.wait_for_selector(f"text=Created {username} ({role}).")
    return password


def screenshot(page: Any, name: str) -> None:
    """Write a PNG: under docs/ (shown in the README) when refreshing, else test-artifacts/."""
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / name), full_page=True)
