"""The INI import preview in a real browser (issue 19): Replace that would delete a loaded model
says so in red and its Apply button is a danger button; each changed field shows before and
after; an uploaded file stays in the text box. Only previews here: nothing is applied."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.browser import PHONE, SHOTS, Page, PanelServer, wait_state


def medium_changed(page: Page, quiet: PanelServer) -> str:
    """demo-medium's section of an export, with one option changed and an alias added."""
    export = page[0].request.get(f"{quiet.url}/presets/export/").text()
    section = export[export.index("[demo-medium]") :]
    section = section[: section.find("\n[", 1) + 1 or len(section)]
    assert "sim-token-ms = 40" in section, section
    return section.replace("sim-token-ms = 40", "sim-token-ms = 20") + "alias = medium-fast\n"


def test_replace_deleting_a_loaded_model_is_red_with_a_danger_button(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    assert quiet.post("/models/load", {"model": "demo-small"})[0] == 200
    wait_state(page, "demo-small", "loaded")
    text = medium_changed((page, console), quiet)
    page.goto(f"{quiet.url}/presets/import/")
    page.set_input_files("#id_file", files=[{"name": "models.ini", "mimeType": "text/plain",
                                             "buffer": text.encode()}])  # fmt: skip
    page.check("#id_replace")
    page.click("button[name=preview]")
    danger = page.locator("#import-danger")
    assert "Deletes running model: demo-small" in danger.inner_text()
    apply = page.locator("#apply-import")
    assert apply.inner_text() == "Apply, deleting 1 running model"
    assert apply.evaluate("b => getComputedStyle(b).backgroundColor") == "rgb(185, 28, 28)"
    rows = page.locator('table[data-preset="demo-medium"] tbody th').all_inner_texts()
    assert rows == ["Aliases", "Options"]  # only what the file changes
    table = page.locator('table[data-preset="demo-medium"]').inner_text()
    assert "medium-fast" in table and "sim-token-ms = 20" in table
    assert page.input_value("#id_text") == text  # the uploaded file, kept for the next try
    assert page.evaluate("a11y.lowText()") == []
    SHOTS.mkdir(exist_ok=True)  # the preview only: the text box shows this machine's paths
    page.locator("#import-preview").screenshot(path=str(SHOTS / "panel-import-preview.png"))
    assert "demo-small" in quiet.models()  # a preview changes nothing
    console.assert_clean()


def test_the_preview_fits_a_phone(open_page: Callable[..., Page], quiet: PanelServer) -> None:
    page, console = open_page("dark", width=PHONE)
    page.goto(f"{quiet.url}/presets/import/")
    page.fill("#id_text", medium_changed((page, console), quiet))
    page.click("button[name=preview]")
    page.wait_for_selector('table[data-preset="demo-medium"]')
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE
    console.assert_clean()


def test_every_error_of_a_file_is_listed_at_once_and_the_text_stays(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page("dark", width=PHONE)
    text = (
        "[demo-typo]\nmodel = /m/t.gguf\nn-gpu-layers = lots\n"  # line 3: not a number
        "[broken\n"  # line 4: no closing bracket
        "[demo-other]\nmodel = /m/o.gguf\nno-such-option = 1\n"  # line 7: unknown option
    )
    page.goto(f"{quiet.url}/presets/import/")
    page.fill("#id_text", text)
    page.click("button[name=preview]")
    box = page.locator("#import-error")
    assert box.locator("h2").inner_text() == "The file has 3 errors"
    items = box.locator(".import-errors li").all_inner_texts()
    assert [i.split(":", 1)[0] for i in items] == ["Line 3", "Line 4", "Line 7"]
    assert box.locator(".ini-lines li.bad").count() == 3
    assert page.input_value("#id_text") == text  # ready to fix and preview again
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE
    assert page.evaluate("a11y.lowText()") == []
    SHOTS.mkdir(exist_ok=True)
    box.screenshot(path=str(SHOTS / "panel-import-errors.png"))
    console.assert_clean()
