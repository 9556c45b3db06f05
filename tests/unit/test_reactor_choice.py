"""``routerpanel.reactor``: which ``manage.py`` runs get Twisted's reactor on uvloop."""

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
