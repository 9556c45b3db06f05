"""``GET /v1/models/{id}`` (issue 49.5): the OpenAI SDK's ``client.models.retrieve(id)`` gets the
model's entry exactly as ``/v1/models`` lists it, and OpenAI's 404 shape for an id it does not
know (or that the caller's key may not see)."""

from __future__ import annotations

from tests.support.asgi import AsgiClient
from tests.support.fake_router import FakeRouter


async def test_a_model_is_its_entry_in_the_list(client: AsgiClient, router: FakeRouter) -> None:
    router.add("demo-small", status="loaded", aliases=["small"], pid=42)
    router.add("org/m:Q4_K_M", status="unloaded")
    listed = {e["id"]: e for e in (await client.get("/v1/models")).json()["data"]}
    for name in ("demo-small", "org/m:Q4_K_M"):
        response = await client.get(f"/v1/models/{name}")
        assert response.status == 200, response.body
        entry = response.json()
        assert entry | {"created": 0} == listed[name] | {"created": 0}


async def test_an_unknown_id_is_openais_404(client: AsgiClient, router: FakeRouter) -> None:
    router.add("demo-small", status="loaded")
    response = await client.get("/v1/models/nope")
    assert response.status == 404
    assert response.json() == {
        "error": {
            "message": "The model 'nope' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
