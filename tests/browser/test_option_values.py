"""Option values checked by the option's type (issue 19), in a real browser: ``n-gpu-layers =
lots`` in the preset form is an error on its row, the error banner takes the focus and links to
the field; in an INI import it is an error naming its line, and nothing is imported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.browser import PHONE, Page, PanelServer, screenshot, wait_focus

MESSAGE = "n-gpu-layers = 'lots': n-gpu-layers expects a number of layers, auto or all."


def submit_new_preset(page: Any, url: str, name: str, key: str, value: str) -> None:
    """Fill the new-preset form with one option row and submit it; wait for its errors."""
    page.goto(f"{url}/presets/new/")
    page.fill("#id_name", name)
    page.fill("#id_args-0-key", key)
    page.fill("#id_args-0-value", value)
    page.click("#preset-form button[type=submit]")
    page.wait_for_selector("#form-errors")


def test_a_value_of_the_wrong_type_is_a_field_error_and_the_banner_takes_the_focus(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    submit_new_preset(page, quiet.url, "typed-values", "n-gpu-layers", "lots")
    wait_focus(page, "form-errors")  # autofocus: the banner takes the focus
    banner = page.locator("#form-errors")
    assert MESSAGE in banner.inner_text()
    assert page.locator("tr.row-error").inner_text().strip() == MESSAGE
    assert page.get_attribute("#id_args-0-value", "aria-invalid") == "true"
    screenshot(page, "panel-option-value-error.png")
    banner.locator('a[href="#id_args-0-value"]').click()
    assert page.evaluate("document.activeElement.id") == "id_args-0-value"
    page.fill("#id_args-0-value", "auto")
    page.click("#preset-form button[type=submit]")
    page.wait_for_selector("h1:has-text('typed-values')")
    console.assert_clean()


def test_the_banner_fits_a_phone(open_page: Callable[..., Page], quiet: PanelServer) -> None:
    page, console = open_page("dark", width=PHONE)
    submit_new_preset(page, quiet.url, "typed-phone", "ctx-size", "8k")
    assert "ctx-size expects a whole number" in page.locator("#form-errors").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE
    assert page.evaluate("a11y.lowText()") == []
    console.assert_clean()


def test_an_import_names_the_line_and_imports_nothing(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    page.goto(f"{quiet.url}/presets/import/")
    page.fill("#id_text", "[typed-a]\nctx-size = 4096\n\n[typed-b]\nn-gpu-layers = lots\n")
    page.click("button[name=preview]")
    error = page.locator("#import-error")
    assert "line 5" in error.inner_text()
    assert "n-gpu-layers expects a number of layers, auto or all" in error.inner_text()
    assert not {"typed-a", "typed-b"} & set(quiet.models())
    console.assert_clean()
