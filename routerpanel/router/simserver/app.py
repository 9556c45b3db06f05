"""Answer requests as llama-server does and run the process lifecycle: the route table, the
handlers, loading, exit requests (signal, exit command, stdin EOF) and simulated crashes.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from functools import partial

from routerpanel.router.simserver.common import BUILD_INFO, JSON, ApiError, hard_exit, log
from routerpanel.router.simserver.completions import (
    GENERATION_SETTINGS,
    Plan,
    Run,
    Style,
    final_events,
    final_result,
    make_plan,
    partial_events,
    sse,
)
from routerpanel.router.simserver.model import MIB, LoadFailed, SimModel, SlotPool
from routerpanel.router.simserver.options import CRASH_EXIT_CODE, SimOptions
from routerpanel.router.simserver.protocol import EXIT_COMMAND, Reporter
from routerpanel.router.simserver.replies import (
    LOADING,
    NOT_FOUND,
    PREFLIGHT,
    UNAUTHORIZED,
    Reply,
    Request,
    json_reply,
)
from routerpanel.router.simserver.stats import Stats
from routerpanel.router.simserver.tokens import (
    BOS_ID,
    EOS_ID,
    N_VOCAB,
    SPECIAL_PIECES,
    detokenize,
    embed,
    embedding_inputs,
    embedding_object,
    piece_json,
    sim_piece,
    token_ids,
    tokenize,
    tokenize_mixed,
)

N_EMBD = 64  # one SHA-512 digest, one byte per dimension
FTYPE = "simulated"
CHAT_TEMPLATE = "{# simulated chat template: <|role|>content per message #}"
PREFILL_STEP_S = 0.05  # --sim-prefill-ms advances the prompt counters in steps this long


PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
# llama-server routes the simulation does not implement: 501 rather than a misleading 404
NOT_SIMULATED = (
    "/infill", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/responses",
    "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/apply-template",
    "/audio/transcriptions", "/v1/audio/transcriptions", "/lora-adapters", "/v1/systemone",
    "/chat/completions/input_tokens", "/v1/chat/completions/input_tokens",
    "/responses/input_tokens", "/v1/responses/input_tokens", "/v1/chat/completions/control",
)  # fmt: skip


@dataclass(frozen=True)
class Route:
    handler: Callable[[Request], Reply]
    wakes: bool = False  # needs the model: waits while it wakes from sleep (ROUTER_SPEC 13.4)
    completion: bool = False  # counts toward --sim-crash-after


class SimServer:
    """The simulated llama-server: routes, completions and the process lifecycle."""

    def __init__(self, opts: SimOptions, reporter: Reporter) -> None:
        self.opts = opts
        self.reporter = reporter
        self.stopping = threading.Event()
        self.model = SimModel(opts, reporter, self.stopping)
        self.slots = SlotPool(opts.parallel if opts.parallel > 0 else 4, opts.ctx_size or 4096)
        self.stats = Stats()
        self._served = 0
        self._served_lock = threading.Lock()
        self._routes = self._build_routes()

    def _build_routes(self) -> dict[tuple[str, str], Route]:
        native, text, chat = (partial(self._complete, s) for s in Style)
        routes = {
            ("GET", "/health"): Route(self._health),
            ("GET", "/v1/health"): Route(self._health),
            ("GET", "/models"): Route(self._models),
            ("GET", "/v1/models"): Route(self._models),
            ("GET", "/props"): Route(self._props),
            ("GET", "/metrics"): Route(self._metrics),
            ("POST", "/props"): Route(self._post_props, wakes=True),
            ("GET", "/slots"): Route(self._slots, wakes=True),
            ("POST", "/tokenize"): Route(self._tokenize, wakes=True),
            ("POST", "/detokenize"): Route(self._detokenize, wakes=True),
            ("POST", "/embedding"): Route(partial(self._embeddings, False), wakes=True),
            ("POST", "/embeddings"): Route(partial(self._embeddings, False), wakes=True),
            ("POST", "/v1/embeddings"): Route(partial(self._embeddings, True), wakes=True),
            ("POST", "/completion"): Route(native, wakes=True, completion=True),
            ("POST", "/completions"): Route(native, wakes=True, completion=True),
            ("POST", "/v1/completions"): Route(text, wakes=True, completion=True),
            ("POST", "/chat/completions"): Route(chat, wakes=True, completion=True),
            ("POST", "/v1/chat/completions"): Route(chat, wakes=True, completion=True),
        }
        for path in NOT_SIMULATED:
            routes[("POST", path)] = Route(self._not_simulated)
        routes[("GET", "/lora-adapters")] = Route(self._not_simulated)
        return routes

    # lifecycle

    def _flood(self) -> None:
        """--sim-flood: write log lines to stderr as fast as the pipe takes them."""
        line = b"simserver flood: " + b"x" * 60 + b"\n"
        block = line * 512
        while not self.stopping.is_set():
            try:
                sys.stderr.buffer.write(block)
                sys.stderr.buffer.flush()
            except (OSError, ValueError):
                return

    def run(self) -> int:
        """Load, announce readiness, then wait for an exit request (main thread)."""
        log.info("loading model '%s' (simulated: nothing is read)", self.opts.model)
        try:
            if not self.model.load():
                return 0  # exit requested while loading
        except LoadFailed as exc:
            log.error("simulated load failure (--sim-fail-load): %s", exc)
            log.error("exiting due to model loading error")
            return 1
        log.info("model loaded: id '%s'", self.opts.model_id)
        self.reporter.send("ready", self.model_info())
        if self.reporter.is_child:
            threading.Thread(target=self._watch_stdin, name="stdin", daemon=True).start()
        if self.opts.flood:
            threading.Thread(target=self._flood, name="flood", daemon=True).start()
        if self.opts.sleep_idle_seconds > 0:
            watcher = partial(self.model.watch_idle, float(self.opts.sleep_idle_seconds))
            threading.Thread(target=watcher, name="idle", daemon=True).start()
        self.stopping.wait()
        log.info("shutting down")
        return 0

    def request_exit(self, reason: str) -> None:
        """Ask the main thread for a graceful exit 0; a second request exits 1 at once (§1.7)."""
        if self.stopping.is_set():
            log.error("Received second interrupt, terminating immediately.")
            hard_exit(1)
        log.info("%s, exiting gracefully", reason)
        self.stopping.set()

    def _watch_stdin(self) -> None:
        """Exit on the router's exit command; exit 1 at once on EOF (ROUTER_SPEC 4.12)."""
        for line in sys.stdin.buffer:
            if EXIT_COMMAND in line:
                self.request_exit("exit command received")
                return
        log.info("EOF on stdin detected, forcing shutdown...")
        hard_exit(1)

    def _count_completion(self) -> None:
        with self._served_lock:
            self._served += 1
            served = self._served
        if self.opts.crash_after and served >= self.opts.crash_after:
            log.error("simulated crash after %d completion requests (--sim-crash-after)", served)
            hard_exit(CRASH_EXIT_CODE)

    # dispatch

    def respond(self, request: Request, send: Callable[[Reply], None]) -> None:
        """Answer one request in llama-server's order: preflight, loading, API key, route."""
        route = self._routes.get((request.method, request.path))
        if request.method == "OPTIONS":
            send(PREFLIGHT)
        elif not self.model.loaded:
            send(LOADING)
        elif not self._authorized(request):
            send(UNAUTHORIZED)
        elif route is None:
            send(NOT_FOUND)
        elif not route.wakes:
            send(self._call(route, request))
        else:
            with self.model.busy():
                reply = self._call(route, request)
                send(reply)
            if route.completion and reply.status == 200:
                self._count_completion()

    def _authorized(self, request: Request) -> bool:
        if not self.opts.api_keys or request.path in PUBLIC_PATHS:
            return True
        key = request.headers.get("authorization") or request.headers.get("x-api-key", "")
        return key.removeprefix("Bearer ") in self.opts.api_keys

    def _call(self, route: Route, request: Request) -> Reply:
        try:
            return route.handler(request)
        except ApiError as exc:
            return json_reply(exc.to_json(), exc.code)
        except Exception as exc:  # llama.cpp's ex_wrapper: anything else is a 500
            log.exception("handler failed")
            return json_reply(ApiError(500, str(exc)).to_json(), 500)

    # routes

    def model_info(self) -> JSON:
        """Return the /v1/models entry, also the payload of the first ``ready`` line."""
        size = self.opts.rss_mb * MIB
        n_ctx = self.opts.ctx_size or 4096
        return {
            "id": self.opts.model_id,
            "aliases": list(self.opts.aliases),
            "tags": list(self.opts.tags),
            "object": "model",
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "created": int(time.time()),
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": 2,
                "n_vocab": N_VOCAB,
                "n_ctx": n_ctx,
                "n_ctx_train": n_ctx,
                "n_embd": N_EMBD,
                "n_params": size * 2,  # as if 4 bits per parameter
                "size": size,
                "ftype": FTYPE,
            },
        }

    def _health(self, request: Request) -> Reply:
        return json_reply({"status": "ok"})

    def _models(self, request: Request) -> Reply:
        model_id = self.opts.model_id
        ollama = {
            "name": model_id,
            "model": model_id,
            "modified_at": "",
            "size": "",
            "digest": "",
            "type": "model",
            "description": "",
            "tags": [""],
            "capabilities": ["completion"],
            "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }  # fmt: skip
        return json_reply({"models": [ollama], "object": "list", "data": [self.model_info()]})

    def _props(self, request: Request) -> Reply:
        o = self.opts
        return json_reply(
            {
                "default_generation_settings": {
                    "params": GENERATION_SETTINGS,
                    "n_ctx": o.ctx_size or 4096,
                },
                "total_slots": self.slots.count,
                "model_alias": o.model_id,
                "model_ftype": FTYPE,
                "model_path": o.model,
                "modalities": {"vision": False, "video": False, "audio": False},
                "media_marker": "<__media__>",
                "endpoint_slots": o.slots,
                "endpoint_props": o.props,
                "endpoint_metrics": o.metrics,
                "ui": False,
                "ui_settings": {},
                "chat_template": CHAT_TEMPLATE,
                "chat_template_caps": {},
                "bos_token": SPECIAL_PIECES[BOS_ID],
                "eos_token": SPECIAL_PIECES[EOS_ID],
                "build_info": BUILD_INFO,
                "is_sleeping": self.model.sleeping,
                "cors_proxy_enabled": False,
            }
        )

    def _post_props(self, request: Request) -> Reply:
        if not self.opts.props:
            raise ApiError(
                501,
                "This server does not support changing global properties. Start it with `--props`",
            )
        request.json()
        return json_reply({"success": True})

    def _metrics(self, request: Request) -> Reply:
        if not self.opts.metrics:
            raise ApiError(
                501, "This server does not support metrics endpoint. Start it with `--metrics`"
            )
        text = self.stats.render(*self.slots.counts())
        start = ("Process-Start-Time-Unix", str(self.stats.started))
        return Reply(200, text.encode(), "text/plain; version=0.0.4", (start,))

    def _slots(self, request: Request) -> Reply:
        if not self.opts.slots:
            raise ApiError(
                501, "This server does not support slots endpoint. Start it with `--slots`"
            )
        slots = self.slots.to_json()
        if request.query.get("fail_on_no_slot") and all(s["is_processing"] for s in slots):
            raise ApiError(503, "no slot available")
        return json_reply(slots)

    def _tokenize(self, request: Request) -> Reply:
        body = request.json()
        if "content" not in body:
            return json_reply({"tokens": []})
        tokens = tokenize_mixed(body["content"], body.get("add_special") is True)
        if body.get("with_pieces") is True:
            return json_reply({"tokens": [{"id": t, "piece": piece_json(t)} for t in tokens]})
        return json_reply({"tokens": tokens})

    def _detokenize(self, request: Request) -> Reply:
        body = request.json()
        tokens = token_ids(body["tokens"]) if "tokens" in body else []
        return json_reply({"content": detokenize(tokens)})

    def _embeddings(self, oai: bool, request: Request) -> Reply:
        if not self.opts.embeddings:
            raise ApiError(
                501, "This server does not support embeddings. Start it with `--embeddings`"
            )
        body = request.json()
        if "input" in body:
            texts = embedding_inputs(body["input"])
        elif "content" in body:
            oai, texts = (
                False,
                embedding_inputs(body["content"]),
            )  # "content" is not OAI (llama.cpp)
        else:
            raise ApiError(400, '"input" or "content" must be provided')
        if not oai:
            return json_reply([{"index": i, "embedding": [embed(t)]} for i, t in enumerate(texts)])
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise ApiError(
                400, "The format to return the embeddings in. Can be either float or base64"
            )
        data = [embedding_object(i, embed(t), encoding == "base64") for i, t in enumerate(texts)]
        n_tokens = sum(len(tokenize(t, add_special=True)) for t in texts)
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        model = body.get("model", self.opts.model_id)
        return json_reply({"model": model, "object": "list", "usage": usage, "data": data})

    def _not_simulated(self, request: Request) -> Reply:
        raise ApiError(501, f"{request.method} {request.path} is not simulated by simserver")

    def _complete(self, style: Style, request: Request) -> Reply:
        plan = make_plan(style, request.json(), self.opts.model_id, self.opts.tokens)
        if plan.stream:
            return Reply(200, content_type="text/event-stream", chunks=self._stream(plan))
        with self.slots.hold(plan.prompt_n) as slot:
            started = time.monotonic()
            pieces = list(self._generate(plan, slot))
            run = Run(plan, slot, "".join(pieces), len(pieces), (time.monotonic() - started) * 1000)
        self.stats.record(run)
        return json_reply(final_result(run))

    def _stream(self, plan: Plan) -> Generator[bytes, None, None]:
        """Yield SSE events as tokens come; a slot is held only once the stream is consumed."""
        with self.slots.hold(plan.prompt_n) as slot:
            started = time.monotonic()
            pieces: list[str] = []
            for piece in self._generate(plan, slot):
                pieces.append(piece)
                yield sse(partial_events(plan, slot, piece, len(pieces)))
            run = Run(plan, slot, "".join(pieces), len(pieces), (time.monotonic() - started) * 1000)
        self.stats.record(run)
        yield sse(final_events(run))
        if plan.style is not Style.NATIVE:
            yield b"data: [DONE]\n\n"

    def _generate(self, plan: Plan, slot: int) -> Iterator[str]:
        """Process the prompt (--sim-prefill-ms, counters moving, nothing sent), then yield the
        simulated tokens, one per --sim-token-ms; stop early on shutdown."""
        if not self._prefill(plan, slot):
            return
        for index in range(plan.n_predict):
            if self.stopping.wait(self.opts.token_ms / 1000):
                return
            self.slots.decoded(slot)
            yield sim_piece(plan.model, index)

    def _prefill(self, plan: Plan, slot: int) -> bool:
        total = self.opts.prefill_ms / 1000
        steps = max(1, int(total / PREFILL_STEP_S))
        self.slots.prompt_processed(slot, 0)
        for step in range(1, steps + 1):
            if total and self.stopping.wait(total / steps):
                return False
            self.slots.prompt_processed(slot, max(1, plan.prompt_n * step // steps))
        return True
