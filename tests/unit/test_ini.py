"""llama.cpp's preset INI dialect: the lexical layer (ROUTER_SPEC §11.A–B, quirks §15.21)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routerpanel.router import ini


def sections(text: str) -> dict[str, list[tuple[str, str]]]:
    return {s.name: s.pairs() for s in ini.parse(text).sections}


class TestLexicalGrammar:
    def test_it_reads_the_worked_example_of_the_spec(self) -> None:
        text = (
            "version = 1\n[*]\nc = 8192\nn-gpu-layers = 8\nstop-timeout = 5\n\n"
            "[ggml-org/gemma-3-4b-it-GGUF:q4_k_m]   ; canonicalized\n"
            "jinja = true\nno-warmup = 1   ; inverted\nalias = gemma,g3\n"
            "load-on-startup = true\n\n[custom]\nmodel = /models/custom-Q4_K_M.gguf\n"
            "sleep-idle-seconds = 300                ; accepted\n"
        )
        assert sections(text) == {
            "*": [("c", "8192"), ("n-gpu-layers", "8"), ("stop-timeout", "5")],
            "ggml-org/gemma-3-4b-it-GGUF:Q4_K_M": [
                ("jinja", "true"),
                ("no-warmup", "1"),
                ("alias", "gemma,g3"),
                ("load-on-startup", "true"),
            ],
            "custom": [("model", "/models/custom-Q4_K_M.gguf"), ("sleep-idle-seconds", "300")],
        }

    def test_it_accepts_every_line_ending(self) -> None:
        assert sections("[a]\r\nx = 1\ry = 2\nz = 3") == {"a": [("x", "1"), ("y", "2"), ("z", "3")]}

    def test_a_semicolon_or_hash_always_ends_a_value(self) -> None:
        text = "[a]\nurl = http://h/x#frag\nb = a;b\nc = keep spaces inside   # note\n"
        assert sections(text)["a"] == [
            ("url", "http://h/x"),
            ("b", "a"),
            ("c", "keep spaces inside"),
        ]

    def test_quotes_are_kept_literally_and_empty_values_are_allowed(self) -> None:
        assert sections('[a]\nx = "q"\ny =\nz =   ; c\n')["a"] == [
            ("x", '"q"'),
            ("y", ""),
            ("z", ""),
        ]

    def test_comments_may_be_indented_but_keys_may_not(self) -> None:
        assert sections("  ; note\n\t# note\n[a]\nx=1\n") == {"a": [("x", "1")]}
        with pytest.raises(ini.IniError, match=r":2: keys and section headers must start"):
            ini.parse("[a]\n  x = 1\n")

    @pytest.mark.parametrize(
        ("text", "line", "message"),
        [
            ("[a]\nx\n", 2, "expected 'key = value'"),
            ("[a]\n1x = 2\n", 2, "invalid key '1x'"),
            ("[a]\n-c = 2\n", 2, "invalid key '-c'"),
            ("[a]\nx = 1\n [b]\n", 3, "must start in column 0"),
            ("[a\nx = 1\n", 1, "missing its closing ']'"),
            ("[a] junk\n", 1, "unexpected text after the section header"),
            ("[]\n", 1, "cannot be empty"),
            ("[  ]\n", 1, "cannot be empty"),
            ("[a]\nx y = 1\n", 2, "invalid key 'x y'"),
        ],
    )
    def test_it_rejects_what_llama_cpp_rejects_and_names_the_line(
        self, text: str, line: int, message: str
    ) -> None:
        with pytest.raises(ini.IniError) as caught:
            ini.parse(text, source="models.ini")
        assert caught.value.line == line
        assert message in str(caught.value)
        assert str(caught.value).startswith(f"models.ini:{line}: ")

    def test_it_names_the_line_of_invalid_utf8(self) -> None:
        with pytest.raises(ini.IniError, match=r":3: not valid UTF-8"):
            ini.parse(b"[a]\nx = 1\ny = \xff\n")

    def test_it_rejects_a_byte_order_mark(self) -> None:
        with pytest.raises(ini.IniError, match="byte-order mark"):
            ini.parse("\ufeff[a]\n".encode())


class TestSections:
    def test_keys_before_the_first_header_form_a_model_named_default(self) -> None:
        doc = ini.parse("model = /m.gguf\n[a]\n")
        assert [s.name for s in doc.sections] == ["default", "a"]
        assert any("model named 'default'" in str(w) for w in doc.warnings)

    def test_an_empty_default_section_is_dropped_and_version_is_ignored(self) -> None:
        assert sections("version = 1\n[a]\nversion = 2\nx = 1\n") == {"a": [("x", "1")]}

    def test_a_repeated_key_keeps_the_last_value(self) -> None:
        doc = ini.parse("[a]\nx = 1\ny = 2\nx = 3\n")
        assert doc.sections[0].pairs() == [("y", "2"), ("x", "3")]
        assert "repeated" in str(doc.warnings[0])

    def test_a_repeated_header_starts_the_section_again(self) -> None:
        doc = ini.parse("[a]\nx = 1\n[b]\n[a]\ny = 2\n")
        assert sections("[a]\nx = 1\n[b]\n[a]\ny = 2\n") == {"a": [("y", "2")], "b": []}
        assert any("discarded" in str(w) for w in doc.warnings)

    def test_trailing_blanks_in_a_section_name_are_dropped_with_a_warning(self) -> None:
        doc = ini.parse("[  foo \t]\nx = 1\n")
        assert doc.sections[0].name == "foo"
        assert "trailing blanks" in str(doc.warnings[0])

    def test_the_global_section_is_found_wherever_it_is(self) -> None:
        doc = ini.parse("[a]\n[*]\nc = 1\n")
        assert doc.global_section is not None
        assert doc.global_section.pairs() == [("c", "1")]
        assert [s.name for s in doc.model_sections] == ["a"]


class TestCanonicalNames:
    @pytest.mark.parametrize(
        ("raw", "canonical"),
        [
            ("org/x-GGUF:q4_k_m", "org/x-GGUF:Q4_K_M"),
            ("org/x:UD-Q4_K_XL", "org/x:Q4_K_XL"),
            ("name:v1.2", "name:2"),
            ("a:b:c", "a:b:C"),
            ("NoTag", "NoTag"),
            ("default", "default"),
            ("*", "*"),
            ("x:", "x:"),
        ],
    )
    def test_it_canonicalises_tags_like_llama_cpp(self, raw: str, canonical: str) -> None:
        assert ini.canonical_name(raw) == canonical

    def test_when_two_headers_name_one_model_the_one_sorting_last_wins(self) -> None:
        doc = ini.parse("[m:q4]\nx = lower\n[m:Q4]\nx = upper\n")
        assert sections("[m:q4]\nx = lower\n[m:Q4]\nx = upper\n") == {"m:Q4": [("x", "lower")]}
        assert "wins" in str(doc.warnings[-1])


class TestRender:
    def test_it_writes_the_global_section_first(self) -> None:
        doc = ini.IniDocument([ini.Section("a", entries=[ini.Entry("x", "1")]), ini.Section("*")])
        assert ini.render(doc).startswith("[*]\n\n[a]\nx = 1\n")

    def test_it_refuses_values_the_dialect_cannot_hold(self) -> None:
        for value in ("a;b", "a#b", "line\nbreak", " lead"):
            doc = ini.IniDocument([ini.Section("a", entries=[ini.Entry("x", value)])])
            with pytest.raises(ini.IniError, match="cannot write x"):
                ini.render(doc)

    def test_a_header_comment_is_written_as_comment_lines(self) -> None:
        text = ini.render(ini.IniDocument([ini.Section("a")]), header="one\ntwo")
        assert text.startswith("; one\n; two\n\n[a]\n")
        assert sections(text) == {"a": []}


# Round-trip properties over the whole writable dialect. Alphabets are fixed strings so that
# generation stays cheap on a busy two-core machine.
KEY_HEAD = "abcxyzABCXYZ_"
KEY_TAIL = KEY_HEAD + "0189.-"
KEYS = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(KEY_HEAD),
    st.text(alphabet=KEY_TAIL, max_size=10),
).filter(lambda k: k not in ini.IGNORED_KEYS)
VALUE_CHARS = "aZ09 \t/:.,=-_'\"[]*é漢\\"
VALUES = st.text(alphabet=VALUE_CHARS, max_size=20).map(lambda v: v.strip(" \t"))
NAMES = (
    st.text(alphabet="aZ09 /:.-_*é漢;#=[", min_size=1, max_size=20)
    .map(lambda n: n.strip(" \t"))
    .filter(lambda n: n not in ("", "default") and not n.startswith("["))
    .map(ini.canonical_name)
)
PROPERTY = settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)


@st.composite
def documents(draw: st.DrawFn) -> ini.IniDocument:
    names = draw(st.lists(NAMES, unique=True, max_size=5))
    doc = ini.IniDocument()
    for name in names:
        section = ini.Section(name, name)
        for key, value in draw(st.dictionaries(KEYS, VALUES, max_size=5)).items():
            section.set(key, value)
        doc.sections.append(section)
    return doc


def shape(doc: ini.IniDocument) -> dict[str, list[tuple[str, str]]]:
    return {s.name: s.pairs() for s in doc.sections}


@PROPERTY
@given(documents())
def test_parse_reads_back_what_render_writes(doc: ini.IniDocument) -> None:
    assert shape(ini.parse(ini.render(doc))) == shape(doc)


LINES = st.one_of(
    st.builds(lambda k, v: f"{k} = {v}", KEYS, VALUES),
    st.builds(lambda k, v, c: f"{k}={v};{c}", KEYS, VALUES, VALUES),
    st.builds(lambda n: f"[{n}]", NAMES),
    st.builds(lambda n, c: f"[ {n}  ]  # {c}", NAMES, VALUES),
    st.sampled_from(["", "  ", "; comment", "   # comment", "version = 1"]),
)


@PROPERTY
@given(st.lists(LINES, max_size=25), st.sampled_from(["\n", "\r\n", "\r"]))
def test_render_of_a_parsed_file_parses_to_the_same_sections(
    lines: list[str], newline: str
) -> None:
    first = ini.parse(newline.join(lines))
    again = ini.parse(ini.render(first))
    assert shape(again) == shape(first)


def test_every_bad_line_is_reported_and_keys_under_a_bad_header_are_dropped() -> None:
    text = "[a]\nx = 1\n[b\ny = 2\n  z = 3\n[c]\nnot a key\nw = 4\n"
    with pytest.raises(ini.IniErrors) as caught:
        ini.parse(text, "f.ini")
    assert [e.line for e in caught.value.errors] == [3, 5, 7]
    assert caught.value.line == 3 and caught.value.message.endswith("(and 2 more)")
    assert str(caught.value).splitlines()[1].startswith("f.ini:5: keys and section headers")
    errors: list[ini.IniError] = []
    doc = ini.parse(text, "f.ini", errors)
    assert len(errors) == 3
    assert {s.name: s.pairs() for s in doc.sections} == {"a": [("x", "1")], "c": [("w", "4")]}


def test_one_bad_line_raises_a_plain_error() -> None:
    with pytest.raises(ini.IniError) as caught:
        ini.parse("[a]\n  x = 1\n")
    assert type(caught.value) is ini.IniError and caught.value.line == 2
