"""Daphne's server for ``serve``, minus Twisted's parsing of POST bodies.

Imported only when ``serve`` runs: importing ``daphne.server`` installs Twisted's asyncio reactor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from daphne.server import Server
from twisted.python.failure import Failure
from twisted.web import http


class RouterPanelServer(Server):  # type: ignore[misc]
    """Daphne's ``Server`` with Twisted's POST form parsing turned off for every request.

    For each POST with a body, Twisted parses the Content-Type with the ``email`` package (about
    75 µs) and a multipart or URL-encoded body into ``request.args`` — which Daphne never reads:
    it hands ASGI the raw body. Daphne builds its ``WebRequest`` itself, without Twisted's
    ``parsePOSTFormSubmission`` argument, but it reports each new request here before any byte
    of its body has been read, so the flag the argument would set is set here instead.
    """

    def protocol_connected(self, protocol: Any) -> None:
        if isinstance(protocol, http.Request):
            protocol._parsePOSTFormSubmission = False
        super().protocol_connected(protocol)

    # ``serve`` prints its URL once every endpoint listens, and reports a failed listen itself
    # (one line and a non-zero exit) instead of Daphne's CRITICAL log line and a clean exit.
    on_listening: Callable[[], None] | None = None
    listen_failure: BaseException | None = None

    def listen_success(self, port: Any) -> None:
        super().listen_success(port)
        if len(self.listening_addresses) == len(self.endpoints) and self.on_listening:
            self.on_listening()

    def listen_error(self, failure: Failure) -> None:
        self.listen_failure = failure.value
        self.stop()
