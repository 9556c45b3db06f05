"""The panel in a real browser against a real ``serve --demo`` (issue 6's list, in its order).

The demo runs three simulated models (small loads in 0.4 s, medium in 1.5 s, large in 4 s) with
``--models-max 2``, so a third load evicts the least recently used idle model. Each test starts
from a router with nothing running (``quiet``). Waits are for conditions, never fixed sleeps.
"""

from __future__ import annotations

import csv
import io
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support.browser import (
    ADMIN_PASSWORD,
    Console,
    PanelServer,
    add_user,
    card,
    chat_as,
    screenshot,
    sign_in,
    wait_live,
    wait_state,
)

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too

Panel = tuple[Any, Console]


def mark_page(page: Any) -> None:
    """Tag the document: if it is still tagged later, the page was never reloaded."""
    page.evaluate("window.__sameDocument = true")


def same_page(page: Any) -> bool:
    return bool(page.evaluate("window.__sameDocument === true"))


def test_log_in(new_page: Callable[..., Panel], quiet: PanelServer) -> None:
    page, console = new_page()
    page.goto(f"{quiet.url}/presets/")
    page.wait_for_url("**/login/?next=/presets/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    page.wait_for_selector("text=That user name and password do not match.")
    page.fill("#id_username", "admin")
    page.fill("#id_password", ADMIN_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{quiet.url}/presets/")
    page.goto(f"{quiet.url}/")
    wait_live(page)
    assert page.locator("#conn").inner_text() == "● live"
    assert page.locator(".user .role").inner_text() == "admin"
    console.assert_clean()


def test_create_a_preset_with_a_field_error_corrected(
    panel: Panel, quiet: PanelServer, tmp_path: Path
) -> None:
    from tests.support.ggufgen import write_tiny_llama

    page, console = panel
    (tmp_path / "models").mkdir()
    gguf = write_tiny_llama(
        tmp_path / "models" / "tiny-chat-F16.gguf",
        n_embd=64,
        n_layer=4,
        n_head=4,
        n_ff=256,
        ctx=4096,
        seed=7,
        vocab_path=None,
        name="tiny-chat",
    )
    page.goto(f"{quiet.url}/presets/new/")
    page.fill("#id_name", "team/tiny-chat:f16")
    page.fill("#id_model_path", str(gguf))
    page.fill("#id_args-0-key", "ctx-sizee")
    page.fill("#id_args-0-value", "2048")
    page.click("#preset-form button[type=submit]")
    page.wait_for_selector("#form-errors")
    assert "use 'team/tiny-chat:F16'" in page.locator(".field.has-error").first.inner_text()
    assert "llama-server has no option 'ctx-sizee'" in page.locator(".row-error").inner_text()

    page.fill("#id_name", "team/tiny-chat:F16")
    page.fill("#id_args-0-key", "ctx-size")
    page.click("[data-add-row=args]")  # the JavaScript row button
    page.fill("#id_args-2-key", "temp")
    page.fill("#id_args-2-value", "0.7")
    page.select_option("#id_pinned", "true")
    page.click("#preset-form button[type=submit]")
    page.wait_for_selector("text=Created team/tiny-chat:F16.")
    assert page.locator("h1").inner_text().startswith("team/tiny-chat:F16")
    assert "ctx-size = 2048" in page.locator("dl.kv").first.inner_text()
    page.wait_for_selector("text=Estimate at context 2048")  # read from the GGUF on save

    page.click("text=Edit")
    page.wait_for_selector("#preset-form")
    screenshot(page, "panel-preset-editor.png")
    console.assert_clean()


def test_start_a_load_from_the_dashboard_and_see_it_loading_then_loaded(panel: Panel) -> None:
    page, console = panel
    mark_page(page)
    card(page, "demo-medium").locator("button[value=load]").click()
    # the toast shows for 4 s from the spawn's answer: look for it now, not after the load
    page.wait_for_selector('.toast:has-text("demo-medium: load started")')
    wait_state(page, "demo-medium", "loading")
    assert card(page, "demo-medium").locator("[data-field=state-text]").inner_text() == "loading"
    wait_state(page, "demo-medium", "loaded")
    assert card(page, "demo-medium").locator("[data-field=pid]").inner_text() != "—"
    assert card(page, "demo-medium").locator("button[value=unload]").is_visible()
    assert same_page(page)
    console.assert_clean()


LOADING_PAST_20_PERCENT = """() => {
  const bar = document.querySelector('.model-card[data-model="demo-large"] progress');
  return bar && bar.hasAttribute("value") && bar.value >= 20;
}"""


def test_an_eviction_through_the_api_changes_the_victims_card_and_the_audit_feed(
    panel: Panel, quiet: PanelServer
) -> None:
    """Small and medium run (the cap is 2); medium is pinned, so loading large evicts small,
    and a request for small then waits in the queue: the dashboard mid-swap."""
    page, console = panel
    mark_page(page)
    card(page, "demo-medium").locator("button[value=pin]").click()
    page.wait_for_selector('.model-card[data-model="demo-medium"] [data-field=pinned]:visible')
    try:
        for model in ("demo-small", "demo-medium"):  # small is used first: the LRU victim
            assert quiet.post("/models/load", {"model": model})[0] == 200
            wait_state(page, model, "loaded")
        assert quiet.post("/models/load", {"model": "demo-large"})[0] == 200
        wait_state(page, "demo-small", "unloaded")
        victim = card(page, "demo-small")
        assert "Evicted for demo-large by" in victim.locator("[data-field=lastline]").inner_text()
        assert victim.locator("button[value=load]").is_visible()
        with ThreadPoolExecutor(1) as pool:  # waits in the queue until large has loaded
            queued = pool.submit(quiet.post, "/models/load", {"model": "demo-small"})
            page.wait_for_selector("#queue-body td:has-text('demo-small')")
            page.wait_for_selector('#feed li.kind-eviction:has-text("demo-small")')
            page.wait_for_function(LOADING_PAST_20_PERCENT)
            page.wait_for_function("Number(document.body.dataset.memoryPoints) >= 3")
            page.wait_for_selector(".toast", state="detached")
            screenshot(page, "panel-dashboard.png")  # mid-swap
            assert queued.result(timeout=120)[0] == 200
        wait_state(page, "demo-small", "loaded")  # large, idle once loaded, made room for it
        page.wait_for_selector('#feed li.kind-eviction:has-text("stopped for demo-small")')
        rows = page.locator("#feed li.kind-eviction").all_inner_texts()
        assert any("demo-small" in r and "stopped for demo-large" in r for r in rows), rows
    finally:
        card(page, "demo-medium").locator("button[value=unpin]").click()
        page.wait_for_selector('.model-card[data-model="demo-medium"] [data-field=pinned]',
                               state="hidden")  # fmt: skip
    assert same_page(page)
    console.assert_clean()


def test_an_operator_cancels_a_queued_request_from_the_dashboard(
    panel: Panel, quiet: PanelServer
) -> None:
    """Small and medium run pinned (the cap is 2), so a request for large waits for good: the
    queue lists it by its request id, Cancel answers its client 499 and the audit feed says who
    cancelled it. Each card says how long its model has been in its state."""
    page, console = panel
    mark_page(page)
    for model in ("demo-small", "demo-medium"):
        card(page, model).locator("button[value=pin]").click()
        page.wait_for_selector(f'.model-card[data-model="{model}"] [data-field=pinned]:visible')
    try:
        for model in ("demo-small", "demo-medium"):
            assert quiet.post("/models/load", {"model": model})[0] == 200
            wait_state(page, model, "loaded")
        since = card(page, "demo-small").locator("[data-field=since]")
        page.wait_for_function("el => /^for \\d/.test(el.textContent)", arg=since.element_handle())
        with ThreadPoolExecutor(1) as pool:
            waiter = pool.submit(chat_as, quiet, "demo-large", "browser-waiter-1")
            row = page.locator('#queue-body li[data-request-id="browser-waiter-1"]')
            row.wait_for()
            assert "anonymous" in row.inner_text()
            page.set_viewport_size({"width": 390, "height": 844})  # the queue fits a phone too
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
            screenshot(page, "panel-queue-phone.png")
            page.set_viewport_size({"width": 1366, "height": 900})
            row.locator("button", has_text="Cancel").click()
            status, body = waiter.result(timeout=30)
            assert status == 499 and body["error"]["type"] == "cancelled"
            assert "cancelled by user:admin" in body["error"]["message"]
        page.wait_for_selector("#queue-body tr.empty")
        page.wait_for_selector('.toast:has-text("cancelled request browser-waiter-1")')
        page.wait_for_selector('#feed li.kind-queue_cancelled:has-text("demo-large")')
        assert "user:admin" in page.locator("#feed li.kind-queue_cancelled").first.inner_text()
        assert card(page, "demo-large").get_attribute("data-state") == "unloaded"
    finally:
        for model in ("demo-small", "demo-medium"):
            card(page, model).locator("button[value=unpin]").click()
            page.wait_for_selector(f'.model-card[data-model="{model}"] [data-field=pinned]',
                                   state="hidden")  # fmt: skip
    assert same_page(page)
    console.assert_clean()


BUSY_CARD = """() => {
  const card = document.querySelector('.model-card[data-model="demo-small"]');
  const n = card.querySelector('[data-field=in_flight]').textContent;
  const who = card.querySelector('[data-field=holders]').textContent;
  return n === "1" && who === "anonymous";
}"""


def test_a_card_shows_live_who_has_requests_in_flight(panel: Panel, quiet: PanelServer) -> None:
    """Requests back to back keep demo-small busy (a demo answer takes 0.3 s) until a memory
    sample, sent every second, has shown who is using it; then the card goes back to 0."""
    page, console = panel
    mark_page(page)
    assert quiet.post("/models/load", {"model": "demo-small"})[0] == 200
    wait_state(page, "demo-small", "loaded")
    stop = threading.Event()

    def keep_busy() -> int:
        sent = 0
        while not stop.is_set():
            sent += 1
            assert chat_as(quiet, "demo-small", f"browser-busy-{sent}", 16)[0] == 200
        return sent

    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(keep_busy)
        try:
            page.wait_for_function(BUSY_CARD)
        finally:
            stop.set()
        assert busy.result(timeout=60) >= 1
    small = '.model-card[data-model="demo-small"]'
    page.wait_for_selector(f"{small} [data-field=in_flight]:text-is('0')")
    assert card(page, "demo-small").locator("[data-field=holders]").inner_text() == ""
    assert same_page(page)
    console.assert_clean()


def test_the_memory_chart_gains_points(panel: Panel) -> None:
    page, console = panel
    page.wait_for_selector("#memchart-system canvas")
    before = int(page.evaluate("Number(document.body.dataset.memoryPoints || 0)"))
    page.wait_for_function(f"Number(document.body.dataset.memoryPoints) >= {before + 2}")
    card(page, "demo-small").locator("button[value=load]").click()
    wait_state(page, "demo-small", "loaded")
    # an earlier test's load left demo-small in the hour's history (and the legend): wait for a
    # sample of it running now (its column's newest value, null while it was not running)
    page.wait_for_function(
        "() => { const v = window.panelChart.cols.models['demo-small'];"
        " return !!v && v[v.length - 1] != null; }"
    )
    page.wait_for_selector("#memchart-models .u-legend th:has-text('demo-small')")
    console.assert_clean()


def test_a_viewer_cannot_load_edit_or_see_the_settings_form(
    panel: Panel, new_page: Callable[..., Panel], quiet: PanelServer
) -> None:
    admin_page, _ = panel
    password = add_user(admin_page, quiet, "vera", "viewer")
    page, console = new_page()
    sign_in(page, quiet, "vera", password)

    assert page.locator("button[value=load]").count() == 0
    assert page.locator(".model-card").count() >= 3
    answer = page.evaluate("window.panelLive.action('load', 'demo-small')")
    assert answer["ok"] is False and answer["forbidden"] is True

    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    forged = page.request.post(
        f"{quiet.url}/actions/model/",
        form={"action": "load", "model": "demo-small", "csrfmiddlewaretoken": token},
        headers={"Referer": f"{quiet.url}/"},
        max_redirects=0,
    )
    assert forged.status == 403
    assert quiet.models()["demo-small"]["state"] == "unloaded"

    preset_id = page.locator('.model-card[data-model="demo-small"]').get_attribute("data-preset-id")
    response = page.goto(f"{quiet.url}/presets/{preset_id}/edit/")
    assert response is not None and response.status == 403
    page.goto(f"{quiet.url}/settings/")
    assert page.locator("#settings-readonly").is_visible()
    assert page.locator("#settings-form, input[name=models_max]").count() == 0
    console.assert_clean("status of 403")


INI = """\
[demo-small]
server-bin = {python} -m routerpanel.router.simserver
sim-load-ms = 400
sim-rss-mb = 64
sim-token-ms = 20
memory = 64M

[imported-model]
model = /models/imported.gguf
ctx-size = 8192
stop-timeout = 20
"""


def test_ini_import_preview_and_apply(panel: Panel, quiet: PanelServer) -> None:
    import shlex
    import sys

    page, console = panel
    page.goto(f"{quiet.url}/presets/import/")
    page.fill("#id_text", "[ok]\nctx-size = 1\n[broken\n")
    page.click("button[name=preview]")
    page.wait_for_selector("#import-error")
    assert "The file has an error on line 3" in page.locator("#import-error").inner_text()
    assert page.locator(".ini-lines li.bad").inner_text().endswith("[broken")

    page.fill("#id_text", INI.format(python=shlex.quote(sys.executable)))
    page.click("button[name=preview]")
    page.wait_for_selector("#import-preview")
    preview = page.locator("#import-preview").inner_text()
    assert "Preview: 1 created, 0 updated, 1 unchanged" in preview
    assert "imported-model" in preview
    page.goto(f"{quiet.url}/presets/")
    assert page.locator("text=imported-model").count() == 0  # a preview changes nothing

    page.go_back()
    page.click("button[name=apply]")
    page.wait_for_selector("text=Imported: 1 created, 0 updated, 1 unchanged.")
    page.wait_for_selector("td >> text=imported-model")
    assert "imported-model" in quiet.models()
    console.assert_clean()


def test_audit_filter_and_csv_export(panel: Panel, quiet: PanelServer, tmp_path: Path) -> None:
    page, console = panel
    assert quiet.post("/models/load", {"model": "demo-small"})[0] == 200
    page.goto(f"{quiet.url}/audit/")
    page.wait_for_selector("#audit-table td:has-text('demo-small')")
    screenshot(page, "panel-audit-log.png")

    page.select_option("#id_model", "demo-small")  # a picker of the known models
    page.select_option("#id_kind", "ready")
    page.click("#audit-filters button[type=submit]")
    page.wait_for_url("**/audit/?model=demo-small&kind=ready*")
    for _ in range(20):  # the audit writer batches its rows: the ready row may come later
        if page.locator("#audit-table tbody td[data-label=Kind]").count():
            break
        page.wait_for_timeout(500)
        page.reload()
    kinds = page.locator("#audit-table tbody td[data-label=Kind]").all_inner_texts()
    assert kinds and set(kinds) == {"ready"}
    links = page.locator("#audit-table tbody td[data-label=Time] a").all()
    shown = {link.get_attribute("href").strip("/").split("/")[-1] for link in links}

    with page.expect_download() as download:
        page.click("#export-csv")
    path = tmp_path / "audit.csv"
    download.value.save_as(path)
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert shown <= {r["id"] for r in rows}  # rows may have landed since the page rendered
    assert {(r["kind"], r["model"]) for r in rows} == {("ready", "demo-small")}
    assert rows[0]["load_seconds"] and rows[0]["to_state"] == "loaded"
    console.assert_clean()


def test_a_models_log_is_tailed_live(panel: Panel, quiet: PanelServer) -> None:
    page, console = panel
    page.goto(f"{quiet.url}/logs/demo-small/")
    wait_live(page)
    # the model's log keeps lines across loads, and an earlier test loaded it: count them first
    loaded = page.locator("#log .line", has_text="model loaded: id 'demo-small'")
    seen = loaded.count()
    assert quiet.post("/models/load", {"model": "demo-small"})[0] == 200
    expect(loaded).to_have_count(seen + 1)
    page.wait_for_selector("#log-state:text-is('loaded')")  # not "unloaded", which holds it
    console.assert_clean()


def test_the_dashboard_fits_a_phone(new_page: Callable[..., Panel], quiet: PanelServer) -> None:
    page, console = new_page(width=390, height=844)
    sign_in(page, quiet, "admin", ADMIN_PASSWORD)
    page.wait_for_selector("#memchart-system canvas")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    box = card(page, "demo-small").bounding_box()
    assert box is not None and box["width"] <= 390
    console.assert_clean()


@pytest.fixture
def own_server(chromium_path: Path, tmp_path: Path) -> Any:
    panel = PanelServer(tmp_path).start()
    yield panel
    panel.stop()


def test_the_websocket_reconnects_after_the_server_restarts(
    new_page: Callable[..., Panel], own_server: PanelServer
) -> None:
    page, console = new_page()
    sign_in(page, own_server, "admin", ADMIN_PASSWORD)
    mark_page(page)
    connects = page.evaluate("window.panelLive.connects")

    own_server.stop()
    # Read state and text in one go: while the server is down the page goes reconnecting ->
    # connecting -> reconnecting every few hundred ms, so a second read may see "connecting".
    page.wait_for_function(
        "document.body.dataset.connection === 'reconnecting'"
        " && document.querySelector('#conn').textContent.includes('reconnecting in')"
    )
    own_server.start()
    page.wait_for_function(f"window.panelLive.connects > {connects}", timeout=90_000)
    wait_live(page)

    assert own_server.post("/models/load", {"model": "demo-small"})[0] == 200
    wait_state(page, "demo-small", "loaded")  # events flow on the new socket
    assert same_page(page)
    console.assert_clean("WebSocket", "ERR_CONNECTION_REFUSED")
