"""API keys on the HTTP surface (ROUTER_SPEC 9.1, DESIGN §5): when they are required, the three
ways to send one, the 401 body, public routes, users' hashed keys, revocation, the actor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer
from django.contrib.auth import get_user_model

from models_app.api import Api, ApiConfig, auth
from models_app.api.auth import Caller, KeyStore, KeyTable, digest
from models_app.models import ApiKey, RouterSettings
from models_app.routing.client import RouterClient
from tests.support.asgi import AsgiClient, django_stand_in
from tests.support.fake_router import FakeRouter, Grant

UNAUTHORIZED = b'{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
SECRET = "rp-test-secret-0123456789"


@pytest.fixture
def required(key_table: dict) -> dict:
    key_table["required"] = True
    key_table["keys"] = {digest(SECRET): Caller("key:alice/laptop", 1)}
    return key_table


@pytest.fixture
def sim_model(router: FakeRouter, simserver) -> str:
    router.add("m", Grant(simserver.port), status="loaded")
    return "m"


class TestRequiredKeys:
    @pytest.mark.parametrize(
        "headers",
        [
            {"authorization": f"Bearer {SECRET}"},
            {"authorization": f"bearer {SECRET}"},
            {"authorization": SECRET},  # a bare key works too (§9.1)
            {"x-api-key": SECRET},
            {"authorization": "Bearer ", "x-api-key": SECRET},  # empty Authorization: X-Api-Key
        ],
    )
    async def test_a_valid_key_is_accepted_in_every_form(
        self, client: AsgiClient, required: dict, headers: dict
    ) -> None:
        response = await client.get("/v1/models", headers=headers)
        assert response.status == 200

    @pytest.mark.parametrize(
        "headers",
        [{}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"authorization": ""}],
    )
    async def test_a_missing_or_wrong_key_is_401_in_llama_cpp_words(
        self, client: AsgiClient, required: dict, headers: dict
    ) -> None:
        for method, path in (
            ("GET", "/models"),
            ("POST", "/models/load"),
            ("GET", "/models/sse"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/props"),
        ):
            response = await client.request(method, path, headers=headers)
            assert (response.status, response.body) == (401, UNAUTHORIZED), path

    async def test_health_and_preflights_are_public(
        self, client: AsgiClient, required: dict
    ) -> None:
        for path in ("/health", "/v1/health"):
            assert (await client.get(path)).status == 200
        assert (await client.request("OPTIONS", "/v1/models")).status == 200

    async def test_the_key_is_taken_and_the_actor_goes_to_the_router(
        self, client: AsgiClient, router: FakeRouter, required: dict, sim_model: str
    ) -> None:
        response = await client.post(
            "/tokenize", {"model": "m"}, headers={"authorization": f"Bearer {SECRET}"}
        )
        assert response.status == 200
        assert (await router.wait_for("router.acquire"))["actor"] == "key:alice/laptop"

    async def test_static_keys_act_by_their_position(
        self, client: AsgiClient, router: FakeRouter, keys: KeyStore, sim_model: str
    ) -> None:
        keys.configure(["first-key", "second-key"])
        assert (await client.post("/tokenize", {"model": "m"})).status == 401
        response = await client.post(
            "/tokenize", {"model": "m"}, headers={"x-api-key": "second-key"}
        )
        assert response.status == 200
        assert (await router.wait_for("router.acquire"))["actor"] == "key:api-key-2"
        keys.configure([])
        assert (await client.post("/tokenize", {"model": "m"})).status == 200


class TestOptionalKeys:
    async def test_without_a_key_the_actor_is_anonymous(
        self, client: AsgiClient, router: FakeRouter, sim_model: str
    ) -> None:
        assert (await client.post("/tokenize", {"model": "m"})).status == 200
        assert (await router.wait_for("router.acquire"))["actor"] == "anonymous"

    async def test_a_wrong_key_is_ignored_as_llama_cpp_does_without_keys(
        self, client: AsgiClient, router: FakeRouter, sim_model: str
    ) -> None:
        headers = {"authorization": "Bearer sk-no-key-required"}
        assert (await client.post("/tokenize", {"model": "m"}, headers=headers)).status == 200

    async def test_a_users_key_still_names_the_actor(
        self, client: AsgiClient, router: FakeRouter, key_table: dict, sim_model: str
    ) -> None:
        key_table["keys"] = {digest(SECRET): Caller("key:bob/ci", 1)}
        await client.post("/tokenize", {"model": "m"}, headers={"x-api-key": SECRET})
        assert (await router.wait_for("router.acquire"))["actor"] == "key:bob/ci"


class TestKeyStoreCache:
    async def test_the_table_is_read_once_then_served_from_memory(self) -> None:
        reads = []

        def loader() -> KeyTable:
            reads.append(1)
            return KeyTable(False, {})

        store = KeyStore(loader, None, ttl=60)
        results = await asyncio.gather(*(store.authenticate({}) for _ in range(20)))
        assert set(results) == {"anonymous"}
        assert len(reads) == 1

    async def test_an_unknown_key_rereads_at_most_once_per_interval(self) -> None:
        table = {"keys": {}}
        reads = []

        def loader() -> KeyTable:
            reads.append(1)
            return KeyTable(True, dict(table["keys"]))

        now = [0.0]
        store = KeyStore(loader, None, ttl=60, miss_refresh=1.0, clock=lambda: now[0])
        with pytest.raises(auth.Unauthorized):
            await store.authenticate({b"x-api-key": b"fresh"})
        table["keys"] = {digest("fresh"): Caller("key:carol/new", 9)}  # issued in another process
        with pytest.raises(auth.Unauthorized):
            await store.authenticate({b"x-api-key": b"fresh"})  # too soon to ask again
        now[0] = 1.5
        assert await store.authenticate({b"x-api-key": b"fresh"}) == "key:carol/new"
        assert len(reads) == 2

    async def test_it_fails_closed_when_the_database_cannot_be_read(self) -> None:
        def broken() -> KeyTable:
            raise RuntimeError("database is down")

        store = KeyStore(broken, None)
        store.configure(["static"])
        with pytest.raises(auth.Unauthorized):
            await store.authenticate({})
        assert await store.authenticate({b"authorization": b"static"}) == "key:api-key-1"
        empty = KeyStore(broken, None)
        with pytest.raises(auth.Unauthorized):
            await empty.authenticate({})  # no static key and no database: nobody


@pytest.fixture
async def db_client(
    router: FakeRouter, layer: InMemoryChannelLayer, simserver
) -> AsyncIterator[AsgiClient]:
    """The API with keys read from the test database (the real KeyStore), model "m" loaded."""
    auth.connect_signals()
    router.add("m", Grant(simserver.port), status="loaded")
    app = Api(
        django_stand_in,
        router=RouterClient(layer, timeout=1.0),
        keys=KeyStore(ttl=60),
        config=ApiConfig(),
    )
    yield AsgiClient(app)
    await app.aclose()


@pytest.mark.django_db(transaction=True)
class TestDatabaseKeys:
    @pytest.fixture
    def alice(self) -> object:
        return get_user_model().objects.create_user("alice", password="pw-for-tests-only")

    async def test_a_users_key_is_stored_hashed_and_works(
        self, db_client: AsgiClient, router: FakeRouter, alice: object
    ) -> None:
        key, secret = await sync_to_async(ApiKey.objects.issue)(alice, "laptop")
        row = await sync_to_async(ApiKey.objects.values().get)(pk=key.pk)
        assert secret not in str(row)
        assert row["hash"] == digest(secret) and row["prefix"] == secret[:10]
        response = await db_client.post(
            "/tokenize", {"model": "m"}, headers={"authorization": f"Bearer {secret}"}
        )
        assert response.status == 200
        assert (await router.wait_for("router.acquire"))["actor"] == "key:alice/laptop"

        async def used() -> bool:
            await sync_to_async(key.refresh_from_db)()
            return key.last_used_at is not None

        for _ in range(200):
            if await used():
                break
            await asyncio.sleep(0.05)
        assert key.last_used_at is not None

    async def test_the_require_switch_and_revocation_apply_at_once(
        self, db_client: AsgiClient, alice: object
    ) -> None:
        key, secret = await sync_to_async(ApiKey.objects.issue)(alice, "laptop")
        assert (await db_client.get("/v1/models")).status == 200  # not required yet
        settings_row = await sync_to_async(RouterSettings.load)()
        settings_row.require_api_key = True
        await sync_to_async(settings_row.save)()
        assert (await db_client.get("/v1/models")).status == 401
        headers = {"x-api-key": secret}
        assert (await db_client.get("/v1/models", headers=headers)).status == 200
        await sync_to_async(key.revoke)()
        response = await db_client.get("/v1/models", headers=headers)
        assert (response.status, response.body) == (401, UNAUTHORIZED)


@pytest.mark.django_db(transaction=True)
class TestKeyRoles:
    """Loading and unloading need the operator role, through the API too (issue 6 item 1)."""

    async def _key_of(self, username: str, role: str | None) -> str:
        from models_app.accounts.roles import GROUPS, set_role

        def make() -> str:
            user = get_user_model().objects.create_user(username, password="pw-for-tests-only")
            if role is not None:
                set_role(user, GROUPS[role])
            return ApiKey.objects.issue(user, "k")[1]

        return await sync_to_async(make)()

    async def test_a_viewers_key_may_use_models_but_not_load_or_unload_them(
        self, db_client: AsgiClient
    ) -> None:
        secret = await self._key_of("vera", "viewer")
        headers = {"authorization": f"Bearer {secret}"}
        assert (await db_client.post("/tokenize", {"model": "m"}, headers=headers)).status == 200
        for path in ("/models/load", "/models/unload", "/models/cancel"):
            response = await db_client.post(path, {"model": "m"}, headers=headers)
            assert response.status == 403
            assert b"permission_error" in response.body and b"operator" in response.body

    async def test_an_operators_key_may_load(
        self, db_client: AsgiClient, router: FakeRouter
    ) -> None:
        secret = await self._key_of("otto", "operator")
        headers = {"authorization": f"Bearer {secret}"}
        response = await db_client.post("/models/unload", {"model": "m"}, headers=headers)
        assert response.status != 403
        assert (await router.wait_for("router.unload"))["actor"] == "key:otto/k"
