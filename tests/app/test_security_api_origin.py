"""State-changing API routes refuse foreign browser origins; inference keeps open CORS (issue 13).

The probe: with no API key configured (the default), any web page a team member had open could
unload a model with a cross-origin ``text/plain`` POST, which a browser sends without a
preflight. Now such a request is 403 in llama.cpp's error shape, without CORS headers, and
never reaches the router; programs (no ``Origin``) and the server's own pages are unaffected.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from models_app.api.app import API_PATHS, Api, route_table
from tests.support.asgi import AsgiClient, Call
from tests.support.fake_router import FakeRouter

OWN = {"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"}
EVIL = {"host": "127.0.0.1:8080", "origin": "http://evil.example"}
STATE_CHANGING = [
    ("POST", "/models/load"),
    ("POST", "/models/unload"),
    ("POST", "/models/cancel"),
    ("POST", "/models"),
    ("DELETE", "/models"),
    ("POST", "/props"),
    ("POST", "/lora-adapters"),
    ("POST", "/slots/0?action=erase"),
    ("GET", "/models?reload=1"),
]


@pytest.fixture
def loaded(router: FakeRouter) -> FakeRouter:
    router.add("m", status="loaded")
    return router


async def send(client: AsgiClient, method: str, path: str, headers: dict[str, str]) -> Call:
    """The request a hostile page can make without a preflight: a ``text/plain`` body."""
    if method not in ("POST", "PUT"):
        return await client.request(method, path, headers=dict(headers))
    body = b'{"model": "m"}'
    return await client.request(
        method, path, body=body, headers={"content-type": "text/plain", **headers}
    )


def assert_refused(response: Call) -> None:
    assert response.status == 403, response.body
    error = response.json()["error"]
    assert error["code"] == 403 and error["type"] == "permission_error"
    assert "may not change the router's state" in error["message"]
    assert response.header("content-type") == "application/json; charset=utf-8"
    assert response.header("access-control-allow-origin") is None


class TestForeignOrigins:
    async def test_a_foreign_origin_cannot_unload(
        self, client: AsgiClient, loaded: FakeRouter
    ) -> None:
        response = await send(client, "POST", "/models/unload", EVIL)
        assert_refused(response)
        assert "http://evil.example" in response.json()["error"]["message"]
        assert loaded.of_type("router.unload") == []

    @pytest.mark.parametrize(("method", "path"), STATE_CHANGING)
    async def test_every_state_changing_route_refuses_a_foreign_origin(
        self, client: AsgiClient, loaded: FakeRouter, method: str, path: str
    ) -> None:
        assert_refused(await send(client, method, path, EVIL))
        assert [m["type"] for m in loaded.received] == []

    @pytest.mark.parametrize(
        "origin", ["http://127.0.0.1:9999", "http://localhost:8080", "https://127.0.0.1:8080"]
    )
    async def test_another_port_host_or_scheme_of_this_machine_is_foreign(
        self, client: AsgiClient, loaded: FakeRouter, origin: str
    ) -> None:
        headers = {"host": "127.0.0.1:8080", "origin": origin}
        assert_refused(await send(client, "POST", "/models/unload", headers))

    async def test_a_page_that_hides_its_origin_is_known_by_fetch_metadata(
        self, client: AsgiClient, loaded: FakeRouter
    ) -> None:
        for site in ("cross-site", "same-site"):
            headers = {"host": "127.0.0.1:8080", "sec-fetch-site": site}
            assert_refused(await send(client, "POST", "/models/unload", headers))
        assert loaded.of_type("router.unload") == []

    async def test_a_null_origin_is_foreign(self, client: AsgiClient, loaded: FakeRouter) -> None:
        headers = {"host": "127.0.0.1:8080", "origin": "null"}
        assert_refused(await send(client, "POST", "/models/load", headers))

    async def test_a_foreign_preflight_for_a_state_change_gets_no_cors(
        self, client: AsgiClient
    ) -> None:
        response = await client.request(
            "OPTIONS",
            "/models/unload",
            headers={**EVIL, "access-control-request-method": "POST"},
        )
        assert response.status == 403
        assert response.header("access-control-allow-origin") is None
        assert response.header("access-control-allow-methods") is None


class TestAllowedCallers:
    async def test_the_servers_own_origin_may_unload(
        self, client: AsgiClient, loaded: FakeRouter
    ) -> None:
        response = await send(client, "POST", "/models/unload", OWN)
        assert (response.status, response.json()) == (200, {"success": True})
        assert len(loaded.of_type("router.unload")) == 1

    async def test_a_program_without_an_origin_may_unload(
        self, client: AsgiClient, loaded: FakeRouter
    ) -> None:
        response = await client.post("/models/unload", {"model": "m"})
        assert response.status == 200

    @override_settings(CORS_ALLOWED_ORIGINS=["http://evil.example"])
    async def test_an_origin_listed_in_cors_allowed_origins_may_unload(
        self, client: AsgiClient, loaded: FakeRouter
    ) -> None:
        response = await send(client, "POST", "/models/unload", EVIL)
        assert response.status == 200
        assert response.header("access-control-allow-origin") == "http://evil.example"

    async def test_inference_keeps_llama_cpps_open_cors(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        # No model "m" served: the router answers, readable by the foreign page.
        response = await send(client, "POST", "/v1/chat/completions", EVIL)
        assert response.status == 400
        assert response.header("access-control-allow-origin") == "http://evil.example"
        preflight = await client.request(
            "OPTIONS",
            "/v1/chat/completions",
            headers={**EVIL, "access-control-request-method": "POST"},
        )
        assert preflight.status == 200
        assert preflight.header("access-control-allow-origin") == "http://evil.example"

    async def test_reading_the_model_list_stays_open_to_any_origin(
        self, client: AsgiClient, loaded: FakeRouter
    ) -> None:
        response = await client.get("/v1/models", headers=EVIL)
        assert response.status == 200
        assert response.header("access-control-allow-origin") == "http://evil.example"


def test_the_route_table_marks_exactly_the_routes_that_change_state(api: Api) -> None:
    marked = {
        (path, method)
        for path, methods in route_table().items()
        for method, route in methods.items()
        if route.changes_state
    }
    assert marked == {
        ("/models", "POST"),
        ("/models", "DELETE"),
        ("/models/load", "POST"),
        ("/models/unload", "POST"),
        ("/models/cancel", "POST"),
        ("/props", "POST"),
        ("/lora-adapters", "POST"),
    }
    assert "/v1/chat/completions" in API_PATHS
