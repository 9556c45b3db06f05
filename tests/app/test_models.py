"""Preset and RouterSettings validation matches what llama.cpp accepts, with clear field errors."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from models_app.models import Preset, RouterSettings

pytestmark = pytest.mark.django_db


def errors_of(preset: Preset) -> dict[str, list[str]]:
    try:
        preset.full_clean()
    except ValidationError as exc:
        return exc.message_dict
    return {}


class TestPresetValidation:
    @pytest.mark.parametrize(
        "name", ["org/name:Q4_K_M", "ggml-org/gemma-3-4b-it-GGUF:Q8_0", "custom", "Qwen 7B", "a:2"]
    )
    def test_it_accepts_model_ids_llama_cpp_accepts(self, name: str) -> None:
        assert errors_of(Preset(name=name)) == {}

    def test_a_lower_case_tag_gets_the_canonical_spelling_in_the_error(self) -> None:
        assert errors_of(Preset(name="org/name:q4_k_m"))["name"] == [
            "llama.cpp spells the tag after ':' in upper case: use 'org/name:Q4_K_M'."
        ]

    @pytest.mark.parametrize(
        ("name", "message"),
        [
            ("*", "'*' is the global section"),
            ("a]b", "cannot contain ']'"),
            (" pad", "cannot start or end with blanks"),
            ("tab\tin", "control characters"),
        ],
    )
    def test_it_rejects_ids_that_cannot_be_a_section(self, name: str, message: str) -> None:
        assert message in " ".join(errors_of(Preset(name=name))["name"])

    def test_stop_timeout_must_not_be_negative(self) -> None:
        assert "stop_timeout" in errors_of(Preset(name="m", stop_timeout=-1))

    def test_stop_timeout_defaults_to_inherit(self) -> None:
        assert Preset(name="m").stop_timeout is None

    def test_unknown_llama_options_are_a_field_error(self) -> None:
        errors = errors_of(Preset(name="m", args=[["ctx-size", "8192"], ["no-mmap", "1"]]))
        assert errors["args"] == [
            "llama-server has no option 'no-mmap'. Use an option name without dashes, "
            "such as ctx-size, n-gpu-layers or temp."
        ]

    def test_a_preset_with_its_own_server_bin_may_use_any_option(self) -> None:
        preset = Preset(name="m", server_bin="python -m sim", args=[["sim-load-ms", "5"]])
        assert errors_of(preset) == {}

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ([["c", "a;b"]], "cannot contain ';'"),
            ([["c", "1"], ["c", "2"]], "given twice"),
            ([["stop-timeout", "3"]], "has its own field"),
            ([["alias", "x"]], "has its own field (alias)"),
            ([["m", "/x.gguf"]], "has its own field (model)"),
            ([["env.X", "1"]], "has its own field"),
            ([["-c", "1"]], "keys start with a letter"),
            ("c=1", "Expected a list"),
        ],
    )
    def test_bad_options_name_the_problem(self, args: object, message: str) -> None:
        assert message in " ".join(errors_of(Preset(name="m", args=args))["args"])

    def test_server_bin_must_split_like_a_shell_command(self) -> None:
        assert "No closing quotation" in " ".join(
            errors_of(Preset(name="m", server_bin="sim 'x"))["server_bin"]
        )

    def test_env_names_are_checked(self) -> None:
        assert "env" in errors_of(Preset(name="m", env=[["1X", "v"]]))

    def test_names_are_unique(self) -> None:
        Preset.objects.create(name="m")
        assert "name" in errors_of(Preset(name="m"))


class TestRouterSettings:
    def test_it_has_one_row_with_the_documented_defaults(self) -> None:
        row = RouterSettings.load()
        assert (row.models_max, row.default_stop_timeout) == (4, 10)
        RouterSettings(models_max=2).save()
        assert RouterSettings.objects.count() == 1
        assert RouterSettings.load().models_max == 2

    def test_models_max_zero_means_unlimited_and_negative_is_rejected(self) -> None:
        row = RouterSettings.load()
        row.models_max = 0
        row.full_clean()
        row.models_max = -1
        with pytest.raises(ValidationError) as caught:
            row.full_clean()
        assert "models_max" in caught.value.message_dict

    def test_a_bad_global_option_is_a_field_error(self) -> None:
        row = RouterSettings.load()
        row.global_args = [["bogus", "1"]]
        with pytest.raises(ValidationError) as caught:
            row.full_clean()
        assert "option 'bogus' not recognized" in caught.value.message_dict["global_args"][0]

    def test_it_cannot_be_deleted(self) -> None:
        with pytest.raises(ValidationError):
            RouterSettings.load().delete()
