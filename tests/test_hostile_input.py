"""Hostile input through the CLI (issue 25): undecodable bytes and lone surrogates in argv, corpora and query
files, JSON nested too deeply, integers too long to convert, fields of the wrong type, and stored terminal escapes.

Every refusal is one `error:` line and exit code 1, never a traceback; every print of stored or typed text reaches
the terminal with its control characters escaped, and --json stays exact JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from retriever.index import Index

# Terminal control: OSC 52 (write the clipboard), a screen clear, CSI as one C1 character, a bidi override (Trojan
# Source), DEL and a bell.
CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e", "\x7f")
EVIL_ID = "evil\x1b[31m"
EVIL_TITLE = "Clipboard \x1b]52;c;aGk=\x07 title"
EVIL_TEXT = "A guitar \x1b[2J clears the screen \u202eelbisivni\u202c and \x9b2J and [bold]markup[/bold]\x7f."
DOCUMENTS = [
    {"_id": EVIL_ID, "title": EVIL_TITLE, "text": EVIL_TEXT},
    {"_id": "plain", "text": "A woman slices an onion in the café ☕."},
    {"_id": "other", "text": "Stock markets fell sharply on Monday."},
]


def assert_one_line_error(done, *fragments):
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_terminal_safe(done):
    for stream in (done.stdout, done.stderr):
        found = [control for control in CONTROLS if control in stream]
        assert not found, (found, stream)


@pytest.fixture(scope="module")
def evil_model(tmp_path_factory, tiny_bert):
    """tiny_bert in a folder whose name holds an OSC 52 sequence: the model name is stored text too (list, info)."""
    folder = tmp_path_factory.mktemp("models") / "model\x1b]52;c;aGk=\x07"
    shutil.copytree(tiny_bert, folder)
    return folder


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, evil_model):
    """One index, `evil`, of DOCUMENTS, built once for the module (the CLI only reads it)."""
    folder = tmp_path_factory.mktemp("hostile")
    corpus = folder / "evil.jsonl"
    corpus.write_text("".join(json.dumps(document) + "\n" for document in DOCUMENTS), encoding="utf-8")
    Index.build(corpus, "evil", folder / "indexes", model=str(evil_model), calibrator="none", device="cpu")
    return folder / "indexes"


# --- argv --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, shown",
    [
        # What `retriever search $'\xff'` puts in sys.argv: Python decodes argv with surrogateescape.
        (["search", "\udcff"], "command-line argument 2 (\\xff) is not valid UTF-8 (byte 0xff at character 1)"),
        (["search", "caf\udce9 au lait", "--json"], "argument 2 (caf\\xe9 au lait)"),
        (["search", "--queries", "queries\udcff.txt"], "argument 3 (queries\\xff.txt)"),
        (["search", "q", "--index-dir", "/tmp/\udc80x"], "argument 4 (/tmp/\\x80x)"),
        (["build", "corpus\udcff.txt"], "argument 2 (corpus\\xff.txt)"),
        (["build", "corpus.txt", "--name", "n\udcff"], "argument 4 (n\\xff)"),
        (["add", "more\udcfe.jsonl", "--name", "evil"], "byte 0xfe at character 5"),
        (["show", "evil", "id\udcff"], "argument 3 (id\\xff)"),
        (["delete", "id\udcff", "--name", "evil"], "argument 2 (id\\xff)"),
        (["encode", "c.txt", "--out", "v\udcff.npy"], "argument 4 (v\\xff.npy)"),
        (["search", "half \ud800 pair"], "a lone surrogate U+D800 at character 6"),
        (["search", "\x1b[2J\udcff"], "argument 2 (\\x1b[2J\\xff)"),  # shown escaped, both kinds
        (["search", "word " * 100 + "\udcff"], "byte 0xff at character 501"),  # a long one, shortened
    ],
)
def test_undecodable_arguments_are_one_line(cli, args, shown):
    done = cli(*args)
    assert_one_line_error(done, shown)
    assert len(done.stderr) < 200


# --- corpora and query files -------------------------------------------------------------------------------

HOSTILE_FILES = [
    # (file name, content, what the error line names after "FILE line N: ")
    ("bytes.txt", b"fine\nbad \xff here\n", "line 2: not valid utf-8 (byte 0xff at column 5)"),
    ("encoded-surrogate.txt", b"fine\n\xed\xa0\x80\n", "line 2: not valid utf-8 (byte 0xed at column 1)"),
    ("bytes.csv", b"id,text\n1,fine\n2,caf\xe9\n", "line 3: not valid utf-8 (byte 0xe9 at column 6)"),
    ("bytes.tsv", b"id\ttext\n1\tfine\n2\t\x80\n", "line 3: not valid utf-8 (byte 0x80 at column 3)"),
    ("bytes.jsonl", b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "\xc3"}\n',
     "line 2: not valid utf-8 (byte 0xc3 at column 23)"),
    ("text.jsonl", '{"_id": "a", "text": "x \\ud800 y"}\n',
     'line 1: "text" holds an invalid character (a lone surrogate U+D800 at character 3)'),
    ("title.jsonl", '{"_id": "a", "title": "\\udfff", "text": "t"}\n',
     'line 1: "title" holds an invalid character (a lone surrogate U+DFFF at character 1)'),
    ("id.jsonl", '{"_id": "a\\udcff", "text": "t"}\n',
     "line 1: the id holds an invalid character (a lone surrogate U+DCFF at character 2)"),
    ("deep.jsonl", '{"_id": "a", "text": "t", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
     "line 1: not valid JSON (nested too deeply to read)"),
    ("deep-object.jsonl", '{"_id": "a", "text": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}\n",
     "line 1: not valid JSON (nested too deeply to read)"),
    ("digits.jsonl", '{"_id": ' + "7" * 5000 + ', "text": "t"}\n', "line 1: an integer of more than 4,300 digits"),
    ("list-text.jsonl", '{"_id": "a", "text": ["t"]}\n', 'line 1: "text" must be a string, got a list'),
    ("object-id.jsonl", '{"_id": {"$oid": "1"}, "text": "t"}\n',
     "line 1: id must be a string or an integer, got an object"),
    ("number-title.jsonl", '{"_id": "a", "text": "t", "title": 1.5}\n', 'line 1: "title" must be a string, got 1.5'),
    ("bool-id.jsonl", '{"_id": false, "text": "t"}\n', "line 1: id must be a string or an integer, got false"),
]


def hostile_file(folder, name, content):
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


@pytest.mark.parametrize("name, content, expected", HOSTILE_FILES, ids=[case[0] for case in HOSTILE_FILES])
def test_a_hostile_corpus_is_one_line_naming_file_and_line(cli, tmp_path, tiny_bert, name, content, expected):
    path = hostile_file(tmp_path, name, content)
    done = cli("build", path, "--name", "hostile", "--model", tiny_bert, "--calibrator", "none",
               "--index-dir", tmp_path / "indexes")
    assert_one_line_error(done, f"{path} {expected}")


# A query's title plays no part in search: a queries file is not refused for one (nor for its metadata).
QUERY_FILES = [case for case in HOSTILE_FILES if "title" not in case[0]]


@pytest.mark.parametrize("name, content, expected", QUERY_FILES, ids=[case[0] for case in QUERY_FILES])
def test_a_hostile_queries_file_is_one_line_naming_file_and_line(cli, index_dir, tmp_path, name, content, expected):
    path = hostile_file(tmp_path, name, content)
    assert_one_line_error(cli("search", "--queries", path, "--name", "evil", "--index-dir", index_dir),
                          f"{path} {expected}")


def test_a_queries_file_with_a_title_no_document_could_have_is_searched(cli, index_dir, tmp_path):
    path = hostile_file(tmp_path, "titles.jsonl", '{"_id": "a", "title": 1.5, "text": "t", "metadata": [1]}\n')
    done = cli("search", "--queries", path, "--name", "evil", "--index-dir", index_dir, "--json", "-k", "1")
    assert done.returncode == 0 and json.loads(done.stdout)["query_id"] == "a"


@pytest.mark.parametrize("name, content, expected", HOSTILE_FILES[5:9], ids=[case[0] for case in HOSTILE_FILES[5:9]])
def test_a_hostile_addition_is_one_line_and_changes_nothing(cli, index_dir, tmp_path, name, content, expected):
    path = hostile_file(tmp_path, name, content)
    assert_one_line_error(cli("add", path, "--name", "evil", "--index-dir", index_dir), f"{path} {expected}")
    assert len(Index.open("evil", index_dir, device="cpu")) == len(DOCUMENTS)


# --- stored terminal escapes -------------------------------------------------------------------------------

TERMINAL_CASES = [
    ["show", "evil", EVIL_ID],
    ["search", "guitar"],
    ["search", "guitar", "--full"],
    ["search", "\x1b]52;c;aGk=\x07 guitar \u202e"],  # the query is echoed as the table's title
    ["list"],
    ["info", "--name", "evil"],
    ["show", "evil", "\x1b[2Jmissing"],  # quoted in the error line
    ["delete", "\x1b[2Jmissing", "--name", "evil"],
]


@pytest.mark.parametrize("args", TERMINAL_CASES, ids=lambda args: " ".join(args[:2]).encode("unicode_escape").decode())
def test_stored_and_typed_text_reaches_the_terminal_escaped(cli, index_dir, monkeypatch, args):
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that no cell folds an escape over two lines
    done = cli(*args, "--index-dir", index_dir)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    assert_terminal_safe(done)
    assert done.returncode == 1 or "\\x1b" in done.stdout  # shown, as a visible escape


def test_show_prints_every_field_escaped_and_no_markup(cli, index_dir):
    done = cli("show", "evil", EVIL_ID, "--index-dir", index_dir)
    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.replace("│", " ").split())
    assert "evil\\x1b[31m" in flat and "\\x1b]52;c;aGk=\\x07" in flat and "\\u202eelbisivni\\u202c" in flat
    assert "\\x9b2J" in flat and "[bold]markup[/bold]\\x7f" in flat  # markup printed as typed, not applied


@pytest.mark.parametrize(
    "args, records",
    [
        (["show", "evil", EVIL_ID, "--json"], lambda lines: [json.loads(line) for line in lines]),
        (["search", "guitar", "--json", "-k", "3"], lambda lines: [json.loads(line) for line in lines]),
        (["list", "--json"], lambda lines: [json.loads(line) for line in lines]),
    ],
    ids=["show", "search", "list"],
)
def test_json_output_is_exact_and_terminal_safe(cli, index_dir, args, records):
    """json.dumps escapes C0 controls but leaves DEL, C1 and bidi overrides raw; they are \\u escapes too, and the
    JSON still decodes to the stored text exactly."""
    done = cli(*args, "--index-dir", index_dir)
    assert done.returncode == 0, done.stderr
    assert_terminal_safe(done)
    decoded = json.dumps(records(done.stdout.splitlines()), ensure_ascii=False)
    if args[0] != "list":
        for value in (EVIL_ID, EVIL_TITLE, EVIL_TEXT):
            assert json.dumps(value, ensure_ascii=False) in decoded
    else:
        assert "model\x1b]52;c;aGk=\x07" in json.loads(done.stdout)["indexes"][0]["model"]


def test_queries_file_ids_and_texts_are_escaped(cli, index_dir, tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"_id": "q\x1b[2J", "text": "guitar \u202e\x07"}) + "\n", encoding="utf-8")
    table = cli("search", "--queries", queries, "--name", "evil", "--index-dir", index_dir)
    assert table.returncode == 0 and "q\\x1b[2J: guitar \\u202e\\x07" in table.stdout, table.stderr
    assert_terminal_safe(table)
    lines = cli("search", "--queries", queries, "--name", "evil", "--json", "--index-dir", index_dir)
    assert_terminal_safe(lines)
    record = json.loads(lines.stdout)
    assert record["query_id"] == "q\x1b[2J" and record["query"] == "guitar \u202e\x07"


def test_an_output_that_cannot_encode_unicode_gets_escapes_not_a_traceback(index_dir):
    """PYTHONIOENCODING=ascii (or a legacy console code page): tables show \\xe9, JSON is all-ASCII and exact."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "cli.main", *args, "--index-dir", str(index_dir)],
                              capture_output=True, timeout=300, env={**os.environ, "PYTHONIOENCODING": "ascii"})

    table = run("show", "evil", "plain")
    assert table.returncode == 0 and b"caf\\xe9 \\u2615" in table.stdout, table.stderr
    exact = run("show", "evil", "plain", "--json")
    assert exact.returncode == 0 and json.loads(exact.stdout)["text"] == DOCUMENTS[1]["text"], exact.stderr
