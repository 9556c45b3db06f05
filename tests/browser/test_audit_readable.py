"""A readable audit log in a real browser (issue 19): a settings change reads "[*] options, Max
running models" and its detail is a before/after table; the model filter is a picker; a `since`
that does not parse is an error banner that takes the focus, not an empty list."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.support.browser import PHONE, Page, PanelServer, screenshot, wait_focus


def test_a_settings_change_is_a_before_after_table_in_words(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    page.goto(f"{quiet.url}/settings/")
    before = page.input_value("#id_settle_timeout")
    page.fill("#id_settle_timeout", str(int(float(before or 5)) + 1))
    page.click("main form button[type=submit]")
    page.goto(f"{quiet.url}/audit/?kind=settings_changed")
    reason = page.locator("#audit-table tbody td[data-label=Reason]").first.inner_text()
    assert reason == "Settle timeout"
    page.locator("#audit-table tbody td[data-label=Time] a").first.click()
    table = page.locator("#audit-changes")
    assert table.locator("th[scope=row]").all_inner_texts() == ["Settle timeout"]
    assert page.locator("pre").count() == 0
    screenshot(page, "panel-audit-change.png")
    page.goto(f"{quiet.url}/settings/")
    page.fill("#id_settle_timeout", before)
    page.click("main form button[type=submit]")
    console.assert_clean()


def test_an_invalid_since_is_an_error_and_the_model_filter_a_picker(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page("dark", width=PHONE)
    page.goto(f"{quiet.url}/audit/")
    options = page.locator("#id_model option").all_inner_texts()
    assert options[0] == "any model" and {"demo-small", "demo-medium", "demo-large"} <= set(options)
    page.goto(f"{quiet.url}/audit/?since=not-a-date")
    wait_focus(page, "filter-errors")  # autofocus: the banner takes the focus
    assert "Since: Enter a valid date/time." in page.inner_text("#filter-errors")
    assert page.inner_text("#audit-table tbody") == "Fix the filter above to see events."
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE
    assert page.evaluate("a11y.lowText()") == []
    console.assert_clean()


def test_a_load_that_started_at_once_is_not_said_to_have_queued(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    chat = {"model": "demo-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    rows = f"{quiet.url}/audit/?kind=load_requested&model=demo-small"
    newest = page.locator("#audit-table tbody td[data-label=Time] a")
    reasons = page.locator("#audit-table tbody td[data-label=Reason]")

    def newest_row() -> str | None:  # the newest row's own link, None: no row yet
        page.goto(rows)
        return newest.first.get_attribute("href") if newest.count() else None

    before = newest_row()  # an earlier test's load of demo-small left its own row
    assert quiet.post("/v1/chat/completions", chat)[0] == 200  # both slots were free
    deadline = time.monotonic() + 15  # the audit writer stores rows in batches
    while newest_row() == before:
        assert time.monotonic() < deadline, "no new load_requested row for demo-small"
        time.sleep(0.3)
    reason = reasons.first.inner_text()
    assert reason == "loading at once: a slot was free"
    console.assert_clean()
