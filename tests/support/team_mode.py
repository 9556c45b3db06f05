"""Team mode as a user runs it: ``runrouter`` and ``serve --no-router`` over PostgreSQL and
Redis, and the chat body the services tier sends through them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support.ports import free_port
from tests.support.serving import Server, run_manage


def chat(model: str, tokens: int = 3, stream: bool = False) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": tokens,
            "stream": stream}  # fmt: skip


@contextmanager
def team(
    tmp_path: Path, pg_database: str, redis_url: str, presets: str, models_max: int, *extra: str
) -> Iterator[tuple[Server, Server]]:
    ini = tmp_path / "models.ini"
    ini.write_text(presets)
    env = {"DATABASE_URL": pg_database, "REDIS_URL": redis_url}
    with ExitStack() as stack:
        router = stack.enter_context(
            run_manage(
                ["runrouter", "--models-preset", str(ini), "--models-max", str(models_max), *extra],
                tmp_path / "router",
                env=env,
                ready="router running",
            )
        )
        web = stack.enter_context(
            run_manage(["serve", "--no-router"], tmp_path / "web", env=env, port=free_port())
        )
        yield router, web
