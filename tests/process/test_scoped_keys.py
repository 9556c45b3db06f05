"""Scoped keys through a real ``manage.py serve`` with simulated children (issue 17.1).

A key made with ``manage.py create_api_key --models --max-concurrent --priority`` while serve
runs (serve re-reads the key table on an unknown key): it lists and uses only its models (an
alias counts as its preset's name), gets 403 outside them and 429 with Retry-After over its
limit, and a client that leaves mid-stream gives its slot back.
"""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support.ports import free_port
from tests.support.scoped_keys import chat, create_key
from tests.support.serving import run_manage, sim_preset, wait_until


def test_a_scoped_key_is_held_to_its_models_and_its_concurrency(tmp_path: Path) -> None:
    marker = f"scoped-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    qwen = sim_preset("qwen-7b", marker, token_ms=100, extra="alias = fast\n")
    ini.write_text(qwen + sim_preset("llama-3", marker))
    args = ["serve", "--models-preset", str(ini), "--models-max", "2"]
    with run_manage(args, tmp_path / "data", port=free_port()) as server:
        secret = create_key(server, "ci", "--models", "qwen*", "--max-concurrent", "1")
        headers = {"authorization": f"Bearer {secret}"}
        client = server.client(headers=headers)

        listing = client.get("/v1/models")
        assert listing.status_code == 200, listing.text
        assert [m["id"] for m in listing.json()["data"]] == ["qwen-7b"]
        assert [m["id"] for m in server.client().get("/models").json()["data"]] == [
            "llama-3",
            "qwen-7b",
        ]  # without the key (keys are not required): everything

        outside = client.post("/v1/chat/completions", json=chat("llama-3"))
        assert outside.status_code == 403
        assert outside.json()["error"] == {
            "code": 403,
            "message": "API key key:admin/ci may not use model 'llama-3' (allowed: qwen*)",
            "type": "permission_error",
        }
        by_alias = client.post("/v1/chat/completions", json=chat("fast"))
        assert by_alias.status_code == 200, by_alias.text

        streaming = threading.Event()
        leave = threading.Event()

        def long_stream() -> None:
            with client.stream("POST", "/v1/chat/completions", json=chat("qwen-7b", 80, True)) as r:
                assert r.status_code == 200
                for _ in r.iter_raw():
                    streaming.set()
                    if leave.is_set():
                        return  # leaves mid-stream: the connection closes

        first = threading.Thread(target=long_stream)
        first.start()
        assert streaming.wait(60)
        over = server.client(headers=headers).post("/v1/chat/completions", json=chat("fast"))
        assert over.status_code == 429, over.text
        assert over.headers["retry-after"] == "1"
        assert over.json()["error"]["code"] == 429
        leave.set()
        first.join(60)

        def admitted() -> bool:
            return (
                client.post("/tokenize", json={"model": "qwen-7b", "content": "x"}).status_code
                == 200
            )

        wait_until(admitted, 30, "the key's slot to come back after the client left")
