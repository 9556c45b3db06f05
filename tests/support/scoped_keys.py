"""Scoped API keys against a served process: make one with ``manage.py create_api_key``, and
the chat body the process tier sends with it."""

from __future__ import annotations

from tests.support.serving import Server, manage_beside


def create_key(server: Server, *args: str) -> str:
    return manage_beside(server, "create_api_key", "admin", *args).strip()


def chat(model: str, tokens: int = 2, stream: bool = False) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": model, "messages": messages, "max_tokens": tokens, "stream": stream}
