"""The configuration reference (docs/configuration.md) names every flag and every variable the
code defines, so the page cannot fall behind the code.

Flags are read from the parsers themselves: ``serve`` and ``runrouter`` as ``manage.py`` builds
them (the router's shared flags come from ``models_app.runtime.add_router_arguments``), less
Django's own options and the hidden ones. Variables are the ``ROUTERPANEL_*`` and ``LLAMA_*``
names that the code under ``routerpanel/`` and ``models_app/`` reads from the environment.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from django.core.management import load_command_class
from django.core.management.base import BaseCommand

from models_app.runtime import add_router_arguments

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"
DJANGO_OWN = {action.dest for action in BaseCommand().create_parser("manage.py", "x")._actions}
# A read of a variable: envstr("X", …), envint(…), os.environ.get("X"), os.environ["X"], …
READ = re.compile(r"(?:\benv\w*|\bgetenv|environ\.get)\(\s*\"((?:ROUTERPANEL|LLAMA)_\w+)\"|"
                  r"environ\[\s*\"((?:ROUTERPANEL|LLAMA)_\w+)\"\s*\]")  # fmt: skip
# The simulated llama-server is a child, not the router: its variables are llama-server's.
NOT_THE_ROUTERS = ("routerpanel/router/simserver/",)


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        if action.dest not in DJANGO_OWN and action.help != argparse.SUPPRESS
        for option in action.option_strings
        if option.startswith("--")
    }


def command_flags(name: str) -> set[str]:
    return flags(load_command_class("models_app", name).create_parser("manage.py", name))


def variables() -> set[str]:
    found: set[str] = set()
    for folder in ("routerpanel", "models_app"):
        for path in (REPO / folder).rglob("*.py"):
            if path.relative_to(REPO).as_posix().startswith(NOT_THE_ROUTERS):
                continue
            found |= {a or b for a, b in READ.findall(path.read_text())}
    return found


def documented(name: str) -> bool:
    # A flag or variable is documented when the page shows it in code: `--flag`, `--flag N`,
    # `NAME`, `NAME=0`.
    return re.search(rf"`{re.escape(name)}(?:[ =`])", PAGE.read_text()) is not None


def test_the_parsers_are_read_whole() -> None:
    router = argparse.ArgumentParser()
    add_router_arguments(router)
    shared = flags(router)
    assert {"--models-preset", "--models-max", "--server-bin", "--queue-policy"} <= shared
    assert shared <= command_flags("serve") and shared <= command_flags("runrouter")
    assert {"--host", "--no-router", "--http"} <= command_flags("serve")
    assert {"--node", "--advertise", "--child-keys"} <= command_flags("runrouter")
    assert "--demo-if-empty" not in command_flags("serve")  # hidden: make run's own


def test_every_flag_of_serve_and_runrouter_is_on_the_configuration_page() -> None:
    missing = sorted(
        f for f in command_flags("serve") | command_flags("runrouter") if not documented(f)
    )
    assert not missing, f"docs/configuration.md does not document {missing}"


def test_the_variables_are_found() -> None:
    found = variables()
    assert {"ROUTERPANEL_DATA_DIR", "ROUTERPANEL_ROUTER_LOOP", "LLAMA_ARG_MODELS_MAX"} <= found
    assert "ROUTERPANEL_KEYS" not in found  # a constant of the preset dialect, not a variable
    assert len(found) > 30


def test_every_variable_the_code_reads_is_on_the_configuration_page() -> None:
    missing = sorted(v for v in variables() if not documented(v))
    assert not missing, f"docs/configuration.md does not document {missing}"


def test_a_name_only_counts_in_code_and_whole() -> None:
    assert documented("--advertise") and documented("ROUTERPANEL_NODE")
    assert not documented("--no-such-flag") and not documented("ROUTERPANEL_NO_SUCH_VARIABLE")
    assert not documented("--models")  # a prefix of --models-max is not --models
