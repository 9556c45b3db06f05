"""API keys in a real browser (issue 17.1 scoped keys, issue 19 "Keys"): the form sets a key's
scope, creating redirects and shows the secret once with a Copy button, a reload neither shows
it again nor issues a second key, the key is held to its scope by the API (also after the scope
is changed), and revoking asks first — with and without JavaScript, and on a phone."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from tests.support.browser import ADMIN_PASSWORD, Console, PanelServer, screenshot

Panel = tuple[Any, Console]


def api_get(server: PanelServer, path: str, secret: str) -> tuple[int, Any]:
    request = urllib.request.Request(server.url + path, headers={"x-api-key": secret})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def api_post(server: PanelServer, path: str, body: dict[str, Any], secret: str) -> int:
    headers = {"x-api-key": secret, "Content-Type": "application/json"}
    request = urllib.request.Request(server.url + path, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def create_key(page: Any, server: PanelServer, name: str, **scope: str) -> str:
    page.goto(f"{server.url}/keys/")
    page.fill("#id_name", name)
    if "models" in scope:
        page.fill("#id_models", scope["models"])
    if "max_concurrent" in scope:
        page.fill("#id_max_concurrent", scope["max_concurrent"])
    if "priority" in scope:
        page.select_option("#id_priority", scope["priority"])
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#new-key-secret")
    assert page.url == f"{server.url}/keys/"  # redirected: the secret came with a GET
    return str(page.locator("#new-key-secret").inner_text()).strip()


def row_of(page: Any, name: str) -> Any:
    return page.locator("#keys-table tbody tr", has_text=name)


def test_create_copy_reload_use_and_revoke_a_scoped_key(panel: Panel, quiet: PanelServer) -> None:
    page, console = panel
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=quiet.url)
    secret = create_key(
        page, quiet, "browser-ci", models="demo-small*", max_concurrent="1", priority="high"
    )
    assert secret.startswith("rp-")
    assert "models demo-small*; at most 1 at once; priority high" in page.inner_text("#new-key")
    screenshot(page, "keys-new.png")

    page.click("#copy-key")
    page.wait_for_selector("#copy-status:has-text('Copied.')")
    assert page.evaluate("navigator.clipboard.readText()") == secret

    page.reload()  # a GET: no resubmission, and the secret is gone
    assert page.locator("#new-key").count() == 0
    assert row_of(page, "browser-ci").count() == 1
    assert "at most 1 at once · high priority" in row_of(page, "browser-ci").inner_text()

    status, listing = api_get(quiet, "/v1/models", secret)
    assert status == 200 and [m["id"] for m in listing["data"]] == ["demo-small"]
    assert api_post(quiet, "/tokenize", {"model": "demo-large", "content": "x"}, secret) == 403
    assert api_post(quiet, "/tokenize", {"model": "demo-small", "content": "x"}, secret) == 200

    row_of(page, "browser-ci").get_by_role("link", name="Edit the scope").click()
    page.fill("#id_models", "demo-small, demo-medium")
    page.click("#scope-form button[type=submit]")
    page.wait_for_selector("text=Saved browser-ci: models demo-small, demo-medium;")
    status, listing = api_get(quiet, "/v1/models", secret)  # the same secret, the new scope
    assert [m["id"] for m in listing["data"]] == ["demo-medium", "demo-small"]

    row_of(page, "browser-ci").get_by_role("link", name="Revoke").click()
    page.wait_for_selector("h1:has-text('Revoke the key “browser-ci”?')")
    page.click("text=Cancel")
    page.wait_for_url(f"{quiet.url}/keys/")
    assert "active" in row_of(page, "browser-ci").inner_text()
    row_of(page, "browser-ci").get_by_role("link", name="Revoke").click()
    page.click("button:has-text('Revoke key')")
    page.wait_for_selector("text=Revoked browser-ci")
    assert "revoked" in row_of(page, "browser-ci").inner_text()
    console.assert_clean()


def test_keys_work_without_javascript(browser: Any, quiet: PanelServer) -> None:
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(f"{quiet.url}/login/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", ADMIN_PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{quiet.url}/")
        secret = create_key(page, quiet, "no-js", models="demo-*")
        assert secret.startswith("rp-")
        assert not page.locator("#copy-key").is_visible()  # nothing to press without JS
        row_of(page, "no-js").get_by_role("link", name="Revoke").click()
        page.click("button:has-text('Revoke key')")
        page.wait_for_selector("text=Revoked no-js")
        assert "revoked" in row_of(page, "no-js").inner_text()
    finally:
        context.close()


def test_the_keys_page_fits_a_phone(new_page: Callable[..., Panel], quiet: PanelServer) -> None:
    page, console = new_page(390, 844)
    page.goto(f"{quiet.url}/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", ADMIN_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{quiet.url}/")
    create_key(page, quiet, "phone", models="demo-small, demo-medium", max_concurrent="4")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width
    screenshot(page, "keys-phone.png")
    console.assert_clean()
