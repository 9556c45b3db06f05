"""The proxy: model selection and validation (§8.B), forwarding (§8.C), errors (Appendix A)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from models_app.api import ApiConfig
from models_app.api.app import Api
from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter, Grant, Reject, Silent
from tests.support.upstreams import ScriptedUpstream, SimServer

NOT_FOUND = b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'


def invalid(message: str) -> dict:
    return {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}


@pytest.fixture
def sim_model(router: FakeRouter, simserver: SimServer) -> str:
    router.add("sim", Grant(simserver.port), status="loaded", aliases=["sim-alias"])
    return "sim"


class TestModelSelection:
    @pytest.mark.parametrize("body", [{}, {"model": ""}, {"model": None}, {"model": 3}, [1, 2]])
    async def test_no_model_is_400_before_asking_the_router(
        self, client: AsgiClient, router: FakeRouter, body: object
    ) -> None:
        response = await client.post("/v1/chat/completions", body)
        assert response.status == 400
        assert response.json() == invalid("model name is missing from the request")
        assert list(response.json()["error"]) == ["code", "message", "type"]
        assert router.of_type("router.acquire") == []

    async def test_an_unknown_model_is_400_from_the_router(self, client: AsgiClient) -> None:
        response = await client.post("/completion", {"model": "ghost", "prompt": "x"})
        assert response.status == 400
        assert response.json() == invalid("model 'ghost' not found")

    async def test_an_alias_reaches_the_model(
        self, client: AsgiClient, router: FakeRouter, sim_model: str
    ) -> None:
        response = await client.post("/tokenize", {"model": "sim-alias", "content": "hi"})
        assert (response.status, response.json()) == (200, {"tokens": [107, 108]})
        assert (await router.wait_for("router.acquire"))["model"] == "sim-alias"

    async def test_a_get_route_takes_the_model_from_the_query(
        self, client: AsgiClient, sim_model: str
    ) -> None:
        response = await client.get("/metrics?model=sim")
        assert response.status == 200
        assert b"llamacpp:" in response.body
        assert (await client.get("/slots")).json() == invalid(
            "model name is missing from the request"
        )

    async def test_props_with_a_model_is_the_childs(
        self, client: AsgiClient, sim_model: str
    ) -> None:
        body = (await client.get("/props?model=sim")).json()
        assert body.get("role") != "router"
        assert "default_generation_settings" in body

    async def test_a_multipart_form_names_its_model_in_a_field(
        self, client: AsgiClient, router: FakeRouter, sim_model: str
    ) -> None:
        boundary = "XyZ"
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nsim\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            f"Content-Type: audio/wav\r\n\r\nRIFF\r\n--{boundary}--\r\n"
        ).encode()
        headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
        response = await client.request(
            "POST", "/v1/audio/transcriptions", body=body, headers=headers
        )
        assert response.status == 501  # simserver does not transcribe; what matters: forwarded
        assert (await router.wait_for("router.acquire"))["model"] == "sim"


class TestAutoload:
    @pytest.mark.parametrize(
        ("query", "expected"),
        [("", True), ("?autoload=", True), ("?autoload=true", True), ("?autoload=1", True),
         ("?autoload=false", False), ("?autoload=TRUE", False), ("?autoload=yes", False)],
    )  # fmt: skip
    async def test_the_query_flag_decides(
        self, client: AsgiClient, router: FakeRouter, sim_model: str, query: str, expected: bool
    ) -> None:
        await client.post(f"/tokenize{query}", {"model": "sim", "content": "a"})
        assert (await router.wait_for("router.acquire"))["autoload"] is expected

    async def test_absent_means_the_servers_default(
        self,
        api: Api,
        client: AsgiClient,
        router: FakeRouter,
        sim_model: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setattr(api, "config", replace(api.config, autoload=False))
        await client.post("/tokenize", {"model": "sim", "content": "a"})
        assert (await router.wait_for("router.acquire"))["autoload"] is False

    async def test_a_model_not_running_without_autoload_is_400(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.add("cold", status="unloaded")
        response = await client.post("/tokenize?autoload=0", {"model": "cold"})
        assert (response.status, response.json()) == (400, invalid("model is not loaded"))


class TestBody:
    async def test_a_body_that_is_not_json_is_400_with_the_parsers_message(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        for body in (b"{not json", b"", b"\xff\xfe{"):
            response = await client.request("POST", "/v1/completions", body=body)
            assert response.status == 400
            error = response.json()["error"]
            assert list(error) == ["code", "message", "type"]
            assert error["type"] == "invalid_request_error"
            assert error["message"]
        assert router.of_type("router.acquire") == []

    @pytest.mark.parametrize("config", [ApiConfig(max_body_bytes=1024)])
    async def test_a_body_too_large_is_413(
        self, client: AsgiClient, router: FakeRouter, config: ApiConfig
    ) -> None:
        big = json.dumps({"model": "m", "prompt": "x" * 2000}).encode()
        declared = await client.request(
            "POST", "/completion", body=big, headers={"content-length": str(len(big))}
        )
        streamed = await client.request(
            "POST", "/completion", body_parts=[big[:600], big[600:1200], big[1200:]]
        )
        for response in (declared, streamed):
            assert response.status == 413
            assert response.json() == {
                "error": {
                    "code": 413,
                    "message": "request body too large (limit: 1024 bytes)",
                    "type": "invalid_request_error",
                }
            }
        assert router.of_type("router.acquire") == []

    async def test_a_body_in_several_messages_is_forwarded_whole(
        self, client: AsgiClient, sim_model: str
    ) -> None:
        body = json.dumps({"model": "sim", "content": "abc"}).encode()
        response = await client.request("POST", "/tokenize", body_parts=[body[:5], body[5:]])
        assert (response.status, response.json()) == (200, {"tokens": [100, 101, 102]})


class TestRouterAnswers:
    async def test_a_rejection_is_relayed_with_retry_after(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.add("busy", Reject(503, "queue is full", "unavailable_error", retry_after=2.4))
        response = await client.post("/v1/chat/completions", {"model": "busy"})
        assert response.status == 503
        assert response.json() == {
            "error": {"code": 503, "message": "queue is full", "type": "unavailable_error"}
        }
        assert response.header("retry-after") == "2"

    async def test_a_failed_load_is_500(self, client: AsgiClient, router: FakeRouter) -> None:
        router.add("bad", Reject(500, "model name=bad failed to load"))
        response = await client.post("/completion", {"model": "bad"})
        assert response.status == 500
        assert response.json() == {
            "error": {
                "code": 500,
                "message": "model name=bad failed to load",
                "type": "server_error",
            }
        }

    async def test_a_silent_router_is_503_router_unavailable(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.add("m", Silent())
        response = await client.post("/completion", {"model": "m"})
        assert response.status == 503
        assert response.json()["error"]["message"] == "router unavailable"


class TestForwarding:
    async def test_the_child_answers_through_us(
        self, client: AsgiClient, router: FakeRouter, sim_model: str
    ) -> None:
        response = await client.post("/v1/embeddings", {"model": "sim", "input": "hello"})
        assert response.status == 200
        assert response.json()["data"][0]["object"] == "embedding"
        assert response.header("server") == "llama.cpp"
        assert response.header("x-accel-buffering") == "no"
        # The child's Content-Length passes through (llama.cpp re-chunks every answer, §15.13).
        assert response.header("content-length") == str(len(response.body))
        release = await router.wait_for("router.release")
        assert release["lease_id"] == "lease-1"  # the lease it was granted

    async def test_a_child_error_status_is_relayed(
        self, client: AsgiClient, router: FakeRouter, simserver: SimServer
    ) -> None:
        router.add("sim", Grant(simserver.port), status="loaded")
        response = await client.post("/infill", {"model": "sim"})
        assert response.status == 501
        assert response.json()["error"]["type"] == "not_supported_error"

    async def test_a_child_404_gets_the_generic_body(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        upstream.answer = lambda r: (404, [("Content-Type", "text/plain")], b"no such slot")
        router.add("m", Grant(upstream.port), status="loaded")
        response = await client.post("/slots/7?action=save", {"model": "m"})
        assert (response.status, response.body) == (404, NOT_FOUND)
        assert response.header("content-type") == "application/json; charset=utf-8"
        assert upstream.received[0].target == "/slots/7?action=save"

    async def test_request_headers_are_forwarded_except_hop_by_hop(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        router.add("m", Grant(upstream.port), status="loaded")
        headers = {
            "content-type": "application/json",
            "authorization": "Bearer sk-client",
            "x-conversation": "abc",
            "accept-encoding": "gzip, br",
            "connection": "upgrade",
            "upgrade": "h2c",
            "te": "trailers",
            "host": "router.example:8080",
            "x-request-id": "rid-7",
        }
        body = json.dumps({"model": "m", "prompt": "x"}).encode()
        response = await client.request(
            "POST", "/v1/completions?model=q&b=2", body=body, headers=headers
        )
        assert response.status == 200
        seen = upstream.received[0]
        assert (seen.method, seen.target, seen.body) == (
            "POST",
            "/v1/completions?model=q&b=2",
            body,
        )
        assert "authorization" not in seen.headers  # a RouterPanel key, never the child's (#18)
        assert seen.headers["x-conversation"] == "abc"
        assert seen.headers["x-request-id"] == "rid-7"
        assert seen.headers["host"] == f"127.0.0.1:{upstream.port}"
        assert seen.headers["accept-encoding"] == "identity"
        assert seen.headers["content-length"] == str(len(body))
        assert "upgrade" not in seen.headers and "te" not in seen.headers
        assert seen.headers.get("connection", "keep-alive") == "keep-alive"

    async def test_response_headers_are_relayed_except_ours_to_set(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        upstream.answer = lambda r: (
            201,
            [
                ("Content-Type", "application/x-custom"),
                ("Server", "cpp-httplib"),
                ("Access-Control-Allow-Origin", "*"),
                ("X-Child", "1"),
                ("Keep-Alive", "timeout=5"),
            ],
            b"payload",
        )
        router.add("m", Grant(upstream.port), status="loaded")
        response = await client.post("/apply-template", {"model": "m"})
        assert (response.status, response.body) == (201, b"payload")
        assert response.header("content-type") == "application/x-custom"
        assert response.header("server") == "llama.cpp"
        assert response.header("x-child") == "1"
        assert response.header("access-control-allow-origin") is None
        assert response.header("keep-alive") is None

    async def test_a_bodyless_child_answer_is_relayed_empty(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        upstream.answer = lambda r: (204, [], b"")
        router.add("m", Grant(upstream.port), status="loaded")
        response = await client.post("/v1/messages/count_tokens", {"model": "m"})
        assert (response.status, response.body) == (204, b"")

    async def test_an_unreachable_child_is_500_proxy_error(
        self, client: AsgiClient, router: FakeRouter, upstream: ScriptedUpstream
    ) -> None:
        port = upstream.port
        await upstream.stop()
        router.add("m", Grant(port), status="loaded")
        response = await client.post("/completion", {"model": "m"})
        assert response.status == 500
        assert response.json() == {
            "error": {
                "code": 500,
                "message": "proxy error: Could not establish connection",
                "type": "server_error",
            }
        }
        await router.wait_for("router.release")

    async def test_concurrent_requests_with_one_request_id_stay_distinct_for_the_router(
        self, client: AsgiClient, router: FakeRouter, slow_simserver: SimServer
    ) -> None:
        router.add("slow", Grant(slow_simserver.port), status="loaded")
        body = {"model": "slow", "prompt": "x", "n_predict": 2}
        calls = [
            client.start("POST", "/completion", json_body=body, headers={"x-request-id": "same"})
            for _ in range(2)
        ]
        for call in calls:
            await call.finish()
            assert call.status == 200
            assert call.header("x-request-id") == "same"
        ids = {m["request_id"] for m in router.of_type("router.acquire")}
        assert len(ids) == 2 and "same" in ids
