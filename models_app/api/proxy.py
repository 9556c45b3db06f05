"""The proxy (ROUTER_SPEC §8): find the model, lease it from the router, stream to its child.

Per request: read the body (the model is inside it, §8.4), validate (§8.6), ``acquire`` a lease
(the router queues, loads and evicts; rule A1-A10), forward to the child's address (host, port
and, for a protected child, its key: issue 18) through its keep-alive pool, relay status,
headers and body chunks as they arrive, and release the lease when the response ends, fails or
the client leaves. A client that leaves while queued cancels the ``acquire``, which takes its
place out of the queue (A7); one that leaves while streaming closes the child connection, which
makes llama-server stop generating (§8.15).

Every chunk that goes out is progress for the router's hang watchdog (``LeaseKeeper.progress``).
When the child's answer breaks off, the router is asked why: if it killed the child as hung,
the client gets that reason — a 503 before the answer started, an SSE ``error`` event before the
end of a stream that had started — instead of a bare cut.

Deviation from llama.cpp, on purpose: a child that cannot be reached answers 500 with the same
``proxy error: <text>`` message, but in the JSON error shape instead of plain text labelled as
JSON (§8.14, a §15.13 gap). The query string is forwarded as received rather than re-encoded in
key order (§8.10): the child reads the same parameters either way. The client's
``Authorization`` and ``X-Api-Key`` are not forwarded (llama.cpp forwards them, §9.1): they are
RouterPanel keys, and a protected child gets its own key from the pool instead.

Receipts and usage (issue 17.2, 17.3): every answer from a child carries
``X-RouterPanel-Queue-Ms`` (waiting for the model: queue and load), ``X-RouterPanel-Load-Ms``
(the load it waited for; 0 when the model was loaded) and, when models were evicted for that
load, ``X-RouterPanel-Evicted`` (their names, comma-separated), from the grant's receipt. When
the answer ends, one ``usage.Usage`` goes to the recorder: the receipt, the time the model was
held, and the token counts read off the last chunks of the answer (``usage.tokens_in``).

Queue comments (issue 17.7, ``waiting``): a streamed request that asked for them and has to wait
gets its head early and comment lines while it waits; its answer then goes out as body only
(the receipt is a comment line), and an error is one SSE ``data:`` event of the error body
(``sse.data_event``).
"""

from __future__ import annotations

import logging
import time
from email import policy
from email.parser import BytesParser
from typing import TYPE_CHECKING

from models_app.accounts import usage
from models_app.api import jsonbody, waiting
from models_app.api.errors import NOT_FOUND, ApiError, dumps, encoded_error
from models_app.api.lease import LeaseKeeper
from models_app.api.pump import Pump
from models_app.api.request import Request
from models_app.api.sse import data_event
from models_app.api.upstream import Answer, UpstreamError
from models_app.routing.wire import Grant
from routerpanel.router.errors import RouterError, unavailable
from routerpanel.router.receipts import Receipt

if TYPE_CHECKING:
    from models_app.api.context import ApiContext

log = logging.getLogger(__name__)

# §8.1: forwarded with the model from the JSON body.
POST_PATHS = (
    "/completion", "/completions", "/v1/completions",
    "/chat/completions", "/v1/chat/completions", "/v1/chat/completions/control",
    "/responses", "/v1/responses",
    "/audio/transcriptions", "/v1/audio/transcriptions",
    "/v1/messages", "/v1/messages/count_tokens",
    "/infill",
    "/embedding", "/embeddings", "/v1/embeddings",
    "/rerank", "/reranking", "/v1/rerank", "/v1/reranking",
    "/v1/systemone",
    "/tokenize", "/detokenize", "/apply-template",
    "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens",
    "/responses/input_tokens", "/v1/responses/input_tokens",
    "/props", "/lora-adapters",
)  # fmt: skip
POST_PREFIXES = ("/slots/",)  # POST /slots/:id_slot
# §8.2: forwarded with the model from ?model= (GET /props?model= comes through routes.props).
GET_PATHS = ("/metrics", "/lora-adapters", "/slots")

# §8.11 drops these request headers, plus the hop-by-hop ones (RFC 9110 §7.6.1); we set our own
# X-Request-Id. Host and Content-Length are set by the HTTP client. The client's keys are ours,
# never the child's (issue 18): the child gets its own key, if it has one, from its pool.
_DROP_REQUEST = frozenset(
    {
        b"host", b"content-length", b"transfer-encoding", b"accept-encoding", b"connection",
        b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"trailer",
        b"upgrade", b"expect", b"x-request-id", b"authorization", b"x-api-key",
    }
)  # fmt: skip
# §8.13 drops these child response headers (and Access-Control-*), plus the hop-by-hop ones.
_DROP_RESPONSE = frozenset(
    {
        b"server", b"transfer-encoding", b"content-length", b"keep-alive", b"connection",
        b"proxy-connection", b"te", b"trailer", b"upgrade", b"x-request-id",
    }
)  # fmt: skip


async def proxy_post(api: ApiContext, request: Request) -> None:
    body = await request.read_body(api.config.max_body_bytes)
    fields = body_fields(body, request.headers.get(b"content-type", b""))
    model = fields.get("model")
    streamed = fields.get("stream") is True
    await forward(api, request, model if isinstance(model, str) else "", body, streamed)


async def proxy_get(api: ApiContext, request: Request) -> None:
    await forward(api, request, request.query("model") or "", b"")


def body_fields(body: bytes, content_type: bytes) -> dict[str, object]:
    """Return the body's top-level fields (``model``, ``stream``; empty unless an object); 400
    if it is not JSON (strict: ``jsonbody.parse``, the same rules as the router's own routes)."""
    if content_type[:19].lower() == b"multipart/form-data":
        return dict(multipart_fields(body, content_type))
    data = jsonbody.parse(body)
    return data if isinstance(data, dict) else {}


def multipart_fields(body: bytes, content_type: bytes) -> dict[str, str]:
    """Return the text fields of a multipart form (§8.4: ``model`` may be one of them)."""
    head = b"Content-Type: " + content_type + b"\r\n\r\n"
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    fields: dict[str, str] = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str) and part.get_filename() is None:
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                fields.setdefault(name, payload.decode("utf-8", "replace"))
    return fields


def autoload_flag(value: str | None, default: bool) -> bool:
    """§8.5: absent or empty is the server's ``default``; exactly ``true`` or ``1`` is on; else
    off."""
    if not value:
        return default
    return value in ("true", "1")


async def forward(
    api: ApiContext, request: Request, model: str, body: bytes, streamed: bool = False
) -> None:
    """Validate, lease the model and relay the exchange (see module doc); ``streamed``: the
    body asks for a stream (queue comments may go out while it waits, ``waiting``)."""
    if not model:
        raise ApiError(400, "model name is missing from the request")
    if api.stopping:
        raise ApiError(503, "router is shutting down")
    autoload = autoload_flag(request.query("autoload"), api.config.autoload)
    ticket = api.gate.admit(request, model)  # issue 17.1: 403 out of scope, 429 over the limit
    router_id = api.claim_request_id(request.request_id)
    request.watch_disconnect()
    arrived = time.time()
    try:
        acquiring = api.router.acquire(
            model,
            actor=request.actor,
            autoload=autoload,
            request_id=router_id,
            priority=request.caller.priority,  # issue 17.5: the fair queue policy reads it
            patient=waiting.patient(request, streamed),
        )
        if waiting.wanted(request, streamed):
            grant = await waiting.Comments(api, request, model).acquire(acquiring)
        else:
            grant = await acquiring
        lease = LeaseKeeper(grant)
        meter = Meter(grant.receipt)
        started = time.monotonic()
        try:
            await relay(api, request, grant, lease, body, meter)
        finally:
            await lease.release()
            api.usage.record(meter.usage(request, grant, arrived, time.monotonic() - started))
    finally:
        ticket.release()  # also when cancelled or the client left
        api.release_request_id(router_id)


class Meter:
    """What the usage row needs from the answer: its status and its last chunks (the tail is
    searched once, at the end; per chunk this only moves two references)."""

    __slots__ = ("last", "previous", "receipt", "status", "whole")

    def __init__(self, receipt: Receipt) -> None:
        self.receipt = receipt
        self.status = 0
        self.previous = self.last = self.whole = b""

    def chunk(self, chunk: bytes) -> None:
        self.previous, self.last = self.last, chunk

    def headers(self) -> list[tuple[bytes, bytes]]:
        """The receipt's headers (issue 17.3)."""
        r = self.receipt
        headers = [
            (b"x-routerpanel-queue-ms", b"%d" % round(r.queued * 1000)),
            (b"x-routerpanel-load-ms", b"%d" % round(r.load * 1000)),
        ]
        if r.evicted:
            headers.append((b"x-routerpanel-evicted", ",".join(r.evicted).encode()))
        return headers

    def usage(self, request: Request, grant: Grant, arrived: float, held: float) -> usage.Usage:
        tail = self.whole[-usage.TAIL_BYTES :] or self.previous + self.last
        prompt, completion = usage.tokens_in(tail) if tail else (None, None)
        r = self.receipt
        status = self.status or (499 if request.client_gone else 500)  # 0: no answer came
        return usage.Usage(
            request.actor, grant.model, arrived, request.path, request.request_id, status,
            r.queued, r.load, r.caused_load, r.evicted, prompt, completion, held,
        )  # fmt: skip


async def relay(
    api: ApiContext, request: Request, grant: Grant, lease: LeaseKeeper, body: bytes, meter: Meter
) -> None:
    pool = api.upstreams.checkout(grant.model, grant.address)
    try:
        try:
            response = await pool.send(
                request.method, upstream_target(request), upstream_headers(request), body
            )
        except UpstreamError as exc:
            raise await failure(api, grant, exc, meter) from None
        meter.status = response.status
        try:
            lease.progress()
            try:
                whole = await whole_answer(response, api.config.whole_answer_bytes, lease)
            except UpstreamError as exc:
                raise await failure(api, grant, exc, meter) from None
            if whole is not None:
                meter.whole = whole
                await send_whole(request, response, whole, meter)
            else:
                await stream_back(api, request, response, grant, lease, meter)
        finally:
            await response.aclose()  # unread: the connection closes and the child stops
    finally:
        api.upstreams.checkin(pool)


async def failure(api: ApiContext, grant: Grant, exc: UpstreamError, meter: Meter) -> Exception:
    """What a client gets when the child fails before the answer started: why the router
    ended the child (it killed it as hung), else ``proxy error: <text>`` (§8.14); with the
    receipt's headers."""
    why = await why_ended(api, grant)
    error = ApiError.from_rejection(why) if why is not None else None
    if error is None:
        error = ApiError(500, f"proxy error: {exc.text}")
    error.headers = (*error.headers, *meter.headers())
    meter.status = error.status
    return error


async def whole_answer(response: Answer, limit: int, lease: LeaseKeeper) -> bytes | None:
    """Read an answer framed by a Content-Length of at most ``limit`` bytes whole; None for
    one that streams (chunked, until close, or bigger).

    Such an answer goes out with the child's framing: a client sees its Content-Length, and a
    child that breaks off before the end is a 500 ``proxy error`` instead of a short body that
    looks complete. It costs no time: llama-server sends such an answer only once it has it all.
    """
    expected = content_length(response)
    if expected is None or expected > limit or response.status == 404:
        return None
    chunks = []
    async for chunk in response.chunks():
        lease.progress()
        chunks.append(chunk)
    return b"".join(chunks)  # chunks() raised if the child sent fewer bytes than announced


async def send_whole(request: Request, response: Answer, body: bytes, meter: Meter) -> None:
    if request.event_stream:  # the head went out while it waited (queue comments)
        await request.end(in_stream(response.status, body))
        return
    headers = response_headers(response)
    headers.extend(meter.headers())
    headers.append((b"content-length", str(len(body)).encode()))
    await request.start(response.status, headers)
    await request.end(body)


async def stream_back(
    api: ApiContext,
    request: Request,
    response: Answer,
    grant: Grant,
    lease: LeaseKeeper,
    meter: Meter,
) -> None:
    """Relay the child's status, headers and body chunks as they arrive (§8.13), each chunk
    from the callback that parsed it (pump.py).

    When the child gave a ``Content-Length``, the chunk that completes the body goes out with
    the end of the response: one message to the server for the last part instead of two.
    """
    if request.event_stream and (response.status != 200 or not is_event_stream(response)):
        chunks = [chunk async for chunk in response.chunks()]  # an error: small
        await request.end(in_stream(response.status, b"".join(chunks)))
        return
    if response.status == 404:  # the generic body replaces the child's (§9.3a keep)
        await request.respond(404, b"", headers=tuple(meter.headers()))
        return
    if not request.event_stream:  # else the head went out while it waited (queue comments)
        headers = response_headers(response)
        headers.extend(meter.headers())
        await request.start(response.status, headers)
    pump = Pump(request, response, lease, meter, content_length(response))
    try:
        last = await pump.run()
    except UpstreamError as exc:  # the child died mid-response: the stream just ends (§3.6)
        log.warning("child on port %s broke off a response: %s", grant.port, exc.text)
        why = await why_ended(api, grant)
        last = b""
        if why is not None and is_event_stream(response):
            last = data_event(dumps(why.body()))  # SSE clients read the error
    await request.end(last)


async def why_ended(api: ApiContext, grant: Grant) -> RouterError | None:
    """Why the child's answer broke off, if we know: the router ended it (it killed the child
    as hung, or it is shutting down), or this server is stopping (team mode's web side closes
    its connections to the children once its shutdown grace is over)."""
    why = await grant.why_ended()
    if why is None and api.stopping:
        why = unavailable("server is shutting down")
    return why


def in_stream(status: int, body: bytes) -> bytes:
    """A whole answer of the child's for a stream whose head went out early: one ``data:``
    event — its body, compact, or for an error (status >= 400) the error in its shape (the
    child's when it has one, the generic one for 404)."""
    if status == 404:
        return data_event(NOT_FOUND)
    try:
        value = jsonbody.parse(body)
    except ApiError:
        value = None
    if status < 400:
        return data_event(dumps(value) if value is not None else b" ".join(body.splitlines()))
    if isinstance(value, dict) and isinstance(value.get("error"), dict):
        return data_event(dumps(value))
    return data_event(encoded_error(status, body.decode("utf-8", "replace")))


def is_event_stream(response: Answer) -> bool:
    return (response.header("content-type") or "").startswith("text/event-stream")


def content_length(response: Answer) -> int | None:
    """The body's length if the child framed it so (not chunked, not until close)."""
    if response.has_header("transfer-encoding"):
        return None
    value = response.header("content-length")
    return int(value) if value is not None and value.isdigit() else None


def upstream_target(request: Request) -> str:
    scope = request.scope
    path: bytes = scope.get("raw_path") or scope["path"].encode()
    query: bytes = scope.get("query_string", b"")
    return (path + b"?" + query if query else path).decode("latin-1")


def upstream_headers(request: Request) -> list[tuple[bytes, bytes]]:
    headers = [(k, v) for k, v in request.headers.items() if k not in _DROP_REQUEST]
    headers.append((b"x-request-id", request.request_id.encode()))
    return headers


def response_headers(response: Answer) -> list[tuple[bytes, bytes]]:
    """The child's headers less the dropped ones (§8.13), plus ``X-Accel-Buffering: no`` unless
    the child sent it already (llama-server does on its streams)."""
    headers = []
    buffering = False
    for name, value in response.raw_headers:
        name = name.lower()
        if name not in _DROP_RESPONSE and not name.startswith(b"access-control-"):
            headers.append((name, value))
            buffering = buffering or name == b"x-accel-buffering"
    if not buffering:
        headers.append((b"x-accel-buffering", b"no"))
    return headers
