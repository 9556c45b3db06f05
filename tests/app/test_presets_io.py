"""import_presets / export_presets against the database: all or nothing, and round trips."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from models_app.models import AuditEvent, AuditKind, Preset, RouterSettings
from models_app.presets.files import export_presets, import_presets
from routerpanel.router.ini import IniError

pytestmark = pytest.mark.django_db

FILE = """version = 1
[*]
c = 8192
stop-timeout = 5

[org/gemma-GGUF:q4_k_m]
model = /models/gemma.gguf
jinja = true
no-warmup = 1
alias = gemma,g3
load-on-startup = true

[sim]
server-bin = python -m routerpanel.router.simserver
sim-load-ms = 200
pinned = true
ttl = 600
memory = 2G
"""


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def snapshot() -> list[dict[str, object]]:
    rows = Preset.objects.order_by("name").values()
    return [{k: v for k, v in row.items() if k not in ("created_at", "updated_at")} for row in rows]


@pytest.fixture
def ini_file(tmp_path: Path) -> Path:
    path = tmp_path / "models.ini"
    path.write_text(FILE)
    return path


class TestImport:
    def test_it_creates_presets_and_the_global_section(self, ini_file: Path) -> None:
        out, _ = run("import_presets", str(ini_file))
        assert "2 created, 0 updated, 0 unchanged, [*] updated" in out
        gemma = Preset.objects.get(name="org/gemma-GGUF:Q4_K_M")
        assert gemma.model_path == "/models/gemma.gguf"
        assert gemma.aliases == ["g3", "gemma"]
        assert gemma.args == [["jinja", "true"], ["no-warmup", "1"]]
        assert gemma.load_on_startup is True
        sim = Preset.objects.get(name="sim")
        assert (sim.pinned, sim.ttl, sim.memory_estimate) == (True, 600, 2 << 30)
        assert RouterSettings.load().global_args == [["c", "8192"], ["stop-timeout", "5"]]

    def test_importing_the_same_file_again_changes_nothing(self, ini_file: Path) -> None:
        run("import_presets", str(ini_file))
        before = snapshot()
        out, _ = run("import_presets", str(ini_file))
        assert "0 created, 0 updated, 2 unchanged" in out
        assert snapshot() == before

    def test_a_changed_preset_is_reported_as_updated(self, ini_file: Path) -> None:
        run("import_presets", str(ini_file))
        ini_file.write_text(FILE.replace("sim-load-ms = 200", "sim-load-ms = 300"))
        out, _ = run("import_presets", str(ini_file))
        assert "  updated: sim" in out
        assert "0 created, 1 updated, 1 unchanged" in out

    def test_a_bad_line_in_the_middle_leaves_the_database_untouched(self, ini_file: Path) -> None:
        run("import_presets", str(ini_file))
        before, settings_before = snapshot(), RouterSettings.load().global_args
        broken = FILE.replace("sim-load-ms = 200", "sim-load-ms = 300") + "[new]\nc = 1\n"
        broken = broken.replace("jinja = true", "jinja = true\n  indented = 1")
        ini_file.write_text(broken)
        with pytest.raises(CommandError) as caught:
            run("import_presets", str(ini_file))
        assert f"{ini_file}:9: keys and section headers must start in column 0" in str(caught.value)
        assert "Nothing was imported." in str(caught.value)
        assert snapshot() == before
        assert RouterSettings.load().global_args == settings_before

    def test_every_bad_line_is_named_at_once(self, ini_file: Path) -> None:
        broken = FILE.replace("jinja = true", "n-gpu-layers = lots").replace(
            "ttl = 600", "tl = 600"
        )
        ini_file.write_text(broken + "[new]\n  c = 1\n")
        with pytest.raises(CommandError) as caught:
            run("import_presets", str(ini_file))
        message = str(caught.value)
        named = [line.split(": ", 1)[0] for line in message.splitlines()[:-1]]
        assert named == [f"{ini_file}:{n}" for n in (8, 17, 20)], message
        assert "Nothing was imported." in message and not Preset.objects.exists()

    def test_a_field_the_file_leaves_out_is_cleared_aliases_too(self) -> None:
        """One rule for every field (issue 49.9): the file is the whole of each preset it names."""
        Preset.objects.create(name="a", model_path="/m/a.gguf", aliases=["fast"], stop_timeout=30)
        report = import_presets("[a]\nmodel = /m/a.gguf\nalias = fast\nstop-timeout = 30\n")
        assert report.unchanged == ["a"]
        import_presets("[a]\nmodel = /m/a2.gguf\n")
        row = Preset.objects.get(name="a")
        assert (row.aliases, row.stop_timeout) == ([], None)

    def test_the_models_preset_file_is_the_whole_truth_for_aliases(self, ini_file: Path) -> None:
        from models_app.presets import sources

        sources.import_preset_file(str(ini_file), io.StringIO())
        ini_file.write_text(FILE.replace("alias = gemma,g3\n", ""))
        assert sources.reimport_preset_file(str(ini_file)) is True
        assert Preset.objects.get(name="org/gemma-GGUF:Q4_K_M").aliases == []

    def test_a_preset_the_database_rejects_rolls_back_the_earlier_ones(self) -> None:
        text = "[a]\nc = 1\n[b]\nc = 2\n[z]\nmodel = /x.gguf\nstop-timeout = 1\n"
        Preset.objects.create(name="other", aliases=["z"])
        with pytest.raises(IniError, match="conflicts with"):
            import_presets(text)
        assert list(Preset.objects.values_list("name", flat=True)) == ["other"]

    def test_dry_run_reports_without_changing_anything(self, ini_file: Path) -> None:
        out, _ = run("import_presets", str(ini_file), "--dry-run")
        assert "2 created" in out and "dry run" in out
        assert Preset.objects.count() == 0
        assert RouterSettings.load().global_args == []

    def test_replace_deletes_presets_the_file_does_not_name(self, ini_file: Path) -> None:
        Preset.objects.create(name="old")
        out, _ = run("import_presets", str(ini_file), "--replace")
        assert "  deleted: old" in out
        assert not Preset.objects.filter(name="old").exists()

    def test_without_replace_other_presets_stay(self, ini_file: Path) -> None:
        Preset.objects.create(name="old")
        run("import_presets", str(ini_file))
        assert Preset.objects.filter(name="old").exists()

    def test_warnings_are_printed(self, tmp_path: Path) -> None:
        path = tmp_path / "w.ini"
        path.write_text("[a]\nstop-timeout = 15s\n")
        _, err = run("import_presets", str(path))
        assert "warning:" in err and "read as 15" in err
        assert Preset.objects.get(name="a").stop_timeout == 15

    def test_a_missing_file_gives_llama_cpps_message(self, tmp_path: Path) -> None:
        with pytest.raises(CommandError, match="preset file does not exist"):
            run("import_presets", str(tmp_path / "nope.ini"))


class TestReloadFromTheFile:
    """``GET /models?reload=1`` re-reads ``--models-preset`` only when the file changed."""

    def test_an_unchanged_file_keeps_the_panels_edits(self, ini_file: Path) -> None:
        from models_app.presets import sources

        path = str(ini_file)
        assert sources.reimport_preset_file(path) is True  # first time: imported
        Preset.objects.filter(name="sim").update(ttl=90)  # an admin's edit in the panel
        assert sources.reimport_preset_file(path) is False
        assert Preset.objects.get(name="sim").ttl == 90

    def test_a_changed_file_is_applied_and_wins_for_its_presets(self, ini_file: Path) -> None:
        from models_app.presets import sources

        path = str(ini_file)
        sources.reimport_preset_file(path)
        Preset.objects.filter(name="sim").update(ttl=90)
        ini_file.write_text(FILE + "\n[new-one]\nmodel = /models/new.gguf\n")
        assert sources.reimport_preset_file(path) is True
        assert Preset.objects.filter(name="new-one").exists()
        assert Preset.objects.get(name="sim").ttl == 600  # the file says so again

    def test_a_missing_or_broken_file_changes_nothing(self, ini_file: Path) -> None:
        from models_app.presets import sources

        sources.reimport_preset_file(str(ini_file))
        before = list(Preset.objects.values())
        ini_file.write_text(FILE + "\n[broken\n")
        with pytest.raises(IniError):
            sources.reimport_preset_file(str(ini_file))
        with pytest.raises(ValueError, match="does not exist"):
            sources.reimport_preset_file(str(ini_file) + ".gone")
        assert list(Preset.objects.values()) == before


class TestWhereAPresetCameFrom:
    """Each preset records its source; a reload drops the file's presets it no longer names."""

    def test_the_models_preset_file_owns_its_presets(self, ini_file: Path) -> None:
        from models_app.presets import sources

        sources.import_preset_file(str(ini_file), io.StringIO())
        sim = Preset.objects.get(name="sim")
        assert (sim.source, sim.source_path) == ("models_preset", str(ini_file.resolve()))
        assert sim.get_source_display() == "the --models-preset file"

    def test_a_renamed_section_replaces_its_old_preset_on_reload(self, ini_file: Path) -> None:
        from models_app.presets import sources

        sources.import_preset_file(str(ini_file), io.StringIO())
        Preset.objects.create(name="made-here")  # in the panel
        run("import_presets", str(self._other_file(ini_file)))  # imported by hand
        ini_file.write_text(FILE.replace("[sim]", "[sim-renamed]"))
        assert sources.reimport_preset_file(str(ini_file)) is True
        names = set(Preset.objects.values_list("name", flat=True))
        assert names == {"org/gemma-GGUF:Q4_K_M", "sim-renamed", "made-here", "by-hand"}
        deleted = AuditEvent.objects.get(kind=AuditKind.PRESET_DELETED)
        assert deleted.model == "sim"

    def test_an_unchanged_file_removes_nothing(self, ini_file: Path) -> None:
        from models_app.presets import sources

        sources.import_preset_file(str(ini_file), io.StringIO())
        assert sources.reimport_preset_file(str(ini_file)) is False
        assert Preset.objects.count() == 2

    def test_a_broken_file_removes_nothing(self, ini_file: Path) -> None:
        from models_app.presets import sources

        sources.import_preset_file(str(ini_file), io.StringIO())
        ini_file.write_text("[gone-but-broken\n")
        with pytest.raises(IniError):
            sources.reimport_preset_file(str(ini_file))
        assert Preset.objects.count() == 2

    def test_a_hand_import_records_the_file_and_removes_nothing(self, ini_file: Path) -> None:
        Preset.objects.create(name="made-here")
        run("import_presets", str(ini_file))
        sim = Preset.objects.get(name="sim")
        assert (sim.source, sim.source_path) == ("import", str(ini_file.resolve()))
        assert Preset.objects.get(name="made-here").source == "panel"

    def test_the_models_dir_drops_a_model_whose_file_is_gone(self, tmp_path: Path) -> None:
        from models_app.presets import sources

        (tmp_path / "a.gguf").write_bytes(b"")
        (tmp_path / "b.gguf").write_bytes(b"")
        sources.import_models_dir(str(tmp_path))
        assert Preset.objects.get(name="a").source == "models_dir"
        (tmp_path / "b.gguf").unlink()
        sources.import_models_dir(str(tmp_path))
        assert list(Preset.objects.values_list("name", flat=True)) == ["a"]

    @staticmethod
    def _other_file(ini_file: Path) -> Path:
        other = ini_file.parent / "other.ini"
        other.write_text("[by-hand]\nmodel = /models/h.gguf\n")
        return other


class TestExport:
    def test_export_then_import_is_a_no_op(self, ini_file: Path, tmp_path: Path) -> None:
        run("import_presets", str(ini_file))
        before, global_before = snapshot(), RouterSettings.load().global_args
        out_file = tmp_path / "export.ini"
        run("export_presets", "-o", str(out_file))
        out, _ = run("import_presets", str(out_file), "--replace")
        assert "0 created, 0 updated, 2 unchanged" in out
        assert snapshot() == before
        assert RouterSettings.load().global_args == global_before

    def test_an_export_is_the_same_bytes_until_the_presets_change(
        self, ini_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import datetime

        from django.utils import timezone

        run("import_presets", str(ini_file))
        first, second = tmp_path / "1.ini", tmp_path / "2.ini"
        run("export_presets", "-o", str(first))
        later = timezone.now() + datetime.timedelta(days=400)
        monkeypatch.setattr(timezone, "now", lambda: later)  # a year on, another clock
        run("export_presets", "-o", str(second))
        assert first.read_bytes() == second.read_bytes()
        assert first.read_text().startswith("; RouterPanel presets (llama.cpp --models-preset")
        Preset.objects.filter(name="sim").update(ttl=1)
        run("export_presets", "-o", str(second))
        assert first.read_bytes() != second.read_bytes()

    def test_the_panel_exports_the_same_file_for_every_user(self, ini_file: Path) -> None:
        from django.contrib.auth import get_user_model
        from django.test import Client

        run("import_presets", str(ini_file))
        bodies = []
        for name in ("ada", "bob"):
            user = get_user_model().objects.create_superuser(name, password="pw-for-tests-1")
            client = Client()
            client.force_login(user)
            bodies.append(client.get("/presets/export/").content)
        assert bodies[0] == bodies[1]
        assert bodies[0] == export_presets().encode()

    def test_it_writes_to_standard_output(self, ini_file: Path) -> None:
        run("import_presets", str(ini_file))
        out, _ = run("export_presets")
        assert "[*]\nc = 8192\nstop-timeout = 5\n" in out
        assert "[org/gemma-GGUF:Q4_K_M]\nmodel = /models/gemma.gguf\nalias = g3,gemma\n" in out

    def test_llama_compatible_export_leaves_routerpanel_keys_out(self, ini_file: Path) -> None:
        run("import_presets", str(ini_file))
        out, err = run("export_presets", "--llama-compatible")
        assert "[sim]" not in out and "pinned" not in out and "server-bin" not in out
        assert "left out sim" in err
        assert export_presets(llama_compatible=True).count("[") == 2


class TestNodes:
    """The RouterPanel key ``node`` (issue 18): the nodes a preset may run on."""

    TEXT = "[a]\nmodel = /m/a.gguf\nnode = studio-2, studio-1\n[b]\nmodel = /m/b.gguf\n"

    def test_it_is_imported_sorted_and_exported_as_one_key(self) -> None:
        import_presets(self.TEXT)
        assert Preset.objects.get(name="a").nodes == "studio-1,studio-2"
        assert Preset.objects.get(name="b").nodes == ""  # any node
        out = export_presets()
        assert "[a]\nmodel = /m/a.gguf\nnode = studio-1,studio-2\n" in out
        assert "[b]\nmodel = /m/b.gguf\n" in out and out.count("node =") == 1
        assert "node" not in export_presets(llama_compatible=True)
        again = import_presets(out)
        assert (again.created, again.updated, again.unchanged) == ([], [], ["a", "b"])

    def test_a_changed_node_list_is_an_update_with_its_before_and_after(self) -> None:
        import_presets(self.TEXT)
        report = import_presets(self.TEXT.replace("studio-2, studio-1", "laptop"), dry_run=True)
        assert report.updated == ["a"]
        assert report.changes["a"] == {"nodes": ["studio-1,studio-2", "laptop"]}
        report = import_presets(self.TEXT.replace("node = studio-2, studio-1\n", ""))
        assert report.changes["a"] == {"nodes": ["studio-1,studio-2", ""]}
        event = AuditEvent.objects.filter(kind=AuditKind.PRESET_CHANGED).latest("pk")
        assert event.details["changes"] == {"nodes": ["studio-1,studio-2", ""]}

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("studio 1", "node name 'studio 1' may only use letters, digits"),
            ("a,a", "node 'a' is named twice"),
            ("a,,b", "a node name is empty"),
        ],
    )
    def test_a_malformed_value_names_its_line_and_imports_nothing(
        self, value: str, message: str
    ) -> None:
        with pytest.raises(IniError) as caught:
            import_presets(f"[ok]\nmodel = /m/ok.gguf\n[a]\nmodel = /m/a.gguf\nnode = {value}\n")
        assert caught.value.line == 5
        assert f"node = {value!r}: {message}" in str(caught.value)
        assert not Preset.objects.exists()
