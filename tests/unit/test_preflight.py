"""What the router checks before a load takes a slot (routerpanel/router/preflight.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from routerpanel.router import preflight
from routerpanel.router.config import PresetSpec


def spec(program: str, *files: tuple[str, str], **kw: object) -> PresetSpec:
    return PresetSpec(name="qwen2.5-7b", argv=(program, "--ctx-size", "512"), files=files, **kw)  # type: ignore[arg-type]


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "qwen.gguf"
    path.write_bytes(b"GGUF")
    return path


class TestTheProgram:
    def test_a_missing_path_is_named_with_the_preset(self, tmp_path: Path) -> None:
        missing = tmp_path / "opt" / "llama-server"
        assert preflight.check(spec(str(missing))) == (
            f"llama-server not found: {missing} (preset qwen2.5-7b)"
        )

    def test_a_name_is_looked_up_on_the_child_s_own_path(
        self, program: Path, tmp_path: Path
    ) -> None:
        elsewhere = spec("llama-server", env=(("PATH", str(tmp_path)),))
        assert preflight.check(elsewhere) == "llama-server not found on PATH (preset qwen2.5-7b)"
        on_its_path = spec("llama-server", env=(("PATH", str(program.parent)),))
        assert preflight.check(on_its_path) is None

    def test_a_file_that_is_not_executable_is_named(self, program: Path) -> None:
        program.chmod(0o644)
        assert preflight.check(spec(str(program))) == (
            f"llama-server is not an executable file: {program} (preset qwen2.5-7b)"
        )

    def test_a_directory_is_not_a_program(self, program: Path) -> None:
        assert preflight.check(spec(str(program.parent))) == (
            f"bin is not an executable file: {program.parent} (preset qwen2.5-7b)"
        )


class TestTheFiles:
    def test_a_present_model_and_program_pass(self, program: Path, model: Path) -> None:
        assert preflight.check(spec(str(program), ("model", str(model)))) is None

    def test_a_missing_model_file_is_named(self, program: Path, tmp_path: Path) -> None:
        gone = tmp_path / "gone.gguf"
        assert preflight.check(spec(str(program), ("model", str(gone)))) == (
            f"model file not found: {gone} (preset qwen2.5-7b)"
        )

    def test_a_missing_mmproj_after_a_good_model_is_named(
        self, program: Path, model: Path, tmp_path: Path
    ) -> None:
        gone = tmp_path / "mmproj.gguf"
        files = (("model", str(model)), ("mmproj", str(gone)))
        assert preflight.check(spec(str(program), *files)) == (
            f"mmproj file not found: {gone} (preset qwen2.5-7b)"
        )

    def test_an_unreadable_model_is_named(
        self, program: Path, model: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # As another user would find it (root reads every file, so mode 000 would not show it).
        real = os.access
        monkeypatch.setattr(
            preflight.os, "access", lambda p, mode: mode != os.R_OK and real(p, mode)
        )
        assert preflight.check(spec(str(program), ("model", str(model)))) == (
            f"model file is not readable: {model} (preset qwen2.5-7b)"
        )

    def test_a_directory_is_not_a_model_file(self, program: Path, tmp_path: Path) -> None:
        assert preflight.check(spec(str(program), ("model", str(tmp_path)))) == (
            f"model file is a directory: {tmp_path} (preset qwen2.5-7b)"
        )

    def test_the_adapter_s_problem_comes_first(self, program: Path) -> None:
        problem = "option 'fit-budget' is not accepted by llama-server (preset qwen2.5-7b)"
        assert preflight.check(spec(str(program), problem=problem)) == problem


def test_input_files_are_found_by_any_spelling() -> None:
    pairs = [("m", "/a.gguf"), ("ctx-size", "512"), ("-md", "/d.gguf"), ("mmproj", "/p.gguf")]
    assert preflight.input_files(pairs) == (
        ("model", "/a.gguf"),
        ("model-draft", "/d.gguf"),
        ("mmproj", "/p.gguf"),
    )
