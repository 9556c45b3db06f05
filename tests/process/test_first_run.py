"""The first ``manage.py serve`` a user runs: a clean first screen, and one-line failures that
change nothing (issues 14 and 20). Real processes, as a user starts them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.ports import free_port
from tests.support.serving import ROOT, SIMSERVER, run_manage

pytestmark = pytest.mark.http_server  # CI runs it on uvicorn too

START_TIMEOUT = 90


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def manage(args: list[str], data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py ARGS`` to its end, as a user would, with its own data dir."""
    full_env = {**os.environ, "ROUTERPANEL_DATA_DIR": str(data), **env}
    full_env.pop("ROUTERPANEL_ADMIN_PASSWORD", None)  # the first run generates and prints one
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )


def changed_nothing(data: Path) -> bool:
    """No database was created in the data dir (so no admin user, no preset)."""
    return not (data / "routerpanel.sqlite3").exists()


class TestFirstScreen:
    def test_it_is_the_password_then_the_url_once_it_answers(self, tmp_path: Path) -> None:
        port = free_port()
        env = {"ROUTERPANEL_ADMIN_PASSWORD": ""}  # generated, printed once
        with run_manage(
            ["serve", "--demo-if-empty"],
            tmp_path / "data",
            port=port,
            env=env,
            ready="RouterPanel on",
            timeout=START_TIMEOUT,
        ) as server:
            # Printed once the socket listens: it answers at once.
            assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
            lines = server.output().splitlines()
        password = next(i for i, line in enumerate(lines) if "with password:" in line)
        url = next(i for i, line in enumerate(lines) if line.startswith("RouterPanel on"))
        assert password < url
        assert lines[url] == (
            f"RouterPanel on http://127.0.0.1:{port}/ (the panel; Django admin at "
            f"http://127.0.0.1:{port}/admin/)"
        )
        noise = [
            line
            for line in lines[: url + 1]
            if any(
                word in line
                for word in ("kombu", "celery.app.trace", "daphne.server", "W001", "Traceback")
            )
        ]
        assert noise == []

    def test_a_second_start_warns_about_no_binary_its_presets_do_not_use(
        self, tmp_path: Path
    ) -> None:
        # Every demo preset has its own server-bin: a missing llama-server concerns none (W001).
        data = tmp_path / "data"
        missing = {"ROUTERPANEL_SERVER_BIN": "no-such-llama-server"}  # the default: not there
        for _ in range(2):
            with run_manage(
                ["serve", "--demo"], data, port=free_port(), env=missing, ready="RouterPanel on"
            ) as server:
                output = server.output()
        assert "W001" not in output and "is not on PATH" not in output
        assert "with password" not in output  # shown the first time only


class TestBusyPort:
    def test_it_fails_with_one_line_naming_the_port_and_changes_nothing(
        self, tmp_path: Path, busy_port: int
    ) -> None:
        done = manage(["serve", "--port", str(busy_port)], tmp_path / "data")
        assert done.returncode != 0
        assert done.stderr.splitlines() == [
            f"CommandError: Port {busy_port} on 127.0.0.1 is already in use: stop what listens "
            "there, or choose another port: make run PORT=9000 (or manage.py serve --port 9000)."
        ]
        assert "RouterPanel on" not in done.stdout and "password" not in done.stdout
        assert changed_nothing(tmp_path / "data")

    def test_a_port_taken_after_the_check_is_reported_the_same_way(
        self, tmp_path: Path, busy_port: int
    ) -> None:
        # Another process may take the port between the check and the listen: serve without
        # its early check, so that the listen itself fails.
        script = (
            "import sys\n"
            "import django, os\n"
            "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'routerpanel.settings')\n"
            "django.setup()\n"
            "from models_app.management.commands import _inputs\n"
            "_inputs.check_listen_address = lambda host, port: None\n"
            "import manage\n"
            f"sys.argv = ['manage.py', 'serve', '--port', '{busy_port}']\n"
            "manage.main()\n"
        )
        env = {**os.environ, "ROUTERPANEL_DATA_DIR": str(tmp_path / "data")}
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            check=False,
        )
        assert done.returncode == 1, done.stderr
        assert "RouterPanel on" not in done.stdout
        assert done.stderr.strip().splitlines() == [
            f"CommandError: Port {busy_port} on 127.0.0.1 is already in use: stop what listens "
            "there, or choose another port: make run PORT=9000 (or manage.py serve --port 9000)."
        ]


class TestBadInput:
    @pytest.mark.parametrize(
        ("name", "value", "message"),
        [
            ("ROUTERPANEL_MODELS_MAX", "abc", "ROUTERPANEL_MODELS_MAX='abc' is not an integer"),
            ("LLAMA_ARG_MODELS_MAX", "two", "LLAMA_ARG_MODELS_MAX='two' is not an integer"),
            ("LLAMA_ARG_PORT", "80a", "LLAMA_ARG_PORT='80a' is not an integer"),
            ("LLAMA_ARG_MODELS_AUTOLOAD", "maybe", "LLAMA_ARG_MODELS_AUTOLOAD='maybe' is not a "
             "boolean; use true or false"),
            ("ROUTERPANEL_LEASE_TTL", "0.5", "ROUTERPANEL_LEASE_TTL=0.5 must be at least 1.0"),
        ],
    )  # fmt: skip
    def test_a_setting_that_does_not_parse_is_one_line_and_status_2(
        self, tmp_path: Path, name: str, value: str, message: str
    ) -> None:
        done = manage(["serve", "--port", str(free_port())], tmp_path / "data", **{name: value})
        assert done.returncode == 2
        assert done.stderr == f"error: {message}\n"
        assert done.stdout == ""

    def test_a_missing_preset_file_fails_before_the_admin_is_created(self, tmp_path: Path) -> None:
        missing = tmp_path / "models.ini"
        done = manage(
            ["serve", "--port", str(free_port()), "--models-preset", str(missing)],
            tmp_path / "data",
        )
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"CommandError: failed to initialize router models: preset file does not exist: "
            f"{missing}"
        ]
        assert "password" not in done.stdout
        assert changed_nothing(tmp_path / "data")

    def test_a_bad_line_in_the_preset_file_is_named_before_anything_changes(
        self, tmp_path: Path
    ) -> None:
        ini = tmp_path / "models.ini"
        ini.write_text(f"[*]\nserver-bin = {SIMSERVER}\n[a]\nsim-load-ms = 5\nsim-warp = 9\n")
        done = manage(
            ["serve", "--port", str(free_port()), "--models-preset", str(ini)],
            tmp_path / "data",
        )
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"CommandError: failed to initialize router models: {ini}:5: option 'sim-warp' not "
            f"recognized in preset 'a' ('{SIMSERVER} --help' does not list it)"
        ]
        assert "password" not in done.stdout
        assert changed_nothing(tmp_path / "data")

    def test_a_missing_models_dir_fails_before_anything_changes(self, tmp_path: Path) -> None:
        done = manage(
            ["serve", "--port", str(free_port()), "--models-dir", str(tmp_path / "nope")],
            tmp_path / "data",
        )
        assert done.returncode == 1
        assert done.stderr.splitlines() == [
            f"CommandError: '{tmp_path / 'nope'}' does not exist or is not a directory"
        ]
        assert changed_nothing(tmp_path / "data")
