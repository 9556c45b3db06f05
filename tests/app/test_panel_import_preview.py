"""The INI import preview (issue 19): each changed field's before and after (aliases and the
[*] section included), a red warning naming the running models the import restarts or deletes
(Replace deleting a loaded model gets a danger button), and an uploaded file kept after preview."""

from __future__ import annotations

import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from models_app.models import Preset
from tests.support.panel import RouterStub, model_row

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db


def preview(client: Client, text: str, **extra: str) -> str:
    response = client.post("/presets/import/", {"text": text, "preview": "1", **extra})
    assert response.status_code == 200
    return response.content.decode()


def test_each_changed_field_shows_before_and_after(
    admin_client: Client, panel_router: RouterStub
) -> None:
    Preset.objects.create(name="ux-test", model_path="/m/a.gguf", aliases=["fast"])
    text = preview(admin_client, "[*]\nctx-size = 4096\n\n[ux-test]\nmodel = /m/b.gguf\n")
    table = text[text.index('data-preset="ux-test"') :]
    table = table[: table.index("</table>")]
    model_file = '<th scope="row">Model file</th><td class="before">/m/a.gguf</td>'
    assert f'{model_file}<td class="after">/m/b.gguf</td>' in table
    aliases = '<th scope="row">Aliases</th><td class="before">fast</td>'
    assert f'{aliases}<td class="after">—</td>' in table  # left out of the file: cleared
    star = text[text.index('data-preset="[*]"') :]
    assert '<td class="before">—</td><td class="after">ctx-size = 4096</td>' in star


def test_running_models_restarted_or_deleted_are_said_in_red(
    admin_client: Client, panel_router: RouterStub
) -> None:
    Preset.objects.create(name="alpha", model_path="/m/a.gguf")
    Preset.objects.create(name="beta", model_path="/m/b.gguf")
    panel_router.models = [model_row("alpha", "loaded"), model_row("beta", "loaded")]
    text = preview(admin_client, "[alpha]\nmodel = /m/a2.gguf\n", replace="on")
    danger = text[text.index('id="import-danger"') :]
    danger = danger[: danger.index("</div>")]
    assert "Deletes running model:</strong> beta" in danger
    assert "Restarts running model</strong>" in danger and ": alpha" in danger
    assert 'class="danger solid" id="apply-import">Apply, deleting 1 running model<' in text


def test_an_uploaded_file_stays_after_preview(
    admin_client: Client, panel_router: RouterStub
) -> None:
    upload = SimpleUploadedFile("models.ini", b"[kept]\nmodel = /m/k.gguf\n")
    response = admin_client.post("/presets/import/", {"file": upload, "preview": "1"})
    text = response.content.decode()
    form = text[text.index('id="import-form"') :]
    assert "[kept]\nmodel = /m/k.gguf" in form  # in the text box, ready to fix and preview again


def test_an_empty_alias_key_clears_the_aliases_and_says_so(
    admin_client: Client, panel_router: RouterStub
) -> None:
    Preset.objects.create(name="ux-test", model_path="/m/a.gguf", aliases=["fast"])
    text = preview(admin_client, "[ux-test]\nmodel = /m/a.gguf\nalias =\n")
    assert (
        '<th scope="row">Aliases</th><td class="before">fast</td><td class="after">—</td>' in text
    )


def test_every_error_of_the_file_is_listed_at_once(
    admin_client: Client, panel_router: RouterStub
) -> None:
    lines = [
        "[good]",  # 1
        "model = /m/g.gguf",  # 2
        "[broken",  # 3: no closing bracket
        "model = /m/b.gguf",  # 4
        "[typed]",  # 5
        "model = /m/t.gguf",  # 6
        "n-gpu-layers = lots",  # 7: not a number
        "no-such-option = 1",  # 8: unknown
        "  indented = 1",  # 9: indented
    ]
    text = preview(admin_client, "\n".join(lines) + "\n")
    box = text[text.index('id="import-error"') :]
    box = box[: box.index("</section>")]
    assert "The file has 4 errors" in box
    found = [int(n) for n in re.findall(r"<strong>Line (\d+):</strong>", box)]
    assert found == [3, 7, 8, 9]
    assert "lots" in box and "no-such-option" in box and "column 0" in box
    assert box.count('class="bad"') == 4  # each bad line marked in the listing
    assert not Preset.objects.exists()


def test_a_changed_node_list_shows_before_and_after(
    admin_client: Client, panel_router: RouterStub
) -> None:
    Preset.objects.create(name="ux-test", model_path="/m/a.gguf", nodes="studio-1")
    text = preview(admin_client, "[ux-test]\nmodel = /m/a.gguf\nnode = studio-2,studio-1\n")
    nodes = '<th scope="row">Nodes</th><td class="before">studio-1</td>'
    assert f'{nodes}<td class="after">studio-1,studio-2</td>' in text
    text = preview(admin_client, "[ux-test]\nmodel = /m/a.gguf\n")
    nodes = '<th scope="row">Nodes</th><td class="before">studio-1</td>'
    assert f'{nodes}<td class="after">any node</td>' in text
