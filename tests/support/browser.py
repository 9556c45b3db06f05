"""The browser tier's helpers: the panel server, a page's console, signing in, screenshots.

``PanelServer`` is a real ``manage.py serve --demo`` on a free port with a temporary data dir,
in its own process group: it can be stopped and started again on the same port and data dir
(the WebSocket reconnect test). ``Console`` records a page's console errors and uncaught
exceptions; a test ends by asserting there were none (issue 6: no console errors). The page
helpers read the dashboard (``card``, ``wait_state``), act through its socket (``action``) and
measure contrast on the page (``A11Y``). The fixtures are in tests/browser/conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.serving import llama_server_stand_in

CHROMIUM = Path("/usr/bin/chromium")
ADMIN_PASSWORD = "admin-pw-for-browser-tests"
START_TIMEOUT = 90.0  # seconds: migrations on a busy 2-core machine
DOCS = REPO / "docs"
# Screenshots go to test-artifacts/ on every run (CI keeps the tree clean); set
# ROUTERPANEL_UPDATE_SCREENSHOTS=1 to refresh the committed ones under docs/.
SHOTS = DOCS if os.environ.get("ROUTERPANEL_UPDATE_SCREENSHOTS") == "1" else REPO / "test-artifacts"


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


class Console:
    """Console errors and uncaught exceptions of a page; ``allow`` lists expected texts."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def assert_clean(self, *allow: str) -> None:
        unexpected = [e for e in self.errors if not any(a in e for a in allow)]
        assert unexpected == [], unexpected


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


def wait_focus(page: Any, element_id: str) -> None:
    """Wait, within Playwright's deadline, until ``element_id`` has the focus: the browser applies
    ``autofocus`` at the page's next rendering, which may come after the load event."""
    script = "id => document.activeElement !== null && document.activeElement.id === id"
    page.wait_for_function(script, arg=element_id)


def screenshot(page: Any, name: str, *, height: int | None = None) -> None:
    """Write a PNG: under docs/ (shown on the docs pages) when refreshing, else test-artifacts/.
    ``height``: only the top of the page, that many pixels."""
    SHOTS.mkdir(exist_ok=True)
    if height is None:
        page.screenshot(path=str(SHOTS / name), full_page=True)
    else:
        width = page.viewport_size["width"]
        page.screenshot(path=str(SHOTS / name), clip={"x": 0, "y": 0, "width": width,
                                                       "height": height})  # fmt: skip


# ---- the dashboard page ----------------------------------------------------------------------

Page = tuple[Any, Console]
PHONE = 390


def card(page: Any, model: str) -> Any:
    return page.locator(f'.model-card[data-model="{model}"]')


def wait_state(page: Any, model: str, state: str) -> None:
    page.wait_for_selector(f'.model-card[data-model="{model}"][data-state="{state}"]')


def chat_as(server: PanelServer, model: str, request_id: str, tokens: int = 2) -> tuple[int, Any]:
    """A chat completion with our own X-Request-Id (the id the queue shows and cancels), that
    waits in the queue even behind pinned models (X-RouterPanel-Wait: the tests look at it)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id,
               "X-RouterPanel-Wait": "1"}  # fmt: skip
    request = urllib.request.Request(
        f"{server.url}/v1/chat/completions", json.dumps(body).encode(), headers
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


# window.a11y: contrast ratios as WCAG 2 defines them, measured on what the page shows.
A11Y = """
window.a11y = (() => {
  function rgba(text) {
    const m = /rgba?\\(([^)]+)\\)/.exec(text || "");
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  }
  function over(top, under) {
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)).concat(1);
  }
  function luminance(c) {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  }
  function ratio(a, b) {
    const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  }
  function background(el) {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    return layers.reverse().reduce((under, c) => over(c, under), [255, 255, 255, 1]);
  }
  function describe(el) {
    return `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}.${[...el.classList].join(".")}`;
  }
  const SKIP = ":disabled, .sr, .skip, option, script, template, noscript";
  // Every visible text below the threshold: "what 'text' 2.31 < 4.5".
  function lowText() {
    const bad = [];
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const node = walker.currentNode;
      const el = node.parentElement;
      if (!node.textContent.trim() || !el || el.closest(SKIP)) continue;
      if (!el.checkVisibility({ opacityProperty: true, visibilityProperty: true })) continue;
      const box = el.getBoundingClientRect();
      if (!box.width || !box.height) continue;
      const style = getComputedStyle(el);
      const bg = background(el);
      const value = ratio(over(rgba(style.color), bg), bg);
      const size = parseFloat(style.fontSize);
      const need = size >= 24 || (Number(style.fontWeight) >= 700 && size >= 18.66) ? 3 : 4.5;
      const text = node.textContent.trim().slice(0, 30);
      if (value < need) bad.push(`${describe(el)} '${text}' ${value.toFixed(2)} < ${need}`);
    }
    return bad;
  }
  // The focused element's ring: is it drawn, how wide, its contrast with what surrounds it.
  function ring() {
    const el = document.activeElement;
    const style = getComputedStyle(el);
    return {
      what: describe(el),
      visible: el.matches(":focus-visible") && style.outlineStyle !== "none",
      width: parseFloat(style.outlineWidth),
      ratio: ratio(rgba(style.outlineColor), background(el.parentElement)),
    };
  }
  // Elements whose right edge passes the viewport (none may, on a phone).
  function overflow() {
    const width = window.innerWidth;
    return [...document.querySelectorAll("body *")]
      .filter((el) => !el.closest(".sr, .skip, template"))
      .map((el) => [el, el.getBoundingClientRect()])
      .filter(([, box]) => box.width > 0 && box.right > width + 0.5)
      .slice(0, 8).map(([el, box]) => `${describe(el)} right=${Math.round(box.right)}`);
  }
  return { lowText, ring, overflow };
})();
"""


# evaluate() has no timeout of its own: an action the socket never answers fails, not hangs.
ACTION = """([name, model]) => Promise.race([
  window.panelLive.action(name, model),
  new Promise((resolve) => setTimeout(() => resolve({ ok: false, message: "no answer" }), 30000)),
])"""


def action(page: Any, name: str, model: str) -> None:
    """Pin, unpin or cancel through the dashboard's socket, as its buttons do. SQLite may refuse
    a write under contention ("database is locked"; the page is told so): try again then."""
    for _ in range(3):
        answer = page.evaluate(ACTION, [name, model])
        if answer["ok"] or "database is locked" not in answer["message"]:
            break
    assert answer["ok"], answer
