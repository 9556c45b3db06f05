"""Fixtures for the panel tests (test_panel_*.py): users per role and a stand-in router.

The panel reaches the router only through ``models_app.panel.views.common.call_router``; the
``router`` fixture replaces it with ``RouterStub``, which records each call and answers from a
small table, so view tests need no channel layer and no event loop of their own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from models_app.accounts.roles import Role, set_role
from models_app.panel.views import common
from models_app.routing.messages import Call

PASSWORD = "pw-for-tests-only"


def model_row(name: str, state: str = "unloaded", **fields: Any) -> dict[str, Any]:
    """One model as the engine's snapshot shows it."""
    running = state in ("loading", "loaded", "sleeping")
    row = {
        "name": name, "aliases": [], "state": state, "status": state, "failed": False,
        "stopping": False, "pid": 4242 if running else None, "port": 40001 if running else None,
        "in_flight": 0, "last_used": time.time() - 30 if running else None,
        "loaded_at": time.time() - 60 if state == "loaded" else None, "queue_position": None,
        "queue_waiters": 0, "memory": 64 << 20 if running else None, "pinned": False,
        "stop_timeout": 10.0, "exit_code": None, "last_exit": None, "args": [], "info": {},
        "progress": None,
    }  # fmt: skip
    return row | fields


class RouterStub:
    """Answer ``call_router`` like the router would; ``down`` makes it unavailable. A call is
    recorded as its kind (``"load"`` for ``router.load``) and the rest of it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.models: list[dict[str, Any]] = []
        self.queue: list[dict[str, Any]] = []
        self.seq = 7
        self.down = False
        self.answers: dict[str, common.Answer] = {}
        self.memory: list[dict[str, Any]] = []
        self.logs: dict[str, list[dict[str, Any]]] = {}

    def snapshot(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "models": self.models,
            "queue": self.queue,
            "memory": None,
            "config": {"models_max": 2},
        }

    async def __call__(
        self, call: Call, wait: float | None = None, node: str | None = None
    ) -> common.Answer:
        kind = call["type"].removeprefix("router.")
        payload = {key: value for key, value in call.items() if key != "type"}
        if node is not None:
            payload["node"] = node  # several hosts: the node asked
        self.calls.append((kind, payload))
        if self.down:
            return common.Answer(error="router unavailable", status=503)
        if kind in self.answers:
            return self.answers[kind]
        if kind == "memory":
            return common.Answer(body={"memory": self.memory})
        if kind == "logs":
            return common.Answer(body={"logs": self.logs.get(payload["model"], [])})
        if kind == "snapshot":
            return common.Answer(body=self.snapshot())
        if kind == "reload":
            return common.Answer(body={"added": [], "removed": [], "changed": [], "restarted": []})
        return common.Answer(body={"success": True})

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        """The calls of one type (``"load"`` for ``router.load``), each without its type."""
        return [payload for k, payload in self.calls if k == kind]


@pytest.fixture
def panel_router(monkeypatch: pytest.MonkeyPatch) -> Iterator[RouterStub]:
    stub = RouterStub()
    monkeypatch.setattr(common, "call_router", stub)
    yield stub


def make_user(name: str, role: Role) -> Any:
    user = get_user_model().objects.create_user(name, password=PASSWORD)
    set_role(user, role)
    return user


def client_for(user: Any, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@pytest.fixture
def viewer(db: None) -> Any:  # db: a user is a row, whatever marks the test carries
    return make_user("vera", Role.VIEWER)


@pytest.fixture
def operator(db: None) -> Any:  # db: a user is a row, whatever marks the test carries
    return make_user("otto", Role.OPERATOR)


@pytest.fixture
def admin(db: None) -> Any:  # db: a user is a row, whatever marks the test carries
    return make_user("ada", Role.ADMIN)


@pytest.fixture
def viewer_client(viewer: Any) -> Client:
    return client_for(viewer)


@pytest.fixture
def operator_client(operator: Any) -> Client:
    return client_for(operator)


@pytest.fixture
def admin_client(admin: Any) -> Client:
    return client_for(admin)
