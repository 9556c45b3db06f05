"""Preset keys are checked against the options of the binary that will run them (issue 14).

The binaries here are small shell scripts that print a help text (b11434's, recorded from the
real build, plus options a newer build might have) and count how often they were asked.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from models_app.models import Preset, RouterSettings
from models_app.presets import files as presets_io
from models_app.presets import server_options, specs
from routerpanel.router import ini, options
from tests.support.serving import B11434_HELP

SIM = f"{sys.executable} -m routerpanel.router.simserver"
NEWER_OPTION = (
    "--fit-budget N                          memory the fit may use\n"
    "                                        (env: LLAMA_ARG_FIT_BUDGET)\n"
)


def fake_server(directory: Path, name: str, help_text: str, *, status: int = 0) -> Path:
    """A program that prints ``help_text`` for --help and appends a line to ``<name>.calls``."""
    (directory / f"{name}.help").write_text(help_text)
    script = directory / name
    script.write_text(
        "#!/bin/sh\n"
        f'echo called >> "{directory}/{name}.calls"\n'
        f'cat "{directory}/{name}.help"\n'
        f"exit {status}\n"
    )
    script.chmod(0o755)
    return script


def calls(script: Path) -> int:
    counter = script.parent / f"{script.name}.calls"
    return len(counter.read_text().splitlines()) if counter.exists() else 0


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    server_options._read_help.cache_clear()


class TestReadingHelp:
    def test_it_reads_a_newer_builds_options_from_its_help(self, tmp_path: Path) -> None:
        newer = fake_server(tmp_path, "llama-server-new", B11434_HELP.read_text() + NEWER_OPTION)
        table = server_options.options_for(str(newer))
        assert isinstance(table, options.OptionTable)
        assert table.lookup("fit-budget") is not None
        assert table.lookup("LLAMA_ARG_FIT_BUDGET") is not None
        assert table.lookup("ctx-size") is not None

    def test_it_runs_a_binary_once_until_the_binary_changes(self, tmp_path: Path) -> None:
        newer = fake_server(tmp_path, "llama-server-new", B11434_HELP.read_text())
        for _ in range(3):
            server_options.options_for(str(newer))
        assert calls(newer) == 1
        (tmp_path / "llama-server-new.help").write_text(B11434_HELP.read_text() + NEWER_OPTION)
        stamp = time.time() + 5
        os.utime(newer, (stamp, stamp))  # a rebuilt binary: same path, new mtime
        table = server_options.options_for(str(newer))
        assert calls(newer) == 2
        assert isinstance(table, options.OptionTable) and table.lookup("fit-budget") is not None

    def test_the_simulated_server_lists_its_own_flags(self) -> None:
        table = server_options.options_for(SIM)
        assert isinstance(table, options.OptionTable)
        assert table.lookup("sim-load-ms") is not None and table.lookup("sim-tag") is not None

    @pytest.mark.parametrize(
        ("command", "reason"),
        [
            ("no-such-server-anywhere", "'no-such-server-anywhere' is not on PATH"),
            (f"{sys.executable} -m no_such_module_here", "'--help' exited with status 1"),
            ("true", "its '--help' lists no option"),
            ("server 'unbalanced", "No closing quotation"),
        ],
    )
    def test_a_help_that_cannot_be_read_says_why(self, command: str, reason: str) -> None:
        found = server_options.options_for(command)
        assert isinstance(found, options.Unreadable)
        assert reason in found.reason

    def test_a_binary_that_does_not_answer_is_given_up_on(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(server_options, "HELP_TIMEOUT", 0.5)
        script = tmp_path / "hangs"
        script.write_text("#!/bin/sh\nsleep 30\n")
        script.chmod(0o755)
        started = time.monotonic()
        found = server_options.options_for(str(script))
        assert isinstance(found, options.Unreadable)
        assert "gave no answer in 0.5 s" in found.reason
        assert time.monotonic() - started < 10


@pytest.mark.django_db
class TestImport:
    def test_a_global_server_bin_lets_its_presets_use_its_options(self) -> None:
        # The reported bug: `option 'sim-load-ms' not recognized in preset 'a'`.
        text = f"[*]\nserver-bin = {SIM}\n\n[a]\nsim-load-ms = 5\n"
        report = presets_io.import_presets(text, source="models.ini")
        assert report.created == ["a"] and report.warnings == []
        assert Preset.objects.get(name="a").args == [["sim-load-ms", "5"]]
        (spec,) = specs.preset_specs(list(Preset.objects.all()), RouterSettings.load())
        assert spec.argv[: len(SIM.split())] == tuple(SIM.split())
        assert spec.argv[len(SIM.split()) :] == ("--sim-load-ms", "5", "--alias", "a")

    def test_a_key_the_binary_does_not_list_is_rejected_and_nothing_changes(self) -> None:
        text = f"[*]\nserver-bin = {SIM}\n\n[a]\nsim-load-ms = 5\nsim-warp-speed = 9\n"
        with pytest.raises(ini.IniError) as caught:
            presets_io.import_presets(text, source="models.ini")
        assert str(caught.value).startswith(
            "models.ini:6: option 'sim-warp-speed' not recognized in preset 'a'"
        )
        assert not Preset.objects.exists()
        assert RouterSettings.load().global_args == []

    def test_a_newer_default_binary_accepts_its_new_options(self, tmp_path: Path) -> None:
        newer = fake_server(tmp_path, "llama-server", B11434_HELP.read_text() + NEWER_OPTION)
        row = RouterSettings.load()
        text = "[m]\nmodel = /m.gguf\nfit-budget = 3\n"
        with pytest.raises(ini.IniError, match="option 'fit-budget' not recognized"):
            presets_io.import_presets(text)  # b11434 (the stand-in on PATH) has no such option
        row.server_binary = str(newer)
        row.save()
        presets_io.import_presets(text)
        (spec,) = specs.preset_specs(list(Preset.objects.all()), RouterSettings.load())
        assert spec.argv[0] == str(newer)
        assert "--fit-budget" in spec.argv

    def test_an_unreadable_binary_accepts_unknown_keys_with_a_warning(self) -> None:
        text = "[m]\nserver-bin = /opt/nowhere/llama-server\nfit-budget = 3\n"
        report = presets_io.import_presets(text, source="models.ini")
        assert report.created == ["m"]
        assert report.warnings == [
            "line 3: option 'fit-budget' in preset 'm' is not checked: the options of "
            "'/opt/nowhere/llama-server' could not be read ('/opt/nowhere/llama-server' is not "
            "on PATH or not executable)"
        ]


@pytest.mark.django_db
class TestPanelValidation:
    def test_a_preset_under_a_global_server_bin_may_use_its_options(self) -> None:
        row = RouterSettings.load()
        row.global_args = [["server-bin", SIM]]
        row.save()
        preset = Preset(name="a", args=[["sim-load-ms", "5"]])
        preset.full_clean()
        assert preset.option_warnings == []

    def test_the_global_options_are_checked_against_their_program(self) -> None:
        row = RouterSettings.load()
        row.global_args = [["server-bin", SIM], ["sim-load-ms", "5"]]
        row.full_clean()
        row.global_args = [["sim-load-ms", "5"]]
        with pytest.raises(Exception, match="option 'sim-load-ms' not recognized"):
            row.full_clean()
