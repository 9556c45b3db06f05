"""The sign-in lockout in a real browser against a real ``serve`` (issue 13).

A user who keeps typing a wrong password meets the panel's lockout page, which says why and for
how long, and the right password does not get past it; an admin who was already signed in sees
the lockout on the Users page and unlocks it, and the user then signs in. Everything happens
from 127.0.0.1, so the address is locked too: the admin signs in before the lockout (sessions
are not affected by it). The server is this module's own, with a limit of 3 failures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.browser import (
    ADMIN_PASSWORD,
    CHROMIUM,
    Console,
    PanelServer,
    add_user,
    screenshot,
    sign_in,
)

Page = tuple[Any, Console]
LIMIT = 3
# Chromium logs every non-2xx document it loads; the lockout page is a 429 on purpose.
EXPECTED_CONSOLE = "status of 429"


@pytest.fixture(scope="module")
def lockout_server(
    chromium_path: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PanelServer]:
    env = {"ROUTERPANEL_LOGIN_FAILURE_LIMIT": str(LIMIT)}
    server = PanelServer(tmp_path_factory.mktemp("lockout"), models_max=1, env=env).start()
    yield server
    server.stop()


def try_sign_in(page: Any, server: PanelServer, username: str, password: str) -> None:
    page.goto(f"{server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def test_a_locked_out_user_sees_why_and_an_admin_unlocks_them(
    new_page: Callable[..., Page], lockout_server: PanelServer
) -> None:
    assert CHROMIUM.exists()
    server = lockout_server
    admin, admin_console = new_page()
    sign_in(admin, server, "admin", ADMIN_PASSWORD)
    password = add_user(admin, server, "victor", "viewer")

    user, user_console = new_page()
    for _ in range(LIMIT - 1):
        try_sign_in(user, server, "victor", "wrong")
        user.wait_for_selector("text=That user name and password do not match.")
    try_sign_in(user, server, "victor", "wrong")
    user.wait_for_selector("#locked-out")
    text = user.locator("#locked-out").inner_text()
    assert "Sign-in locked for now" in text
    assert (
        "Too many failed sign-ins for the user name victor and from this computer's address: "
        f"{LIMIT} within 15 minutes."
    ) in text
    assert "ask an admin to unlock it on the Users page" in text
    screenshot(user, "panel-lockout.png")

    try_sign_in(user, server, "victor", password)  # the right password: still locked
    user.wait_for_selector("#locked-out")
    assert user.url.endswith("/login/")

    admin.goto(f"{server.url}/users/")
    admin.wait_for_selector('[data-lockout="user:victor"]')
    assert admin.locator('[data-lockout="address:127.0.0.1"]').count() == 1
    screenshot(admin, "panel-users-lockouts.png")
    admin.click("text=Unlock user name victor")
    admin.wait_for_selector("text=Unlocked sign-in for the user name victor.")
    # victor's failures were the address's failures too: both lockouts are gone
    assert admin.locator("#lockouts").inner_text().count("Unlock") == 0

    sign_in(user, server, "victor", password)
    assert user.locator(".user .role").inner_text() == "viewer"

    admin.goto(f"{server.url}/audit/?kind=login_unlocked")
    row = admin.locator("table tbody tr").first
    assert "user:admin" in row.inner_text()
    admin.goto(f"{server.url}/audit/?kind=login_locked")
    assert "victor from 127.0.0.1" in admin.locator("table tbody").inner_text()
    admin_console.assert_clean()
    user_console.assert_clean(EXPECTED_CONSOLE)
