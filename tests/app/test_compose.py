"""docker-compose.yml without a Docker engine: every app service runs a real command, sets only
variables settings.py reads, and the file has what a team deployment needs (issue 5)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import get_commands, load_command_class

from tests.support.paths import REPO

COMPOSE = REPO / "docker-compose.yml"
THIRD_PARTY = {"postgres", "redis"}  # images configured by their own variables
RECORD_ENV = r"""
import json, os, sys
OURS = os.path.join(os.getcwd(), "routerpanel") + os.sep
def note(key):  # only what our settings (and their env helpers) read, not the libraries
    if sys._getframe(2).f_code.co_filename.startswith(OURS):
        Recording.seen.add(key)
class Recording(dict):
    seen = set()
    def get(self, key, default=None):
        note(key)
        return super().get(key, default)
    def __getitem__(self, key):
        note(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        note(key)
        return super().__contains__(key)
os.environ = Recording(os.environ)
import routerpanel.settings
print(json.dumps(sorted(Recording.seen)))
"""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def settings_reads(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every environment variable settings.py reads, recorded while it is imported."""
    env = {**os.environ, "ROUTERPANEL_DATA_DIR": str(tmp_path_factory.mktemp("data"))}
    out = subprocess.run(
        [sys.executable, "-c", RECORD_ENV], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout  # fmt: skip
    return set(json.loads(out.splitlines()[-1])) - {"DJANGO_SETTINGS_MODULE"}


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if name not in THIRD_PARTY}


def test_it_has_every_service_of_the_team_deployment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"postgres", "redis", "web", "router", "worker", "beat"} <= set(services)
    assert services["router"]["profiles"] == ["linux"]
    assert services["web"]["network_mode"] == "service:router"
    for name in ("postgres", "redis", "web", "router", "worker", "beat"):
        assert "healthcheck" in services[name], name
    assert {"postgres-data", "redis-data", "routerpanel-data"} <= set(compose["volumes"])
    env_file = services["web"]["env_file"]
    assert env_file == [{"path": ".env", "required": False}]


def test_every_app_service_runs_manage_py_or_celery(compose: dict[str, Any]) -> None:
    for name, service in app_services(compose).items():
        argv = _argv(service["command"])
        assert argv[:2] == ["python", "manage.py"] or argv[0] == "celery", name


def test_the_manage_py_commands_exist_and_take_these_flags(compose: dict[str, Any]) -> None:
    commands = get_commands()
    checked = 0
    for name, service in app_services(compose).items():
        argv = _argv(service["command"])
        if argv[:2] != ["python", "manage.py"]:
            continue
        command = argv[2]
        assert command in commands, f"{name}: manage.py has no command {command!r}"
        parser = load_command_class(commands[command], command).create_parser("manage.py", command)
        parser.parse_args(argv[3:])  # exits (SystemExit) on an unknown flag
        checked += 1
    assert checked == 6  # migrate, router, web; two router nodes and their web (profile nodes)
    web = _argv(compose["services"]["web"]["command"])
    assert web[2:4] == ["serve", "--no-router"]
    assert _argv(compose["services"]["router"]["command"])[2] == "runrouter"


def test_the_celery_invocations_are_valid(compose: dict[str, Any]) -> None:
    seen = set()
    for name, service in app_services(compose).items():
        argv = _argv(service["command"])
        if argv[0] != "celery":
            continue
        assert argv[1:3] == ["-A", "routerpanel"], name
        seen.add(argv[3])
        celery = str(Path(sys.executable).with_name("celery"))
        # Click rejects an unknown option before it reaches --help (exit status 2).
        result = subprocess.run(
            [celery, *argv[1:], "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"{name}: {result.stderr}"
    assert seen == {"worker", "beat"}
    beat = _argv(compose["services"]["beat"]["command"])
    assert "django_celery_beat.schedulers:DatabaseScheduler" in beat


def test_every_variable_it_sets_is_one_settings_reads(
    compose: dict[str, Any], settings_reads: set[str]
) -> None:
    for name, service in app_services(compose).items():
        environment = service.get("environment") or {}
        assert set(environment) <= settings_reads, f"{name}: {set(environment) - settings_reads}"
    web = compose["services"]["web"]["environment"]
    assert {"DATABASE_URL", "REDIS_URL", "ROUTERPANEL_DATA_DIR"} <= set(web)
    assert web["DATABASE_URL"].startswith("postgres://") and web["REDIS_URL"].startswith("redis://")


def test_env_example_lists_settings_variables_and_the_composes_own(
    settings_reads: set[str],
) -> None:
    example = (REPO / ".env.example").read_text()
    names = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", example, flags=re.MULTILINE))
    interpolated = set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", COMPOSE.read_text()))
    assert names - settings_reads <= interpolated, names - settings_reads - interpolated
    assert settings_reads <= names, f"not in .env.example: {settings_reads - names}"


def test_the_dockerfile_runs_the_web_side_by_default() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "FROM python:3.11" in dockerfile
    cmd = re.search(r"^CMD (.+)$", dockerfile, flags=re.MULTILINE)
    assert cmd is not None and json.loads(cmd.group(1))[2:4] == ["serve", "--no-router"]


def _argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_the_nodes_profile_runs_two_named_routers_and_a_web(compose: dict[str, Any]) -> None:
    services = compose["services"]
    names = []
    for service in ("node-1", "node-2"):
        assert services[service]["profiles"] == ["nodes"]
        argv = _argv(services[service]["command"])
        assert argv[2] == "runrouter"
        names.append(argv[argv.index("--node") + 1])
        assert argv[argv.index("--advertise") + 1] == services[service]["hostname"]
        health = services[service]["healthcheck"]["test"]
        assert health[health.index("--node") + 1] == names[-1]
        data = services[service]["volumes"][0].split(":")[0]
        assert data in compose["volumes"], service  # each node its own data dir
    assert len(set(names)) == 2
    web = _argv(services["web-nodes"]["command"])
    assert web[2:4] == ["serve", "--no-router"] and services["web-nodes"]["profiles"] == ["nodes"]
