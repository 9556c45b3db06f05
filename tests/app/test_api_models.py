"""The router's own routes: /props, /models and /v1/models (with ?reload=), load and unload."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from models_app.api import listing
from models_app.api.app import Api
from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter, Reject, Silent

NOT_FOUND = b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
LLAMA_KEYS = [
    "id",
    "aliases",
    "tags",
    "object",
    "owned_by",
    "created",
    "status",
    "architecture",
    "source",
    "can_remove",
]
EXTRA_KEYS = [
    "state",
    "stopping",
    "in_flight",
    "pid",
    "memory",
    "pinned",
    "queue_position",
    "queue_depth",
    "last_used",
    "backoff",
    "node",
    "nodes",
]
META = {"vocab_type": 1, "n_vocab": 256, "n_ctx": 4096}


class TestProps:
    async def test_it_describes_the_router_in_llama_cpp_key_order(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.models_max = 2
        response = await client.get("/props")
        assert response.status == 200
        body = response.json()
        assert list(body) == [
            "role",
            "max_instances",
            "models_autoload",
            "model_alias",
            "model_path",
            "default_generation_settings",
            "ui_settings",
            "build_info",
            "cors_proxy_enabled",
        ]
        assert body["role"] == "router"
        assert body["max_instances"] == 2
        assert body["models_autoload"] is True
        assert body["default_generation_settings"] == {"params": None, "n_ctx": 0}
        assert body["build_info"].startswith("b")

    async def test_it_reports_no_autoload(
        self, api: Api, client: AsgiClient, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(api, "config", replace(api.config, autoload=False))
        assert (await client.get("/props")).json()["models_autoload"] is False

    async def test_a_silent_router_is_503_router_unavailable(
        self, client: AsgiClient, router: FakeRouter, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        async def silent(message: dict) -> None:
            pass

        monkeypatch.setattr(router, "router_snapshot", silent)
        response = await client.get("/props")
        assert response.status == 503
        assert response.json() == {
            "error": {"code": 503, "message": "router unavailable", "type": "unavailable_error"}
        }
        assert response.header("retry-after") == "5"


class TestModelsList:
    async def test_it_lists_entries_in_llama_cpp_shape_and_order(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.add("b-model", status="loaded", aliases=["zeta", "alpha"], args=["llama-server"])
        router.add("B-upper", status="unloaded")
        router.add("a-model", status="loading", pid=4242, memory=1 << 30, queue_waiters=2)
        for path in ("/models", "/v1/models"):
            response = await client.get(path)
            assert response.status == 200
            body = response.json()
            assert list(body) == ["data", "object"]
            assert body["object"] == "list"
            ids = [entry["id"] for entry in body["data"]]
            assert ids == ["B-upper", "a-model", "b-model"]  # byte order (§2.14)
            for entry in body["data"]:
                assert list(entry) == LLAMA_KEYS + EXTRA_KEYS
            assert len({entry["created"] for entry in body["data"]}) == 1
        loaded = body["data"][2]
        assert loaded["aliases"] == ["alpha", "zeta"]
        assert loaded["object"] == "model"
        assert loaded["owned_by"] == "llamacpp"
        preset = "[b-model]\n\n"  # a program without options: the section alone
        assert loaded["status"] == {"value": "loaded", "args": ["llama-server"], "preset": preset}
        assert loaded["architecture"] == {
            "input_modalities": ["text"],
            "output_modalities": ["text"],
        }
        assert (loaded["source"], loaded["can_remove"]) == ("preset", False)
        loading = body["data"][1]
        assert (loading["pid"], loading["memory"], loading["queue_depth"]) == (4242, 1 << 30, 2)

    async def test_each_entry_carries_its_options_as_ini_like_llama_cpp(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        """``status.preset`` (ROUTER_SPEC 11.17), checked against a real b11434 router's answer
        for the same command line: host, port and alias are left out, flags are 1 or 0."""
        args = ["/path/llama-server", "--host", "127.0.0.1", "--no-jinja", "--log-colors",
                "off", "--offline", "--port", "0", "--no-slots", "--temperature", "0.8",
                "--alias", "m:Q8_0", "--ctx-size", "1024", "--hf-repo", "org/m:Q8_0",
                "--seed", "42"]  # fmt: skip
        router.add("m:Q8_0", status="unloaded", args=args)
        for path in ("/models", "/v1/models"):
            (entry,) = (await client.get(path)).json()["data"]
            assert entry["status"]["preset"] == (
                "[m:Q8_0]\njinja = 0\nlog-colors = off\noffline = 1\nslots = 0\n"
                "temperature = 0.8\nctx-size = 1024\nhf-repo = org/m:Q8_0\nseed = 42\n\n"
            )

    async def test_a_failed_model_shows_its_exit_code(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.add("crashy", status="unloaded", state="failed", failed=True, exit_code=3)
        router.add("stuck", status="unloaded", state="stuck", failed=True, exit_code=None)
        data = (await client.get("/models")).json()["data"]
        assert data[0]["status"] == {
            "value": "unloaded",
            "args": [],
            "exit_code": 3,
            "failed": True,
        }
        assert data[0]["state"] == "failed"
        assert data[1]["status"]["exit_code"] == 1  # a kill reports 1 (§3.5)

    async def test_the_childs_info_is_merged_only_while_running(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        info = {"id": "child-id", "object": "model", "meta": META, "pid": "not ours"}
        router.add("running", status="loaded", info=info, pid=7)
        router.add("stopped", status="unloaded", info=info)
        running, stopped = (await client.get("/models")).json()["data"]
        assert running["id"] == "running"  # ours first: the child's id does not override
        assert running["meta"] == META
        assert list(running)[len(LLAMA_KEYS)] == "meta"  # after llama.cpp's keys, before ours
        assert running["pid"] == 7
        assert "meta" not in stopped

    def test_hidden_entries_are_left_out(self) -> None:
        rows = [{"name": "seen"}, {"name": "hidden", "hidden": True}]
        assert [e["id"] for e in listing.render(rows, time.time())["data"]] == ["seen"]

    def test_the_stored_architecture_wins_over_text_only(self) -> None:
        row = {"name": "vision", "architecture": {"input_modalities": ["text", "image"]}}
        entry = listing.render([row], 0)["data"][0]
        assert entry["architecture"] == {
            "input_modalities": ["text", "image"],
            "output_modalities": ["text"],
        }


class TestReload:
    @pytest.mark.parametrize("value", ["1", "0", "false"])  # §15.1 keep: any non-empty value
    async def test_any_non_empty_value_reloads_first(
        self, client: AsgiClient, router: FakeRouter, value: str
    ) -> None:
        router.on_reload = lambda: router.add("new-model", status="unloaded")
        response = await client.get(f"/models?reload={value}")
        assert response.status == 200
        assert [e["id"] for e in response.json()["data"]] == ["new-model"]
        reload = await router.wait_for("router.reload")
        assert reload["actor"] == "anonymous"

    async def test_an_empty_value_does_not_reload(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        await client.get("/v1/models?reload=")
        assert router.of_type("router.reload") == []

    async def test_a_failed_reload_answers_500_with_its_text(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.reload_result = Reject(500, "failed to parse server config file: models.ini")
        response = await client.get("/models?reload=1")
        assert response.status == 500
        assert response.json() == {
            "error": {
                "code": 500,
                "message": "failed to parse server config file: models.ini",
                "type": "server_error",
            }
        }


class TestLoad:
    async def test_it_starts_the_model(self, client: AsgiClient, router: FakeRouter) -> None:
        router.add("m", status="unloaded", aliases=["alias-m"])
        response = await client.post("/models/load", {"model": "alias-m"})
        assert (response.status, response.json()) == (200, {"success": True})
        load = await router.wait_for("router.load")
        assert (load["model"], load["actor"]) == ("alias-m", "anonymous")

    @pytest.mark.parametrize("body", [{"model": "nope"}, {}, {"model": 7}])
    async def test_an_unknown_model_is_the_generic_404(
        self, client: AsgiClient, router: FakeRouter, body: dict
    ) -> None:
        response = await client.post("/models/load", body)
        assert (response.status, response.body) == (404, NOT_FOUND)

    async def test_a_running_model_is_400(self, client: AsgiClient, router: FakeRouter) -> None:
        router.add("m", status="loaded")
        response = await client.post("/models/load", {"model": "m"})
        assert response.status == 400
        assert response.json() == {
            "error": {
                "code": 400,
                "message": "model is already running",
                "type": "invalid_request_error",
            }
        }

    async def test_a_body_that_is_not_json_is_400(self, client: AsgiClient) -> None:
        response = await client.post("/models/load", body=b"model=m")
        assert response.status == 400
        assert response.json()["error"]["type"] == "invalid_request_error"


class TestCancelQueued:
    """``POST /models/cancel``: RouterPanel's own route for an operator's cancel."""

    async def test_it_cancels_a_models_queued_requests(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.queued["m"] = ["r1", "r2"]
        response = await client.post("/models/cancel", {"model": "m"})
        assert (response.status, response.json()) == (
            200, {"success": True, "cancelled": ["r1", "r2"]}
        )  # fmt: skip
        message = await router.wait_for("router.cancel_queued")
        assert (message["model"], message["actor"]) == ("m", "anonymous")

    async def test_it_cancels_one_request_by_id(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        router.queued["r7"] = ["r7"]
        response = await client.post("/models/cancel", {"request_id": "r7"})
        assert response.json()["cancelled"] == ["r7"]
        assert (await router.wait_for("router.cancel_queued"))["queued_request"] == "r7"

    async def test_nothing_queued_is_404_in_the_error_shape(
        self, client: AsgiClient, router: FakeRouter
    ) -> None:
        response = await client.post("/models/cancel", {"model": "m"})
        assert response.status == 404
        assert response.json()["error"]["type"] == "not_found_error"

    @pytest.mark.parametrize(
        "body", [{}, {"model": "m", "request_id": "r"}, {"model": 7}, {"request_id": ["r"]}]
    )
    async def test_it_needs_exactly_one_string_target(
        self, client: AsgiClient, router: FakeRouter, body: dict
    ) -> None:
        response = await client.post("/models/cancel", body)
        assert response.status == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert router.of_type("router.cancel_queued") == []


class TestUnload:
    async def test_it_stops_the_model(self, client: AsgiClient, router: FakeRouter) -> None:
        router.add("m", status="loaded")
        response = await client.post("/models/unload", {"model": "m"})
        assert (response.status, response.json()) == (200, {"success": True})

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ({"model": "nope"}, "model is not found"),  # 400 here, 404 on load (§15.2 keep)
            ({}, "model is not found"),
            ({"model": "idle"}, "model is not running"),
        ],
    )
    async def test_it_refuses_with_400(
        self, client: AsgiClient, router: FakeRouter, body: dict, message: str
    ) -> None:
        router.add("idle", status="unloaded")
        response = await client.post("/models/unload", body)
        assert response.status == 400
        assert response.json() == {
            "error": {"code": 400, "message": message, "type": "invalid_request_error"}
        }

    async def test_a_silent_router_is_503(self, client: AsgiClient, router: FakeRouter) -> None:
        router.add("m", Silent(), status="loaded")

        async def silent(message: dict) -> None:
            pass

        router.router_unload = silent  # type: ignore[method-assign]
        started = time.monotonic()
        response = await client.post("/models/unload", {"model": "m"})
        assert response.status == 503
        assert time.monotonic() - started < 20
