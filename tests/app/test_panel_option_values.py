"""Option values checked by the option's type, from llama-server's option table (issue 19):
``n-gpu-layers = lots`` is a field error in the preset form (the banner takes the focus and
links to the field) and a line-numbered error in an INI import, which then changes nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from models_app.models import AuditEvent, Preset
from routerpanel.router import options
from tests.support.panel import RouterStub
from tests.support.preset_form import form

pytest_plugins = ("tests.support.panel",)


def problem(key: str, value: str) -> str | None:
    found = options.builtin().lookup(key)
    assert found is not None, key
    return options.value_problem(found[0], value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("n-gpu-layers", "99"), ("n-gpu-layers", "auto"), ("n-gpu-layers", "all"), ("ngl", "-1"),
     ("ctx-size", "8192"), ("c", "0"), ("temp", "0.7"), ("top-p", "1"), ("cont-batching", "true"),
     ("flash-attn", "auto"), ("fa", "on"), ("rope-scaling", "yarn"), ("pooling", "mean"),
     ("jinja", "true"), ("poll", "50"), ("cache-type-k", "q8_0"), ("alias", "anything")],
)  # fmt: skip
def test_values_of_the_right_type_pass(key: str, value: str) -> None:
    assert problem(key, value) is None


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [("n-gpu-layers", "lots", "expects a number of layers, auto or all"),
     ("ctx-size", "8k", "expects a whole number"), ("ctx-size", "4096.5", "expects a whole number"),
     ("temp", "warm", "expects a number"), ("flash-attn", "maybe", "expects on, off, auto"),
     ("rope-scaling", "cubic", "expects one of none, linear, yarn"),
     ("poll", "101", "from 0 to 100")],
)  # fmt: skip
def test_values_of_the_wrong_type_are_refused(key: str, value: str, says: str) -> None:
    assert says in (problem(key, value) or "")


@pytest.mark.django_db
def test_the_form_shows_a_field_error_and_a_banner_that_links_to_it(
    admin_client: Client, panel_router: RouterStub
) -> None:
    response = admin_client.post("/presets/new/", form(args=[("n-gpu-layers", "lots")]))
    assert response.status_code == 200 and not Preset.objects.exists()
    text = response.content.decode()
    message = (
        "n-gpu-layers = &#x27;lots&#x27;: n-gpu-layers expects a number of layers, auto or all."
    )
    assert text.count(message) == 2  # on its row and in the banner
    assert 'id="form-errors" tabindex="-1" autofocus' in text
    assert '<a href="#id_args-0-value">Option 1</a>' in text
    assert 'id="id_args-0-value" value="lots"' in text and 'aria-invalid="true"' in text
    assert not panel_router.of_kind("reload")


@pytest.mark.django_db
def test_an_import_names_the_line_and_changes_nothing(
    admin_client: Client, panel_router: RouterStub
) -> None:
    Preset.objects.create(name="alpha", model_path="/models/old.gguf")
    ini = "[alpha]\nmodel = /models/alpha.gguf\n\n[beta]\nctx-size = 4096\nn-gpu-layers = lots\n"
    for button in ("preview", "apply"):
        response = admin_client.post("/presets/import/", {"text": ini, button: "1"})
        text = response.content.decode()
        assert response.status_code == 200
        assert "The file has an error on line 6" in text
        assert "n-gpu-layers expects a number of layers, auto or all" in text
    assert list(Preset.objects.values_list("name", "model_path")) == [("alpha", "/models/old.gguf")]
    assert not AuditEvent.objects.exists() and not panel_router.of_kind("reload")
