"""The supervision files for a native router (issue 12): launchd on macOS, systemd on Linux.

Neither can be loaded here; these tests read them as their system would and check what makes a
crashed router come back: the command, the restart policy and the stop time.
"""

from __future__ import annotations

import configparser
import plistlib
import subprocess

from tests.support.paths import REPO

PLIST = REPO / "deploy" / "macos" / "org.routerpanel.router.plist"
UNIT = REPO / "deploy" / "linux" / "routerpanel-router.service"


def test_the_launchd_agent_runs_the_router_and_restarts_it_after_a_crash() -> None:
    agent = plistlib.loads(PLIST.read_bytes())
    args = agent["ProgramArguments"]
    assert args[0].endswith("/.venv/bin/python") and args[1].endswith("/manage.py")
    assert args[2] == "runrouter"
    assert agent["KeepAlive"] == {"SuccessfulExit": False}  # again after a crash, not a stop
    assert agent["RunAtLoad"] is True
    assert agent["ExitTimeOut"] >= 30  # children get their stop-timeout before SIGKILL
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} <= set(agent["EnvironmentVariables"])


def test_the_systemd_unit_runs_the_router_and_restarts_it_after_a_crash() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    service = unit["Service"]
    assert "manage.py runrouter" in service["ExecStart"]
    assert service["Restart"] == "on-failure"
    assert service["KillMode"] == "mixed"  # SIGTERM to runrouter only: it stops the children
    assert int(service["TimeoutStopSec"]) >= 30
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_templates_name_no_machine_path() -> None:
    for path in (PLIST, UNIT):
        text = path.read_text()
        assert "@ROUTERPANEL_DIR@" in text
        assert "/work/" not in text and "/home/" not in text and "/Users/" not in text


def test_the_installer_is_valid_shell() -> None:
    script = REPO / "tools" / "install_router_service.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
