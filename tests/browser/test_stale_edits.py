"""Two admins in two browsers edit one preset of a real ``serve``: the second save, made on the
form opened before the first, is refused with who and when and both sets of values; nothing of
the first is lost; saving again replaces it knowingly."""

from __future__ import annotations

from collections.abc import Callable

from tests.support.browser import Page, PanelServer, add_user, screenshot, sign_in


def test_a_stale_preset_form_is_refused_and_shows_both_changes(
    panel: Page, new_page: Callable[..., Page], quiet: PanelServer
) -> None:
    ada, ada_console = panel
    password = add_user(ada, quiet, "bea", "admin")
    bea, bea_console = new_page()
    sign_in(bea, quiet, "bea", password)

    ada.goto(f"{quiet.url}/")
    source = ada.locator('.model-card[data-model="demo-small"]').get_attribute("data-preset-id")
    ada.goto(f"{quiet.url}/presets/{source}/clone/")
    ada.fill("#id_name", "stale-demo")
    ada.click("#preset-form button[type=submit]")
    ada.wait_for_selector("text=Created stale-demo.")
    edit = ada.url.rstrip("/") + "/edit/"

    ada.goto(edit)
    bea.goto(edit)  # both forms are open on the same version
    ada.fill("#id_stop_timeout", "5")
    ada.fill("#id_ttl", "300")
    ada.click("#preset-form button[type=submit]")
    ada.wait_for_selector("text=Saved stale-demo.")

    bea.fill("#id_aliases_text", "stale-alias")
    bea.click("#preset-form button[type=submit]")
    banner = bea.locator("#stale-edit")
    banner.wait_for()
    assert "stale-demo was changed by admin at " in banner.inner_text()
    table = banner.locator("table.stale-diff").inner_text()
    assert "Stop timeout\t5\t—" in table and "Idle TTL\t300\t—" in table
    assert "Aliases\t—\tstale-alias" in table
    assert bea.locator("#id_aliases_text").input_value() == "stale-alias"  # kept on the page
    screenshot(bea, "panel-stale-edit.png", height=560)  # the banner and the model's fields
    ada.goto(edit.removesuffix("edit/"))
    stored = ada.locator("dl.kv").first.inner_text()
    assert "stale-alias" not in stored and "300" in stored  # ada's change stands

    bea.click("#preset-form button[type=submit]")  # reviewed: replace theirs with mine
    bea.wait_for_selector("text=Saved stale-demo.")
    assert "stale-alias" in bea.locator("dl.kv").first.inner_text()

    bea.click("text=Delete")
    bea.click("form button.danger")
    bea.wait_for_selector("text=Deleted stale-demo.")
    ada_console.assert_clean()
    bea_console.assert_clean()
