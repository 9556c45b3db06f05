"""The dashboard WebSocket: who may connect, snapshot first then numbered events, actions by role,
resync, logs and the live audit feed."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import OperationalError
from django.test import Client

from models_app.accounts.roles import Role, set_role
from models_app.models import AuditEvent, AuditKind
from models_app.panel.consumers import CLOSE_FORBIDDEN, DashboardConsumer
from models_app.panel.views import actions, common
from models_app.routing import topology, wire
from routerpanel.router.catalogue import Event
from tests.support.dashboard_socket import TIMEOUT, connect, receive
from tests.support.panel import RouterStub, make_user, model_row

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db(transaction=True)


async def emit(seq: int, kind: str, data: dict[str, Any]) -> None:
    event = {"seq": seq, "type": kind, "time": 1.0, "data": data}
    await get_channel_layer().group_send(topology.EVENTS_GROUP, wire.event(event))


@pytest.fixture
def stub(panel_router: RouterStub) -> RouterStub:
    panel_router.models = [model_row("demo-small", "loaded"), model_row("demo-large")]
    panel_router.memory = [
        {
            "time": 10.0,
            "system": {"used": 1, "available": 2},
            "children": {"demo-small": {"rss": 3}},
        }
    ]
    panel_router.logs = {"demo-small": [{"time": 1.0, "stream": "stderr", "text": "hello"}]}
    return panel_router


class TestConnect:
    @pytest.mark.parametrize("role", [None, Role.NONE], ids=["anonymous", "no-role"])
    async def test_a_visitor_without_a_role_is_refused(self, role: Role | None) -> None:
        user = AnonymousUser() if role is None else await sync_to_async(make_user)("x", role)
        socket = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
        socket.scope["user"] = user
        connected, code = await socket.connect(timeout=TIMEOUT)
        assert (connected, code) == (False, CLOSE_FORBIDDEN)

    async def test_the_snapshot_comes_first_then_memory_audit_and_events(
        self, stub: RouterStub
    ) -> None:
        await sync_to_async(AuditEvent.objects.record)(AuditKind.READY, model="demo-small")
        socket = await connect(await sync_to_async(make_user)("vera", Role.VIEWER))
        first = await socket.receive_json_from(timeout=TIMEOUT)
        assert first["type"] == "snapshot"
        assert first["snapshot"]["seq"] == 7
        assert [m["name"] for m in first["snapshot"]["models"]] == ["demo-small", "demo-large"]
        assert first["presets"] == {}
        memory = await socket.receive_json_from(timeout=TIMEOUT)
        assert memory["type"] == "memory"
        assert memory["history"]["models"] == {"demo-small": [3]}
        audit = await socket.receive_json_from(timeout=TIMEOUT)
        assert audit["type"] == "audit" and audit["initial"] is True
        assert [row["kind"] for row in audit["rows"]] == ["ready"]

        await emit(
            8, Event.MODEL_STATE, {"model": "demo-large", "from": "unloaded", "to": "loading"}
        )
        event = await receive(socket, "event")
        assert event["event"]["seq"] == 8 and event["event"]["data"]["to"] == "loading"
        await socket.disconnect()

    async def test_the_router_being_down_is_said_in_place_of_the_snapshot(
        self, stub: RouterStub
    ) -> None:
        stub.down = True
        socket = await connect(await sync_to_async(make_user)("vera", Role.VIEWER))
        first = await socket.receive_json_from(timeout=TIMEOUT)
        assert first == {"type": "snapshot", "error": "router unavailable", "presets": {}}
        await socket.disconnect()

    async def test_the_full_stack_needs_a_session_and_our_own_origin(
        self, stub: RouterStub
    ) -> None:
        from routerpanel.asgi import application

        user = await sync_to_async(make_user)("vera", Role.VIEWER)
        client = Client()
        await sync_to_async(client.force_login)(user)
        cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
        for origin, expected in ((b"http://evil.example", False), (b"http://localhost", True)):
            headers = [(b"origin", origin), (b"cookie", cookie), (b"host", b"localhost")]
            socket = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
            connected, _ = await socket.connect(timeout=TIMEOUT)
            assert connected is expected, origin
            if connected:
                assert (await receive(socket, "snapshot"))["snapshot"]["seq"] == 7
                await socket.disconnect()
        anonymous = WebsocketCommunicator(
            application, "/ws/dashboard/", headers=[(b"origin", b"http://localhost")]
        )
        assert (await anonymous.connect(timeout=TIMEOUT))[0] is False


class TestMessages:
    async def test_a_viewers_action_is_refused_and_never_reaches_the_router(
        self, stub: RouterStub
    ) -> None:
        socket = await connect(await sync_to_async(make_user)("vera", Role.VIEWER))
        await receive(socket, "snapshot")
        for action in ("load", "unload", "pin", "cancel"):
            await socket.send_json_to({"type": "action", "id": 1, "action": action,
                                       "model": "demo-small"})  # fmt: skip
            answer = await receive(socket, "action_result")
            assert answer["ok"] is False and answer["forbidden"] is True
            assert answer["message"].startswith("forbidden")
        assert not stub.of_kind("load") and not stub.of_kind("unload")
        assert not stub.of_kind("reload")
        await socket.disconnect()

    async def test_an_operators_load_goes_to_the_router_as_the_user(self, stub: RouterStub) -> None:
        socket = await connect(await sync_to_async(make_user)("otto", Role.OPERATOR))
        await receive(socket, "snapshot")
        await socket.send_json_to(
            {"type": "action", "id": 5, "action": "load", "model": "demo-large"}
        )
        answer = await receive(socket, "action_result")
        assert answer == {
            "type": "action_result",
            "id": 5,
            "ok": True,
            "message": "demo-large: load started",
            "pending": False,
        }
        assert stub.of_kind("load") == [{"model": "demo-large", "actor": "user:otto"}]
        await socket.disconnect()

    async def test_an_operator_cancels_a_queued_request_over_the_socket(
        self, stub: RouterStub
    ) -> None:
        stub.answers["cancel_queued"] = common.Answer(body={"success": True, "cancelled": ["r9"]})
        socket = await connect(await sync_to_async(make_user)("otto", Role.OPERATOR))
        await receive(socket, "snapshot")
        await socket.send_json_to(
            {"type": "action", "id": 6, "action": "cancel", "model": "m", "request_id": "r9"}
        )
        answer = await receive(socket, "action_result")
        assert answer["ok"] is True and answer["message"] == "m: cancelled request r9"
        assert stub.of_kind("cancel_queued") == [{"queued_request": "r9", "actor": "user:otto"}]
        await socket.disconnect()

    async def test_an_action_the_database_refuses_is_answered_not_dropped(
        self, stub: RouterStub, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def locked(*args: Any) -> None:
            raise OperationalError("database is locked")

        monkeypatch.setattr(actions, "set_pinned", locked)
        socket = await connect(await sync_to_async(make_user)("otto", Role.OPERATOR))
        await receive(socket, "snapshot")
        await socket.send_json_to({"type": "action", "id": 7, "action": "pin", "model": "m"})
        answer = await receive(socket, "action_result")
        assert answer["id"] == 7 and answer["ok"] is False
        assert answer["message"] == "m: pin failed (database is locked)"
        await socket.disconnect()

    async def test_a_role_taken_away_while_connected_stops_the_next_action(
        self, stub: RouterStub
    ) -> None:
        user = await sync_to_async(make_user)("otto", Role.OPERATOR)
        socket = await connect(user)
        await receive(socket, "snapshot")
        await sync_to_async(set_role)(user, Role.VIEWER)
        await socket.send_json_to({"type": "action", "id": 1, "action": "unload",
                                   "model": "demo-small"})  # fmt: skip
        assert (await receive(socket, "action_result"))["ok"] is False
        assert not stub.of_kind("unload")
        await socket.disconnect()

    async def test_resync_sends_a_new_snapshot_and_logs_send_the_ring(
        self, stub: RouterStub
    ) -> None:
        socket = await connect(await sync_to_async(make_user)("vera", Role.VIEWER))
        await receive(socket, "snapshot")
        stub.seq = 42
        await socket.send_json_to({"type": "resync"})
        assert (await receive(socket, "snapshot"))["snapshot"]["seq"] == 42
        await socket.send_json_to({"type": "logs", "model": "demo-small"})
        logs = await receive(socket, "logs")
        assert logs["model"] == "demo-small" and logs["lines"][0]["text"] == "hello"
        await socket.send_json_to({"type": "nonsense"})
        assert (await receive(socket, "error"))["message"] == "unknown message 'nonsense'"
        await socket.disconnect()

    async def test_the_logs_page_asks_for_no_memory_history(self, stub: RouterStub) -> None:
        socket = await connect(
            await sync_to_async(make_user)("vera", Role.VIEWER), "/ws/dashboard/?memory=0"
        )
        assert (await socket.receive_json_from(timeout=TIMEOUT))["type"] == "snapshot"
        assert (await socket.receive_json_from(timeout=TIMEOUT))["type"] == "audit"
        assert not stub.of_kind("memory")
        await socket.disconnect()

    async def test_new_audit_rows_follow_a_lifecycle_event(self, stub: RouterStub) -> None:
        socket = await connect(await sync_to_async(make_user)("vera", Role.VIEWER))
        await receive(socket, "audit")
        row = await sync_to_async(AuditEvent.objects.record)(
            AuditKind.EVICTION, model="demo-small", actor="user:otto", trigger_model="demo-large"
        )
        await emit(8, Event.MODEL_EVICTED, {"victim": "demo-small"})
        audit = await receive(socket, "audit")
        assert audit["initial"] is False
        assert [(r["id"], r["kind"], r["url"]) for r in audit["rows"]] == [
            (row.pk, "eviction", f"/audit/{row.pk}/")
        ]
        await socket.disconnect()
