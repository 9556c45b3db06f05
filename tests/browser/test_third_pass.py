"""Issue 49, the panel's third pass, in a real browser: the usage chart spans the days asked for
with axes in the theme's ink; the queue card holds its table at 1440 px with a request queued;
the empty queue's text stays whole on a phone (each at 1440 x 900 and 390 x 844, light and dark,
checked by ``scrollWidth`` and the chart's axis range, and screenshotted); the focus goes to the
error banner after a server-side error on Settings and Reservations; the memory chart ticks at
whole, round times; the Presets table's Actions cells are table cells; Ctrl-C on ``serve`` says
what it stops."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import (
    PHONE,
    Page,
    PanelServer,
    action,
    chat_as,
    screenshot,
    wait_focus,
    wait_live,
    wait_state,
)

VIEWS = [(1440, "light"), (1440, "dark"), (PHONE, "light"), (PHONE, "dark")]
LONG_ID = "a-rather-long-request-id-0049"


def view(page: Any, width: int, scheme: str) -> None:
    """Show the page at ``width`` in ``scheme`` (each chart reads both when it is built)."""
    page.set_viewport_size({"width": width, "height": 844 if width <= PHONE else 900})
    page.emulate_media(color_scheme=scheme)


# A text's line boxes: more than one is a text broken over lines.
LINES = "el => { const r = document.createRange(); r.selectNodeContents(el); return r.getClientRects().length; }"  # noqa: E501
# Elements inside a box whose edges pass the box's.
SPILLS = """box => {
  const b = box.getBoundingClientRect();
  return [...box.querySelectorAll("*")].map((el) => [el, el.getBoundingClientRect()])
    .filter(([, r]) => r.width > 0 && (r.right > b.right + 0.5 || r.left < b.left - 0.5))
    .map(([el, r]) => `${el.tagName.toLowerCase()}.${[...el.classList].join(".")} ${Math.round(r.right)} > ${Math.round(b.right)}`);
}"""  # noqa: E501


def fits(page: Any, width: int) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert page.evaluate("a11y.overflow()") == []


# ---- 1: the usage chart ------------------------------------------------------------------------


def charted(page: Any, quiet: PanelServer) -> None:
    """A chat for demo-small, then /usage/ until its hour is stored (the usage rows are written
    in batches)."""
    chat = {"model": "demo-small", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2}  # fmt: skip
    assert quiet.post("/v1/chat/completions", chat)[0] == 200
    deadline = time.monotonic() + 60
    while True:
        page.goto(f"{quiet.url}/usage/?days=7")
        if page.evaluate("JSON.parse(document.getElementById('usage-hourly').textContent).length"):
            return
        assert time.monotonic() < deadline, "no usage hour stored within 60 s"


def test_the_usage_chart_spans_the_days_asked_for_in_the_themes_ink(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    charted(page, quiet)
    for width, scheme in VIEWS:
        view(page, width, scheme)
        page.goto(f"{quiet.url}/usage/?days=7")
        page.wait_for_function("window.panelUsageChart !== undefined")
        chart = page.evaluate("""() => {
          const u = window.panelUsageChart;
          const ink = getComputedStyle(document.documentElement).getPropertyValue("--chart-axis");
          return { x: [u.scales.x.min, u.scales.x.max], ink: ink.trim(),
                   strokes: u.axes.map((a, i) => a.stroke(u, i)) };
        }""")  # fmt: skip
        low, high = chart["x"]
        assert high - low == pytest.approx(7 * 86400, abs=2), chart  # the week, not 2027-2029
        assert abs(high - time.time()) < 300, chart  # ending now
        assert chart["strokes"] == [chart["ink"], chart["ink"]], (scheme, chart)
        fits(page, width)
        screenshot(page, f"panel-usage-{width}-{scheme}.png")
    console.assert_clean()


# ---- 2 and 3: the queue card -------------------------------------------------------------------


@contextlib.contextmanager
def medium_queued(page: Any, quiet: PanelServer) -> Iterator[None]:
    """Small and large run pinned (the cap is 2): a chat for demo-medium waits in the queue."""
    for model in ("demo-small", "demo-large"):
        action(page, "pin", model)
        assert quiet.post("/models/load", {"model": model})[0] == 200
        wait_state(page, model, "loaded")
    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(chat_as, quiet, "demo-medium", LONG_ID)
        page.wait_for_selector(f'#queue-body li[data-request-id="{LONG_ID}"]')
        try:
            yield
        finally:
            view(page, 1440, "light")
            page.goto(f"{quiet.url}/")
            page.wait_for_function("window.panelLive && window.panelLive.isOpen()")
            action(page, "cancel", "demo-medium")
            assert waiter.result(timeout=60)[0] == 499
            for model in ("demo-small", "demo-large"):
                action(page, "unpin", model)


def test_the_queue_card_holds_a_queued_request_at_every_width(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    with medium_queued(page, quiet):
        for width, scheme in VIEWS:
            view(page, width, scheme)
            page.goto(f"{quiet.url}/")
            wait_live(page)
            page.wait_for_selector(f'#queue-body li[data-request-id="{LONG_ID}"]')
            fits(page, width)
            queue = page.locator("section.queue")
            assert queue.evaluate(SPILLS) == [], (width, scheme)
            name = page.locator("#queue-body tr.queue-entry td[data-label=Model]")
            assert name.evaluate(LINES) == 1, (width, scheme)  # "demo-medium", not "demo-mediu / m"
            screenshot(page, f"panel-queue-{width}-{scheme}.png")
    console.assert_clean()


def test_the_empty_queue_says_so_in_whole_words(open_page: Callable[..., Page]) -> None:
    page, console = open_page()
    for width, scheme in VIEWS:
        view(page, width, scheme)
        page.reload()
        wait_live(page)
        empty = page.locator("#queue-body tr.empty td")
        assert empty.inner_text() == "Nothing is waiting."
        assert empty.evaluate(LINES) == 1, (width, scheme)  # not "Not / hing / is / wait / ing."
        fits(page, width)
        screenshot(page, f"panel-queue-empty-{width}-{scheme}.png")
    console.assert_clean()


# ---- 8: the focus after a server-side error ----------------------------------------------------


def test_a_server_side_error_moves_the_focus_to_the_banner_on_settings_and_reservations(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    page.goto(f"{quiet.url}/settings/")
    page.fill("#id_settle_timeout", "9999")
    page.click("#settings-form button[type=submit]")
    wait_focus(page, "form-errors")
    link = page.locator("#form-errors a[href='#id_settle_timeout']")
    assert "At most 600 seconds." in link.locator("xpath=..").inner_text()

    page.goto(f"{quiet.url}/reservations/")
    page.click("#reservation-form button[type=submit]")  # nothing filled in
    wait_focus(page, "form-errors")
    assert page.locator("#form-errors a[href='#id_starts_at']").count() == 1
    console.assert_clean("status of 400")  # the refused booking's answer


# ---- 10: the memory chart's ticks, the Presets table, Ctrl-C ------------------------------------

TICKS = """async ([now, span]) => {
  const c = window.panelChart;
  const time = [];
  for (let t = now - span; t <= now; t += span / 40) time.push(t);
  const same = (v) => time.map(() => v);
  c.system.draw(time, [{ label: "Used", values: same(2e9), color: "#000" }]);
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  const u = c.system.uplot;
  return { splits: u.axes[0]._splits, values: u.axes[0]._values };
}"""


# At 390 px the last hour ticked at 9:59, 10:14, 10:29, 10:44 (uPlot's 15-minute steps from a
# first sample at an odd fraction of a second); wider, or at other fractions, it looked right.
@pytest.mark.parametrize("width", [PHONE, 1366])
def test_the_memory_charts_time_ticks_are_whole_round_times(
    open_page: Callable[..., Page], width: int
) -> None:
    page, console = open_page(width=width)
    page.wait_for_function("window.panelChart && window.panelChart.range === '1h'")
    page.evaluate("window.panelChart.load = window.panelChart.push = () => {}")  # no redraws
    minute = int(time.time()) // 60 * 60
    for span in (100, 1800, 3500):
        for k in range(60):  # the newest sample at each second of a minute, at odd fractions
            newest = minute - k - 0.37 - k / 100
            ticks = page.evaluate(TICKS, [newest, span])
            splits = ticks["splits"]
            assert len(splits) >= 2, ticks
            step = splits[1] - splits[0]
            assert step in (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600), (span, ticks)
            assert all(s % step == 0 for s in splits), (span, newest, ticks)  # not :29, :59
    console.assert_clean()


def test_the_presets_tables_actions_are_cells_of_their_rows(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    page.goto(f"{quiet.url}/presets/")
    rows = page.evaluate("""() => [...document.querySelectorAll("main table.grid tbody tr")]
      .map((tr) => [...tr.cells].map((td) => [getComputedStyle(td).display,
                                              Math.round(td.getBoundingClientRect().bottom)]))""")
    assert len(rows) >= 3
    for cells in rows:
        assert {display for display, _ in cells} == {"table-cell"}, cells
        assert len({bottom for _, bottom in cells}) == 1, cells  # one border under the row
    console.assert_clean()


def test_ctrl_c_on_serve_says_what_it_stops(chromium_path: Path, tmp_path: Path) -> None:
    server = PanelServer(tmp_path).start()
    try:
        assert server.post("/models/load", {"model": "demo-small"})[0] == 200
        server.wait_for(lambda: server.models()["demo-small"]["state"] == "loaded")
        assert server.proc is not None
        os.killpg(server.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        server.proc.wait(60)
    finally:
        server.stop()
    log = server.log_path.read_text()
    said = log[log.index("RouterPanel on ") :]
    assert "Stopping RouterPanel" in said and "demo-small" in said, said
    assert said.rstrip().endswith("Stopped."), said
