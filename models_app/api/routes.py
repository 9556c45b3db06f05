"""The routes the router answers itself (ROUTER_SPEC §9.B, Appendix A).

Every answer about models comes from the router (``RouterClient.call``), so this web
process may be one of several (team mode). Status codes follow llama.cpp, quirks included:
an unknown model is 404 on ``/models/load`` (answered with the generic body, §9.3a) but 400 on
``/models/unload`` (§15.2 keep), and ``?reload=`` with any non-empty value reloads (§15.1 keep).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer

from models_app.api import jsonbody, listing, proxy
from models_app.api.errors import FEATURE_DISABLED, ApiError, dumps
from models_app.api.request import Request
from models_app.panel import dashboard_sockets
from models_app.routing import metrics as router_metrics
from models_app.routing import nodes
from routerpanel.router.config import DEFAULT_STOP_TIMEOUT
from routerpanel.router.errors import RouterError

if TYPE_CHECKING:
    from models_app.api.context import ApiContext

HEALTH = b'{"status":"ok"}'
RELOAD_STOP_GRACE = 5.0  # seconds past the stop-timeout a reload waits for a removed child
RELOAD_POLL = 0.05


async def health(api: ApiContext, request: Request) -> None:
    """§9.6: 200 as soon as we listen; says nothing about the children (public)."""
    await request.respond(200, HEALTH)


async def ready(api: ApiContext, request: Request) -> None:
    """RouterPanel's own ``GET /ready``: 200 when a router answers now, 503 when none does.

    ``/health`` stays llama.cpp's (200 as soon as we listen, §9.6) for compatibility; this is
    the route health checks and load balancers should use (public, like /health).
    """
    try:
        body = await api.ready_client.ready()
    except RouterError as exc:
        answer = {"status": "unavailable", "error": exc.message}
        await request.respond(503, dumps(answer), headers=((b"retry-after", b"5"),))
        return
    problems = body.get("problems") or []
    # Serving goes on: 200, but a filling or full disk is said (the router's files lag).
    status = "degraded" if problems else "ok"
    await request.respond_json({"status": status, "router": body, "problems": problems})


async def props(api: ApiContext, request: Request) -> None:
    """§9.7: the router's own props; with ``?model=`` the child's, through the GET proxy."""
    if request.query("model"):
        await proxy.proxy_get(api, request)
        return
    snapshot = await api.router.snapshot()
    config = snapshot.get("config") or {}
    await request.respond_json(
        {
            "role": "router",
            "max_instances": config.get("models_max", 0),
            "models_autoload": api.config.autoload,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": None, "n_ctx": 0},
            "ui_settings": {},
            "build_info": api.config.build_info,
            "cors_proxy_enabled": False,
        }
    )


async def list_nodes(api: ApiContext, request: Request) -> None:
    """Ours (issue 18): the router nodes of this installation, live and lost, as the web
    process's directory shows them; ``[]`` with one unnamed router."""
    now = time.time()
    found = await nodes.known()
    await request.respond_json({"data": [n.as_json(now) for n in found], "object": "list"})


async def list_models(api: ApiContext, request: Request) -> None:
    """§9.8: ``GET /models`` and ``GET /v1/models``; ``?reload=<anything>`` re-reads presets."""
    removed: set[str] = set()
    if request.query("reload"):
        api.refuse_foreign_origin(request)  # a reload restarts changed models: it changes state
        # sources=True: re-read --models-preset/--models-dir too, as llama.cpp re-reads its
        # sources; the panel's reloads after an edit do not, so they never undo that edit.
        answer = await api.router.reload(actor=request.actor, sources=True)  # 500
        removed = set(answer.get("removed") or ())
    snapshot = await _until_stopped(api, removed)
    models = api.gate.visible(request.caller, snapshot.get("models") or ())  # a key's scope
    await request.respond_json(listing.render(models, time.time()))


async def retrieve_model(api: ApiContext, request: Request) -> None:
    """``GET /v1/models/{id}`` (OpenAI's ``models.retrieve``): the entry ``/v1/models`` lists
    for that id (an id may hold slashes: ``org/model:Q4_K_M``); OpenAI's 404 for an id it does
    not list, or that the caller's key may not see."""
    name = request.path.removeprefix("/v1/models/")
    snapshot = await api.router.snapshot()
    models = api.gate.visible(request.caller, snapshot.get("models") or ())
    row = next((m for m in models if m.get("name") == name and not m.get("hidden")), None)
    if row is None:
        error = {
            "message": f"The model '{name}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        await request.respond(404, dumps({"error": error}), own_404=True)
        return
    await request.respond_json(listing.entry(row, int(time.time())))


async def _until_stopped(api: ApiContext, removed: set[str]) -> dict[str, Any]:
    """Return a snapshot once the ``removed`` models' children have exited.

    llama.cpp's reload blocks until the models it removes have stopped (§2.19), so its answer
    no longer lists them. The wait is bounded by their stop-timeout plus a grace (a removed
    model first finishes its in-flight requests); past it the listing shows them stopping. A
    reload is rare and the wait short, so this polls the snapshot instead of holding an event
    subscription.
    """
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    while True:
        snapshot = await api.router.snapshot()
        left = [m for m in snapshot.get("models") or () if m.get("name") in removed]
        if not left:
            return snapshot
        if deadline is None:
            longest = max(float(m.get("stop_timeout") or DEFAULT_STOP_TIMEOUT) for m in left)
            deadline = loop.time() + longest + RELOAD_STOP_GRACE
        if loop.time() >= deadline:
            return snapshot
        await asyncio.sleep(RELOAD_POLL)


async def load(api: ApiContext, request: Request) -> None:
    """§9.9 (through the queue, rule A9): ``{"success": true}`` once the load has started."""
    model = await _model_of(api, request)
    if not model:
        raise ApiError(404, "model is not found")  # llama.cpp looks "" up: not found, 404
    _check_operator(api, request)
    api.gate.check(request, model)
    await request.respond_json(await api.router.load(model, actor=request.actor))


async def unload(api: ApiContext, request: Request) -> None:
    """§9.10: ``{"success": true}`` at once; the child exits within its stop-timeout."""
    model = await _model_of(api, request)
    if not model:
        raise ApiError(400, "model is not found")
    _check_operator(api, request)
    api.gate.check(request, model)
    await request.respond_json(await api.router.unload(model, actor=request.actor))


async def cancel_queued(api: ApiContext, request: Request) -> None:
    """RouterPanel's own: reject queued requests with 499 (operator role).

    Body ``{"model": "x"}`` cancels every request waiting for x; ``{"request_id": "r"}`` the one
    with that ``X-Request-Id``. Answers ``{"success": true, "cancelled": [ids]}``, or 404 when
    nothing matching waits. Running requests are not touched (unload stops those).
    """
    data = await _json_of(api, request)
    model, request_id = data.get("model"), data.get("request_id")
    if not isinstance(model, str | None) or not isinstance(request_id, str | None):
        raise ApiError(400, "'model' and 'request_id' must be strings")
    if bool(model) == bool(request_id):
        raise ApiError(400, "give exactly one of 'model' or 'request_id'")
    _check_operator(api, request)
    if model:
        api.gate.check(request, model)
    answer = await api.router.cancel_queued(
        actor=request.actor, model=model, queued_request=request_id
    )
    await request.respond_json(answer)


def _check_operator(api: ApiContext, request: Request) -> None:
    """Loading, unloading and cancelling are the operator's (DESIGN §5): a viewer's key may
    only use."""
    if not api.keys.may_operate(request.actor):
        raise ApiError(403, "this API key's owner may not load or unload models (operator role)")


async def _model_of(api: ApiContext, request: Request) -> str:
    model = (await _json_of(api, request)).get("model")
    return model if isinstance(model, str) else ""


async def _json_of(api: ApiContext, request: Request) -> dict[str, Any]:
    return jsonbody.parse_object(await request.read_body(api.config.max_body_bytes))


async def downloads_unsupported(api: ApiContext, request: Request) -> None:
    """``POST /models`` and ``DELETE /models`` (§9.12-9.13): presets are added in the panel."""
    raise ApiError(
        501, "downloading models into the cache is not supported by RouterPanel; add a preset"
    )


async def feature_disabled(api: ApiContext, request: Request) -> None:
    """``/tools`` and ``/cors-proxy`` (§9.19): disabled, in llama.cpp's words."""
    await request.respond(403, FEATURE_DISABLED)


async def metrics(api: ApiContext, request: Request) -> None:
    """``GET /metrics``: the router's metrics in Prometheus text; ``?model=X`` is X's own (§8.2)."""
    if request.query("model"):
        await proxy.proxy_get(api, request)
        return
    answer = await api.router.metrics()
    families = [*(answer.get("metrics") or []), *api.usage.counters.families()]  # 17.2
    families += await dashboard_sockets.families(get_channel_layer())  # issue 45.6
    body = router_metrics.render(families)
    await request.respond(200, body, router_metrics.CONTENT_TYPE)
