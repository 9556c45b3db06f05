"""Twisted's reactor on uvloop, for ``manage.py serve`` under Daphne.

Daphne runs on Twisted's asyncio reactor, which it installs on a new stock asyncio loop the first
time ``daphne.server`` is imported — at Django's setup, ``daphne`` being an installed app. When
the command is ``serve`` with Daphne, ``manage.py`` installs that reactor first, on a uvloop
loop: Daphne keeps a reactor it finds installed, so it serves, and the router beside it runs,
on the loop ``serve --http uvicorn`` uses, for less CPU per streamed token and per request
(bench/README.md, "Daphne on uvloop").

``serve`` leaves Twisted's signal handling off and handles SIGINT and SIGTERM through the loop
(``serve._run_daphne``), under either loop: the SIGCHLD handler Twisted would add is for
processes Twisted spawns, and the router's children are the loop's (on uvloop, libuv's).

``ROUTERPANEL_DAPHNE_LOOP=asyncio`` keeps the stock loop (to compare, or to rule uvloop out).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence


def serves_with_daphne(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether ``manage.py`` with ``argv`` runs ``serve`` on Daphne on uvloop."""
    if argv[1:2] != ["serve"] or environ.get("ROUTERPANEL_DAPHNE_LOOP") == "asyncio":
        return False
    http = environ.get("ROUTERPANEL_HTTP") or "daphne"
    for index, arg in enumerate(argv):
        if arg == "--http" and index + 1 < len(argv):
            http = argv[index + 1]
        elif arg.startswith("--http="):
            http = arg.split("=", 1)[1]
    return http == "daphne"


def install_uvloop_reactor() -> None:
    """Install Twisted's asyncio reactor on a uvloop loop; before anything imports a reactor."""
    if "twisted.internet.reactor" in sys.modules:
        return  # too late: the first reactor stays (Daphne's, on the stock loop)
    import uvloop
    from twisted.internet import asyncioreactor

    asyncioreactor.install(uvloop.new_event_loop())  # type: ignore[no-untyped-call]


def prepare(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Called by ``manage.py`` before Django's setup."""
    if serves_with_daphne(argv, environ):
        install_uvloop_reactor()
