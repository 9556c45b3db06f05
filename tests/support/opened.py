"""The version a panel form carries as a page opens it (``models_app/edits.py``), read from the
page the way a browser gets it, for tests that post forms."""

from __future__ import annotations

import html
import re
from typing import Any

_HIDDEN = re.compile(r'<input type="hidden" name="([^"]*seen_version)" value="([^"]*)"')


def versions(client: Any, url: str) -> dict[str, str]:
    """Every ``seen_version`` field on the page at ``url``: {field name: value}."""
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    found = {
        name: html.unescape(value) for name, value in _HIDDEN.findall(response.content.decode())
    }
    assert found, f"no form on {url} carries a version"
    return found


def opened(client: Any, url: str, prefix: str = "") -> dict[str, str]:
    """The one version field named ``{prefix}seen_version`` on the page at ``url``."""
    name = f"{prefix}seen_version"
    return {name: versions(client, url)[name]}
