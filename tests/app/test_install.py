"""The install is the same everywhere: locked versions, the supported Pythons, and a CI script
that installs and starts what the tiers need or says plainly why it cannot (issues 14, 20)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"


def pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def locked() -> dict[str, set[str]]:
    """Package name (normalised) -> versions the lock pins (one per Python marker)."""
    found: dict[str, set[str]] = {}
    for match in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", LOCK.read_text(), re.M):
        found.setdefault(normalise(match.group(1)), set()).add(match.group(2))
    return found


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class TestLockFile:
    def test_it_pins_every_direct_dependency_at_the_version_pyproject_names(self) -> None:
        project = pyproject()["project"]
        direct = project["dependencies"] + project["optional-dependencies"]["test"]
        pins = locked()
        for requirement in direct:
            name, version = re.fullmatch(
                r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", requirement
            ).groups()  # type: ignore[union-attr]
            assert pins.get(normalise(name)) == {version}, requirement

    def test_every_pin_carries_hashes_and_transitive_ones_are_there_too(self) -> None:
        text = LOCK.read_text()
        entries = re.findall(r"^[A-Za-z0-9_.-]+==.*?(?=^\S|\Z)", text, re.M | re.S)
        assert len(entries) > 60  # the direct ones are about 25: the rest are transitive
        assert all("--hash=sha256:" in entry for entry in entries)
        assert "twisted" in locked() and "kombu" in locked()

    def test_the_image_installs_the_locked_versions(self) -> None:
        dockerfile = (REPO / "Dockerfile").read_text()
        assert "COPY pyproject.toml README.md requirements.lock ./" in dockerfile
        assert "pip install --constraint requirements.lock ." in dockerfile

    def test_make_installs_from_it_and_lock_refreshes_it(self) -> None:
        makefile = (REPO / "Makefile").read_text()
        assert "pip install --quiet --require-hashes -r $(LOCK)" in makefile
        assert "--no-deps -e ." in makefile
        assert re.search(
            r"^lock: .*\n\t\$\(VENV\)/bin/uv pip compile pyproject.toml", makefile, re.M
        )
        assert "make lock" in (REPO / "README.md").read_text()


class TestPythonVersions:
    def test_pyproject_and_the_makefile_agree_on_3_11_to_3_13(self) -> None:
        assert pyproject()["project"]["requires-python"] == ">=3.11,<3.14"
        assert "(3, 11) <= v <= (3, 13)" in (REPO / "Makefile").read_text()

    def test_make_takes_the_newest_python_that_really_runs(self, tmp_path: Path) -> None:
        # A pyenv shim for a version that is not selected exits 127; it must be passed over.
        fake = {
            "python3.13": "#!/bin/sh\necho 'pyenv: python3.13: command not found' >&2\nexit 127\n",
            "python3.12": "#!/bin/sh\necho /opt/py312/bin/python3.12\n",
            "python3.11": "#!/bin/sh\necho /opt/py311/bin/python3.11\n",
        }
        for name, script in fake.items():
            (tmp_path / name).write_text(script)
            (tmp_path / name).chmod(0o755)
        env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
        found = subprocess.run(
            [str(REPO / "tools/find_python.sh")], env=env, capture_output=True, text=True
        )
        assert (found.returncode, found.stdout) == (0, "/opt/py312/bin/python3.12\n")

    def test_this_interpreter_is_one_make_accepts(self) -> None:
        assert (3, 11) <= sys.version_info[:2] <= (3, 13)
        found = subprocess.run(
            [str(REPO / "tools/find_python.sh")], capture_output=True, text=True, check=True
        )
        version = subprocess.run(
            [found.stdout.strip(), "-c", "import sys; print(sys.version_info[:2] >= (3, 11))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert version.stdout == "True\n"


def ci_function(body: str, tmp_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    """Source .ci/run (which then only defines its functions) and run ``body`` in bash."""
    script = f"source {REPO / '.ci/run'}\n{body}\n"
    env = {**os.environ, "PATH": path, "HOME": str(tmp_path), "SERVICE_START_TIMEOUT": "2"}
    return subprocess.run(
        [BASH, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )


BASH = shutil.which("bash") or "/bin/bash"
BASICS = ("sh", "sleep", "mv", "ls", "sort", "tail", "head", "sed", "dirname")


def fake_bin(directory: Path, **scripts: str) -> str:
    """A PATH of ``scripts`` and a few basic tools only (not this machine's services)."""
    directory.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)
    basics = directory.parent / "basics"
    basics.mkdir(exist_ok=True)
    for tool in BASICS:
        found = shutil.which(tool)
        if found and not (basics / tool).exists():
            (basics / tool).symlink_to(found)
    return f"{directory}:{basics}"


class TestCiScript:
    def test_a_redis_that_will_not_start_fails_with_a_clear_message(self, tmp_path: Path) -> None:
        path = fake_bin(tmp_path / "bin", **{"redis-cli": "exit 1", "redis-server": "exit 1"})
        done = ci_function("start_redis", tmp_path, path)
        assert done.returncode == 1
        assert done.stderr.strip() == "error: redis-server would not start on 127.0.0.1:6379"

    def test_a_missing_redis_is_installed_from_debian_packages(self, tmp_path: Path) -> None:
        log = tmp_path / "apt.log"
        path = fake_bin(
            tmp_path / "bin",
            **{"apt-get": f'echo "$@" >> {log}', "redis-cli": "exit 1", "redis-server": "exit 1"},
        )
        # redis-server "exists" only after apt-get ran: hide it until then.
        (tmp_path / "bin" / "redis-server").rename(tmp_path / "redis-server")
        install = f"mv {tmp_path}/redis-server {tmp_path}/bin/"
        apt = f'echo "$@" >> {log}; if [ "$1" = install ]; then {install}; fi'
        (tmp_path / "bin" / "apt-get").write_text(f"#!/bin/sh\n{apt}\n")
        done = ci_function("start_redis", tmp_path, path)
        assert log.read_text().splitlines() == ["update", "install -y redis-server"]
        assert "installing Redis (Debian package redis-server)" in done.stdout
        assert done.stderr.strip() == "error: redis-server would not start on 127.0.0.1:6379"

    def test_a_postgres_that_does_not_come_up_fails_with_a_clear_message(
        self, tmp_path: Path
    ) -> None:
        (tmp_path / "postgresql" / "15" / "main").mkdir(parents=True)  # a cluster "is installed"
        path = fake_bin(tmp_path / "bin", pg_isready="exit 2", pg_ctlcluster="exit 1")
        done = ci_function(f"PG_CONF={tmp_path}/postgresql\nstart_postgres", tmp_path, path)
        assert done.returncode == 1
        assert re.fullmatch(
            r"error: PostgreSQL \S+ did not start on 127.0.0.1:5432 \(see /var/log/postgresql/\)",
            done.stderr.strip(),
        )

    def test_a_failed_llama_server_build_is_said_plainly(self, tmp_path: Path) -> None:
        # The real build script, failing at once: its Python cannot download the sdist.
        body = f"export ROUTERPANEL_CACHE={tmp_path}/cache PYTHON=/bin/false\nbuild_llama_server"
        done = ci_function(body, tmp_path, os.environ["PATH"])
        assert done.returncode == 1
        assert done.stderr.strip().splitlines()[-1] == (
            "error: building llama-server b11434 failed (tools/build_llama.sh printed its log "
            "above); the llama tier needs it"
        )
