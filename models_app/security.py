"""Who may talk to this server from a browser, and what ``serve`` says when it is wide open.

RouterPanel runs on a machine a whole team reaches over the LAN, with the panel open in browsers
next to every other web page. A page of another origin — another port of the same machine
included — must not drive the panel or change the router's state as the signed-in operator.

* **Origins.** ``origin_allowed`` is the one rule for the dashboard's WebSocket and for the API
  routes that change state: the request's ``Origin`` must be exactly the server's own origin
  (scheme, host and port: the scheme the server saw or ``SECURE_PROXY_SSL_HEADER`` says, the
  ``Host`` header, which must be one of ``ALLOWED_HOSTS``) or one of a configured list
  (``CSRF_TRUSTED_ORIGINS`` for the WebSocket, ``CORS_ALLOWED_ORIGINS`` for the API), with
  Django's ``https://*.example.org`` wildcard. It is Django's CSRF origin check, applied where
  Django's middleware does not run. Requiring the ``Host`` to be an allowed host closes DNS
  rebinding: a page at ``http://evil.example:8080`` resolved to this machine sends
  ``Host: evil.example:8080``, which no deployment lists.
* **The warning.** ``warn_if_open`` is called by ``serve``: a listener on a non-loopback
  address with no API key lets anyone on the network load, unload and use every model; one
  line says so and names the step that closes it (the keys and settings pages say it too).
* **CSV cells.** ``csv_cell`` neutralises spreadsheet formulas in exported text (OWASP).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, TextIO
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

Scope = MutableMapping[str, Any]
AsgiApp = Callable[[Scope, Any, Any], Awaitable[None]]

SECURE_SCHEMES = frozenset({"https", "wss"})
# Browsers say where a request comes from even when they send no Origin (RFC 8941 structured
# header, Fetch Metadata): these two values mean "a page of another origin".
FOREIGN_FETCH_SITES = frozenset({b"cross-site", b"same-site"})


# ---- origins ------------------------------------------------------------------------------------


def header(headers: Iterable[tuple[bytes, bytes]] | Mapping[bytes, bytes], name: bytes) -> str:
    """Return a header's value as text ("" when absent); the last one wins, as in ``Request``."""
    items = headers.items() if isinstance(headers, Mapping) else headers
    value = b""
    for key, found in items:
        if key == name:
            value = found
    return value.decode("latin-1").strip()


def is_secure(scheme: str, headers: Mapping[bytes, bytes]) -> bool:
    """Whether the client reached us over TLS, as Django's ``HttpRequest.scheme`` decides it.

    With ``SECURE_PROXY_SSL_HEADER`` set and the header present, the header decides (its first
    comma-separated value must equal the secure value); otherwise the server's own scheme does.
    """
    proxy_header: tuple[str, str] | None = settings.SECURE_PROXY_SSL_HEADER
    if proxy_header:
        meta_name, secure_value = proxy_header
        name = meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode()
        value = header(headers, name)
        if value:
            return value.split(",", 1)[0].strip() == secure_value
    return scheme in SECURE_SCHEMES


def allowed_hosts() -> list[str]:
    """``ALLOWED_HOSTS``, with Django's own defaults when it is empty under DEBUG."""
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not hosts:
        hosts = [".localhost", "127.0.0.1", "[::1]"]
    return hosts


def own_origin(scheme: str, headers: Mapping[bytes, bytes]) -> str | None:
    """This server's origin as the client addressed it, or None if the Host is not ours."""
    host = header(headers, b"host").lower()
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, allowed_hosts()):
        return None
    return f"{'https' if is_secure(scheme, headers) else 'http'}://{host}"


def trusted_origin(origin: str, trusted: Iterable[str]) -> bool:
    """Whether ``origin`` is listed: exactly, or under a ``scheme://*.domain`` wildcard."""
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    for pattern in trusted:
        pattern = pattern.lower()
        if "*" not in pattern:
            if origin == pattern:
                return True
            continue
        wildcard = urlsplit(pattern)
        if wildcard.scheme == parsed.scheme and is_same_domain(
            parsed.netloc, wildcard.netloc.lstrip("*")
        ):
            return True
    return False


def origin_allowed(
    origin: str, scheme: str, headers: Mapping[bytes, bytes], trusted: Iterable[str]
) -> bool:
    """Whether a request with this ``Origin`` comes from our own origin or a trusted one."""
    origin = origin.lower()
    if not origin or origin == "null":  # "null": a sandboxed frame, a file:// page, a redirect
        return False
    mine = own_origin(scheme, headers)
    if mine is not None and origin == mine:
        return True
    return trusted_origin(origin, trusted)


def foreign_browser_origin(scope: Scope, headers: Mapping[bytes, bytes]) -> str | None:
    """Return why a request that changes state is refused, or None to let it through.

    A request with an ``Origin`` must come from our own origin or ``CORS_ALLOWED_ORIGINS``.
    A request without one is a program (curl, an SDK) unless the browser's Fetch Metadata says a
    page of another site sent it: browsers omit ``Origin`` on some requests (a form's GET, an
    image), never ``Sec-Fetch-Site``.
    """
    origin = header(headers, b"origin")
    if origin:
        trusted = settings.CORS_ALLOWED_ORIGINS
        if origin_allowed(origin, scope.get("scheme", "http"), headers, trusted):
            return None
        return (
            f"requests from the web page at {origin!s:.200} may not change the router's state; "
            "list that origin in CORS_ALLOWED_ORIGINS to allow it"
        )
    if headers.get(b"sec-fetch-site", b"").strip().lower() in FOREIGN_FETCH_SITES:
        return "requests from another site's web page may not change the router's state"
    return None


def websocket_origin_allowed(scope: Scope) -> bool:
    """The dashboard socket's rule: our own origin or one of ``CSRF_TRUSTED_ORIGINS``."""
    headers = dict(scope.get("headers") or ())
    origin = header(headers, b"origin")
    scheme = scope.get("scheme", "ws")
    return origin_allowed(origin, scheme, headers, settings.CSRF_TRUSTED_ORIGINS)


class OwnOriginOnly:
    """ASGI middleware for WebSockets: refuse a handshake from any origin but the panel's own.

    Replaces Channels' ``AllowedHostsOriginValidator``, which compares host names only, so that
    ``http://127.0.0.1:9999`` passed for a panel at ``http://127.0.0.1:8080``. A refused
    handshake is closed (HTTP 403) before the consumer or the session lookup runs.
    """

    def __init__(self, application: AsgiApp) -> None:
        self.application = application

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            raise ValueError("OwnOriginOnly guards WebSocket connections only")
        if websocket_origin_allowed(scope):
            await self.application(scope, receive, send)
        else:
            await WebsocketDenier.as_asgi()(scope, receive, send)


# ---- serve's warning ----------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether a listen address only accepts connections from this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def open_to_network(host: str, api_keys: Iterable[str], keys_required: bool) -> bool:
    """Whether anyone who can reach ``host`` may use and steer the router without a key."""
    return not is_loopback(host) and not any(api_keys) and not keys_required


def warn_if_open(host: str, api_keys: Iterable[str], out: TextIO) -> bool:
    """Say in one line, at start, that the API is open to the network and the step that closes
    it; return whether it is.

    ``keys_required`` is the stored *API key required* switch: with it on, personal keys guard
    the API even without ``--api-key``.
    """
    from models_app.models import RouterSettings

    if not open_to_network(host, api_keys, RouterSettings.load().require_api_key):
        return False
    out.write(
        f"WARNING: the API on {host} is open to the network: keys are not required, so anyone "
        "who reaches it may use, load and unload every model. To close it, turn on "
        "'Require an API key for the router API' in the panel's Settings.\n"
    )
    return True


# ---- CSV export ---------------------------------------------------------------------------------

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """Return a CSV value that a spreadsheet shows as text, never runs (OWASP CSV injection).

    Text starting with ``= + - @``, a tab or a carriage return gets a leading apostrophe.
    Numbers pass unchanged, so a negative number stays a number.
    """
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
