"""The dispatcher: which paths are ours, the generic 404, CORS, X-Request-Id, fall-through."""

from __future__ import annotations

import re

import pytest

from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter, Grant

NOT_FOUND = b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
JSON_TYPE = "application/json; charset=utf-8"


class TestHealth:
    async def test_it_answers_ok_in_llama_cpp_shape(self, client: AsgiClient) -> None:
        for path in ("/health", "/v1/health"):
            response = await client.get(path)
            assert (response.status, response.body) == (200, b'{"status":"ok"}')
            assert response.header("content-type") == JSON_TYPE
            assert response.header("server") == "llama.cpp"
            assert response.header("content-length") == "15"


class TestUnknownRoutes:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("GET", "/v1/nothing-here"),
            ("GET", "/models/nothing"),
            ("POST", "/health"),  # known path, wrong method (§9.3)
            ("GET", "/models/load"),
            ("DELETE", "/v1/chat/completions"),
            ("GET", "/slots/"),
            ("PUT", "/models"),
        ],
    )
    async def test_they_get_the_generic_404_in_middleware_key_order(
        self, client: AsgiClient, method: str, path: str
    ) -> None:
        response = await client.request(method, path)
        assert response.status == 404
        assert response.body == NOT_FOUND
        assert response.header("content-type") == JSON_TYPE
        assert response.header("content-length") == str(len(NOT_FOUND))

    async def test_the_features_llama_cpp_disables_answer_403(self, client: AsgiClient) -> None:
        response = await client.get("/tools")
        assert response.status == 403
        assert response.body == (
            b'{"error":{"message":"this feature is disabled","type":"feature_disabled"}}'
        )

    async def test_downloads_are_not_supported(self, client: AsgiClient) -> None:
        response = await client.post("/models", {"model": "org/repo:Q4_K_M"})
        assert response.status == 501
        error = response.json()["error"]
        assert list(error) == ["code", "message", "type"]
        assert error["type"] == "not_supported_error"


class TestDjangoFallThrough:
    async def test_other_paths_go_to_django(self, client: AsgiClient) -> None:
        response = await client.get("/panel/")
        assert (response.status, response.body) == (200, b"<html>django</html>")

    async def test_a_django_404_is_rewritten_for_api_clients(self, client: AsgiClient) -> None:
        response = await client.get("/no-such-page", headers={"accept": "*/*"})
        assert (response.status, response.body) == (404, NOT_FOUND)
        assert response.header("content-type") == JSON_TYPE

    async def test_a_browser_still_gets_the_panels_404_page(self, client: AsgiClient) -> None:
        response = await client.get("/no-such-page", headers={"accept": "text/html,*/*;q=0.8"})
        assert (response.status, response.body) == (404, b"<html>django</html>")

    async def test_the_real_asgi_application_serves_the_admin_and_our_routes(self) -> None:
        from routerpanel.asgi import application

        real = AsgiClient(application)
        admin = await real.get("/admin/", headers={"accept": "text/html"})
        assert admin.status == 302
        assert "/admin/login/" in (admin.header("location") or "")
        health = await real.get("/health")
        assert (health.status, health.body) == (200, b'{"status":"ok"}')


class TestCors:
    async def test_a_preflight_needs_no_key_and_allows_everything(
        self, client: AsgiClient, key_table: dict
    ) -> None:
        key_table["required"] = True
        response = await client.request(
            "OPTIONS", "/v1/chat/completions", headers={"origin": "http://ui.example"}
        )
        assert (response.status, response.body) == (200, b"")
        assert response.header("access-control-allow-origin") == "http://ui.example"
        assert response.header("access-control-allow-credentials") == "true"
        assert response.header("access-control-allow-methods") == "GET, POST, DELETE, OPTIONS"
        assert response.header("access-control-allow-headers") == "*"

    async def test_the_origin_is_echoed_on_answers(self, client: AsgiClient) -> None:
        response = await client.get("/health", headers={"origin": "http://ui.example"})
        assert response.header("access-control-allow-origin") == "http://ui.example"
        plain = await client.get("/health")
        assert plain.header("access-control-allow-origin") is None


class TestRequestId:
    async def test_one_is_made_when_the_client_sends_none(self, client: AsgiClient) -> None:
        first = await client.get("/health")
        second = await client.get("/health")
        assert re.fullmatch(r"[0-9a-f]{32}", first.header("x-request-id") or "")
        assert first.header("x-request-id") != second.header("x-request-id")

    async def test_the_clients_is_echoed_on_every_answer(self, client: AsgiClient) -> None:
        for path in ("/health", "/v1/nothing"):
            response = await client.get(path, headers={"x-request-id": "job-42.step:7"})
            assert response.header("x-request-id") == "job-42.step:7"

    @pytest.mark.parametrize("bad", ["has space", "x" * 129, "new\\nline", "é"])
    async def test_an_unsafe_one_is_replaced(self, client: AsgiClient, bad: str) -> None:
        response = await client.get("/health", headers={"x-request-id": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", response.header("x-request-id") or "")

    async def test_it_is_the_acquires_request_id(
        self, client: AsgiClient, router: FakeRouter, simserver
    ) -> None:
        router.add("m", Grant(simserver.port), status="loaded")
        response = await client.post(
            "/tokenize", {"model": "m", "content": "a"}, headers={"x-request-id": "trace-1"}
        )
        assert response.status == 200
        assert response.header("x-request-id") == "trace-1"
        acquire = await router.wait_for("router.acquire")
        assert acquire["request_id"] == "trace-1"
