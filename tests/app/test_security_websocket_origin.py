"""The dashboard WebSocket accepts the panel's own origin only: scheme, host and port (issue 13).

A page served from another port of the same machine (``http://127.0.0.1:9999``) used to pass,
since Channels' validator compares host names only, and could drive the dashboard as the
signed-in operator. These tests open the socket through the real ASGI application with a real
session cookie, so what refuses is what runs in production.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client, override_settings

from models_app import security
from models_app.accounts.roles import Role
from tests.support.panel import RouterStub, make_user, model_row

pytest_plugins = ("tests.support.panel",)
pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 10.0
PANEL = b"127.0.0.1:8080"


@pytest.fixture
def stub(panel_router: RouterStub) -> RouterStub:
    panel_router.models = [model_row("demo-small", "loaded")]
    return panel_router


@pytest.fixture
async def cookie() -> bytes:
    user = await sync_to_async(make_user)("olga", Role.OPERATOR)
    client = Client()
    await sync_to_async(client.force_login)(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def opens(
    cookie: bytes, origin: bytes | None, host: bytes = PANEL, **scope: Any
) -> tuple[bool, Any]:
    from routerpanel.asgi import application

    headers = [(b"host", host), (b"cookie", cookie)]
    if origin is not None:
        headers.append((b"origin", origin))
    socket = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
    socket.scope.update(scope)
    connected, code = await socket.connect(timeout=TIMEOUT)
    if connected:
        await socket.disconnect()
    return connected, code


class TestTheDashboardSocket:
    async def test_the_panels_own_origin_connects(self, stub: RouterStub, cookie: bytes) -> None:
        assert (await opens(cookie, b"http://127.0.0.1:8080"))[0] is True

    @pytest.mark.parametrize(
        "origin",
        [
            b"http://127.0.0.1:9999",  # another port of the same machine (the probe)
            b"http://localhost:3000",  # an allowed host name, another port (the probe)
            b"http://127.0.0.1",  # same host, default port
            b"https://127.0.0.1:8080",  # same host and port, another scheme
            b"http://evil.example",
            b"null",  # a sandboxed frame or a file:// page
            b"",
        ],
    )
    async def test_another_origin_is_refused_before_the_consumer_runs(
        self, stub: RouterStub, cookie: bytes, origin: bytes
    ) -> None:
        connected, _ = await opens(cookie, origin)
        assert connected is False
        assert stub.calls == []  # the consumer never asked the router for a snapshot

    async def test_a_socket_without_an_origin_is_refused(
        self, stub: RouterStub, cookie: bytes
    ) -> None:
        assert (await opens(cookie, None))[0] is False

    async def test_a_host_name_not_allowed_is_refused_even_when_the_origin_matches_it(
        self, stub: RouterStub, cookie: bytes
    ) -> None:
        # DNS rebinding: evil.example resolved to this machine; Origin and Host agree.
        host = b"evil.example:8080"
        assert (await opens(cookie, b"http://evil.example:8080", host=host))[0] is False

    @override_settings(CSRF_TRUSTED_ORIGINS=["https://panel.example.org"])
    async def test_a_trusted_origin_connects(self, stub: RouterStub, cookie: bytes) -> None:
        assert (await opens(cookie, b"https://panel.example.org"))[0] is True
        assert (await opens(cookie, b"http://panel.example.org"))[0] is False

    @override_settings(SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"))
    async def test_behind_an_https_proxy_the_origin_is_https(
        self, stub: RouterStub, cookie: bytes
    ) -> None:
        from routerpanel.asgi import application

        headers = [(b"host", PANEL), (b"cookie", cookie), (b"x-forwarded-proto", b"https")]
        for origin, expected in ((b"https://127.0.0.1:8080", True), (PANEL, False)):
            socket = WebsocketCommunicator(
                application, "/ws/dashboard/", headers=[*headers, (b"origin", origin)]
            )
            connected, _ = await socket.connect(timeout=TIMEOUT)
            assert connected is expected, origin
            if connected:
                await socket.disconnect()


class TestTheOriginRule:
    """``security.origin_allowed``: the rule shared by the socket and the API."""

    def headers(self, host: str = "studio.local:8080", **more: str) -> dict[bytes, bytes]:
        found = {b"host": host.encode()}
        found.update({k.replace("_", "-").encode(): v.encode() for k, v in more.items()})
        return found

    @override_settings(ALLOWED_HOSTS=["studio.local"])
    def test_the_exact_origin_of_an_allowed_host_passes(self) -> None:
        assert security.origin_allowed("http://studio.local:8080", "http", self.headers(), [])
        assert security.origin_allowed("HTTP://Studio.Local:8080", "http", self.headers(), [])
        assert not security.origin_allowed("http://studio.local:8081", "http", self.headers(), [])
        assert not security.origin_allowed("http://studio.local", "http", self.headers(), [])

    @override_settings(ALLOWED_HOSTS=["127.0.0.1"])
    def test_a_host_outside_allowed_hosts_has_no_own_origin(self) -> None:
        assert security.own_origin("http", self.headers()) is None
        assert not security.origin_allowed("http://studio.local:8080", "http", self.headers(), [])

    def test_wildcard_trusted_origins_match_subdomains_of_their_scheme(self) -> None:
        trusted = ["https://*.example.org"]
        assert security.trusted_origin("https://panel.example.org", trusted)
        assert not security.trusted_origin("http://panel.example.org", trusted)
        assert not security.trusted_origin("https://example.org.evil.example", trusted)

    @override_settings(SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"))
    def test_the_proxy_header_decides_the_scheme_when_configured(self) -> None:
        assert security.is_secure("http", self.headers(x_forwarded_proto="https"))
        assert not security.is_secure("https", self.headers(x_forwarded_proto="http"))
        assert security.is_secure("https", self.headers())

    def test_without_the_setting_the_proxy_header_is_ignored(self) -> None:
        assert not security.is_secure("http", self.headers(x_forwarded_proto="https"))
