"""What preset keys mean: llama-server options, router keys and RouterPanel keys (§11.C)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routerpanel.router import helptext, ini, options, presets
from routerpanel.router.presets import PresetDef, parse_presets, render_presets

WORKED_EXAMPLE = """version = 1
[*]
c = 8192
n-gpu-layers = 8
stop-timeout = 5

[ggml-org/gemma-3-4b-it-GGUF:q4_k_m]   ; canonicalized to ...:Q4_K_M
jinja = true
no-warmup = 1
alias = gemma,g3
load-on-startup = true

[custom]
model = /models/custom-Q4_K_M.gguf
sleep-idle-seconds = 300
"""


class TestLlamaKeys:
    def test_it_reads_the_worked_example(self) -> None:
        parsed = parse_presets(WORKED_EXAMPLE)
        assert parsed.global_def == PresetDef(
            name="*", args=(("c", "8192"), ("n-gpu-layers", "8")), stop_timeout=5
        )
        gemma, custom = parsed.presets
        assert gemma == PresetDef(
            name="ggml-org/gemma-3-4b-it-GGUF:Q4_K_M",
            aliases=("g3", "gemma"),
            args=(("jinja", "true"), ("no-warmup", "1")),
            load_on_startup=True,
        )
        assert custom.model_path == "/models/custom-Q4_K_M.gguf"
        assert custom.args == (("sleep-idle-seconds", "300"),)

    @pytest.mark.parametrize(
        "key", ["c", "ctx-size", "LLAMA_ARG_CTX_SIZE", "no-warmup", "hf", "hf-repo", "temp", "ngl"]
    )
    def test_it_accepts_every_spelling_llama_cpp_accepts(self, key: str) -> None:
        assert parse_presets(f"[m]\n{key} = 1\n").presets[0].args == ((key, "1"),)

    def test_model_and_alias_spellings_fill_their_own_fields(self) -> None:
        parsed = parse_presets("[m]\nm = /a.gguf\na = x, y,,x\n[n]\nLLAMA_ARG_MODEL = /b.gguf\n")
        assert parsed.presets[0].model_path == "/a.gguf"
        assert parsed.presets[0].aliases == ("x", "y")
        assert parsed.presets[1].model_path == "/b.gguf"

    def test_an_unknown_key_is_rejected_with_llama_cpps_message_and_the_line(self) -> None:
        with pytest.raises(ini.IniError) as caught:
            parse_presets("[m]\nc = 1\nno-mmap = 1\n", source="x.ini")
        assert str(caught.value) == "x.ini:3: option 'no-mmap' not recognized in preset 'm'"

    def test_keys_are_case_sensitive(self) -> None:
        with pytest.raises(ini.IniError, match="option 'CTX-SIZE' not recognized"):
            parse_presets("[m]\nCTX-SIZE = 1\n")

    def test_a_program_whose_options_are_unknown_gets_its_keys_unchecked_with_a_warning(
        self,
    ) -> None:
        text = "[sim]\nserver-bin = python -m routerpanel.router.simserver\nsim-load-ms = 200\n"
        parsed = parse_presets(text)
        preset = parsed.presets[0]
        assert preset.server_bin == "python -m routerpanel.router.simserver"
        assert preset.args == (("sim-load-ms", "200"),)
        assert [w.line for w in parsed.warnings] == [3]
        assert "option 'sim-load-ms' in preset 'sim' is not checked" in str(parsed.warnings[0])

    def test_the_global_section_is_checked_too(self) -> None:
        with pytest.raises(ini.IniError, match=r":2: option 'bogus' not recognized in preset '\*'"):
            parse_presets("[*]\nbogus = 1\n")


SIM = "python -m routerpanel.router.simserver"
SIM_TABLE = helptext.parse_help("  -m, --model VALUE   path\n  --sim-load-ms VALUE   ms\n", SIM)
# A newer llama-server: b11434's options plus one it does not know.
NEWER_TABLE = options.OptionTable.of(
    [
        *options.builtin().options,
        options.LlamaOption(("--fit-budget",), (), "LLAMA_ARG_FIT_BUDGET", True, False),
        options.LlamaOption(("--turbo",), ("--no-turbo",), None, False, False),
    ],
    "/opt/llama-new/llama-server",
)


def resolver(**tables: options.Catalogue) -> presets.Resolver:
    """Programs by command; anything else is unreadable."""
    known = {"llama-server": options.builtin(), SIM: SIM_TABLE, **tables}
    return lambda program: known.get(program) or options.Unreadable(program, "not found")


class TestProgramOptions:
    """Keys are checked against the program that runs the preset (ROUTER_SPEC 11.10)."""

    def test_a_server_bin_in_the_global_section_is_inherited_by_key_checks(self) -> None:
        text = f"[*]\nserver-bin = {SIM}\n[a]\nsim-load-ms = 5\n"
        parsed = parse_presets(text, options_for=resolver())
        assert parsed.presets[0].args == (("sim-load-ms", "5"),)
        assert parsed.warnings == []

    def test_a_key_the_program_does_not_list_is_rejected_naming_the_program(self) -> None:
        text = f"[*]\nserver-bin = {SIM}\n[a]\nsim-load-ms = 5\nn-gpu-layers = 99\n"
        with pytest.raises(ini.IniError) as caught:
            parse_presets(text, source="m.ini", options_for=resolver())
        assert str(caught.value) == (
            f"m.ini:5: option 'n-gpu-layers' not recognized in preset 'a' ('{SIM} --help' "
            "does not list it)"
        )

    def test_a_section_server_bin_wins_over_the_global_one(self) -> None:
        text = f"[*]\nserver-bin = {SIM}\n[a]\nserver-bin = llama-server\nsim-load-ms = 5\n"
        with pytest.raises(ini.IniError, match="option 'sim-load-ms' not recognized in preset 'a'"):
            parse_presets(text, options_for=resolver())

    def test_the_default_program_is_the_one_given(self) -> None:
        text = "[a]\nfit-budget = 3\n"
        with pytest.raises(ini.IniError, match="option 'fit-budget' not recognized"):
            parse_presets(text, options_for=resolver())
        newer = resolver(newer=NEWER_TABLE)
        assert parse_presets(text, default_bin="newer", options_for=newer).presets[0].args == (
            ("fit-budget", "3"),
        )

    def test_the_global_section_is_checked_against_its_own_program(self) -> None:
        text = f"[*]\nserver-bin = {SIM}\nsim-load-ms = 1\n"
        parsed = parse_presets(text, options_for=resolver())
        assert parsed.global_def is not None
        assert parsed.global_def.args == (("sim-load-ms", "1"),)
        unknown = r"option 'sim-load-ms' not recognized in preset '\*'"
        with pytest.raises(ini.IniError, match=unknown):
            parse_presets("[*]\nsim-load-ms = 1\n", options_for=resolver())

    def test_an_unreadable_program_accepts_unknown_keys_with_a_warning_naming_the_line(
        self,
    ) -> None:
        text = "[*]\nserver-bin = /opt/fork/server\n[a]\nc = 512\nfit-budget = 3\n"
        parsed = parse_presets(text, options_for=resolver())
        assert parsed.presets[0].args == (("c", "512"), ("fit-budget", "3"))
        (warning,) = parsed.warnings
        assert warning.line == 5
        assert "the options of '/opt/fork/server' could not be read (not found)" in warning.message

    def test_a_newer_programs_options_render_with_its_own_table(self) -> None:
        preset = PresetDef(
            name="m",
            args=(("LLAMA_ARG_FIT_BUDGET", "3"), ("no-turbo", "1"), ("c", "512")),
        )
        argv = presets.render_argv(preset, None, "llama-server", NEWER_TABLE)
        assert argv == (
            "llama-server",
            "--fit-budget",
            "3",
            "--log-colors",
            "off",
            "--no-turbo",
            "--alias",
            "m",
            "--ctx-size",
            "512",
        )

    def test_keys_no_table_knows_follow_as_flags_in_file_order(self) -> None:
        preset = PresetDef(name="m", args=(("zeta", "1"), ("alpha", ""), ("c", "512")))
        argv = presets.render_argv(preset, None, "/opt/fork/server")
        assert argv[-3:] == ("--zeta", "1", "--alpha")


class TestRouterFlagsInAPresetFile:
    """llama.cpp drops its router's own flags from a preset file (11.15); we warn (issue 20)."""

    @pytest.mark.parametrize(
        ("key", "home"),
        [
            ("models-max", "serve --models-max N, or max running models in the panel's settings"),
            ("LLAMA_ARG_MODELS_MAX", "serve --models-max N"),
            ("api-key", "serve --api-key K"),
            ("models-dir", "serve --models-dir DIR"),
            ("no-models-autoload", "serve --no-models-autoload"),
            ("port", "nothing: the router gives every child its own port"),
        ],
    )
    def test_it_warns_naming_the_line_and_where_the_value_belongs(
        self, key: str, home: str
    ) -> None:
        parsed = parse_presets(f"[*]\nc = 1\n{key} = 1\n")
        (warning,) = parsed.warnings
        assert warning.line == 3
        assert f"'{key}' in preset '*' is ignored, as llama.cpp ignores it" in warning.message
        assert home in warning.message

    def test_the_value_changes_nothing_the_child_runs_with(self) -> None:
        parsed = parse_presets("[m]\nmodels-max = 1\nc = 1\n")
        argv = presets.render_argv(parsed.presets[0], None, "llama-server")
        assert "--models-max" not in argv and "1" in argv


class TestRouterKeys:
    @pytest.mark.parametrize(
        ("value", "expected", "warns"),
        [
            ("15", 15, False),
            ("15s", 15, True),
            (" +7", 7, False),
            ("abc", 10, True),
            ("-3", 0, True),
        ],
    )
    def test_stop_timeout_is_read_like_c_stoi(self, value: str, expected: int, warns: bool) -> None:
        parsed = parse_presets(f"[m]\nstop-timeout = {value}\n")
        assert parsed.presets[0].stop_timeout == expected
        assert bool(parsed.warnings) is warns

    def test_router_keys_may_use_llama_cpps_pseudo_env_names(self) -> None:
        text = "[m]\n__PRESET_STOP_TIMEOUT = 3\n__PRESET_LOAD_ON_STARTUP = 1\n"
        preset = parse_presets(text).presets[0]
        assert (preset.stop_timeout, preset.load_on_startup) == (3, True)

    def test_load_on_startup_accepts_only_llama_truthy_words(self) -> None:
        parsed = parse_presets("[a]\nload-on-startup = on\n[b]\nload-on-startup = yes\n")
        assert [p.load_on_startup for p in parsed.presets] == [True, False]
        assert "counts as false" in str(parsed.warnings[0])

    def test_routerpanel_keys_are_read_into_fields(self) -> None:
        text = (
            "[m]\npinned = true\nttl = 300\nload-timeout = 60\nmemory = 8G\nenabled = off\n"
            "env.CUDA_VISIBLE_DEVICES = 0\nhang-timeout = 2.5\n"
        )
        preset = parse_presets(text).presets[0]
        assert (preset.pinned, preset.ttl, preset.load_timeout) == (True, 300, 60)
        assert preset.hang_timeout == 2.5
        assert preset.memory == 8 << 30
        assert preset.enabled is False
        assert preset.env == (("CUDA_VISIBLE_DEVICES", "0"),)

    def test_node_names_the_nodes_a_preset_may_run_on_sorted(self) -> None:
        text = "[m]\nnode = studio-2, studio-1\n[any]\nnode =\n[unset]\nc = 1\n"
        assert [p.nodes for p in parse_presets(text).presets] == [
            ("studio-1", "studio-2"),
            (),
            (),
        ]

    def test_node_is_not_allowed_in_the_global_section(self) -> None:
        with pytest.raises(ini.IniError) as caught:
            parse_presets("[*]\nc = 1\nnode = studio-1\n[m]\nc = 2\n")
        assert caught.value.line == 3
        assert "in [*]: name the nodes in each model's section" in str(caught.value)

    @pytest.mark.parametrize(
        ("line", "message"),
        [
            ("node = studio 1", "node = 'studio 1': node name 'studio 1' may only use letters"),
            ("node = a,,b", "node = 'a,,b': a node name is empty"),
            ("node = a, b, a", "node = 'a, b, a': node 'a' is named twice"),
            ("node = a/b", "node name 'a/b' may only use"),
            ("pinned = maybe", "pinned = 'maybe': use true or false"),
            ("ttl = -1", "ttl = '-1': expected a whole number"),
            ("load-timeout = 1.5", "expected a whole number"),
            ("hang-timeout = -1", "hang-timeout = '-1': expected a number of seconds"),
            ("hang-timeout = soon", "hang-timeout = 'soon': expected a number of seconds"),
            ("hang-timeout = nan", "expected a number of seconds"),
            ("hang-timeout = 1e3", "expected a number of seconds"),
            ("memory = lots", "memory = 'lots': expected a size"),
            ("server-bin = 'unclosed", "No closing quotation"),
            ("env.1BAD = x", "environment variable names"),
        ],
    )
    def test_bad_routerpanel_values_name_the_line(self, line: str, message: str) -> None:
        with pytest.raises(ini.IniError) as caught:
            parse_presets(f"[m]\nc = 1\n{line}\n")
        assert caught.value.line == 3
        assert message in str(caught.value)

    @pytest.mark.parametrize(
        ("text", "size"),
        [("1073741824", 1 << 30), ("512M", 512 << 20), ("512MiB", 512 << 20), ("1.5G", 3 << 29)],
    )
    def test_sizes_use_binary_units(self, text: str, size: int) -> None:
        assert presets.parse_size(text) == size

    def test_sizes_are_written_in_the_largest_exact_unit(self) -> None:
        assert presets.format_size(8 << 30) == "8G"
        assert presets.format_size(1536 << 20) == "1536M"
        assert presets.format_size(1000) == "1000"


class TestAliases:
    def test_an_alias_equal_to_another_model_name_is_rejected(self) -> None:
        with pytest.raises(ini.IniError, match="alias 'b' for model 'a' conflicts with existing"):
            parse_presets("[a]\nalias = b\n[b]\n")

    def test_an_alias_shared_by_two_models_is_rejected(self) -> None:
        with pytest.raises(ini.IniError, match="alias 'x' for model 'b' conflicts with alias of"):
            parse_presets("[a]\nalias = x\n[b]\nalias = x\n")


class TestRender:
    def test_the_worked_example_round_trips(self) -> None:
        first = parse_presets(WORKED_EXAMPLE)
        text = render_presets(first.global_def, first.presets)
        again = parse_presets(text)
        assert (again.global_def, again.presets) == (first.global_def, first.presets)

    def test_llama_compatible_output_leaves_routerpanel_keys_and_programs_out(self) -> None:
        text = (
            "[a]\nc = 1\npinned = true\nttl = 5\nmemory = 1G\nenv.X = 1\nstop-timeout = 3\n"
            "node = s1\n[sim]\nserver-bin = python -m x\nfoo = 1\n[off]\nenabled = false\n"
        )
        parsed = parse_presets(text)
        out = render_presets(parsed.global_def, parsed.presets, llama_compatible=True)
        assert out == "[a]\nc = 1\nstop-timeout = 3\n"

    def test_full_output_keeps_everything(self) -> None:
        text = "[a]\nc = 1\npinned = false\nmemory = 1536M\nenv.X = 1\n[off]\nenabled = false\n"
        parsed = parse_presets(text)
        again = parse_presets(render_presets(parsed.global_def, parsed.presets))
        assert again.presets == parsed.presets

    def test_node_is_written_back_as_one_key(self) -> None:
        parsed = parse_presets("[a]\nc = 1\nnode = s2,s1\n[b]\nc = 2\n")
        out = render_presets(parsed.global_def, parsed.presets)
        assert out == "[a]\nc = 1\nnode = s1,s2\n\n[b]\nc = 2\n"


NODE_NAMES = st.from_regex(r"[A-Za-z0-9._-]{1,10}", fullmatch=True)
OPTION_KEYS = st.sampled_from(["c", "ctx-size", "temp", "no-warmup", "jinja", "n-gpu-layers"])
SAFE = st.text(alphabet="abcXYZ019./_-:", min_size=1, max_size=12)
INTS = st.integers(-1, 1 << 20).map(str)
# Values of each option's type (llama-server's table; a value of another type is refused).
TYPED = {"c": INTS, "ctx-size": INTS, "temp": st.sampled_from(["0", "0.7", "1.5", "-1"]),
         "n-gpu-layers": st.one_of(INTS, st.sampled_from(["auto", "all"]))}  # fmt: skip


@st.composite
def preset_defs(draw: st.DrawFn, name: str) -> PresetDef:
    keys = draw(st.lists(OPTION_KEYS, unique=True, max_size=4))
    args = {key: draw(TYPED.get(key, SAFE)) for key in keys}
    return PresetDef(
        name=name,
        model_path=draw(st.one_of(st.just(""), SAFE)),
        args=tuple(args.items()),
        env=tuple(draw(st.dictionaries(st.sampled_from(["A", "B_1"]), SAFE, max_size=2)).items()),
        stop_timeout=draw(st.one_of(st.none(), st.integers(0, 600))),
        load_on_startup=draw(st.one_of(st.none(), st.booleans())),
        pinned=draw(st.one_of(st.none(), st.booleans())),
        ttl=draw(st.one_of(st.none(), st.integers(0, 10_000))),
        load_timeout=draw(st.one_of(st.none(), st.integers(0, 10_000))),
        hang_timeout=draw(st.one_of(st.none(), st.integers(0, 600), st.sampled_from([0.5, 2.5]))),
        memory=draw(st.one_of(st.none(), st.integers(0, 1 << 40))),
        enabled=draw(st.booleans()),
        # [*] may not name nodes
        nodes=() if name == "*" else tuple(sorted(draw(st.sets(NODE_NAMES, max_size=3)))),
    )


@st.composite
def preset_files(draw: st.DrawFn) -> tuple[PresetDef | None, list[PresetDef]]:
    names = draw(st.lists(st.sampled_from(["a", "org/m:Q4_K_M", "b-2", "c.d"]), unique=True))
    global_def = draw(st.one_of(st.none(), preset_defs("*")))
    return global_def, [draw(preset_defs(name)) for name in names]


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(preset_files())
def test_render_then_parse_gives_back_the_same_definitions(
    files: tuple[PresetDef | None, list[PresetDef]],
) -> None:
    global_def, defs = files
    parsed = parse_presets(render_presets(global_def, defs))
    expected_global = global_def if global_def is not None and _has_keys(global_def) else None
    if expected_global is not None:
        expected_global = _normalise_global(expected_global)
    assert parsed.global_def == expected_global
    assert parsed.presets == defs


def _has_keys(preset: PresetDef) -> bool:
    return bool(presets.def_to_section(preset).entries)


def _normalise_global(preset: PresetDef) -> PresetDef:
    return PresetDef(**{**preset.__dict__, "name": "*"})


class TestRenderArgv:
    def test_it_renders_the_worked_example_like_llama_cpp(self) -> None:
        parsed = parse_presets(WORKED_EXAMPLE)
        custom = parsed.presets[1]
        assert presets.render_argv(custom, parsed.global_def, "llama-server") == (
            "llama-server",
            "--log-colors",
            "off",
            "--sleep-idle-seconds",
            "300",
            "--alias",
            "custom",
            "--ctx-size",
            "8192",
            "--model",
            "/models/custom-Q4_K_M.gguf",
            "--n-gpu-layers",
            "8",
        )

    def test_negative_spellings_render_their_negative_flag(self) -> None:
        gemma = parse_presets(WORKED_EXAMPLE).presets[0]
        argv = presets.render_argv(gemma, None, "llama-server")
        assert "--no-warmup" in argv and "--jinja" in argv
        assert argv[argv.index("--alias") + 1] == gemma.name

    def test_of_two_synonyms_the_key_sorting_last_wins(self) -> None:
        preset = PresetDef(name="m", args=(("ctx-size", "2"), ("c", "1")))
        argv = presets.render_argv(preset, None, "llama-server")
        assert argv[argv.index("--ctx-size") + 1] == "2"

    def test_the_preset_overrides_the_global_section(self) -> None:
        glob = PresetDef(name="*", args=(("c", "8192"), ("temp", "0.5")))
        preset = PresetDef(name="m", args=(("ctx-size", "1024"),))
        argv = presets.render_argv(preset, glob, "llama-server")
        assert argv[argv.index("--ctx-size") + 1] == "1024"
        assert argv[argv.index("--temperature") + 1] == "0.5"

    def test_reserved_options_are_dropped(self) -> None:
        preset = PresetDef(name="m", args=(("port", "1"), ("api-key", "k"), ("models-max", "3")))
        assert presets.render_argv(preset, None, "llama-server") == (
            "llama-server",
            "--log-colors",
            "off",
            "--alias",
            "m",
        )

    def test_another_program_gets_unknown_keys_as_flags_and_is_split_like_a_shell(self) -> None:
        preset = PresetDef(
            name="sim",
            server_bin="python3 -m 'routerpanel.router.simserver'",
            args=(("sim-load-ms", "200"), ("c", "512"), ("sim-ignore-sigterm", "")),
        )
        assert presets.render_argv(preset, None, "llama-server") == (
            "python3",
            "-m",
            "routerpanel.router.simserver",
            "--log-colors",
            "off",
            "--alias",
            "sim",
            "--ctx-size",
            "512",
            "--sim-load-ms",
            "200",
            "--sim-ignore-sigterm",
        )


class TestRouterFlagsAreNeverCarried:
    """A router flag in a preset file is warned about and dropped: never stored on the preset,
    exported or passed to a child, whatever program runs it (issue 44.4)."""

    @pytest.mark.parametrize(
        "key", ["models-max", "LLAMA_ARG_MODELS_MAX", "api-key", "host", "port"]
    )
    def test_it_is_not_stored_on_the_preset(self, key: str) -> None:
        parsed = parse_presets(f"[*]\nc = 1\n{key} = 2\n[m]\nmodels-dir = /x\nc = 2\n")
        glob, model = parsed.global_def, parsed.presets[0]
        assert glob is not None and glob.args == (("c", "1"),)
        assert model.args == (("c", "2"),)
        assert [w.line for w in parsed.warnings] == [3, 5]

    def test_a_program_of_its_own_never_gets_them(self) -> None:
        """Its option table does not know them: they used to pass as ``--models-max 2``."""
        sim = f"{sys.executable} -m routerpanel.router.simserver"
        parsed = parse_presets(f"[*]\nmodels-max = 2\n[m]\nserver-bin = {sim}\nsim-load-ms = 5\n")
        assert parsed.global_def is None or parsed.global_def.args == ()
        stored = PresetDef(name="m", server_bin=sim, args=(("models-max", "2"), ("port", "9")))
        argv = presets.render_argv(stored, None, "llama-server", options.OptionTable.of((), "sim"))
        assert "--models-max" not in argv and "--port" not in argv

    def test_one_stored_by_an_older_version_is_not_exported(self) -> None:
        stored = PresetDef(name="m", args=(("models-max", "2"), ("ctx-size", "512")))
        text = render_presets(None, [stored])
        assert "models-max" not in text and "ctx-size = 512" in text
