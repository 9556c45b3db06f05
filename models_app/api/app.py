"""The HTTP dispatcher: router API and proxy as raw ASGI, everything else to Django.

The router API and the proxy are the hot path, so they skip Django's request machinery
(middleware, URL resolver, sessions, sync/async hops): one dict lookup on the path picks the
route, the key check is in memory, and the handler talks ASGI through ``Request``. Paths that
are not ours (the panel, the admin, static files) go to the Django ASGI app unchanged.

Route table (method → handler; every route needs an API key when keys are required, except
``/health`` and ``/v1/health``; OPTIONS on any API path is a CORS preflight, §9.2; routes marked
* change the router's or a child's state and refuse foreign browser origins, see below):

=============================  ==============  ==========================================
path                           methods         handler
=============================  ==============  ==========================================
/health, /v1/health            GET             routes.health (public)
/ready                         GET             routes.ready (public: 503 without a router)
/props                         GET             routes.props (``?model=`` → GET proxy)
/props                         POST            proxy.proxy_post
/models, /v1/models            GET             routes.list_models (``?reload=``)
/v1/models/<id>                GET             routes.retrieve_model (OpenAI's 404 shape)
/models                        POST, DELETE    routes.downloads_unsupported (501) *
/models/load, /models/unload   POST            routes.load, routes.unload *
/models/cancel                 POST            routes.cancel_queued (ours: queued → 499) *
/models/sse                    GET             sse.stream_events
/metrics                       GET             routes.metrics (Prometheus; ``?model=`` → proxy)
/usage                         GET             usage_route.usage_summary (ours, issue 17.2)
/v1/nodes                      GET             routes.list_nodes (ours, issue 18)
/tools, /cors-proxy            GET, POST       routes.feature_disabled (403)
proxy.POST_PATHS, /slots/<id>  POST            proxy.proxy_post (model from the JSON body;
                                               * for /props, /lora-adapters, /slots/<id>)
proxy.GET_PATHS                GET             proxy.proxy_get (model from ``?model=``)
=============================  ==============  ==========================================

``GET /models?reload=1`` re-reads the presets and restarts changed models, so it is guarded
like the starred routes.

Browser origins (issue 13): inference keeps llama.cpp's permissive CORS (the ``Origin`` is
echoed, §9.2), so browser chat front ends on any origin work. A starred route answers 403 to a
request whose ``Origin`` is neither this server's own nor in ``CORS_ALLOWED_ORIGINS``, or that
the browser marks as sent by another site (``Sec-Fetch-Site``) — otherwise any web page a team
member has open could unload models with a ``text/plain`` POST, which needs no preflight. The
refusal carries no CORS headers, and neither does a preflight for it. Requests without
``Origin`` (curl, SDKs) are not browsers' and pass to the key check as before.

Any other method on those paths, and any path under ``/v1/``, ``/models/`` or ``/slots/``, is
404 ``File Not Found``. Other paths go to Django; a 404 that Django produces for a client that
does not accept HTML is rewritten to the same generic body (§9.3a keep), so API clients see
llama.cpp's 404 everywhere while a browser still gets the panel's page.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from models_app import runtime, security
from models_app.accounts import usage
from models_app.api import auth, proxy, routes, scopes, sse, usage_route
from models_app.api.config import ApiConfig
from models_app.api.errors import NOT_FOUND, UNAUTHORIZED, ApiError, encoded_error
from models_app.api.request import JSON_TYPE, ClientGone, Message, Receive, Request, Scope, Send
from models_app.api.upstream import Upstreams
from models_app.routing.client import RouterClient
from routerpanel.router.errors import RouterError

log = logging.getLogger(__name__)

Handler = Callable[["Api", Request], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

API_PREFIXES = ("/v1/", "/models/", "/slots/")
READY_TIMEOUT = 2.0
PREFLIGHT_HEADERS = (
    (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
    (b"access-control-allow-headers", b"*"),
)


@dataclass(frozen=True, slots=True)
class Route:
    handler: Handler
    public: bool = False
    changes_state: bool = False  # refused to foreign browser origins (see the module doc)


def route_table() -> dict[str, dict[str, Route]]:
    """Path → method → route (see the module doc)."""
    table: dict[str, dict[str, Route]] = {}

    def add(paths: tuple[str, ...], methods: tuple[str, ...], route: Route) -> None:
        for path, method in itertools.product(paths, methods):
            table.setdefault(path, {})[method] = route

    inference = tuple(path for path in proxy.POST_PATHS if path not in STATE_POST_PATHS)
    add(inference, ("POST",), Route(proxy.proxy_post))
    add(STATE_POST_PATHS, ("POST",), Route(proxy.proxy_post, changes_state=True))
    add(proxy.GET_PATHS, ("GET",), Route(proxy.proxy_get))
    add(("/health", "/v1/health"), ("GET",), Route(routes.health, public=True))
    add(("/ready",), ("GET",), Route(routes.ready, public=True))
    add(("/props",), ("GET",), Route(routes.props))
    add(("/models", "/v1/models"), ("GET",), Route(routes.list_models))
    add(("/models",), ("POST", "DELETE"), Route(routes.downloads_unsupported, changes_state=True))
    add(("/models/load",), ("POST",), Route(routes.load, changes_state=True))
    add(("/models/unload",), ("POST",), Route(routes.unload, changes_state=True))
    add(("/models/cancel",), ("POST",), Route(routes.cancel_queued, changes_state=True))
    add(("/models/sse",), ("GET",), Route(sse.stream_events))
    add(("/tools", "/cors-proxy"), ("GET", "POST"), Route(routes.feature_disabled))
    add(("/metrics",), ("GET",), Route(routes.metrics))  # ?model= still proxies (§8.2)
    add(("/usage",), ("GET",), Route(usage_route.usage_summary))  # issue 17.2
    add(("/v1/nodes",), ("GET",), Route(routes.list_nodes))  # issue 18
    return table


# Proxied POSTs that change a child rather than ask it something: its props, its LoRA scales,
# a slot saved, restored or erased.
STATE_POST_PATHS = ("/props", "/lora-adapters")
PREFIX_ROUTES = (
    *((prefix, {"POST": Route(proxy.proxy_post, changes_state=True)})
      for prefix in proxy.POST_PREFIXES),
    ("/v1/models/", {"GET": Route(routes.retrieve_model)}),  # OpenAI's models.retrieve(id)
)  # fmt: skip
API_PATHS = frozenset(route_table())


def is_api_path(path: str) -> bool:
    """Whether ``path`` is answered by the API rather than by Django (the panel)."""
    return path in API_PATHS or _prefixed(path) is not None


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
        gate: scopes.Gate | None = None,
        recorder: usage.UsageRecorder | None = None,
    ) -> None:
        self.django = django_app
        self.router = router or RouterClient()
        # /ready must answer before a load balancer gives up: a short first-answer deadline.
        self.ready_client = self.router.with_timeout(READY_TIMEOUT)
        self.keys = keys or auth.DEFAULT
        self.login_failures = login_failures  # None: 401s are not audited (tests)
        self.gate = gate or scopes.Gate(self.keys)  # scoped keys; unaudited unless given
        self.config = config or ApiConfig()
        self.usage = recorder or usage.RECORDER  # usage rows, written off the request path
        self.upstreams = Upstreams(self.config)
        self.routes = route_table()
        self._request_ids: set[str] = set()
        # The queues of the open event streams (/models/sse, sse.py): streams that never end
        # by themselves, ended by ``end_streams`` when the server stops.
        self.event_streams: set[asyncio.Queue[bytes]] = set()
        # Set by ``drain`` when the server stops: new proxied requests are refused, and the
        # last proxied request in flight to end wakes the drain (``release_request_id``).
        self.stopping = False
        self._drained: asyncio.Event | None = None

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
            await self._preflight(methods, request)
        else:
            await request.respond(404, NOT_FOUND)

    async def _preflight(self, methods: dict[str, Route], request: Request) -> None:
        """§9.2: 200 with CORS headers; but no CORS for a foreign origin asking to change state."""
        asked = request.headers.get(b"access-control-request-method", b"").decode("latin-1")
        route = methods.get(asked.strip().upper())
        if route is not None and route.changes_state and self._foreign(request) is not None:
            request.cors = False
            await request.respond(403, encoded_error(403, "this origin may not change state"))
            return
        await request.respond(200, b"", b"text/html", PREFLIGHT_HEADERS)

    def _foreign(self, request: Request) -> str | None:
        return security.foreign_browser_origin(request.scope, request.headers)

    def refuse_foreign_origin(self, request: Request) -> None:
        """Raise 403 if a browser page of another origin sent this state-changing request."""
        reason = self._foreign(request)
        if reason is not None:
            request.cors = False  # the page may not even read the refusal
            raise ApiError(403, reason)

    async def _handle(self, route: Route, request: Request) -> None:
        try:
            if route.changes_state:
                self.refuse_foreign_origin(request)
            if not route.public:
                request.caller = await self.keys.identify(request.headers)
                request.actor = request.caller.actor
            await route.handler(self, request)
        except auth.Unauthorized:
            if self.login_failures is not None:
                self.login_failures.note(request.scope, request.headers)
            await request.respond(401, UNAUTHORIZED)
        except ApiError as exc:
            await self._fail(request, exc.status, exc.body, exc.headers)
        except RouterError as exc:
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
            await self._fail(request, 500, encoded_error(500, str(exc) or type(exc).__name__))
        finally:
            request.stop_watching()

    async def _fail(
        self, request: Request, status: int, body: bytes, headers: tuple[Any, ...] = ()
    ) -> None:
        if request.client_gone:
            return
        if not request.started:
            await request.respond(status, body, headers=headers)
        elif not request.finished:  # too late for a status: end the stream
            await request.end(sse.data_event(body) if request.event_stream else b"")

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
        if not self._request_ids and self._drained is not None:
            self._drained.set()

    def in_flight(self) -> int:
        """Proxied requests under way: queued for their model, or being answered by it."""
        return len(self._request_ids)

    def end_streams(self) -> None:
        """The server is stopping: end the event streams now (each sends its end and its
        connection closes) rather than have the server wait for clients that never leave."""
        for queue in self.event_streams:
            queue.put_nowait(sse.END)

    async def drain(self, grace: float) -> None:
        """The server is stopping: end the event streams, refuse new proxied requests (503),
        and give those under way up to ``grace`` seconds to end. What is still running after
        that is ended by whoever stops the router (its clients are told why: the router's
        shutdown revokes their leases)."""
        self.stopping = True
        self.end_streams()
        if not self._request_ids:
            return
        self._drained = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._drained.wait()

    async def aclose(self) -> None:
        """Close the connections to the children: what still runs ends, is given a moment to
        tell its client why and to record its usage; then the last usage rows are stored."""
        await self.upstreams.aclose()
        await self.drain(ENDING)
        await self.usage.drain(deadline=5.0)  # the last usage rows, if the database answers


_SUFFIXES = itertools.count(2)
ENDING = 5.0  # seconds the requests cut by ``aclose`` get to tell their clients why


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
    kwargs.setdefault(
        "gate",
        scopes.Gate(
            kwargs.get("keys") or auth.DEFAULT,
            scope_refusals=scopes.audited(scopes.SCOPE),
            busy_refusals=scopes.audited(scopes.BUSY),
            quota_refusals=scopes.audited(scopes.QUOTA),
        ),
    )
    started = runtime.current()  # serve starts it before it builds the app
    kwargs.setdefault(
        "config",
        ApiConfig(sse_keepalive=settings.ROUTERPANEL["SSE_KEEPALIVE"], autoload=started.autoload),
    )
    return Api(django_app, **kwargs)
