"""What a child inherits from the router's environment, as docs/serving.md says (issue 14).

The router's own variables are removed (so an API key or ``--models-max`` never reaches a
child); every other ``LLAMA_ARG_*`` passes through, as in llama.cpp. Through a real
``manage.py serve`` and the environment of the child process it starts.
"""

from __future__ import annotations

from pathlib import Path

from routerpanel.router.supervisor import ROUTER_ONLY_ENV
from tests.support.ports import free_port
from tests.support.serving import ROOT, run_manage, sim_preset, simserver_processes, wait_until

ROUTER_OWN = {
    "LLAMA_ARG_MODELS_MAX": "3",
    "LLAMA_ARG_MODELS_AUTOLOAD": "1",
    "LLAMA_API_KEY": "sk-router-only",
    "LLAMA_ARG_API_KEY_FILE": "/nowhere/keys.txt",
    "ROUTERPANEL_SSE_KEEPALIVE": "15",
}
PASSED_ON = {"LLAMA_ARG_N_GPU_LAYERS": "7", "LLAMA_ARG_THREADS": "2"}


def test_children_get_every_llama_arg_but_the_routers_own(tmp_path: Path) -> None:
    marker = f"env-{tmp_path.name}"
    ini = tmp_path / "models.ini"
    ini.write_text(sim_preset("m", marker))
    env = ROUTER_OWN | PASSED_ON
    with run_manage(
        ["serve", "--models-preset", str(ini)], tmp_path / "data", port=free_port(), env=env
    ) as server:
        client = server.client(headers={"Authorization": "Bearer sk-router-only"})
        # serve took its own variables (the stored default is 4), and kept them from the child
        assert client.get("/props").json()["max_instances"] == 3
        assert server.client().get("/v1/models").status_code == 401  # LLAMA_API_KEY is in force
        assert client.post("/models/load", json={"model": "m"}).status_code == 200
        pid = server.process.pid
        wait_until(lambda: len(simserver_processes(marker, pid)) == 1, 30, "the child")
        (child,) = simserver_processes(marker, pid)
        inherited = child.environ()
    for name, value in PASSED_ON.items():
        assert inherited.get(name) == value, name
    for name in ROUTER_OWN:
        assert name not in inherited, name


def test_the_docs_name_every_variable_the_children_do_not_get() -> None:
    readme = (ROOT / "docs" / "serving.md").read_text()
    for pattern in ROUTER_ONLY_ENV:
        assert f"`{pattern}`" in readme, pattern
    assert "The `LLAMA_ARG_*` variables are removed from the children's environment" not in readme
