"""The Django admin serves presets: create one through the add form, with a field error first."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from models_app.models import Preset
from tests.support.admin import FORM

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client() -> Client:
    user = get_user_model().objects.create_superuser("admin", "", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


def test_it_shows_a_field_error_then_creates_the_preset(admin_client: Client) -> None:
    response = admin_client.post("/admin/models_app/preset/add/", FORM)
    assert response.status_code == 200
    assert "use &#x27;org/tiny:Q8_0&#x27;" in response.content.decode()
    assert not Preset.objects.exists()

    response = admin_client.post("/admin/models_app/preset/add/", {**FORM, "name": "org/tiny:Q8_0"})
    assert response.status_code == 302, response.content.decode()[:2000]
    preset = Preset.objects.get()
    assert (preset.name, preset.stop_timeout, preset.args) == (
        "org/tiny:Q8_0",
        15,
        [["ctx-size", "4096"]],
    )
    assert preset.updated_by is not None and preset.updated_by.username == "admin"


def test_the_admin_needs_a_login() -> None:
    response = Client().get("/admin/models_app/preset/")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_the_admin_pages_render_with_their_styles(admin_client: Client) -> None:
    assert admin_client.get("/admin/models_app/preset/").status_code == 200
    assert admin_client.get("/admin/models_app/routersettings/").status_code == 200
    assert Client().get("/static/admin/css/base.css").status_code == 200
