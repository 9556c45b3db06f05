"""The preset form as the browser posts it, for the panel's preset tests."""

from __future__ import annotations

from typing import Any


def form(args: list[tuple[str, str]] = (), env: list[tuple[str, str]] = (), **fields: Any) -> dict:
    """A preset form body as the browser posts it: fields plus two row formsets."""
    body: dict[str, Any] = {
        "name": "org/tiny:Q8_0", "aliases_text": "", "model_path": "/models/tiny.gguf",
        "enabled": "on", "stop_timeout": "", "load_on_startup": "", "pinned": "", "ttl": "",
        "load_timeout": "", "memory": "", "server_bin": "",
    }  # fmt: skip
    for prefix, rows in (("args", list(args)), ("env", list(env))):
        rows = [*rows, ("", "")]
        body |= {
            f"{prefix}-TOTAL_FORMS": str(len(rows)),
            f"{prefix}-INITIAL_FORMS": "0",
            f"{prefix}-MIN_NUM_FORMS": "0",
            f"{prefix}-MAX_NUM_FORMS": "1000",
        }
        for n, (key, value) in enumerate(rows):
            body |= {f"{prefix}-{n}-key": key, f"{prefix}-{n}-value": value}
    return body | fields
