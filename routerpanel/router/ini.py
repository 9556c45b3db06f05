"""Read and write llama.cpp's preset INI dialect (``--models-preset``), exactly as b11434 does.

This module is lexical only: it turns text into sections of ``key = value`` entries and back.
What the keys mean (llama-server options, router-only keys, RouterPanel's own keys) is decided in
``presets.py``. Pure: no I/O beyond the text it is given, no Django.

The grammar follows ROUTER_SPEC §11.A–B. Every line is blank, a comment, a ``[section]`` header
or a ``key = value`` line, with keys and headers in column 0; anything else rejects the whole
file. Unlike llama.cpp, every error names the line. Quirks kept on purpose, because a file that
llama.cpp accepts must mean the same thing here (§15.21):

* ``;`` and ``#`` always end a value, even without a space before them;
* a repeated key keeps its last value; a repeated section header starts that section again;
* keys before the first header form the section ``default``, dropped when empty;
* ``version`` is ignored everywhere;
* tags are canonicalised: ``[org/x:q4_k_m]`` is ``org/x:Q4_K_M``, ``[org/x:UD-Q4_K_XL]`` is
  ``org/x:Q4_K_XL``; when two headers canonicalise to one name, the one whose raw name sorts
  last wins, as in llama.cpp's ordered map.

Deliberate differences, each reported as a warning or an error with the line:

* trailing blanks in a section name (``[ foo ]`` is ``foo `` in llama.cpp) are stripped;
* a header whose ``]`` is missing is an error (llama.cpp lets the name run across lines);
* a UTF-8 byte-order mark or invalid UTF-8 is an error naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

GLOBAL_SECTION = "*"
DEFAULT_SECTION = "default"
IGNORED_KEYS = frozenset({"version"})

_NEWLINE = re.compile(r"\r\n|\n|\r")
_BLANK = re.compile(r"[ \t]*")
_COMMENT = re.compile(r"[ \t]*[;#].*")
_HEADER = re.compile(r"\[[ \t]*(?P<name>[^\] \t][^\]]*)\][ \t]*(?:[;#].*)?")
_KEY = r"[A-Za-z_][A-Za-z0-9_.-]*"
_KEY_RE = re.compile(_KEY)
_ENTRY = re.compile(r"(?P<key>" + _KEY + r")[ \t]*=[ \t]*(?P<value>[^;#]*?)[ \t]*(?:[;#].*)?")
_TAG_RUN = re.compile(r"[-.]([A-Za-z0-9_]+)$")
_UNWRITABLE_VALUE = re.compile(r"[;#\r\n]")


class IniError(ValueError):
    """The text is not a valid preset file; ``line`` is 1-based (0 when not tied to a line)."""

    def __init__(self, message: str, line: int = 0, source: str = "<preset>") -> None:
        self.message = message
        self.line = line
        self.source = source
        self.warnings: list[IniWarning] = []  # what the file's other lines warned of, if known
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {message}")


class IniErrors(IniError):
    """Every error found in one file, in line order; reads as the first one (``line``,
    ``message``) so callers that show one error still can, and ``str()`` names them all."""

    def __init__(self, errors: list[IniError]) -> None:
        self.errors = errors
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(first.message + more, first.line, first.source)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def raise_all(errors: list[IniError], warnings: list[IniWarning] | None = None) -> None:
    """Raise what ``errors`` holds: nothing, the one error, or all of them as ``IniErrors``;
    the file's ``warnings`` go with it (a file with errors still shows what it warned of)."""
    if not errors:
        return
    if len(errors) == 1:
        raised = errors[0]
    else:
        flat = [one for e in errors for one in (e.errors if isinstance(e, IniErrors) else [e])]
        raised = IniErrors(sorted(flat, key=lambda e: e.line))
    raised.warnings = list(warnings or ())
    raise raised


@dataclass(frozen=True)
class IniWarning:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


@dataclass
class Entry:
    key: str
    value: str
    line: int = 0


@dataclass
class Section:
    """One ``[name]`` block. ``name`` is canonical; ``raw_name`` is as written."""

    name: str
    raw_name: str = ""
    line: int = 0
    entries: list[Entry] = field(default_factory=list)

    def set(self, key: str, value: str, line: int = 0) -> bool:
        """Set ``key``, keeping the last value at its last position; True if it was repeated."""
        repeated = any(entry.key == key for entry in self.entries)
        self.entries = [entry for entry in self.entries if entry.key != key]
        self.entries.append(Entry(key, value, line))
        return repeated

    def get(self, key: str) -> str | None:
        for entry in self.entries:
            if entry.key == key:
                return entry.value
        return None

    def pairs(self) -> list[tuple[str, str]]:
        return [(entry.key, entry.value) for entry in self.entries]


@dataclass
class IniDocument:
    """Sections in file order: the global ``[*]`` one (if any) and one per model."""

    sections: list[Section] = field(default_factory=list)
    warnings: list[IniWarning] = field(default_factory=list)

    @property
    def global_section(self) -> Section | None:
        return next((s for s in self.sections if s.name == GLOBAL_SECTION), None)

    @property
    def model_sections(self) -> list[Section]:
        return [s for s in self.sections if s.name != GLOBAL_SECTION]


def canonical_name(name: str) -> str:
    """Upper-case the tag after the last ``:`` as llama.cpp does (ROUTER_SPEC 11.9)."""
    if name in (GLOBAL_SECTION, DEFAULT_SECTION) or ":" not in name:
        return name
    prefix, _, tag = name.rpartition(":")
    run = _TAG_RUN.search(tag)
    return f"{prefix}:{(run.group(1) if run else tag).upper()}"


def decode(data: bytes, source: str = "<preset>") -> str:
    """Decode UTF-8, naming the line of the first bad byte."""
    if data.startswith(b"\xef\xbb\xbf"):
        raise IniError("file starts with a UTF-8 byte-order mark; llama.cpp rejects it", 1, source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise IniError("not valid UTF-8", line, source) from None


def parse(
    text: str | bytes, source: str = "<preset>", errors: list[IniError] | None = None
) -> IniDocument:
    """Parse a preset file; raise ``IniError`` naming the bad line (``IniErrors``: every bad
    line, when there are several). With ``errors`` given, bad lines are added to it instead
    and the document of the good lines is returned, so a caller can check those too."""
    if isinstance(text, bytes):
        text = decode(text, source)
    elif text.startswith("\ufeff"):
        raise IniError("file starts with a UTF-8 byte-order mark; llama.cpp rejects it", 1, source)
    doc = IniDocument()
    by_raw: dict[str, Section] = {}
    current = Section(DEFAULT_SECTION, DEFAULT_SECTION, 0)
    by_raw[DEFAULT_SECTION] = current
    found: list[IniError] = [] if errors is None else errors
    for number, line in enumerate(_NEWLINE.split(text), start=1):
        if _BLANK.fullmatch(line) or _COMMENT.fullmatch(line):
            continue
        try:
            if line.startswith("["):
                current = _open_section(line, number, source, by_raw, doc)
            else:
                _read_entry(line, number, source, current, doc)
        except IniError as exc:
            found.append(exc)
            if line.startswith("["):  # the keys under a bad header belong to no section
                current = Section(line, line, number)
    if errors is None:
        raise_all(found)
    doc.sections = _finish_sections(by_raw, doc)
    return doc


def _open_section(
    line: str, number: int, source: str, by_raw: dict[str, Section], doc: IniDocument
) -> Section:
    header = _HEADER.fullmatch(line)
    if header is None:
        if line.startswith("[]") or _BLANK.fullmatch(line[1:].split("]", 1)[0]):
            raise IniError("a section name cannot be empty", number, source)
        if "]" not in line:
            raise IniError("section header is missing its closing ']'", number, source)
        raise IniError("unexpected text after the section header", number, source)
    raw = header.group("name")
    name = raw.rstrip(" \t")
    if name != raw:
        doc.warnings.append(IniWarning(number, f"trailing blanks dropped from section [{name}]"))
    if raw in by_raw and (by_raw[raw].entries or raw != DEFAULT_SECTION):
        # llama.cpp quirk (§11.5): a repeated header starts the section again, empty.
        doc.warnings.append(
            IniWarning(number, f"section [{name}] repeated: keys given above it are discarded")
        )
    section = Section(canonical_name(name), raw, number)
    by_raw[raw] = section
    return section


def _read_entry(line: str, number: int, source: str, section: Section, doc: IniDocument) -> None:
    entry = _ENTRY.fullmatch(line)
    if entry is None:
        raise IniError(_explain_bad_line(line), number, source)
    key, value = entry.group("key"), entry.group("value")
    if key in IGNORED_KEYS:
        return
    if section.set(key, value, number):
        doc.warnings.append(
            IniWarning(number, f"key '{key}' repeated in [{section.name}]: the last value wins")
        )


def _explain_bad_line(line: str) -> str:
    if line[:1] in (" ", "\t"):
        return "keys and section headers must start in column 0 (this line is indented)"
    if "=" not in line:
        return "expected 'key = value', a [section] header, a comment or a blank line"
    key = line.split("=", 1)[0].rstrip(" \t")
    if not _KEY_RE.fullmatch(key):
        return f"invalid key {key!r}: keys start with a letter or '_' and use [A-Za-z0-9_.-]"
    return "malformed 'key = value' line"


def _finish_sections(by_raw: dict[str, Section], doc: IniDocument) -> list[Section]:
    """Drop an empty ``default``; resolve canonical-name collisions as llama.cpp does."""
    sections = [s for s in by_raw.values() if s.entries or s.raw_name != DEFAULT_SECTION]
    winners: dict[str, Section] = {}
    for section in sorted(sections, key=lambda s: s.raw_name.encode()):
        loser = winners.get(section.name)
        if loser is not None:
            doc.warnings.append(
                IniWarning(
                    section.line,
                    f"[{section.raw_name}] and [{loser.raw_name}] both name model "
                    f"'{section.name}'; [{section.raw_name}] wins",
                )
            )
        winners[section.name] = section
    kept = [s for s in sections if winners[s.name] is s]
    if any(s.raw_name == DEFAULT_SECTION and s.line == 0 for s in kept):
        first = min(e.line for e in by_raw[DEFAULT_SECTION].entries)
        doc.warnings.append(
            IniWarning(first, "keys before the first [section] define a model named 'default'")
        )
    return kept


def check_value(value: str) -> str | None:
    """Return why ``value`` cannot be written in the INI dialect, or None if it can."""
    if _UNWRITABLE_VALUE.search(value):
        return "values cannot contain ';', '#' or line breaks in llama.cpp's INI format"
    if value != value.strip(" \t"):
        return "values cannot start or end with blanks in llama.cpp's INI format"
    return None


def check_key(key: str) -> str | None:
    """Return why ``key`` cannot be written, or None if it can."""
    if not _KEY_RE.fullmatch(key):
        return "keys start with a letter or '_' and use only letters, digits, '_', '.' and '-'"
    return None


def check_section_name(name: str) -> str | None:
    """Return why ``name`` cannot be a section header, or None if it can."""
    if not name:
        return "a section name cannot be empty"
    if "]" in name or "\r" in name or "\n" in name:
        return "a section name cannot contain ']' or line breaks"
    if name != name.strip(" \t"):
        return "a section name cannot start or end with blanks"
    return None


def render(doc: IniDocument, header: str = "") -> str:
    """Write ``doc`` back as text that ``parse`` (and llama.cpp) reads to the same sections."""
    lines = [f"; {row}" if row else ";" for row in header.splitlines()]
    if lines:
        lines.append("")
    ordered = sorted(doc.sections, key=lambda s: s.name != GLOBAL_SECTION)
    for section in ordered:
        problem = check_section_name(section.name)
        if problem:
            raise IniError(f"cannot write [{section.name}]: {problem}")
        lines.append(f"[{section.name}]")
        for entry in section.entries:
            problem = check_key(entry.key) or check_value(entry.value)
            if problem:
                raise IniError(f"cannot write {entry.key} in [{section.name}]: {problem}")
            lines.append(f"{entry.key} = {entry.value}")
        lines.append("")
    return "\n".join(lines)
