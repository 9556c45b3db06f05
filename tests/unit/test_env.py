"""Settings helpers fail loudly on values that do not parse (STYLE 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from routerpanel.env import (
    EnvError,
    envbool,
    envchoice,
    envfloat,
    envint,
    envlist,
    envpath,
    envstr,
    secret_key_from,
    split_list,
)


class TestEnvbool:
    def test_it_reads_true_and_false_in_any_case(self) -> None:
        assert envbool("X", False, {"X": "TRUE"}) is True
        assert envbool("X", True, {"X": "false"}) is False
        assert envbool("X", True, {"X": "0"}) is False

    def test_it_uses_the_default_when_unset_or_blank(self) -> None:
        assert envbool("X", True, {}) is True
        assert envbool("X", False, {"X": "  "}) is False

    def test_it_raises_on_junk_and_names_the_variable(self) -> None:
        with pytest.raises(EnvError, match="DEBUG='maybe' is not a boolean"):
            envbool("DEBUG", False, {"DEBUG": "maybe"})


class TestEnvchoice:
    def test_it_reads_a_choice_in_any_case_or_the_default(self) -> None:
        assert envchoice("VIA", ("auto", "tcp"), "auto", {"VIA": " TCP "}) == "tcp"
        assert envchoice("VIA", ("auto", "tcp"), "auto", {}) == "auto"

    def test_it_names_the_choices_for_anything_else(self) -> None:
        with pytest.raises(EnvError, match="VIA='udp' is not one of auto, tcp"):
            envchoice("VIA", ("auto", "tcp"), "auto", {"VIA": "udp"})


class TestEnvint:
    def test_it_reads_integers(self) -> None:
        assert envint("N", 4, {"N": " 12 "}) == 12

    def test_it_raises_on_junk(self) -> None:
        with pytest.raises(EnvError, match="N='4x' is not an integer"):
            envint("N", 4, {"N": "4x"})

    def test_it_raises_below_the_minimum(self) -> None:
        with pytest.raises(EnvError, match="must be at least 0"):
            envint("N", 4, {"N": "-1"}, minimum=0)

    def test_an_unset_variable_may_mean_none(self) -> None:
        assert envint("N", None, {}) is None
        assert envint("N", None, {"N": "0"}) == 0


class TestEnvfloat:
    def test_it_reads_numbers_and_defaults(self) -> None:
        assert envfloat("T", 30.0, {"T": "2.5"}) == 2.5
        assert envfloat("T", 30.0, {}) == 30.0

    @pytest.mark.parametrize("junk", ["abc", "nan", "inf", "-1"])
    def test_it_raises_on_junk_non_finite_or_negative(self, junk: str) -> None:
        with pytest.raises(EnvError, match=f"T={junk}|T='{junk}'"):
            envfloat("T", 30.0, {"T": junk})


def test_llama_cpp_booleans_are_understood() -> None:
    assert envbool("B", True, {"B": "disabled"}) is False
    assert envbool("B", False, {"B": "enabled"}) is True


def test_split_list_reads_a_command_line_list() -> None:
    assert split_list(" k1, ,k2,") == ["k1", "k2"] and split_list(None) == []


def test_envlist_drops_blanks() -> None:
    assert envlist("H", ["a"], {"H": "x, ,y,"}) == ["x", "y"]
    assert envlist("H", ["a"], {}) == ["a"]


def test_envstr_and_envpath_use_defaults(tmp_path: Path) -> None:
    assert envstr("S", "d", {}) == "d"
    assert envpath("P", tmp_path, {}) == tmp_path.resolve()
    assert envpath("P", tmp_path, {"P": str(tmp_path / "x")}) == (tmp_path / "x").resolve()


class TestSecretKey:
    def test_it_generates_a_key_once_and_keeps_it_private(self, tmp_path: Path) -> None:
        first = secret_key_from(tmp_path, {})
        assert len(first) >= 50
        assert secret_key_from(tmp_path, {}) == first
        assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600

    def test_it_prefers_the_environment(self, tmp_path: Path) -> None:
        assert secret_key_from(tmp_path, {"SECRET_KEY": "given"}) == "given"
        assert not (tmp_path / "secret_key").exists()
