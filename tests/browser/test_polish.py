"""The panel's polish in a real browser (issue 19): an h1 on every page; WCAG AA contrast for
text (4.5:1, 3:1 for large text) and for the focus ring (3:1) in the light and the dark theme;
nothing wider than a 390 px phone, with a request waiting in the queue; the logs page (one
timestamp a line, a filter box, level colours, a download) and a Logs button on every card.

A test adds a preset whose load fails (demo-broken), for error lines in a log.
Contrast is measured on the page (``A11Y``, in tests/support/browser.py): each visible text
node's colour against the backgrounds under it (composited up the tree), and each focused
control's outline against its parent's.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import (
    A11Y,
    PHONE,
    Page,
    PanelServer,
    action,
    card,
    chat_as,
    screenshot,
    wait_state,
)

SCHEMES = ("light", "dark")
BROKEN = "demo-broken"
BROKEN_INI = """\
[demo-broken]
server-bin = {python} -m routerpanel.router.simserver
sim-load-ms = 100
sim-fail-load = true
"""


@contextlib.contextmanager
def queued(page: Any, quiet: PanelServer) -> Iterator[None]:
    """Small and medium run pinned (the cap is 2), so a chat for large waits in the queue until
    the block ends, which cancels it and unpins both."""
    for model in ("demo-small", "demo-medium"):
        action(page, "pin", model)
        assert quiet.post("/models/load", {"model": model})[0] == 200
        wait_state(page, model, "loaded")
    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(chat_as, quiet, "demo-large", "a-rather-long-request-id-0001")
        page.wait_for_selector('#queue-body li[data-request-id="a-rather-long-request-id-0001"]')
        try:
            yield
        finally:
            page.goto(f"{quiet.url}/")
            page.wait_for_function("window.panelLive && window.panelLive.isOpen()")
            action(page, "cancel", "demo-large")
            assert waiter.result(timeout=60)[0] == 499
            for model in ("demo-small", "demo-medium"):
                action(page, "unpin", model)


def panel_pages(page: Any) -> list[str]:
    """Every page of the panel an admin reaches (read on the dashboard)."""
    preset = card(page, "demo-small").get_attribute("data-preset-id")
    event = page.locator("#feed li a.badge").first.get_attribute("href")
    return ["/", "/presets/", f"/presets/{preset}/", f"/presets/{preset}/edit/", "/presets/new/",
            "/presets/import/", "/audit/", event, "/settings/", "/keys/", "/users/",
            "/reservations/", "/logs/demo-small/"]  # fmt: skip


def visit(page: Any, quiet: PanelServer, path: str) -> None:
    page.goto(quiet.url + path)
    if page.locator("body.live-page").count():
        page.wait_for_function("window.panelLive && window.panelLive.snapshots > 0")


FOCUS = {  # page -> controls whose focus ring is measured, on light and dark surfaces
    "/": ["nav a", "button.link", ".model-card button[value=load]", "[data-field=logs-link]",
          ".ranges button", "#queue-body button"],
    "/audit/": ["#id_model", "#audit-filters button[type=submit]"],
    "/logs/demo-small/": ["#log-search", "#log-download"],
}  # fmt: skip


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_page_has_an_h1_and_aa_contrast_for_text_and_focus(
    open_page: Callable[..., Page], quiet: PanelServer, scheme: str
) -> None:
    page, console = open_page(scheme)
    with queued(page, quiet):
        assert page.evaluate("getComputedStyle(document.body).color") == (
            "rgb(230, 237, 243)" if scheme == "dark" else "rgb(17, 24, 39)"
        )
        for path in panel_pages(page):
            visit(page, quiet, path)
            assert page.locator("h1").count() == 1, path
            assert page.evaluate("a11y.lowText()") == [], path
            for control in FOCUS.get(path, []):
                page.keyboard.press("Tab")  # keyboard modality: focus() then shows the ring
                page.locator(f"{control} >> visible=true").first.focus()
                ring = page.evaluate("a11y.ring()")
                assert ring["visible"] and ring["width"] >= 2 and ring["ratio"] >= 3, (path, ring)
        visit(page, quiet, "/")
        if scheme == "dark":
            screenshot(page, "panel-dashboard-dark.png")
    console.assert_clean()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_sign_in_page_has_an_h1_and_aa_contrast(
    new_page: Callable[..., Page], quiet: PanelServer, scheme: str
) -> None:
    page, console = new_page(color_scheme=scheme)
    page.add_init_script(A11Y)
    page.goto(f"{quiet.url}/login/")
    assert page.locator("h1").inner_text() == "Sign in to RouterPanel"
    assert page.evaluate("a11y.lowText()") == []
    page.keyboard.press("Tab")
    page.focus("#id_username")
    ring = page.evaluate("a11y.ring()")
    assert ring["visible"] and ring["ratio"] >= 3, ring
    console.assert_clean()


# 390 px: today's phones; 320 px: WCAG's reflow width, where the old queue table was 370 px wide
# in this Chromium's fonts (the issue measured 425 px at 390 with another phone's fonts).
@pytest.mark.parametrize(("scheme", "width"), [("light", PHONE), ("dark", PHONE), ("light", 320)])
def test_no_page_is_wider_than_a_phone_with_a_request_in_the_queue(
    open_page: Callable[..., Page], quiet: PanelServer, scheme: str, width: int
) -> None:
    page, console = open_page(scheme, width=width)
    with queued(page, quiet):
        page.wait_for_selector("#memchart-system canvas")
        for path in panel_pages(page):
            visit(page, quiet, path)
            assert page.evaluate("document.documentElement.scrollWidth") <= width, path
            assert page.evaluate("a11y.overflow()") == [], path
            if re.fullmatch(r"/presets/\d+/", path):
                assert page.locator("#preset-changes tbody tr").count() >= 1  # pinned: a change
        if width == PHONE:
            visit(page, quiet, "/")
            screenshot(page, f"panel-queue-{width}-{scheme}.png")
    console.assert_clean()


CLOCK = re.compile(r"^\d{2}:\d{2}:\d{2}[.,]\d{3,6}$")


def import_broken(page: Any, quiet: PanelServer) -> None:
    if BROKEN in quiet.models():
        return
    page.goto(f"{quiet.url}/presets/import/")
    page.fill("#id_text", BROKEN_INI.format(python=shlex.quote(sys.executable)))
    page.click("button[name=preview]")
    page.click("button[name=apply]")
    page.wait_for_selector("text=Imported: 1 created")


def test_the_log_has_one_timestamp_a_line_a_filter_and_level_colours(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    import_broken(page, quiet)
    page.goto(f"{quiet.url}/logs/{BROKEN}/")
    page.wait_for_function("window.panelLive && window.panelLive.snapshots > 0")
    quiet.post("/models/load", {"model": BROKEN})  # answers before the load fails
    page.wait_for_selector("#log .line.lv-error")
    # the failure writes two error lines; the count below needs the second one in too
    page.wait_for_selector("#log .line:has-text('exiting due to model loading error')")
    lines = page.locator("#log .line")
    for i in range(lines.count()):
        line = lines.nth(i)
        assert line.locator(".t").count() == 1
        assert CLOCK.match(line.locator(".t").inner_text()), line.inner_text()
        assert not re.match(r"\d{2}:\d{2}:\d{2}", line.locator(".x").inner_text())

    error = page.locator("#log .line.lv-error .x").first
    info = page.locator("#log .line.lv-info .x").first
    colour = "el => getComputedStyle(el).color"
    assert error.evaluate(colour) != info.evaluate(colour)
    assert page.evaluate("a11y.lowText()") == []

    total = lines.count()
    page.fill("#log-search", "simulated load failure")
    shown = page.locator("#log .line:visible")
    assert shown.count() == 1 and "--sim-fail-load" in shown.inner_text()
    assert page.locator("#log-count").inner_text() == f"1 of {total} lines"
    page.fill("#log-search", "")
    assert page.locator("#log .line:visible").count() == total
    page.fill("#log-search", "model")  # leaves out the spawn line (it names this machine's paths)
    assert page.locator("#log-count").inner_text() == f"{total - 1} of {total} lines"
    screenshot(page, "panel-logs.png")
    console.assert_clean()


def test_the_log_downloads_as_text(
    open_page: Callable[..., Page], quiet: PanelServer, tmp_path: Path
) -> None:
    page, console = open_page()
    assert quiet.post("/models/load", {"model": "demo-small"})[0] == 200
    page.goto(f"{quiet.url}/logs/demo-small/")
    page.wait_for_selector("#log .line:has-text(\"model loaded: id 'demo-small'\")")
    with page.expect_download() as download:
        page.click("#log-download")
    assert download.value.suggested_filename == "demo-small.log"
    path = tmp_path / "demo-small.log"
    download.value.save_as(path)
    text = path.read_text()
    assert "model loaded: id 'demo-small'" in text
    # Raw: the child's own clock stays in the text, after the router's ISO time and the stream.
    assert re.search(r"^\S+Z stderr \d{2}:\d{2}:\d{2}\.\d{3} simserver INFO", text, re.M), text
    response = page.request.get(f"{quiet.url}/logs/demo-small.log")
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["content-disposition"].startswith("attachment;")
    console.assert_clean()


@pytest.mark.parametrize("width", [1366, PHONE])
def test_every_card_has_a_logs_button(
    open_page: Callable[..., Page], quiet: PanelServer, width: int
) -> None:
    page, console = open_page(width=width)
    cards = page.locator(".model-card")
    assert cards.count() >= 3
    for i in range(cards.count()):
        button = cards.nth(i).locator("a.button[data-field=logs-link]")
        assert button.is_visible() and button.inner_text() == "Logs"
        name = cards.nth(i).get_attribute("data-model")
        assert button.get_attribute("aria-label") == f"Logs of {name}"
    card(page, "demo-medium").locator("[data-field=logs-link]").click()
    page.wait_for_url(f"{quiet.url}/logs/demo-medium/")
    assert page.locator("h1").inner_text().startswith("Logs of demo-medium")
    console.assert_clean()


HAS_PIXEL = """([selector, rgb]) => {
  const canvas = document.querySelector(selector);
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  for (let i = 0; i < data.length; i += 4) {
    const near = [0, 1, 2].every((k) => Math.abs(data[i + k] - rgb[k]) <= 2);
    if (near && data[i + 3] === 255) return true;
  }
  return false;
}"""


def test_the_charts_grid_follows_the_theme(open_page: Callable[..., Page]) -> None:
    """uPlot draws on a canvas with colours from panel.css; a theme change redraws it."""
    page, console = open_page("dark")
    canvas = "#memchart-system canvas"
    page.wait_for_selector(canvas)
    page.wait_for_function(HAS_PIXEL, arg=[canvas, [0x30, 0x36, 0x3D]])  # --chart-grid, dark
    page.emulate_media(color_scheme="light")
    page.wait_for_function(HAS_PIXEL, arg=[canvas, [0xE5, 0xE7, 0xEB]])  # --chart-grid, light
    console.assert_clean()


def test_a_preset_shows_its_effective_values_and_their_source(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    """The demo presets set no stop-timeout: the router uses the Settings default (10 s)."""
    page, console = open_page()
    page.goto(f"{quiet.url}/presets/")
    row = page.locator("tr", has=page.locator("a", has_text="demo-small"))
    assert row.locator("td[data-label=Stop-timeout]").inner_text() == "10 s default (Settings)"
    row.locator("a", has_text="demo-small").click()
    page.wait_for_selector("#effective-stop-timeout")
    assert page.locator("#effective-stop-timeout").inner_text() == "10 s default (Settings)"
    console.assert_clean()
