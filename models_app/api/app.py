"""The HTTP dispatcher: router API and proxy as raw ASGI, everything else to Django.

The router API and the proxy are the hot path, so they skip Django's request machinery
(middleware, URL resolver, sessions, sync/async hops): one dict lookup on the path picks the
route, the key check is in memory, and the handler talks ASGI through ``Request``. Paths that
are not ours (the panel, the admin, static files) go to the Django ASGI app unchanged.

Route table (method → handler; every route needs an API key when keys are required, except
``/health`` and ``/v1/health``; OPTIONS on any API path is a CORS preflight, §9.2):

=============================  ==============  ==========================================
path                           methods         handler
=============================  ==============  ==========================================
/health, /v1/health            GET             routes.health (public)
/props                         GET             routes.props (``?model=`` → GET proxy)
/props                         POST            proxy.proxy_post
/models, /v1/models            GET             routes.list_models (``?reload=``)
/models                        POST, DELETE    routes.downloads_unsupported (501)
/models/load, /models/unload   POST            routes.load, routes.unload
/models/cancel                 POST            routes.cancel_queued (ours: queued → 499)
/models/sse                    GET             sse.stream_events
/metrics                       GET             routes.metrics (Prometheus; ``?model=`` → proxy)
/tools, /cors-proxy            GET, POST       routes.feature_disabled (403)
proxy.POST_PATHS, /slots/<id>  POST            proxy.proxy_post (model from the JSON body)
proxy.GET_PATHS                GET             proxy.proxy_get (model from ``?model=``)
=============================  ==============  ==========================================

Any other method on those paths, and any path under ``/v1/``, ``/models/`` or ``/slots/``, is
404 ``File Not Found``. Other paths go to Django; a 404 that Django produces for a client that
does not accept HTML is rewritten to the same generic body (§9.3a keep), so API clients see
llama.cpp's 404 everywhere while a browser still gets the panel's page.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from models_app.api import auth, proxy, routes, sse
from models_app.api.config import ApiConfig
from models_app.api.errors import NOT_FOUND, UNAUTHORIZED, ApiError, error_body
from models_app.api.request import JSON_TYPE, ClientGone, Message, Receive, Request, Scope, Send
from models_app.api.upstream import Upstreams
from models_app.bridge import RouterClient, RouterRejected

log = logging.getLogger(__name__)

Handler = Callable[["Api", Request], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_PREFIXES = ("/v1/", "/models/", "/slots/")
PREFLIGHT_HEADERS = (
    (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
    (b"access-control-allow-headers", b"*"),
)


@dataclass(frozen=True, slots=True)
class Route:
    handler: Handler
    public: bool = False


def route_table() -> dict[str, dict[str, Route]]:
    """Path → method → route (see the module doc)."""
    table: dict[str, dict[str, Route]] = {}

    def add(paths: tuple[str, ...], methods: tuple[str, ...], route: Route) -> None:
        for path, method in itertools.product(paths, methods):
            table.setdefault(path, {})[method] = route

    add(proxy.POST_PATHS, ("POST",), Route(proxy.proxy_post))
    add(proxy.GET_PATHS, ("GET",), Route(proxy.proxy_get))
    add(("/health", "/v1/health"), ("GET",), Route(routes.health, public=True))
    add(("/props",), ("GET",), Route(routes.props))
    add(("/models", "/v1/models"), ("GET",), Route(routes.list_models))
    add(("/models",), ("POST", "DELETE"), Route(routes.downloads_unsupported))
    add(("/models/load",), ("POST",), Route(routes.load))
    add(("/models/unload",), ("POST",), Route(routes.unload))
    add(("/models/cancel",), ("POST",), Route(routes.cancel_queued))
    add(("/models/sse",), ("GET",), Route(sse.stream_events))
    add(("/tools", "/cors-proxy"), ("GET", "POST"), Route(routes.feature_disabled))
    add(("/metrics",), ("GET",), Route(routes.metrics))  # ?model= still proxies (§8.2)
    return table


PREFIX_ROUTES = tuple((prefix, {"POST": Route(proxy.proxy_post)}) for prefix in proxy.POST_PREFIXES)


class Api:
    """The HTTP ASGI app (see module doc); ``router``, ``keys`` and ``config`` are injectable."""

    def __init__(
        self,
        django_app: AsgiApp,
        *,
        router: RouterClient | None = None,
        keys: auth.KeyStore | None = None,
        config: ApiConfig | None = None,
        login_failures: auth.LoginFailures | None = None,
    ) -> None:
        self.django = django_app
        self.router = router or RouterClient()
        self.keys = keys or auth.DEFAULT
        self.login_failures = login_failures  # None: 401s are not audited (tests)
        self.config = config or ApiConfig()
        self.upstreams = Upstreams(self.config)
        self.routes = route_table()
        self._request_ids: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan, when run without ProtocolTypeRouter
            await self.django(scope, receive, send)
            return
        path: str = scope["path"]
        methods = self.routes.get(path)
        if methods is None:
            methods = _prefixed(path)
            if methods is None:
                await self._to_django(scope, receive, send)
                return
        request = Request(scope, receive, send)
        route = methods.get(request.method)
        if route is not None:
            await self._handle(route, request)
        elif request.method == "OPTIONS":
            await request.respond(200, b"", b"text/html", PREFLIGHT_HEADERS)
        else:
            await request.respond(404, NOT_FOUND)

    async def _handle(self, route: Route, request: Request) -> None:
        try:
            if not route.public:
                request.actor = await self.keys.authenticate(request.headers)
            await route.handler(self, request)
        except auth.Unauthorized:
            if self.login_failures is not None:
                self.login_failures.note(request.scope, request.headers)
            await request.respond(401, UNAUTHORIZED)
        except ApiError as exc:
            await self._fail(request, exc.status, exc.body, exc.headers)
        except RouterRejected as exc:
            error = ApiError.from_rejection(exc)
            await self._fail(request, error.status, error.body, error.headers)
        except ClientGone:
            pass
        except asyncio.CancelledError:
            if not request.client_gone:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # we cancelled ourselves because the client left
        except Exception as exc:  # §9.4: anything else is a 500 with the exception's text
            log.exception("%s %s failed", request.method, request.path)
            await self._fail(request, 500, error_body(500, str(exc) or type(exc).__name__))
        finally:
            request.stop_watching()

    async def _fail(
        self, request: Request, status: int, body: bytes, headers: tuple[Any, ...] = ()
    ) -> None:
        if request.client_gone:
            return
        if not request.started:
            await request.respond(status, body, headers=headers)
        elif not request.finished:
            await request.end()  # too late for a status: end the stream

    # ---- Django ---------------------------------------------------------------------------------

    async def _to_django(self, scope: Scope, receive: Receive, send: Send) -> None:
        accept = next((v for k, v in scope.get("headers", ()) if k == b"accept"), b"")
        if b"text/html" in accept:
            await self.django(scope, receive, send)
        else:
            await self.django(scope, receive, _NotFoundRewriter(send))

    # ---- request ids ----------------------------------------------------------------------------

    def claim_request_id(self, request_id: str) -> str:
        """Return a router request id unique in this process: the client's, suffixed if in use."""
        unique = request_id
        while unique in self._request_ids:
            unique = f"{request_id}.{next(_SUFFIXES)}"
        self._request_ids.add(unique)
        return unique

    def release_request_id(self, request_id: str) -> None:
        self._request_ids.discard(request_id)

    async def aclose(self) -> None:
        await self.upstreams.aclose()


_SUFFIXES = itertools.count(2)


def _prefixed(path: str) -> dict[str, Route] | None:
    for prefix, methods in PREFIX_ROUTES:
        if path.startswith(prefix) and len(path) > len(prefix):
            return methods
    if path.startswith(API_PREFIXES):
        return {}
    return None


class _NotFoundRewriter:
    """Pass Django's response through, but replace a 404 with the generic body (§9.3a)."""

    __slots__ = ("_rewriting", "_send")

    def __init__(self, send: Send) -> None:
        self._send = send
        self._rewriting = False

    async def __call__(self, message: Message) -> None:
        if self._rewriting:
            return  # Django's own 404 body
        if message["type"] == "http.response.start" and message["status"] == 404:
            self._rewriting = True
            headers = [
                (b"content-type", JSON_TYPE),
                (b"content-length", str(len(NOT_FOUND)).encode()),
                (b"server", b"llama.cpp"),
            ]
            await self._send({"type": "http.response.start", "status": 404, "headers": headers})
            await self._send({"type": "http.response.body", "body": NOT_FOUND})
            return
        await self._send(message)


def build_http_app(django_app: AsgiApp, **kwargs: Any) -> Api:
    """Return the HTTP ASGI app: our routes raw, the rest through ``django_app``."""
    from django.conf import settings

    auth.connect_signals()
    kwargs.setdefault("login_failures", auth.LoginFailures())
    kwargs.setdefault("config", ApiConfig(sse_keepalive=settings.ROUTERPANEL["SSE_KEEPALIVE"]))
    return Api(django_app, **kwargs)
