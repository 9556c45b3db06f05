"""Speak the router's child protocol (ROUTER_SPEC §4): write state lines to the reserved stdout.

The exit command is read from stdin by ``SimServer``; with ``LLAMA_SERVER_ROUTER_PORT`` unset
the reporter writes nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TextIO

from routerpanel.router.simserver.common import JSON, compact

ROUTER_PORT_ENV = "LLAMA_SERVER_ROUTER_PORT"
STATE_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = b"cmd_router_to_child:exit"


class Reporter:
    """Write child-protocol state lines (ROUTER_SPEC §4.B) to the reserved stdout, or nowhere."""

    def __init__(self, out: TextIO | None) -> None:
        self._out = out
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> Reporter:
        """Reserve stdout for state lines when started by a router, as llama-server does."""
        if ROUTER_PORT_ENV not in os.environ:
            return cls(None)
        sys.stdout.flush()
        reserved = os.dup(1)  # not inherited (PEP 446), like llama.cpp's F_DUPFD_CLOEXEC
        os.dup2(2, 1)  # from now on anything printed to stdout lands on stderr
        return cls(os.fdopen(reserved, "w", encoding="utf-8", errors="replace"))

    @property
    def is_child(self) -> bool:
        return self._out is not None

    def send(self, state: str, payload: JSON) -> None:
        """Write one compact, flushed ``cmd_child_to_router:state:{...}`` line."""
        if self._out is None:
            return
        line = STATE_PREFIX + compact({"state": state, "payload": payload}) + "\n"
        with self._lock:
            try:
                self._out.write(line)
                self._out.flush()
            except OSError:  # the router is gone; stdin EOF will end us
                pass

    def progress(self, value: float) -> None:
        """Send one ``loading`` line for the text model."""
        payload = {"stages": ["text_model"], "current": "text_model", "value": value}
        self.send("loading", payload)
