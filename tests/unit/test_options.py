"""The table of llama-server options (build b11434) and its lookup (ROUTER_SPEC §11.C, §11.D)."""

from __future__ import annotations

import pytest

from routerpanel.router import options
from routerpanel.router.options import LlamaOption


def find(key: str) -> LlamaOption:
    found = options.lookup(key)
    assert found is not None, key
    return found[0]


def render_key(key: str, value: str) -> list[str]:
    """Store ``key = value`` as a preset would (11.12), then render it (11.16)."""
    found = options.lookup(key)
    assert found is not None, key
    option, negative = found
    return options.render(option, options.stored_value(option, negative, value))


class TestTable:
    def test_it_holds_every_option_of_this_build(self) -> None:
        assert len(options.all_options()) == 256

    def test_it_keeps_options_in_declared_order(self) -> None:
        firsts = [o.args[0] for o in options.all_options()]
        assert firsts[:3] == ["-h", "--version", "-cl"]
        assert firsts[-1] == "--spec-default"

    def test_it_gives_every_option_a_distinct_first_spelling(self) -> None:
        firsts = [o.sort_key for o in options.all_options()]
        assert len(set(firsts)) == len(firsts)

    def test_it_leaves_out_options_of_other_programs(self) -> None:
        for key in ("no-mmap", "mmap", "prompt", "p", "color", "display-prompt", "server-base"):
            assert options.lookup(key) is None, key

    def test_it_includes_server_only_options(self) -> None:
        for key in ("sleep-idle-seconds", "models-preset", "models-max", "load-mode", "np"):
            assert options.lookup(key) is not None, key

    def test_it_uses_the_server_branch_for_parallel(self) -> None:
        assert find("np").args == ("-np", "--parallel")
        assert find("np").env == "LLAMA_ARG_N_PARALLEL"

    def test_it_returns_the_same_object_on_every_call(self) -> None:
        assert options.all_options() is options.all_options()


class TestLookup:
    def test_it_finds_short_and_long_spellings_of_the_same_option(self) -> None:
        assert find("c") is find("ctx-size")
        assert find("ngl") is find("n-gpu-layers")
        assert find("hf") is find("hf-repo")

    def test_it_finds_env_names(self) -> None:
        assert find("LLAMA_ARG_CTX_SIZE") is find("c")
        assert find("LLAMA_API_KEY") is find("api-key")
        assert find("HF_TOKEN") is find("hf-token")
        assert find("MTMD_BACKEND_DEVICE") is find("mmproj-device")

    def test_it_marks_negative_spellings(self) -> None:
        assert options.lookup("no-warmup") == (find("warmup"), True)
        assert options.lookup("warmup") == (find("warmup"), False)
        assert options.lookup("nkvo") == (find("kv-offload"), True)

    def test_it_finds_every_negative_spelling_of_an_option(self) -> None:
        assert options.lookup("no-mmproj") == (find("mmproj-auto"), True)
        assert options.lookup("no-mmproj-auto") == (find("mmproj-auto"), True)

    def test_it_does_not_invert_the_derived_negative_env_name(self) -> None:
        assert options.lookup("LLAMA_ARG_NO_ENDPOINT_SLOTS") == (find("slots"), False)
        assert options.lookup("LLAMA_ARG_ENDPOINT_SLOTS") == (find("slots"), False)

    def test_it_derives_no_negative_env_name_without_a_negative_form(self) -> None:
        assert find("c").env_neg is None
        assert options.lookup("LLAMA_ARG_NO_CTX_SIZE") is None

    def test_it_derives_no_negative_env_name_without_an_env_name(self) -> None:
        assert find("warmup").env is None
        assert options.lookup("LLAMA_ARG_NO_WARMUP") is None

    def test_it_rejects_unknown_keys(self) -> None:
        for key in ("foo", "", "-c", "--ctx-size", "CTX-SIZE", "llama_arg_ctx_size"):
            assert options.lookup(key) is None, key

    def test_it_does_not_know_preset_only_keys(self) -> None:
        for key in ("load-on-startup", "stop-timeout", "dedup-cache-models"):
            assert options.lookup(key) is None, key
        for key in ("__PRESET_LOAD_ON_STARTUP", "__PRESET_STOP_TIMEOUT"):
            assert options.lookup(key) is None, key

    def test_it_knows_version_which_the_ini_parser_must_skip_first(self) -> None:
        # Rule 11.6 drops `version` before lookup; the table itself has --version.
        assert find("version").args == ("--version",)

    def test_it_finds_every_spelling_and_env_name_of_every_option(self) -> None:
        for option in options.all_options():
            keys = [s.lstrip("-") for s in option.args + option.args_neg]
            keys += [e for e in (option.env, option.env_neg) if e is not None]
            for key in keys:
                assert find(key) is option, key


class TestKeyAndSortKey:
    def test_it_names_an_option_by_its_last_spelling(self) -> None:
        assert find("c").key == "ctx-size"
        assert find("temp").key == "temperature"
        assert find("spec-draft-hf").key == "hf-repo-draft"
        assert find("ui-config").key == "webui-config"
        assert find("no-warmup").key == "warmup"

    def test_it_sorts_by_the_first_spelling_as_bytes(self) -> None:
        keys = ["hf", "c", "a", "temp", "port", "host"]
        ordered = sorted((find(k) for k in keys), key=lambda o: o.sort_key)
        assert [o.args[0] for o in ordered] == ["--host", "--port", "--temp", "-a", "-c", "-hf"]

    def test_it_sorts_upper_case_short_spellings_before_lower_case(self) -> None:
        assert find("C").sort_key < find("c").sort_key

    def test_it_orders_the_verified_child_argv(self) -> None:
        # ROUTER_SPEC 16.2: the router's rendering of one preset, in order.
        preset = {
            "model": "/m.gguf",
            "c": "384",
            "a": "aliased",
            "no-warmup": "1",
            "temp": "0.5",
            "tags": "t2,t1",
            "no-slots": "1",
            "port": "50013",
            "offline": "1",
            "log-colors": "off",
            "np": "1",
            "host": "127.0.0.1",
        }
        stored = {
            find(k): options.stored_value(find(k), k.startswith("no-"), v)
            for k, v in preset.items()
        }
        argv = [
            a
            for o in sorted(stored, key=lambda o: o.sort_key)
            for a in options.render(o, stored[o])
        ]
        assert " ".join(argv) == (
            "--host 127.0.0.1 --log-colors off --offline --port 50013 --no-slots --tags t2,t1"
            " --temperature 0.5 --no-warmup --alias aliased --ctx-size 384 --model /m.gguf"
            " --parallel 1"
        )


class TestBooleans:
    @pytest.mark.parametrize("value", ["on", "enabled", "true", "1"])
    def test_it_accepts_exactly_the_truthy_words(self, value: str) -> None:
        assert options.is_truthy(value)
        assert not options.is_falsey(value)

    @pytest.mark.parametrize("value", ["off", "disabled", "false", "0"])
    def test_it_accepts_exactly_the_falsey_words(self, value: str) -> None:
        assert options.is_falsey(value)
        assert not options.is_truthy(value)

    @pytest.mark.parametrize("value", ["yes", "no", "True", "ON", " 1", "", "auto", "-1"])
    def test_it_treats_other_words_as_neither(self, value: str) -> None:
        assert not options.is_truthy(value)
        assert not options.is_falsey(value)


class TestStoredValue:
    def test_it_inverts_a_truthy_value_given_to_a_negative_spelling(self) -> None:
        assert options.stored_value(find("warmup"), True, "1") == "false"

    def test_it_stores_true_for_any_other_value_given_to_a_negative_spelling(self) -> None:
        for value in ("0", "yes", "no", ""):
            assert options.stored_value(find("warmup"), True, value) == "true"

    def test_it_stores_positive_spellings_as_written(self) -> None:
        assert options.stored_value(find("warmup"), False, "no") == "no"
        assert options.stored_value(find("c"), False, "8192") == "8192"


class TestRender:
    def test_it_renders_a_valued_option_with_its_last_spelling(self) -> None:
        assert render_key("c", "8192") == ["--ctx-size", "8192"]
        assert render_key("temp", "0") == ["--temperature", "0"]
        assert render_key("LLAMA_ARG_CTX_SIZE", "off") == ["--ctx-size", "off"]

    def test_it_renders_a_truthy_negative_key_as_the_negative_flag(self) -> None:
        assert render_key("no-warmup", "1") == ["--no-warmup"]

    def test_it_renders_yes_and_no_as_not_falsey(self) -> None:
        assert render_key("jinja", "no") == ["--jinja"]
        assert render_key("no-warmup", "yes") == ["--warmup"]

    def test_it_renders_a_falsey_flag_with_its_last_negative_spelling(self) -> None:
        assert render_key("kv-offload", "0") == ["--no-kv-offload"]
        assert render_key("mmproj-auto", "off") == ["--no-mmproj-auto"]

    def test_it_renders_the_negative_env_name_as_enabling(self) -> None:
        assert render_key("LLAMA_ARG_NO_ENDPOINT_SLOTS", "1") == ["--slots"]

    def test_it_omits_a_falsey_flag_without_a_negative_form(self) -> None:
        assert render_key("offline", "0") == []
        assert render_key("offline", "1") == ["--offline"]

    def test_it_refuses_an_option_with_two_values(self) -> None:
        option = find("control-vector-layer-range")
        assert option.takes_two_values
        with pytest.raises(ValueError, match="control-vector-layer-range"):
            options.render(option, "1 2")
