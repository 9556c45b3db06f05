"""The memory charts (issue 19): 24 h and 7 d span exactly their window even with one data point;
memory axes tick at round binary steps with axis titles; a model with one sample is drawn as a
point; a stretch without data is a gap; nothing measured is said in words, not drawn as an axis
of "1 B, 1 B, 1 B". The 7 d history is served by a route here (the rollups take minutes)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.support.browser import Page, PanelServer, screenshot

GIB, MIB = 1 << 30, 1 << 20


def history(route: Any, body: dict[str, Any]) -> None:
    time.sleep(1.0)
    route.fulfill(status=200, content_type="application/json", body=json.dumps(body))


def axis(page: Any, plot: str) -> dict[str, Any]:
    return dict(page.evaluate(f"""() => {{
      const u = window.panelChart.{plot}.uplot;
      return u && {{ x: [u.scales.x.min, u.scales.x.max], splits: u.axes[1]._splits,
                     values: u.axes[1]._values, labels: u.axes.map((a) => a.label) }};
    }}"""))  # fmt: skip


def test_seven_days_with_one_point_spans_the_week_with_round_ticks(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    now = time.time()
    window = [now - 7 * 86400, now]
    t = now // 600 * 600 - 3600
    body = {
        "available": True, "bucket": 600, "window": window, "time": [t - 1200, t - 600, t],
        "system": {"used": [9.3 * GIB, None, 9.5 * GIB], "used_max": [10 * GIB, None, 10 * GIB],
                   "available": [14 * GIB, None, 14 * GIB], "swap_used": [0, None, 0]},
        "models": {"demo-once": [None, None, 300 * MIB]},
    }  # fmt: skip
    page.route(
        lambda url: "/memory/history/" in url and "range=7d" in url,
        lambda route: history(route, body),
    )
    page.click(".ranges button[data-range='7d']")
    page.wait_for_function("window.panelChart.shown === '7d'")  # drawn, not only asked for
    system = axis(page, "system")
    assert system["x"] == window  # the whole week, not the three points' 20 minutes
    assert system["labels"] == ["Time", "Memory"]
    assert system["values"] == ["0 GiB", "4 GiB", "8 GiB", "12 GiB", "16 GiB"]  # not 9.3, 18.6
    models = axis(page, "models")
    assert models["values"][:3] == ["0 MiB", "100 MiB", "200 MiB"]
    lonely = page.evaluate("window.panelChart.models.uplot.series[1].points.filter("
                           "window.panelChart.models.uplot, 1)")  # fmt: skip
    assert lonely == [2]  # its one sample is drawn as a point
    screenshot(page, "panel-chart-7d.png")
    console.assert_clean()


def test_an_empty_range_says_so_instead_of_drawing_an_axis(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page("dark")
    now = time.time()
    body = {
        "available": True, "bucket": 60, "window": [now - 86400, now], "time": [now - 120],
        "system": {"used": [2 * GIB], "used_max": [2 * GIB], "available": [20 * GIB],
                   "swap_used": [0]},
        "models": {},
    }  # fmt: skip
    page.route(
        lambda url: "/memory/history/" in url and "range=24h" in url,
        lambda route: history(route, body),
    )
    page.click(".ranges button[data-range='24h']")
    # the live range of a quiet server is empty too: wait for the 24 h answer to be drawn
    page.wait_for_function("window.panelChart.shown === '24h'")
    page.wait_for_selector("#memchart-models .chart-empty")
    assert page.inner_text("#memchart-models") == "No model was running in this range."
    assert axis(page, "system")["x"] == body["window"]
    console.assert_clean()


def test_a_few_seconds_of_live_samples_span_two_minutes_with_whole_second_ticks(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    page.wait_for_function("window.panelChart && window.panelChart.range === '1h'")
    now = time.time()
    ticks = page.evaluate(
        """async (now) => {
          const c = window.panelChart;
          c.load({ time: [now - 2, now - 1, now], used: [2e9, 2e9, 2e9], available: [9e9, 9e9, 9e9],
                   swap_used: [0, 0, 0], wired: [0, 0, 0], models: {} });
          c.load = c.push = () => {};  // no live sample or late history redraws before the read
          await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
          const u = c.system.uplot;
          return { x: [u.scales.x.min, u.scales.x.max], values: u.axes[0]._values };
        }""",
        now,
    )
    assert ticks["x"] == [now - 120, now]  # two minutes, ending at the newest sample
    assert ticks["values"] and not any("." in v for v in ticks["values"]), ticks["values"]
    console.assert_clean()
