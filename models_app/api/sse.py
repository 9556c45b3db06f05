"""``GET /models/sse``: the router's events as llama.cpp's server-sent events (ROUTER_SPEC §10).

Each event is one ``data: {"model", "event"[, "data"]}`` line and a blank line. As in llama.cpp
no event is sent on connect (no snapshot: clients read ``GET /models``), and a subscriber sees
only events that happen after its stream opened (§10.2). The response headers go out at once,
though, so a client of an idle router can tell a live stream from a dead server (the server
writes them only with the first body bytes, so an empty body chunk pushes them out). Unlike
llama.cpp, a comment line (``: keep-alive``) goes out whenever nothing else has for
``sse_keepalive`` seconds, so that proxies in front of us do not close an idle stream; SSE
parsers ignore comments. The stream ends when the client disconnects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from models_app.api.errors import dumps
from models_app.api.request import Request
from routerpanel.router.catalogue import Event
from routerpanel.router.states import DOWN, FAILED_STATES, ModelState, api_status

if TYPE_CHECKING:
    from models_app.api.context import ApiContext

log = logging.getLogger(__name__)

KEEP_ALIVE = b": keep-alive\n\n"
END = b""  # put on a stream's queue: the stream ends (the pump's last item, Api.end_streams)
# Enough loop turns for the pump task to join the events group on the in-memory layer before
# the stream opens (§10.2); on Redis the first few milliseconds of events may be missed.
_SUBSCRIBE_YIELDS = 3
_DOWN = frozenset(state.value for state in DOWN)
_FAILED = frozenset(state.value for state in FAILED_STATES)


def data_event(payload: bytes) -> bytes:
    """One ``data:`` event (``payload``: compact JSON, one line). An error in a stream that has
    started is one such event of the error body, ``{"error": {...}}``: OpenAI's and llama.cpp's
    clients read it as the stream's error."""
    return b"data: " + payload + b"\n\n"


def llama_status(state: str | None) -> str | None:
    try:
        return api_status(ModelState(state)) if state else None
    except ValueError:
        return None


class LlamaEvents:
    """Translate router events into llama.cpp's SSE events, for one subscriber (§10.5).

    * ``model.state`` that spawns a child (a down state → ``loading``): ``model_status
      {"status": "loading"}``;
    * any other ``model.state`` that changes llama.cpp's status, or a loading progress update:
      ``status_change {"status"[, "exit_code"][, "info"][, "progress"]}``; changes only llama.cpp
      cannot see (the stopping flag, failed → unloaded) send nothing;
    * ``model.progress`` (a loading child's progress line): ``status_change {"status":
      "loading", "progress": ...}``;
    * ``presets.reloaded``: ``{"model": "*", "event": "models_reload"}``.

    The exit code comes from the event, else from the ``model.exited`` event just before it.
    """

    def __init__(self) -> None:
        self._exit_codes: dict[str, int] = {}

    def translate(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        data = event.get("data") or {}
        if kind == Event.PRESETS_RELOADED:
            return [{"model": "*", "event": "models_reload"}]
        if kind == Event.MODEL_EXITED:
            code = data.get("exit_code")
            if not isinstance(code, int) and data.get("signal"):
                code = 1  # llama.cpp reports any signal death, a force kill too, as 1 (§3.5)
            if isinstance(code, int):
                self._exit_codes[data["model"]] = code
        if kind == Event.MODEL_PROGRESS:
            progress = {"status": "loading", "progress": data.get("progress")}
            return [{"model": data.get("model"), "event": "status_change", "data": progress}]
        if kind != Event.MODEL_STATE:
            return []
        change = self._change(data)
        return [] if change is None else [change]

    def _change(self, data: Mapping[str, Any]) -> dict[str, Any] | None:
        model, frm, to = data.get("model"), data.get("from"), data.get("to")
        before = llama_status(frm)
        status = data.get("status") or llama_status(to)
        if status == "loading" and frm in _DOWN:
            return {"model": model, "event": "model_status", "data": {"status": "loading"}}
        payload: dict[str, Any] = {"status": status}
        progress = data.get("progress")
        if status == "unloaded":
            if before == "unloaded":
                return None
            payload["exit_code"] = self._exit_code(data)
        elif status == before and not (status == "loading" and progress is not None):
            return None
        if status == "loaded" and data.get("info"):
            payload["info"] = data["info"]
        if status == "loading" and progress is not None:
            payload["progress"] = progress
        return {"model": model, "event": "status_change", "data": payload}

    def _exit_code(self, data: Mapping[str, Any]) -> int:
        model = data.get("model")
        code = data.get("exit_code")
        remembered = self._exit_codes.pop(model, None) if isinstance(model, str) else None
        if isinstance(code, int):
            return code
        if remembered is not None:
            return remembered
        return 1 if data.get("failed") or data.get("to") in _FAILED else 0


async def stream_events(api: ApiContext, request: Request) -> None:
    """Stream llama.cpp's model events until the client disconnects."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    api.event_streams.add(queue)  # Api.end_streams ends it when the server stops
    pumping = asyncio.ensure_future(_pump(api, queue, request))
    for _ in range(_SUBSCRIBE_YIELDS):
        await asyncio.sleep(0)
    request.watch_disconnect()
    try:
        await request.start(
            200,
            [
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
            ],
        )
        await request.write(b"")  # the headers, now: not with the first event
        while True:
            try:
                chunk = await asyncio.wait_for(queue.get(), api.config.sse_keepalive)
            except TimeoutError:
                chunk = KEEP_ALIVE
            if chunk == END:
                break
            await request.write(chunk)
        await request.end()
    finally:
        api.event_streams.discard(queue)
        pumping.cancel()


async def _pump(api: ApiContext, queue: asyncio.Queue[bytes], request: Request) -> None:
    translator = LlamaEvents()
    try:
        async for event in api.router.events():
            for item in translator.translate(event):
                model = item["model"]
                if model == "*" or api.gate.allows(request.caller, model):  # a key's scope
                    queue.put_nowait(b"data: " + dumps(item) + b"\n\n")
    except Exception:
        log.warning("router event stream failed; closing an SSE stream", exc_info=True)
    queue.put_nowait(END)
