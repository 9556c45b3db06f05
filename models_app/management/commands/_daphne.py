"""Daphne's server for ``serve``, minus Twisted's parsing of POST bodies.

Imported only when ``serve`` runs: importing ``daphne.server`` installs Twisted's asyncio reactor.
"""

from __future__ import annotations

from typing import Any

from daphne.server import Server
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
