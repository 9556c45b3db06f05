"""A write the disk refuses, seen from the panel: a page that says so (503), not a bare 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError
from django.test import Client

from models_app.disk import low_space


@pytest.mark.django_db
def test_a_sign_in_on_a_full_disk_says_the_disk_is_full(
    django_user_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    django_user_model.objects.create_user("ann", password="pw-for-tests-only")

    def full(*args: Any, **kwargs: Any) -> None:  # the session's write, on a full disk
        raise OperationalError("database or disk is full")

    monkeypatch.setattr("django.contrib.auth.views.auth_login", full)
    response = Client().post("/login/", {"username": "ann", "password": "pw-for-tests-only"})
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "30"
    text = response.content.decode()
    assert "The server cannot write its data" in text and "database or disk is full" in text


def test_low_space_is_said_under_the_threshold(tmp_path: Any) -> None:
    assert low_space(tmp_path, 0) is None
    said = low_space(tmp_path, 1 << 40)  # a petabyte: never free here
    assert said is not None and said.startswith(f"the data dir {tmp_path} has ")
