"""What a route handler may use of the API application (app.Api): the router, the key gate, the
configuration, usage, the upstream clients, the open event streams and the request ids. Handlers
are typed against this, so they import nothing of app.py, which imports them for its route table.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from models_app.accounts import usage
    from models_app.api import auth, scopes
    from models_app.api.config import ApiConfig
    from models_app.api.request import Request
    from models_app.api.upstream import Upstreams
    from models_app.routing.client import RouterClient


class ApiContext(Protocol):
    router: RouterClient
    ready_client: RouterClient  # the same router, with a short first-answer deadline (/ready)
    keys: auth.KeyStore
    gate: scopes.Gate
    config: ApiConfig
    usage: usage.UsageRecorder
    upstreams: Upstreams
    event_streams: set[asyncio.Queue[bytes]]  # the open /models/sse streams
    stopping: bool  # the server is stopping: new proxied requests are refused

    def claim_request_id(self, request_id: str) -> str: ...
    def release_request_id(self, request_id: str) -> None: ...
    def refuse_foreign_origin(self, request: Request) -> None: ...
