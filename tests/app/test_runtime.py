"""This process's start-up options (models_app.runtime): built once from a command's flags,
frozen, and handed to what serves (the API's config) when the app is built."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from models_app import runtime
from models_app.api.app import build_http_app
from tests.support.asgi import django_stand_in


def parsed(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    runtime.add_router_arguments(parser)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--no-models-autoload", dest="autoload", action="store_false")
    parser.add_argument("--no-router", action="store_true")
    return vars(parser.parse_args(argv))


def test_a_commands_flags_make_one_frozen_runtime() -> None:
    flags = ["--api-key", "sk-a, sk-b,,", "--no-models-autoload", "--server-bin", "llama-x"]
    started = runtime.Runtime.from_options(parsed(*flags, "--models-dir", "/models", "--no-router"))
    assert started == runtime.Runtime(
        autoload=False, api_keys=("sk-a", "sk-b"), models_dir="/models", router=False,
        server_bin="llama-x",
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        started.autoload = True  # type: ignore[misc]


def test_the_api_built_after_the_start_takes_its_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "_started", None)
    assert runtime.current() == runtime.Runtime()  # no command: the defaults
    assert build_http_app(django_stand_in).config.autoload is True
    runtime.start(runtime.Runtime(autoload=False))
    assert build_http_app(django_stand_in).config.autoload is False
