"""Which ``manage.py`` runs get uvloop: Twisted's reactor for ``serve`` on Daphne
(``routerpanel.reactor``), and ``runrouter``'s loop."""

from __future__ import annotations

import pytest

from routerpanel.reactor import serves_with_daphne


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        (["manage.py", "serve"], {}, True),
        (["manage.py", "serve", "--port", "9000", "--http", "daphne"], {}, True),
        (["manage.py", "serve", "--http", "uvicorn"], {}, False),
        (["manage.py", "serve", "--http=uvicorn"], {}, False),
        (["manage.py", "serve"], {"ROUTERPANEL_HTTP": "uvicorn"}, False),
        (["manage.py", "serve", "--http", "daphne"], {"ROUTERPANEL_HTTP": "uvicorn"}, True),
        (["manage.py", "serve"], {"ROUTERPANEL_DAPHNE_LOOP": "asyncio"}, False),
        (["manage.py", "runrouter"], {}, False),
        (["manage.py", "migrate"], {}, False),
        (["manage.py"], {}, False),
    ],
)
def test_only_serve_on_daphne_gets_the_uvloop_reactor(
    argv: list[str], environ: dict[str, str], expected: bool
) -> None:
    assert serves_with_daphne(argv, environ) is expected


@pytest.mark.parametrize(("setting", "loop_module"), [(None, "uvloop"), ("asyncio", "asyncio")])
def test_runrouter_runs_on_uvloop_unless_told_otherwise(
    setting: str | None, loop_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from models_app.management.commands.runrouter import run_loop

    if setting is None:
        monkeypatch.delenv("ROUTERPANEL_ROUTER_LOOP", raising=False)
    else:
        monkeypatch.setenv("ROUTERPANEL_ROUTER_LOOP", setting)
    seen: list[str] = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

    run_loop(main())
    assert seen == [loop_module]
