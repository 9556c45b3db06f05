"""An unmodified OpenAI SDK chats through ``serve --demo`` (issue: "an OpenAI client can chat")."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.support.ports import free_port
from tests.support.serving import run_manage

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too


def test_the_openai_sdk_lists_models_and_chats_streamed_and_not(tmp_path: Path) -> None:
    with run_manage(["serve", "--demo", "--models-max", "2"], tmp_path, port=free_port()) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        ids = sorted(model.id for model in client.models.list())
        assert ids == ["demo-large", "demo-medium", "demo-small"]

        reply = client.chat.completions.create(
            model="demo-small", messages=[{"role": "user", "content": "hello"}], max_tokens=6
        )
        assert reply.choices[0].message.content
        assert "simulated" in reply.choices[0].message.content
        assert reply.usage is not None and reply.usage.completion_tokens == 6

        pieces = [
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model="demo-small",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=5,
                stream=True,
            )
            if chunk.choices
        ]
        assert len([p for p in pieces if p]) == 5

        try:
            client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "x"}]
            )
        except openai.BadRequestError as exc:
            assert exc.status_code == 400
            assert "model 'no-such-model' not found" in str(exc)
        else:
            raise AssertionError("an unknown model must be a 400")
