"""Reading a server program's options from its --help text (preset keys are checked against it)."""

from __future__ import annotations

from pathlib import Path

from routerpanel.router import helptext, options

B11434_HELP = Path(__file__).resolve().parents[1] / "fixtures/llama-server-b11434-help.txt"

SIMSERVER_STYLE = """usage: python -m routerpanel.router.simserver [flags]

A simulated llama-server.

  --host VALUE                   address to listen on (default 127.0.0.1)
  -m, --model VALUE              model path
  --slots                        enable GET /slots (the default)
  --no-slots                     disable GET /slots
  --sim-crash-after VALUE        exit 3 after N completions
"""


def fields(option: options.LlamaOption) -> tuple[object, ...]:
    return (option.args, option.args_neg, option.env, option.takes_value, option.takes_two_values)


class TestLlamaServerHelp:
    def test_b11434s_help_gives_exactly_the_built_in_table(self) -> None:
        # The fixture is `llama-server --help` of the real b11434 build; the built-in table was
        # generated from its source. Both must agree option by option (--help prints them in
        # groups, the table in declared order).
        table = helptext.parse_help(B11434_HELP.read_text(), "llama-server")
        assert table is not None
        builtin = options.builtin()
        assert len(table.options) == len(builtin.options) == 256
        assert sorted(map(fields, table.options)) == sorted(map(fields, builtin.options))
        assert set(table.by_key) == set(builtin.by_key)

    def test_it_reads_env_names_from_the_description(self) -> None:
        text = (
            "-c,    --ctx-size N                     size of the prompt context\n"
            "                                        (env: LLAMA_ARG_CTX_SIZE)\n"
        )
        table = helptext.parse_help(text, "x")
        assert table is not None
        assert table.lookup("LLAMA_ARG_CTX_SIZE") == (table.options[0], False)

    def test_negative_spellings_follow_the_positive_ones(self) -> None:
        text = "-kvo,  --kv-offload, -nkvo, --no-kv-offload   whether to offload\n"
        table = helptext.parse_help(text, "x")
        assert table is not None
        (option,) = table.options
        assert option.args == ("-kvo", "--kv-offload")
        assert option.args_neg == ("-nkvo", "--no-kv-offload")
        assert table.lookup("nkvo") == (option, True)

    def test_a_no_flag_without_its_positive_is_a_flag_of_its_own(self) -> None:
        table = helptext.parse_help("--no-host                               no host\n", "x")
        assert table is not None
        assert fields(table.options[0]) == (("--no-host",), (), None, False, False)

    def test_a_description_line_starting_with_a_dash_is_not_an_option(self) -> None:
        text = (
            "--prio N                                set priority:\n"
            "                                        -1 = low, 0 = normal\n"
        )
        table = helptext.parse_help(text, "x")
        assert table is not None
        assert [o.args for o in table.options] == [("--prio",)]


class TestOtherPrograms:
    def test_it_reads_indented_help_like_the_simulated_servers(self) -> None:
        table = helptext.parse_help(SIMSERVER_STYLE, "sim")
        assert table is not None
        assert [o.args for o in table.options] == [
            ("--host",),
            ("-m", "--model"),
            ("--slots",),
            ("--no-slots",),
            ("--sim-crash-after",),
        ]
        assert table.lookup("sim-crash-after") is not None
        assert table.lookup("m") == (table.options[1], False)
        assert table.origin == "sim"

    def test_a_text_without_options_is_not_a_help_text(self) -> None:
        assert helptext.parse_help("Segmentation fault\n", "x") is None
        assert helptext.parse_help("", "x") is None
