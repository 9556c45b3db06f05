"""The browser tier: headless Chromium (Debian's, driven by Playwright) against a real
``manage.py serve --demo`` on a free port with a temporary data dir (DESIGN §9).

``server`` is that subprocess (``PanelServer``; it and the page helpers are in
``tests/support/browser.py``). ``panel`` signs a page in as admin, ``open_page`` makes signed-in
admin pages (light or dark, at any width), ``new_page`` gives more pages (other users) in fresh
contexts. Every page records console errors and uncaught exceptions; a test ends by asserting
there were none (issue 6: no console errors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import (
    A11Y,
    ADMIN_PASSWORD,
    CHROMIUM,
    PHONE,
    Console,
    Page,
    PanelServer,
    sign_in,
)
from tests.support.tiers import missing

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
WAIT = 30_000  # ms: Playwright's default wait for a condition


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    return CHROMIUM


# Package scope, not session: Playwright's sync API keeps an event loop running in the main
# thread while it is open, and every later tier that starts a loop (asyncio.run, pytest-asyncio)
# would fail with "cannot be called from a running event loop". Close it when the tier ends.
@pytest.fixture(scope="package")
def browser(chromium_path: Path) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(chromium_path), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="package")
def server(chromium_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PanelServer]:
    panel = PanelServer(tmp_path_factory.mktemp("panel")).start()
    yield panel
    panel.stop()


@pytest.fixture
def quiet(server: PanelServer) -> PanelServer:
    server.unload_all()
    return server


@pytest.fixture
def new_page(browser: Any) -> Iterator[Callable[..., tuple[Any, Console]]]:
    contexts: list[Any] = []

    def make(width: int = 1366, height: int = 900, **options: Any) -> tuple[Any, Console]:
        """A page in a fresh context; ``options`` go to it (``color_scheme="dark"``…)."""
        context = browser.new_context(viewport={"width": width, "height": height}, **options)
        context.set_default_timeout(WAIT)
        contexts.append(context)
        page = context.new_page()
        return page, Console(page)

    yield make
    for context in contexts:
        context.close()


@pytest.fixture
def panel(new_page: Callable[..., tuple[Any, Console]], quiet: PanelServer) -> tuple[Any, Console]:
    """A page signed in as the admin, on the live dashboard."""
    page, console = new_page()
    sign_in(page, quiet, "admin", ADMIN_PASSWORD)
    return page, console


@pytest.fixture
def open_page(new_page: Callable[..., Page], quiet: PanelServer) -> Callable[..., Page]:
    """A signed-in admin page: ``scheme`` light or dark, ``width`` 1366 or a phone's."""

    def make(scheme: str = "light", width: int = 1366) -> Page:
        page, console = new_page(width=width, height=844 if width <= PHONE else 900,
                                 color_scheme=scheme, reduced_motion="reduce")  # fmt: skip
        page.add_init_script(A11Y)
        sign_in(page, quiet, "admin", ADMIN_PASSWORD)
        return page, console

    return make
