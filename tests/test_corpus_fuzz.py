"""Fuzzing the corpus readers and the terminal escaping with hypothesis (issue 25), bounded and derandomized so a
CI run is deterministic and takes seconds.

Whatever a file holds (arbitrary bytes, JSON-ish lines with lone surrogates, deep nesting and long integers, table
rows with stray quotes), reading it either gives Documents of valid Unicode or raises RetrieverError with one line;
never any other exception."""

from __future__ import annotations

import gzip
import json
import os
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from retriever.corpus import documents_from_records, iter_corpus, read_corpus, read_queries
from retriever.errors import RetrieverError
from retriever.text import check_argument, invalid_character, terminal_json, terminal_safe

FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
FORMATS = (".txt", ".jsonl", ".csv", ".tsv", ".jsonl.gz")
ENCODINGS = ("utf-8", "latin-1", "utf-16", "unicode_escape")
# What a terminal may act on: C0 (but tab and newline), DEL, C1, bidi overrides and isolates, lone surrogates.
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")

# Text of any character, terminal controls and blanks drawn often; half of it with lone surrogates too (hypothesis
# leaves them out by default, and st.text leaves them out even of an alphabet that holds them: joined by hand).
clean_character = st.one_of(st.characters(), st.sampled_from("\x00\x1b\x07\x9b\u202e\u2066\n\t\r "))
any_character = st.one_of(clean_character, st.characters(categories=["Cs"]))
any_text = st.one_of(st.lists(clean_character, max_size=40), st.lists(any_character, max_size=40)).map("".join)
fields = st.sampled_from(["_id", "id", "text", "title", "x"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), any_text)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(fields, inner, max_size=4)), max_leaves=8)
records = st.dictionaries(fields, json_values, max_size=5)
# BEIR-shaped records, so the checks past the shape (lone surrogates, blank text, ids) are reached too.
documents = st.fixed_dictionaries(
    {"_id": st.one_of(any_text, st.integers()), "text": any_text},
    optional={"title": st.one_of(st.none(), any_text, json_values)})


@st.composite
def json_lines(draw) -> bytes:
    """Lines of a .jsonl file: records of any shape, some nested past the parser's depth, some with integers past
    Python's conversion limit, some cut short or with bytes spliced in."""
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["document", "document", "record", "deep", "digits", "cut", "bytes"]))
        line = json.dumps(draw(documents if kind in ("document", "digits") else records)).encode()
        if kind == "deep":
            depth = draw(st.integers(500, 5000))
            line = b'{"_id": "d", "text": "t", "x": ' + b"[" * depth + b"]" * depth + b"}"
        elif kind == "digits":
            line = line[:-1] + b', "n": ' + b"9" * draw(st.integers(4000, 6000)) + b"}"
        elif kind == "cut":
            line = line[: draw(st.integers(0, len(line)))]
        elif kind == "bytes":
            at = draw(st.integers(0, len(line)))
            line = line[:at] + draw(st.binary(min_size=1, max_size=4)) + line[at:]
        lines.append(line)
    return b"\n".join(lines) + b"\n"


@st.composite
def table_rows(draw) -> tuple[str, bytes]:
    """A .csv or .tsv file: a header that may lack columns, rows of any text (stray quotes, delimiters, newlines),
    most with as many fields as the header, some with lone surrogates (written as the bytes surrogatepass gives)."""
    suffix = draw(st.sampled_from([".csv", ".tsv"]))
    delimiter = "," if suffix == ".csv" else "\t"
    header = draw(st.sampled_from([["id", "text"], ["id", "title", "text"], ["text"], ["ID", " Text "]]))
    character = draw(st.sampled_from([clean_character, any_character])) | st.sampled_from(['"', delimiter])
    rows = [delimiter.join(header)]
    for _ in range(draw(st.integers(0, 4))):
        width = draw(st.one_of(st.just(len(header)), st.integers(1, 5)))
        cells = draw(st.lists(st.lists(character, max_size=12).map("".join), min_size=width, max_size=width))
        rows.append(delimiter.join(cells))
    return suffix, "\n".join(rows).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def write(folder, suffix: str, content: bytes):
    path = folder / f"corpus{suffix}"
    path.write_bytes(gzip.compress(content) if suffix.endswith(".gz") else content)
    return path


def assert_read_or_refused(path, encoding: str = "utf-8") -> None:
    """Reading PATH gives Documents of valid Unicode (what a tokenizer and SQLite take), or one RetrieverError."""
    try:
        documents = list(iter_corpus(path, encoding))
    except RetrieverError as error:
        assert "\n" not in str(error)
        event("refused: " + re.sub(r"^.*?(line \d+)?: ", "", str(error))[:22])
        return
    event(f"read: {'some' if documents else 'no'} documents")
    for document in documents:
        for value in (document.doc_id, document.text, document.source):
            assert isinstance(value, str) and value and invalid_character(value) is None
        assert document.title is None or (isinstance(document.title, str) and invalid_character(document.title) is None)
    for read in (read_corpus, read_queries):  # the checks on top: empty file, repeated ids
        try:
            read(path, encoding)
        except RetrieverError:
            pass


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # unicode_escape's, on "\\q"
@FUZZ
@given(suffix=st.sampled_from(FORMATS), encoding=st.sampled_from(ENCODINGS), content=st.binary(max_size=600))
def test_arbitrary_bytes_are_read_or_refused(folder, suffix, encoding, content):
    assert_read_or_refused(write(folder, suffix, content), encoding)


@FUZZ
@given(content=json_lines())
def test_json_lines_of_any_shape_are_read_or_refused(folder, content):
    assert_read_or_refused(write(folder, ".jsonl", content))


@FUZZ
@given(table=table_rows())
def test_table_rows_of_any_text_are_read_or_refused(folder, table):
    assert_read_or_refused(write(folder, *table))


@FUZZ
@given(batch=st.lists(st.one_of(documents, records, json_values), max_size=4))
def test_request_records_are_read_or_refused(batch):
    """The server's add requests: records already parsed from JSON, through the same checks."""
    try:
        documents = documents_from_records(batch)
    except RetrieverError as error:
        assert "\n" not in str(error)
        return
    assert all(invalid_character(d.doc_id + d.text + (d.title or "")) is None for d in documents)


@FUZZ
@given(text=st.lists(any_character, max_size=200).map("".join))
def test_terminal_safe_leaves_no_control_character(text):
    shown = terminal_safe(text)
    assert not TERMINAL_CONTROL.search(shown)
    assert all(unicodedata.category(c) not in ("Cc", "Cs") for c in shown.replace("\t", "").replace("\n", ""))
    assert terminal_safe(shown) == shown  # nothing left to escape


def test_json_output_escapes_invisible_characters_and_line_separators():
    """From a QA run: a zero-width space, a mark of direction or a byte-order mark was printed raw in --json, and
    U+2028 split one JSON line in two for str.splitlines()."""
    value = {"q": "a\u200eb\u061cc\u200bd\ufeffe\u2028f\u2029g tag\U000e0041 \u2764\ufe0f"}
    text = terminal_json(value)
    assert json.loads(text) == value and len(text.splitlines()) == 1
    assert "\\u200e" in text and "\\u2028" in text and "\\udb40\\udc41" in text and "\u2764\ufe0f" in text


def test_text_from_windows_shows_its_line_breaks_and_a_lone_carriage_return_stays_escaped():
    """From a QA run: `retriever show` printed a CRLF text's lines ending in \\x0d."""
    assert terminal_safe("line one\r\nline two\rover") == "line one\nline two\\x0dover"


@FUZZ
@given(value=json_values)
def test_terminal_json_is_exact_and_leaves_no_control_character(value):
    text = terminal_json(value)
    assert not TERMINAL_CONTROL.search(text) and "\n" not in text
    assert json.dumps(json.loads(text), ensure_ascii=True) == json.dumps(value, ensure_ascii=True)


@FUZZ
@given(raw=st.binary(max_size=80))
def test_any_command_line_bytes_are_taken_or_refused_in_one_line(raw):
    argument = os.fsdecode(raw)  # what Python puts in sys.argv for these bytes
    try:
        assert check_argument(argument, 2) == argument and invalid_character(argument) is None
    except RetrieverError as error:
        message = str(error)
        assert "\n" not in message and not TERMINAL_CONTROL.search(message) and "byte 0x" in message
        assert message.startswith("command-line argument 2 (")
