"""Turn completion request bodies into plans and finished runs, and shape them as llama-server
does: native /completion, OpenAI text and chat, whole bodies and SSE stream events.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from routerpanel.router.simserver.common import BUILD_INFO, JSON, ApiError, compact
from routerpanel.router.simserver.tokens import detokenize, tokenize

PROMPT_MS_PER_TOKEN = 0.05
GENERATION_SETTINGS: JSON = {
    "seed": 4294967295,
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "max_tokens": -1,
    "n_predict": -1,
    "stream": False,
}


class Style(Enum):
    NATIVE = "native"  # /completion: llama.cpp's own shape, streams end without [DONE]
    TEXT = "text"  # /v1/completions
    CHAT = "chat"  # /v1/chat/completions


@dataclass(frozen=True)
class Plan:
    """What one completion request will produce, decided before generating."""

    style: Style
    stream: bool
    prompt: str
    prompt_n: int
    n_predict: int  # tokens to generate
    limited: bool  # stopped by the request's n_predict rather than by the simulated EOS
    include_usage: bool
    id: str
    created: int
    model: str


@dataclass(frozen=True)
class Run:
    """One finished generation."""

    plan: Plan
    slot: int
    text: str
    n_generated: int
    predicted_ms: float

    @property
    def finish_reason(self) -> str:
        return "length" if self.plan.limited else "stop"

    def usage(self) -> JSON:
        prompt_n, n = self.plan.prompt_n, self.n_generated
        return {
            "completion_tokens": n,
            "prompt_tokens": prompt_n,
            "total_tokens": n + prompt_n,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    def timings(self) -> JSON:
        prompt_n, prompt_ms = self.plan.prompt_n, self.plan.prompt_n * PROMPT_MS_PER_TOKEN
        n, ms = self.n_generated, self.predicted_ms
        return {
            "cache_n": 0,
            "prompt_n": prompt_n,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
            "prompt_per_second": round(1000 * prompt_n / prompt_ms, 3) if prompt_ms else 0.0,
            "predicted_n": n,
            "predicted_ms": round(ms, 3),
            "predicted_per_token_ms": round(ms / n, 3) if n else 0.0,
            "predicted_per_second": round(1000 * n / ms, 3) if ms > 0 else 0.0,
        }


def make_plan(style: Style, body: JSON, model_id: str, sim_tokens: int) -> Plan:
    """Validate a completion request body and decide what it will produce."""
    prompt = chat_prompt(body) if style is Style.CHAT else completion_prompt(body)
    requested = requested_tokens(body)
    options = body.get("stream_options")
    return Plan(
        style=style,
        stream=body.get("stream") is True,
        prompt=prompt,
        prompt_n=len(tokenize(prompt, add_special=True)),
        n_predict=sim_tokens if requested < 0 else min(requested, sim_tokens),
        limited=0 <= requested < sim_tokens,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        id="chatcmpl-" + "".join(random.choices(string.ascii_letters + string.digits, k=32)),
        created=int(time.time()),
        model=model_id,
    )


def requested_tokens(body: JSON) -> int:
    """Return n_predict (or its aliases max_tokens, max_completion_tokens); -1 if absent."""
    for key in ("n_predict", "max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if type(value) is not int or value < -1:
            raise ApiError(400, f'"{key}" must be an integer >= -1')
        return value
    return -1


def completion_prompt(body: JSON) -> str:
    if "prompt" not in body:
        raise ApiError(400, "[json.exception.out_of_range.403] key 'prompt' not found")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(type(t) is int for t in prompt):
        return detokenize(prompt)
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)  # llama.cpp would answer one result per prompt; one is enough here
    raise ApiError(400, '"prompt" must be a string, an array of strings or of token ids')


def chat_prompt(body: JSON) -> str:
    """Render the messages with a simulated template (``<|role|>content`` each)."""
    if "messages" not in body:
        raise ApiError(400, "'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise ApiError(400, "Expected 'messages' to be an array")
    parts = []
    for message in messages:
        if not isinstance(message, dict):
            raise ApiError(400, "Expected 'messages' to be an array of objects")
        parts.append(f"<|{message.get('role', '')}|>{message_text(message.get('content'))}\n")
    return "".join(parts) + "<|assistant|>"


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
    return ""


def _oai_chunk(plan: Plan, obj: str) -> JSON:
    return {
        "created": plan.created,
        "id": plan.id,
        "model": plan.model,
        "system_fingerprint": BUILD_INFO,
        "object": obj,
    }


def chat_chunk(plan: Plan, delta: JSON, finish_reason: str | None = None) -> JSON:
    choice = {"finish_reason": finish_reason, "index": 0, "delta": delta}
    return {"choices": [choice], **_oai_chunk(plan, "chat.completion.chunk")}


def text_result(plan: Plan, text: str, finish_reason: str | None) -> JSON:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    return {
        "choices": [choice],
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": BUILD_INFO,
        "object": "text_completion",
        "id": plan.id,
    }


def partial_events(plan: Plan, slot: int, piece: str, n_decoded: int) -> list[JSON]:
    """Return the stream events for one generated token, in llama-server's shapes."""
    if plan.style is Style.NATIVE:
        return [
            {
                "index": 0,
                "content": piece,
                "tokens": [],
                "stop": False,
                "id_slot": slot,
                "tokens_predicted": n_decoded,
                "tokens_evaluated": plan.prompt_n,
            }
        ]
    if plan.style is Style.TEXT:
        return [text_result(plan, piece, None)]
    first = [chat_chunk(plan, {"role": "assistant", "content": None})] if n_decoded == 1 else []
    return [*first, chat_chunk(plan, {"content": piece})]


def native_result(run: Run, content: str) -> JSON:
    plan = run.plan
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": run.slot,
        "stop": True,
        "model": plan.model,
        "tokens_predicted": run.n_generated,
        "tokens_evaluated": plan.prompt_n,
        "generation_settings": {**GENERATION_SETTINGS, "n_predict": plan.n_predict},
        "prompt": plan.prompt,
        "has_new_line": "\n" in run.text,
        "truncated": False,
        "stop_type": "limit" if plan.limited else "eos",
        "stopping_word": "",
        "tokens_cached": plan.prompt_n + run.n_generated,
        "timings": run.timings(),
    }


def final_events(run: Run) -> list[JSON]:
    """Return the events that close a stream (usage and timings go on the last)."""
    plan = run.plan
    if plan.style is Style.NATIVE:
        return [native_result(run, "")]
    if plan.style is Style.TEXT:
        result = text_result(plan, "", run.finish_reason)
        return [{**result, "usage": run.usage(), "timings": run.timings()}]
    events = [chat_chunk(plan, {}, run.finish_reason)]
    if plan.include_usage:  # OpenAI: the usage chunk has empty choices
        events.append({"choices": [], **_oai_chunk(plan, "chat.completion.chunk")})
        events[-1]["usage"] = run.usage()
    events[-1]["timings"] = run.timings()
    return events


def final_result(run: Run) -> JSON:
    """Return the body of a non-streamed completion."""
    plan = run.plan
    if plan.style is Style.NATIVE:
        return native_result(run, run.text)
    if plan.style is Style.TEXT:
        return {
            **text_result(plan, run.text, run.finish_reason),
            "usage": run.usage(),
            "timings": run.timings(),
        }
    message = {"role": "assistant", "content": run.text}
    choice = {"finish_reason": run.finish_reason, "index": 0, "message": message}
    return {
        "choices": [choice],
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": BUILD_INFO,
        "object": "chat.completion",
        "usage": run.usage(),
        "id": plan.id,
        "timings": run.timings(),
    }


def sse(events: Sequence[JSON]) -> bytes:
    return "".join(f"data: {compact(event)}\n\n" for event in events).encode()
