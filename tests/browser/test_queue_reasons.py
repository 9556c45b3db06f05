"""A queue entry says what it waits on and what would help (issue 19), in the queue table and on
the card, live and without JavaScript alike; a card never says "queued" while its model loads.

Small and medium run pinned (the cap is 2), so a chat for large that asked to wait
(X-RouterPanel-Wait) waits: both pins are named with "unpin them or raise Max running models",
and no load time is promised. Unpinning one frees a slot: large's entry goes on to stop the idle
model and load, and its card drops "queued #1" as its state turns to loading.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tests.support.browser import (
    PHONE,
    SHOTS,
    Page,
    PanelServer,
    action,
    card,
    chat_as,
    screenshot,
    wait_state,
)

WHY = ("waiting for a slot: demo-medium is pinned, demo-small is pinned — unpin them or raise"
       " Max running models")  # fmt: skip
LIMIT = "gives up after 600 s"  # the default max wait: no request waits without an end
# Every time a card shows its state and its queue flag, they must agree.
WATCH = """() => {
  window.__mixed = [];
  const check = () => {
    for (const el of document.querySelectorAll(".model-card[data-model]")) {
      const flag = el.querySelector('[data-field="queued"]');
      const mixed = el.dataset.state === "loading" && flag && !flag.hidden;
      if (mixed) window.__mixed.push(el.dataset.model);
    }
  };
  new MutationObserver(check).observe(document.getElementById("cards"),
    { subtree: true, attributes: true, childList: true, characterData: true });
}"""


def entry_text(page: Any, model: str) -> str:
    rows = page.locator(f'#queue-body tr[data-model="{model}"]')
    return "\n".join(rows.nth(i).inner_text() for i in range(rows.count()))


def pin_both(page: Any, quiet: PanelServer) -> None:
    for model in ("demo-small", "demo-medium"):
        action(page, "pin", model)
        assert quiet.post("/models/load", {"model": model})[0] == 200
        wait_state(page, model, "loaded")


def test_a_waiting_entry_names_the_pins_and_a_loading_card_is_not_queued(
    open_page: Callable[..., Page], quiet: PanelServer
) -> None:
    page, console = open_page()
    pin_both(page, quiet)
    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(chat_as, quiet, "demo-large", "reason-0001")
        try:
            page.wait_for_selector('#queue-body li[data-request-id="reason-0001"]')
            page.wait_for_function(
                "document.querySelector('#queue-body [data-field=\"queue-reason\"]')"
                "?.textContent.startsWith('waiting for a slot')"
            )
            live = entry_text(page, "demo-large")
            assert WHY in live and LIMIT in live
            assert "loads in" not in live  # only an operator frees a slot: no time is promised
            large = card(page, "demo-large")
            assert large.locator('[data-field="queued"]').is_visible()
            assert large.locator('[data-field="queue-reason"]').inner_text() == WHY
            screenshot(page, "panel-queue-reason.png")

            # The page as the server renders it (no JavaScript) says the same words.
            html = page.request.get(f"{quiet.url}/").text()
            assert WHY in html and LIMIT in html

            page.evaluate(WATCH)
            action(page, "unpin", "demo-small")
            wait_state(page, "demo-large", "loaded")
            assert page.evaluate("window.__mixed") == []
            assert waiter.result(timeout=60)[0] == 200
            page.wait_for_selector("#queue-body tr.empty")
            assert not large.locator('[data-field="queue-reason"]').is_visible()
        finally:
            if not waiter.done():
                action(page, "cancel", "demo-large")
            for model in ("demo-small", "demo-medium"):
                action(page, "unpin", model)
    console.assert_clean()


def test_the_reason_fits_a_phone(open_page: Callable[..., Page], quiet: PanelServer) -> None:
    page, console = open_page("dark", width=PHONE)
    pin_both(page, quiet)
    with ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(chat_as, quiet, "demo-large", "reason-phone-1")
        try:
            page.wait_for_selector('#queue-body li[data-request-id="reason-phone-1"]')
            assert WHY in entry_text(page, "demo-large")
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE
            assert page.evaluate("a11y.overflow()") == []
            assert page.evaluate("a11y.lowText()") == []
            SHOTS.mkdir(exist_ok=True)  # the queue box, not the whole long page
            shot = str(SHOTS / "panel-queue-reason-390-dark.png")
            page.locator("section.queue").screenshot(path=shot)
        finally:
            action(page, "cancel", "demo-large")
            assert waiter.result(timeout=60)[0] == 499
            for model in ("demo-small", "demo-medium"):
                action(page, "unpin", model)
    console.assert_clean()
