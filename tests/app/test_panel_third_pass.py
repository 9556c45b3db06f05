"""Issue 49, the panel's third pass: the open API said where an admin looks (keys and settings
pages, serve's start-up line), labels in the settings' "Saved:" flash, and the INI import's rules
(warnings beside errors; one rule for a negative stop-timeout in the INI and the form; one rule,
stated on the preview, for what a file leaves out)."""

from __future__ import annotations

import io

import pytest
from django.test import Client

from models_app import runtime
from models_app.models import Preset, RouterSettings
from models_app.security import warn_if_open
from tests.support.panel import RouterStub
from tests.support.preset_form import form
from tests.support.settings_form import body

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db

SWITCH = "Require an API key for the router API"


def banner(client: Client, path: str) -> str | None:
    text = client.get(path).content.decode()
    if 'id="api-open"' not in text:
        return None
    box = text[text.index('id="api-open"') :]
    return box[: box.index("</div>")]


class TestTheOpenApi:
    def test_the_keys_and_settings_pages_say_keys_are_not_required_and_how_to_require_them(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        for path in ("/keys/", "/settings/"):
            box = banner(admin_client, path)
            assert box is not None, path
            assert "any key, a wrong one or none" in box and SWITCH in box, box
        RouterSettings.objects.filter(pk=1).update(require_api_key=True)
        assert banner(admin_client, "/keys/") is None
        assert banner(admin_client, "/settings/") is None

    def test_a_static_key_closes_it_too(
        self, admin_client: Client, panel_router: RouterStub, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(runtime, "_started", runtime.Runtime(api_keys=("sk-static",)))
        assert banner(admin_client, "/keys/") is None

    def test_serve_on_the_network_says_it_in_one_line_with_the_step_that_closes_it(self) -> None:
        out = io.StringIO()
        assert warn_if_open("0.0.0.0", [], out) is True
        lines = out.getvalue().strip().splitlines()
        assert len(lines) == 1, lines
        assert "0.0.0.0" in lines[0] and SWITCH in lines[0]


def test_the_saved_flash_names_the_fields_by_their_labels(
    admin_client: Client, panel_router: RouterStub
) -> None:
    answer = admin_client.post(
        "/settings/", body(require_api_key="on", models_max="2"), follow=True
    )
    text = answer.content.decode()
    assert f"Saved: Max running models, {SWITCH}." in text, text[text.find("Saved") - 50 :][:300]


class TestImport:
    def preview(self, client: Client, text: str) -> str:
        response = client.post("/presets/import/", {"text": text, "preview": "1"})
        assert response.status_code == 200
        return response.content.decode()

    def test_a_file_with_errors_shows_its_warnings_too(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        text = self.preview(
            admin_client, "[a]\nmodel = /m/a.gguf\nstop-timeout = -5\n\n[b]\nn-gpu-layers = lots\n"
        )
        box = text[text.index('id="import-error"') :]
        box = box[: box.index("</section>")]
        assert "lots" in box
        assert "line 3: stop-timeout = -5 means 0 (kill at once)" in box, box

    def test_a_negative_stop_timeout_means_zero_in_the_form_as_in_the_file(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        response = admin_client.post("/presets/new/", form(stop_timeout="-1"), follow=True)
        text = response.content.decode()
        assert Preset.objects.get(name="org/tiny:Q8_0").stop_timeout == 0, text
        assert "stop-timeout = -1 means 0 (kill at once)" in text

    def test_a_field_the_file_leaves_out_is_cleared_for_every_field_and_the_preview_says_so(
        self, admin_client: Client, panel_router: RouterStub
    ) -> None:
        Preset.objects.create(
            name="ux-test", model_path="/m/a.gguf", aliases=["fast"], stop_timeout=30
        )
        text = self.preview(admin_client, "[ux-test]\nmodel = /m/a.gguf\n")
        table = text[text.index('data-preset="ux-test"') :]
        table = table[: table.index("</table>")]
        for label, before in (("Aliases", "fast"), ("Stop-timeout", "30")):
            row = f'<th scope="row">{label}</th><td class="before">{before}</td>'
            assert f'{row}<td class="after">—</td>' in table, (label, table)
        rule = text[text.index('id="import-rule"') :]
        assert "leaves out" in rule[: rule.index("</p>")]
