"""The index home, list / show / remove, names, empty queries, result tables, help texts, Ctrl-C and stray OS
errors, concurrent builds and too-small corpora, through the CLI entry point."""

from __future__ import annotations

import errno
import fcntl
import importlib
import json
import re
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from retriever.versions.home import NAME_RULE
from retriever.versions.layout import LOCK, VERSIONS
from tests.helpers import TEXTS, assert_one_line_error, assert_usage_error


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def docs(tmp_path) -> Path:
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return corpus


@pytest.fixture()
def built_home(cli, docs, tiny_bert, index_home) -> Path:
    """The index 'docs' built in the index home ($RETRIEVER_HOME, set for every test), with no --index-dir."""
    done = cli("build", docs, "--model", tiny_bert, "--calibrator", "none")
    assert done.returncode == 0, done.stderr
    return index_home


# --- the index home ------------------------------------------------------------------------------------------


def test_the_index_home_does_not_depend_on_the_current_folder(cli, docs, tiny_bert, index_home, tmp_path,
                                                              monkeypatch):
    somewhere, elsewhere = tmp_path / "somewhere", tmp_path / "elsewhere"
    somewhere.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(somewhere)
    done = cli("build", docs, "--model", tiny_bert, "--calibrator", "none")
    assert done.returncode == 0, done.stderr
    # the index home is the default: the hint needs no --index-dir
    assert done.stderr.strip().endswith('search it with: retriever search "..." --name docs')
    assert (index_home / "docs").is_symlink() and not (somewhere / "indexes").exists()
    monkeypatch.chdir(elsewhere)
    done = cli("search", TEXTS[1], "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"][0]["doc_id"] == "docs.txt:2"
    # messages name the folder absolutely, whatever was typed
    assert_one_line_error(cli("search", "q", "--name", "absent", "--index-dir", "rel"),
                          f"no index named 'absent' in {elsewhere / 'rel'}; build it with: retriever build CORPUS "
                          f"--name absent --index-dir {elsewhere / 'rel'}")
    monkeypatch.setenv("RETRIEVER_HOME", str(tmp_path / "other-home"))
    assert_one_line_error(cli("search", "q"), f"no index in {tmp_path / 'other-home'}; build one with: "
                                              "retriever build CORPUS")


def test_an_index_dir_that_is_a_file_fails_before_anything_is_read(cli, docs, tmp_path, monkeypatch):
    import retriever.engines.local

    monkeypatch.setattr(retriever.engines.local, "iter_corpus", lambda *a, **k: pytest.fail("read the corpus"))
    readme = tmp_path / "README.md"
    readme.write_text("not a folder")
    assert_one_line_error(cli("build", docs, "--name", "x", "--index-dir", readme),
                          f"index folder {readme} is not a folder")
    assert_one_line_error(cli("list", "--index-dir", readme), f"index folder {readme} is not a folder")


# --- list, show, remove --------------------------------------------------------------------------------------


def test_list_shows_every_index_and_json(cli, built_home, tmp_path, tiny_bert, monkeypatch):
    import cli.index_commands as commands

    monkeypatch.setattr(commands, "stdout", Console(width=250, soft_wrap=True))  # the model is a long path
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps({"_id": f"m{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    assert cli("build", more, "--model", tiny_bert, "--calibrator", "flow").returncode == 0  # falls back to none
    done = cli("list")
    assert done.returncode == 0, done.stderr
    assert f"indexes in {built_home}" in done.stdout
    lines = done.stdout.splitlines()
    more_line = next(line for line in lines if "│ more " in line)
    docs_line = next(line for line in lines if "│ docs " in line)
    assert lines.index(more_line) < lines.index(docs_line)  # the most recently written first
    assert "4" in docs_line and "flat" in docs_line and "none" in docs_line and "(UTC)" in done.stdout
    assert "(flow asked" in done.stdout
    listed = json.loads(cli("list", "--json").stdout)
    assert listed["index_dir"] == str(built_home)
    assert [(r["name"], r["documents"], r["calibrator"], r["index_type"]) for r in listed["indexes"]] == [
        ("more", 4, "none", "flat"), ("docs", 4, "none", "flat")]
    assert listed["indexes"][0]["calibrator_asked"] == "flow" and listed["indexes"][1]["model"] == str(tiny_bert)
    # Every field it prints is one its --help names (a field added without a word there fails here).
    documented = set(re.findall(r'"(\w+)"', " ".join(cli("list", "--help").stdout.split()).replace("│", "")))
    assert {key for record in listed["indexes"] for key in record} | set(listed) <= documented
    empty = cli("list", "--index-dir", tmp_path / "nothing-here")
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no index in" in empty.stderr and "retriever build CORPUS --index-dir" in empty.stderr
    assert json.loads(cli("list", "--json", "--index-dir", tmp_path / "nothing-here").stdout)["indexes"] == []


def test_show_prints_one_document_in_full(cli, built_home, tmp_path, tiny_bert):
    long_text = " ".join(f"word{i}" for i in range(150))
    corpus = tmp_path / "titled.jsonl"
    corpus.write_text(json.dumps({"_id": "d-1", "title": "The title", "text": long_text}) + "\n"
                      + json.dumps({"_id": "d-2", "text": "short"}) + "\n")
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none").returncode == 0
    done = cli("show", "titled", "d-1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"doc_id": "d-1", "title": "The title", "text": long_text,
                                       "source": str(corpus), "line": 1, "metadata": None}
    table = cli("show", "titled", "d-1")
    assert table.returncode == 0
    words = table.stdout.replace("│", " ").split()
    assert all(f"word{i}" in words for i in range(150)) and "d-1" in words and str(corpus) in "".join(words)
    assert_one_line_error(cli("show", "titled", "d-9"), "no document 'd-9' in index 'titled'")
    assert_one_line_error(cli("show", "absent", "d-1"), f"no index named 'absent' in {built_home}")
    assert_one_line_error(cli("show", "bad name", "d-1"), "invalid index name 'bad name'")


def test_remove_asks_unless_yes_and_removes_every_version(cli, built_home, monkeypatch):
    import typer

    assert cli("delete", "docs.txt:1", "--name", "docs").returncode == 0  # a second version
    answers = []
    monkeypatch.setattr(typer, "confirm", lambda question, **k: answers.append(question) or False)
    done = cli("remove", "docs")
    assert done.returncode == 1 and "kept index 'docs'" in done.stderr
    assert answers == [f"remove index 'docs' (3 documents) from {built_home}?"]
    assert (built_home / "docs").is_symlink()

    def abort(cause):  # as click's prompt answers Ctrl-C and the end of input
        def confirm(question, **k):
            try:
                raise cause
            except (KeyboardInterrupt, EOFError):
                raise typer.Abort() from None
        return confirm

    monkeypatch.setattr(typer, "confirm", abort(KeyboardInterrupt()))
    interrupted = cli("remove", "docs")  # Ctrl-C at the question, whatever stdin is
    assert interrupted.returncode == 130 and interrupted.stderr.strip() == "interrupted: index 'docs' is unchanged"
    monkeypatch.setattr(typer, "confirm", abort(EOFError()))
    closed = cli("remove", "docs")
    assert closed.returncode == 1 and "no answer to the question (input is closed)" in closed.stderr
    monkeypatch.setattr(typer, "confirm", lambda question, **k: True)
    done = cli("remove", "docs")
    assert done.returncode == 0 and f"removed index 'docs' from {built_home}" in done.stderr
    assert not (built_home / "docs").exists() and not (built_home / VERSIONS / "docs").exists()
    assert_one_line_error(cli("remove", "docs", "--yes"), f"no index named 'docs' in {built_home}")


def test_remove_yes_never_asks_and_refuses_while_a_writer_runs(cli, built_home, monkeypatch):
    import typer

    monkeypatch.setattr(typer, "confirm", lambda *a, **k: pytest.fail("asked despite --yes"))
    lock_path = built_home / VERSIONS / "docs" / LOCK
    with open(lock_path, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert_one_line_error(cli("remove", "docs", "-y"), "index 'docs' is being written by another retriever "
                              f"process (pid {os.getpid()}); wait for it to finish, then remove it")
    assert (built_home / "docs").is_symlink()
    assert cli("remove", "docs", "-y").returncode == 0 and not (built_home / "docs").exists()


def test_a_write_that_waits_for_another_says_so(cli, built_home):
    """From a QA run: a delete queued behind a running refit sat silent for as long as the refit ran."""
    import threading

    lock_path = built_home / VERSIONS / "docs" / LOCK
    with open(lock_path, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        release = threading.Timer(0.5, fcntl.flock, (lock, fcntl.LOCK_UN))
        release.start()
        done = cli("delete", "docs.txt:1", "--name", "docs")
        release.join()
    assert done.returncode == 0, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("waiting: index 'docs' is being written by another retriever process (pid ")
    assert first.endswith("); this write goes next") and "updated index 'docs'" in done.stderr
    assert "waiting" not in cli("delete", "docs.txt:2", "--name", "docs").stderr  # only where it waits


# --- names, queries, result tables -----------------------------------------------------------------------------


def test_bad_names_are_one_line_errors_that_show_the_rule_before_anything_is_read(cli, docs, tmp_path, monkeypatch):
    import retriever.engines.local

    monkeypatch.setattr(retriever.engines.local, "iter_corpus", lambda *a, **k: pytest.fail("read the corpus"))
    for name in ("a" * 300, "my index", "é-名前", "-x", "../escape", ".hidden"):
        assert_one_line_error(cli("build", docs, "--name", name), "invalid index name", NAME_RULE)
    assert_one_line_error(cli("build", docs, "--name=-x"), "invalid index name '-x'", NAME_RULE)
    assert_one_line_error(cli("build", docs, "--name", "a" * 300), "(300 characters)")
    spaced = tmp_path / "my docs.txt"
    spaced.write_text("text\n")
    assert_one_line_error(cli("build", spaced), "the corpus file's stem 'my docs' is not a valid index name",
                          NAME_RULE, "pass --name")
    assert_one_line_error(cli("search", "q", "--name", "my index"), "invalid index name 'my index'", NAME_RULE)


def test_the_search_hint_after_build_pastes_into_a_shell(cli, docs, tiny_bert, tmp_path):
    index_dir = tmp_path / "a folder with spaces"
    done = cli("build", docs, "--name", "docs.v1", "--model", tiny_bert, "--calibrator", "none",
               "--index-dir", index_dir)
    assert done.returncode == 0, done.stderr
    hint = done.stderr.strip().splitlines()[-1]
    assert hint == f"search it with: retriever search \"...\" --name docs.v1 --index-dir '{index_dir}'"
    import shlex

    argv = shlex.split(hint.removeprefix("search it with: retriever "))
    again = cli(*[TEXTS[0] if arg == "..." else arg for arg in argv], "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["results"][0]["doc_id"] == "docs.txt:1"


def test_empty_or_blank_queries_are_one_line_errors(cli, built_home):
    # zero-width spaces, a byte-order mark: nothing either side reads (from a QA run: each ranked every document alike)
    for query in ("", "   ", "\t\n", "\u200b\u200b", "\ufeff", "\u2060 \u200d"):
        assert_one_line_error(cli("search", query), "empty query: give some text to search for")
    for query in ("lamp", ""):
        assert_one_line_error(cli("search", query, "--queries", "nowhere.txt"),
                              'give either a query ("...") or --queries FILE, not both')


def test_tables_never_cut_doc_ids_and_full_shows_whole_texts(cli, tmp_path, tiny_bert, monkeypatch):
    import cli.index_commands as commands

    monkeypatch.setattr(commands, "stdout", Console(width=120, soft_wrap=True))
    long_id = "collection-2024/section-17/" + "x" * 12 + "-document-000123"  # 55 characters
    long_text = " ".join(f"word{i}" for i in range(120))
    corpus = tmp_path / "long.jsonl"
    corpus.write_text(json.dumps({"_id": long_id, "title": "Title", "text": long_text}) + "\n"
                      + json.dumps({"_id": "short", "text": "tiny text"}) + "\n")
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none").returncode == 0

    snippet = cli("search", "word5", "--name", "long", "--mode", "dense")
    assert snippet.returncode == 0, snippet.stderr
    rows = [line for line in snippet.stdout.splitlines() if long_id in line]
    assert len(rows) == 1 and rows[0].rstrip().endswith("… │")  # the whole id, the text cut on one line
    assert len(snippet.stdout.splitlines()) == 7  # title, 3 header lines, 2 rows, bottom
    # Hybrid tables add where each side ranked a hit (dense / keyword rank): the id still whole, on one line
    # where the width allows.
    monkeypatch.setattr(commands, "stdout", Console(width=130, soft_wrap=True))
    hybrid = cli("search", "word5", "--name", "long")
    assert hybrid.returncode == 0, hybrid.stderr
    header = next(line for line in hybrid.stdout.splitlines() if "doc id" in line)
    assert "d/k" in header
    rows = [line for line in hybrid.stdout.splitlines() if long_id in line]
    assert len(rows) == 1 and "/1 │" in rows[0] and rows[0].rstrip().endswith("… │")  # keyword's first
    assert any("/- │" in line and "short" in line for line in hybrid.stdout.splitlines())  # no keyword match

    full = cli("search", "word5", "--name", "long", "--full")
    assert full.returncode == 0
    assert any(long_id in line for line in full.stdout.splitlines())
    words = full.stdout.replace("│", " ").split()
    assert all(f"word{i}" in words for i in range(120)) and "…" not in full.stdout

    monkeypatch.setattr(commands, "stdout", Console(width=50, soft_wrap=True))  # too narrow: the id folds
    narrow = cli("search", "word5", "--name", "long", "--mode", "dense")
    id_column = "".join(line.split("│")[3].strip() for line in narrow.stdout.splitlines() if line.count("│") == 4)
    assert long_id in id_column  # above its text (`test_search_results_are_readable_at_80_columns`)


# --- help ------------------------------------------------------------------------------------------------------


def test_every_option_shows_its_default_and_choices():
    import typer.main

    from cli.main import app
    from cli.options import DEVICES, DTYPES, INDEX_TYPES, POOLING_MODES

    group = typer.main.get_command(app)
    checked = 0
    for command_name, command in group.commands.items():
        for param in command.params:
            if param.param_type_name != "option" or param.is_flag or param.required or param.name == "help":
                continue
            help_text = param.help or ""
            shown = param.show_default is not False and param.default is not None
            assert shown or "[default:" in help_text, f"{command_name} {param.opts}: no default in its help"
            checked += 1
    assert checked > 60
    choices = {"--pooling": POOLING_MODES, "--dtype": DTYPES, "--index-type": INDEX_TYPES,
               "--device": (*DEVICES, "cuda:N")}
    found = set()
    for command_name, command in group.commands.items():
        for param in command.params:
            for option, values in choices.items():
                if option in getattr(param, "opts", ()):
                    assert param.metavar == "[" + "|".join(values) + "]", (command_name, option)
                    found.add(option)
            if "--calibrator" in getattr(param, "opts", ()) and command_name != "bench":
                assert all(name in param.help for name in ("flow", "whitening", "natsv-K", "none"))
    assert found == set(choices)
    # the library's own lists, which the CLI repeats so that --help imports neither torch nor faiss
    from retriever.encode.device import DEVICES as LIBRARY_DEVICES
    from retriever.encode.encoder import DTYPES as LIBRARY_DTYPES
    from retriever.encode.pooling import POOLING_MODES as LIBRARY_POOLING
    from retriever.store.spec import INDEX_TYPES as LIBRARY_INDEX_TYPES

    assert (POOLING_MODES, DEVICES, DTYPES, INDEX_TYPES) == (
        LIBRARY_POOLING, LIBRARY_DEVICES, tuple(LIBRARY_DTYPES), LIBRARY_INDEX_TYPES)


def test_help_renders_the_default_notes_and_choices(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # typer's help console reads it: each option on one line
    done = cli("build", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.replace("│", " ").split())
    assert "[default: the corpus file's stem, or the folder's name]" in text  # not eaten as rich markup
    assert "[default: all-MiniLM-L6-v2, embedded]" in text and "[default: 0]" in text
    assert "[cls|last-avg|last2-avg|first-last-avg]" in text and "[default: last-avg]" in text
    assert "[default: $RETRIEVER_HOME, else" in text
    assert_usage_error(cli("build", "x.txt", "--pooling", "mean"),
                       "'mean' is not one of cls, last-avg, last2-avg, first-last-avg")
    assert_usage_error(cli("search", "q", "--device", "gpu"), "'gpu' is not one of auto, cpu, cuda, cuda:N")
    # a negative seed reached auto's check after the corpus was encoded, and ended in a traceback (a QA run)
    for command in (["build", "x.txt"], ["refit", "x"], ["check", "x"], ["bench", "stsb"]):
        assert_usage_error(cli(*command, "--seed", "-1"), "--seed", "'-1' is not a whole number from 0 to")


# --- usage errors: one line each ---------------------------------------------------------------------------------

WHOLE_K = "is not a whole number from 1 to 10000"


@pytest.mark.parametrize(
    "arguments, line",
    [
        (["search", "q", "-k", "1e9"], f"invalid value for -k: '1e9' {WHOLE_K}"),
        (["search", "q", "-k", "abc"], f"invalid value for -k: 'abc' {WHOLE_K}"),
        (["search", "q", "-k", "0"], f"invalid value for -k: '0' {WHOLE_K}"),
        (["search", "q", "-k", "-1"], f"invalid value for -k: '-1' {WHOLE_K}"),
        (["search", "q", "-k", "1000000000"], f"invalid value for -k: '1000000000' {WHOLE_K}"),
        (["search", "q", "--weight", "2"], "invalid value for --weight: '2' is not a number from 0 to 1"),
        (["search", "q", "--min-score", "high"], "invalid value for --min-score: 'high' is not a number"),
        (["search", "q", "--nprobe", "many"], "invalid value for --nprobe: 'many' is not a whole number"),
        (["search", "q", "--mode", "fuzzy"], "invalid value for --mode: 'fuzzy' is not one of dense, keyword, hybrid"),
        (["build", "x.txt", "--index-type", "annoy"],
         "invalid value for --index-type: 'annoy' is not one of auto, flat, hnsw, ivf, ivfpq"),
        (["build", "x.txt", "--fit-sample", "2.5"], "invalid value for --fit-sample: '2.5' is not a whole number"),
        (["encode", "x.txt", "-o", "x.npy", "--batch-size", "x"],
         "invalid value for --batch-size: 'x' is not a whole number"),
        (["serve", "--port", "70000"], "invalid value for --port: '70000' is not a whole number from 1 to 65535"),
        (["serve", "--shards", "0"], "invalid value for --shards: '0' is not a whole number of at least 1"),
        (["bench", "--seed", "one"], "invalid value for --seed: 'one' is not a whole number from 0 to "
                                     "18446744073709551615"),
        (["search", "q", "--bogus"], "no such option: --bogus (see retriever search --help)"),
        # a query that starts with '-' (a QA run: nothing said how to search for it)
        (["search", "-5 degrees"], "no such option: -5: an argument that starts with '-' goes last, after '--' "
                                   "(retriever search [OPTIONS] -- '-5 degrees')"),
        (["search", "q", "-k"], "option '-k' requires an argument (see retriever search --help)"),
        (["search", "q", "extra"], "got unexpected extra argument(s) (extra) (see retriever search --help)"),
        (["rollback"], "missing argument '[INDEX] VERSION' (see retriever rollback --help)"),
        (["encode", "x.txt"], "missing option '--out' / '-o' (see retriever encode --help)"),
        (["frobnicate"], "no such command 'frobnicate' (see retriever --help)"),
        (["serch", "q"], "no such command 'serch'. Did you mean 'search', 'serve', 'bench'? (see retriever --help)"),
        # a command that deletes is suggested for a near miss only (a QA run: `rename` was told of `remove`)
        (["rename", "a", "b"], "no such command 'rename' (see retriever --help)"),
        (["remov", "a"], "no such command 'remov'. Did you mean 'remove'? (see retriever --help)"),
    ],
)
def test_a_bad_command_line_is_one_error_line(cli, arguments, line):
    """Exit code 2, as click gives a usage error, but the project's one line instead of a usage box."""
    done = cli(*arguments)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"error: {line}\n")


def test_a_folder_or_a_corpus_file_where_another_path_is_meant_says_so(cli, tmp_path):
    """From a CLI QA run: a folder given as a corpus file was an 'unsupported format (no extension)', as fit
    queries 'no such file'; two corpus files to build were 'not a format a reader reads'; a folder with no model
    in it broke off in the middle of transformers' list."""
    (tmp_path / "a.jsonl").write_text('{"_id": "a", "text": "one"}\n')
    (tmp_path / "b.jsonl").write_text('{"_id": "b", "text": "two"}\n')
    (tmp_path / "empty").mkdir()
    cases = {("encode", tmp_path, "--out", tmp_path / "x.npy"):
             f"{tmp_path}: a folder, where one corpus file is read (.txt, .jsonl, .csv, .tsv, or .gz of them)",
             ("build", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--name", "two", "--index-dir", tmp_path / "h"):
             f"{tmp_path / 'a.jsonl'}: not a format a reader reads (Markdown, HTML, reStructuredText, text, PDF, Word) "
             "(a corpus file, .jsonl, .csv, .tsv, is read alone: build from one, then add the others)",
             ("build", tmp_path / "a.jsonl", "--model", tmp_path / "empty", "--index-dir", tmp_path / "h"):
             f"model folder {tmp_path / 'empty'} holds no config.json: not a model saved by transformers "
             "(save_pretrained), or not the folder holding its files"}
    cases[("build", tmp_path / "a.jsonl", "--index-type", "flat", "--opq", "--index-dir", tmp_path / "h")] = (
        "--index-type flat takes no opq (an option of another index type)")
    for arguments, line in cases.items():
        done = cli(*arguments)
        assert (done.returncode, done.stderr) == (1, f"error: {line}\n"), arguments


def test_h_is_help_as_for_most_commands(cli):
    """From a CLI QA run: -h was an unknown option."""
    for arguments in (["-h"], ["search", "-h"], ["build", "-h"]):
        done = cli(*arguments)
        assert done.returncode == 0 and "Usage: retriever" in done.stdout, arguments


def test_help_and_version_still_print_in_full(cli):
    from retriever import __version__

    done = cli("search", "--help")
    assert done.returncode == 0 and done.stderr == ""
    assert "Usage:" in done.stdout and "-k" in done.stdout and "--mode" in done.stdout
    done = cli()  # no command: the whole help, exit code 2 as before
    assert done.returncode == 2 and "Commands" in done.stdout and "rollback" in done.stdout
    assert cli("--version").stdout == f"retriever {__version__}\n"


def test_long_values_are_shortened_in_error_lines(cli, built_home):
    for version in ("x" * 5000, "7" * 5000):  # the digits once made int() fail with a traceback
        done = cli("rollback", version, "--name", "docs")
        assert_one_line_error(done, "index 'docs' has no kept version '" + version[:50], version[-50:] + "'")
        assert len(done.stderr) < 400 and "…" in done.stderr
    done = cli("search", "q", "-k", "9" * 5000)
    assert done.returncode == 2 and len(done.stderr) < 400 and done.stderr.count("\n") == 1


# --- Ctrl-C and stray OS errors ----------------------------------------------------------------------------------


def killed_build(corpus: Path, tiny_bert, signal_name: str) -> subprocess.CompletedProcess:
    """`retriever build CORPUS --replace` of 'docs' in a process of its own, in chunks of 8, sent SIGNAL_NAME (SIGINT:
    Ctrl-C) as its third batch is encoded."""
    # A job started with '&' from a non-interactive shell (a CI runner, nohup) inherits SIGINT as ignored, and
    # Python then keeps it ignored; the child restores the handler a terminal's Ctrl-C would meet.
    script = textwrap.dedent(f"""
        import os, signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import retriever.index as index
        from retriever.encode.encoder import Encoder
        from retriever.encode.query_kit import QueryKitEncoder
        build = index.Index.build.__func__
        index.Index.build = classmethod(lambda cls, *a, **k: build(cls, *a, **{{**k, "chunk_rows": 8}}))
        calls = [0]
        def signalled(encode):  # by the model or from its kit, whichever encodes
            def encode_tokenized(self, tokenized, *args):
                calls[0] += 1
                if calls[0] == 3:
                    os.kill(os.getpid(), signal.{signal_name})
                return encode(self, tokenized, *args)
            return encode_tokenized
        for encoder in (Encoder, QueryKitEncoder):
            encoder.encode_tokenized = signalled(encoder.encode_tokenized)
        sys.argv = ["retriever", "build", {str(corpus)!r}, "--model", {str(tiny_bert)!r}, "--calibrator", "none",
                    "--replace"]
        from cli.main import main
        main()
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_ctrl_c_during_a_build_is_one_line_and_the_build_resumes(cli, built_home, docs, tiny_bert, tmp_path):
    """A real SIGINT while encoding a rebuild of 'docs' (in chunks of 8, the third chunk interrupted): exit 130,
    one line saying the index is unchanged, the previous version still searches, and the same command resumes."""
    corpus = tmp_path / "docs.txt"
    corpus.write_text("".join(f"Document number {i} about topic {i % 5}.\n" for i in range(40)), encoding="utf-8")
    killed = killed_build(corpus, tiny_bert, "SIGINT")
    assert killed.returncode == 130, killed.stderr
    assert killed.stderr.strip().splitlines()[-1] == (
        "interrupted: index 'docs' is unchanged (the previous version is intact); re-run the same command to resume")
    assert "Traceback" not in killed.stderr and "Aborted" not in killed.stderr
    before = cli("search", TEXTS[2], "--json")
    assert json.loads(before.stdout)["results"][0]["doc_id"] == "docs.txt:3"  # the previous version
    listed = cli("list")  # the interrupted build is shown, with how to resume or drop it
    line = next(line for line in listed.stderr.splitlines() if line.startswith("interrupted build of 'docs'"))
    assert "16 of 40 documents encoded" in line and "run the same build command again to resume" in line
    assert json.loads(cli("list", "--json").stdout)["interrupted_builds"][0]["encoded"] == 16
    again = cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--replace")
    assert again.returncode == 0, again.stderr
    assert "resumed a killed build: 16 of 40 documents were already encoded" in again.stderr
    assert json.loads(cli("list", "--json").stdout)["interrupted_builds"] == []
    assert "built index 'docs': 40 documents" in again.stderr


def test_sigterm_during_a_build_unwinds_as_ctrl_c_does(cli, built_home, tiny_bert, tmp_path):
    """From a QA run: `kill` (SIGTERM) exited 143 without a word and left its partial folder until the next write.
    It is unwound as Ctrl-C is: one line, exit 143 as a shell reports it, the build resumable."""
    corpus = tmp_path / "docs.txt"
    corpus.write_text("".join(f"Document number {i} about topic {i % 5}.\n" for i in range(40)), encoding="utf-8")
    killed = killed_build(corpus, tiny_bert, "SIGTERM")
    assert killed.returncode == 143, killed.stderr
    assert killed.stderr.strip().splitlines()[-1] == (
        "terminated: index 'docs' is unchanged (the previous version is intact); re-run the same command to resume")
    assert "Traceback" not in killed.stderr
    assert json.loads(cli("list", "--json").stdout)["interrupted_builds"][0]["encoded"] == 16


def test_ctrl_c_while_the_command_line_loads_is_one_line():
    """From a CLI QA run: a Ctrl-C in the first tenth of a second (the imports of typer, rich and the library)
    printed the traceback of whichever import it landed in. The console script (`cli.entry`) says "interrupted"."""
    script = textwrap.dedent("""
        import os, signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Ctrl-C meets it
        class CtrlC:  # lands as typer is imported
            def find_spec(self, name, path, target=None):
                if name == "typer":
                    os.kill(os.getpid(), signal.SIGINT)
                return None
        sys.meta_path.insert(0, CtrlC())
        sys.argv = ["retriever", "list"]
        from cli.entry import main
        main()
    """)
    loading = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert (loading.returncode, loading.stderr) == (130, "interrupted\n")
    assert 'retriever = "cli.entry:main"' in (REPO / "pyproject.toml").read_text()  # what the console script runs
    # a job started in the background ignores Ctrl-C, and goes on ignoring it (from the review)
    ignored = textwrap.dedent("""
        import signal
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        import cli.main
        cli.main.main = lambda: print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
        from cli.entry import main
        main()
    """)
    kept = subprocess.run([sys.executable, "-c", ignored], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert kept.stdout.strip() == "True", kept.stderr


def test_ctrl_c_while_a_command_line_is_parsed_is_one_line(cli, monkeypatch):
    """From a CLI QA run: a Ctrl-C landing while typer parsed the arguments (outside every command's body) exited
    130 with nothing said: typer answers it with its own exit code."""
    import typer.core

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(typer.core.TyperGroup, "resolve_command", interrupted)  # the command's name, parsed
    done = cli("list")
    assert (done.returncode, done.stderr) == (130, "interrupted\n")


def test_ctrl_c_during_other_commands(cli, built_home, tmp_path, monkeypatch):
    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder
    from retriever.index import Index

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    extra = tmp_path / "extra.txt"
    extra.write_text("A new document.\n")
    for encoder in (Encoder, QueryKitEncoder):  # by the model or from its kit, whichever encodes
        monkeypatch.setattr(encoder, "encode_tokenized", interrupt)
    done = cli("add", extra, "--name", "docs")
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (
        130, "interrupted: index 'docs' is unchanged (the previous version is intact)")
    assert len(Index.open("docs", built_home)) == 4
    monkeypatch.setattr(Encoder, "encode", interrupt)
    monkeypatch.setattr(QueryKitEncoder, "encode", interrupt)  # a search may encode from the kept kit
    done = cli("search", "q")
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (130, "interrupted")
    done = cli("encode", extra, "--out", tmp_path / "v.npy", "--model", Index.open("docs", built_home)
               .snapshot.manifest.encoder["model"])
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (
        130, f"interrupted: {tmp_path / 'v.npy'} is incomplete; re-run the same command to resume")


def test_a_stray_os_error_is_one_line(cli, built_home, monkeypatch):
    from retriever.index import Index

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/indexes/docs")

    monkeypatch.setattr(Index, "delete", full_disk)
    assert_one_line_error(cli("delete", "docs.txt:1", "--name", "docs"),
                          "error: No space left on device: /data/indexes/docs")
    monkeypatch.setattr(Index, "compact", lambda self: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")))
    assert_one_line_error(cli("compact", "--name", "docs"), "error: denied")


# --- concurrent builds, too-small corpora -------------------------------------------------------------------------


def test_a_build_refuses_while_another_process_writes_that_index(cli, built_home, docs, tiny_bert):
    versions = built_home / VERSIONS / "docs"
    before = sorted(os.listdir(versions))
    holder = subprocess.Popen(  # another process holding the writer lock, as a running build does
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from retriever.versions.folder import writer_lock
            with writer_lock({str(built_home)!r}, "docs"):
                print("locked", flush=True)
                sys.stdin.readline()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "locked"
        done = cli("build", docs, "--model", tiny_bert, "--calibrator", "none", "--replace")
        assert_one_line_error(done, f"error: index 'docs' is being written by another retriever process (pid "
                                    f"{holder.pid}); wait for it to finish, or build under another --name")
        assert sorted(os.listdir(versions)) == before  # nothing written
    finally:
        holder.communicate("\n", timeout=30)
    assert cli("build", docs, "--model", tiny_bert, "--calibrator", "none", "--replace").returncode == 0  # free again


def test_a_one_document_corpus_builds_uncalibrated_with_a_warning(cli, tmp_path, tiny_bert):
    one = tmp_path / "one.txt"
    one.write_text("The only document.\n")
    done = cli("build", one, "--model", tiny_bert, "--calibrator", "flow")
    assert done.returncode == 0, done.stderr
    warning = ("warning: only 1 document: too few to fit the flow (it needs at least 33 for 32 dimensions); built "
               "without calibration (calibrator none); once the index holds more documents run: retriever refit "
               "--name one --calibrator flow")
    assert done.stderr.count(warning) == 1 and "1 document truncated" not in done.stderr
    assert json.loads(cli("search", "only", "--json").stdout)["results"][0]["doc_id"] == "one.txt:1"
    info = cli("info", "--name", "one")
    assert "flow was asked for: only 1 document" in " ".join(info.stdout.replace("│", " ").split())
    assert_one_line_error(cli("refit", "--name", "one", "--calibrator", "flow"),
                          "index 'one' holds only 1 document: too few to fit the flow (it needs at least 33 for "
                          "32 dimensions)")


def test_counts_agree_with_their_nouns(cli, tmp_path, tiny_bert, monkeypatch):
    corpus = tmp_path / "long.txt"
    corpus.write_text("word " * 2000 + "\n")
    done = cli("encode", corpus, "--out", tmp_path / "v.npy", "--model", tiny_bert)
    assert done.returncode == 0 and "1 text truncated at 512 tokens" in done.stderr, done.stderr
    done = cli("build", corpus, "--model", tiny_bert, "--calibrator", "none")
    assert "built index 'long': 1 document (1 encoded)" in done.stderr
    assert "1 document longer than the encoder reads cut into passages (29 vectors in all)" in done.stderr
    done = cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--no-passages", "--name", "cut")
    assert "1 document truncated at the max length" in done.stderr
    # A document past the passages a document may have (65,536; 5 here) keeps the first ones, and says so.
    corpus.write_text("word " * 2000 + "qxtail\n")
    for module in ("retriever.encode.passages", "cli.index_commands"):
        monkeypatch.setattr(importlib.import_module(module), "MAX_PASSAGES", 5)
    done = cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--name", "capped")
    assert ("1 document longer than the encoder reads cut into passages (5 vectors in all); 1 document longer than "
            "5 passages: dense search reads the first 5 of it, keyword search all of it") in done.stderr
    assert json.loads(cli("search", "qxtail", "--name", "capped", "--mode", "keyword", "--json").stdout)["results"]
    assert_one_line_error(cli("delete", "absent", "--name", "long"), "1 id is not in the index: 'absent'")
    done = cli("verify", "long")
    assert done.returncode == 0 and "files, " in done.stderr


# --- damaged indexes, a full disk -----------------------------------------------------------------------------


def test_a_damaged_index_is_one_error_line_in_every_command(cli, built_home):
    config = (built_home / "docs").resolve() / "calibrator" / "calibrator.json"
    data = bytearray(config.read_bytes())
    data[3] ^= 0xFF  # not UTF-8 any more: a UnicodeDecodeError deep in a JSON read
    config.write_bytes(bytes(data))
    damaged = "error: index 'docs' is damaged: calibrator cannot be read"
    for command in (("search", "a query", "--name", "docs"), ("info", "--name", "docs"), ("show", "docs", "x"),
                    ("check", "docs"), ("delete", "docs.txt:1", "--name", "docs")):
        assert_one_line_error(cli(*command), damaged)
    assert_one_line_error(cli("verify", "docs"),
                          "error: index 'docs' is damaged: calibrator/calibrator.json does not match its manifest")
    listed = cli("list", "--json")
    assert listed.returncode == 0 and "calibrator cannot be read" not in listed.stdout  # list reads manifests only


def test_a_full_disk_during_refit_is_one_error_line(cli, built_home, monkeypatch):
    from retriever.store.vectors import VectorStore

    def full(*args, **kwargs):  # faiss's wording: strerror inside a RuntimeError
        raise RuntimeError("Error in void faiss::FileIOWriter::operator()(const void*, size_t, size_t) at "
                           "impl/io.cpp:120: Error: 'ret == nitems' failed: write error: No space left on device")

    before = (built_home / "docs").resolve()
    monkeypatch.setattr(VectorStore, "save", full)
    assert_one_line_error(cli("refit", "--name", "docs", "--calibrator", "sn"),
                          "error: index 'docs' was not written: the disk is full (No space left on device); the "
                          "previous version is intact")
    assert (built_home / "docs").resolve() == before


# --- issue 45: what a new user met ---------------------------------------------------------------------------


def test_every_command_on_one_index_takes_its_name_as_an_argument(cli, built_home, docs, tiny_bert, tmp_path):
    """info, versions, compact, refit (INDEX), add and rollback ([INDEX] X) take the index as check and show do:
    as an argument or with --name, both agreeing. ('more' is built last: picking the latest would be wrong.)"""
    more = tmp_path / "more.txt"
    more.write_text("\n".join(reversed(TEXTS)) + "\n", encoding="utf-8")
    assert cli("build", more, "--model", tiny_bert, "--calibrator", "none").returncode == 0
    extra = tmp_path / "extra.txt"
    extra.write_text("A new document about ships.\n", encoding="utf-8")
    for command in (("info", "docs", "--json"), ("versions", "docs", "--json")):
        done = cli(*command)
        assert done.returncode == 0 and "using index" not in done.stderr, done.stderr
        assert json.loads(done.stdout).get("name", json.loads(done.stdout).get("manifest", {}).get("name")) == "docs"
    assert json.loads(cli("info", "docs", "--name", "docs", "--json").stdout)["manifest"]["name"] == "docs"
    assert_one_line_error(cli("info", "docs", "--name", "more"),
                          "two different indexes named: 'docs' and --name 'more'")
    done = cli("add", "docs", extra)
    assert done.returncode == 0 and "updated index 'docs': 5 documents" in done.stderr, done.stderr
    assert cli("add", extra, "--name", "more").returncode == 0  # --name as before
    assert cli("compact", "docs").returncode == 0
    done = cli("refit", "docs", "--calibrator", "sn")
    assert done.returncode == 0 and "refitted index 'docs'" in done.stderr, done.stderr
    done = cli("rollback", "docs", "3")  # the compacted version, before the refit
    assert done.returncode == 0 and "index 'docs' is at version 3 again: 5 documents" in done.stderr, done.stderr
    assert cli("rollback", "2", "--name", "more").returncode == 0
    assert_one_line_error(cli("rollback", "docs", "1", "2"), "rollback takes one version")
    assert_one_line_error(cli("add", "docs", extra, extra), "add takes one corpus")
    assert len(json.loads(cli("versions", "more", "--json").stdout)["versions"]) == 2


def test_info_measures_isotropy_on_the_smaller_side(cli, built_home, monkeypatch):
    """The top direction's share of the variance is the top eigenvalue of a (dim x dim) covariance, or of the
    (rows x rows) Gram matrix of the same vectors: the same nonzero eigenvalues. A small index (4 documents, 32
    dimensions here; 40 and 384 with MiniLM) solves the small one, and every one is solved on one BLAS thread: a
    384 x 384 eigenproblem took seconds on 2 busy cores with two, and `info` with it."""
    import numpy as np
    from threadpoolctl import threadpool_info

    from retriever.numeric import anisotropy

    solved, eigvalsh = [], np.linalg.eigvalsh

    def recorded(matrix):
        threads = {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}
        solved.append((matrix.shape, threads))
        return eigvalsh(matrix)

    monkeypatch.setattr(np.linalg, "eigvalsh", recorded)
    done = cli("info", "--name", "docs", "--json")
    assert done.returncode == 0, done.stderr
    assert solved and all(shape == (4, 4) and threads == {1} for shape, threads in solved), solved
    for rows, dim in ((40, 384), (500, 16)):  # the same values as the covariance's eigenvalues give
        vectors = np.random.default_rng(rows).standard_normal((rows, dim)) + 0.5
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        centered = unit - unit.mean(0)
        spectrum = eigvalsh(centered.T @ centered)
        assert anisotropy(vectors)["top_direction_share"] == round(spectrum[-1] / spectrum.sum(), 4)
        assert solved[-1] == ((min(rows, dim),) * 2, {1})


def test_a_rate_not_yet_known_is_not_shown_as_a_dash():
    from rich.progress import Progress

    from retriever.progress import RateColumn

    progress = Progress()
    task = progress.add_task("Encoding", total=10)
    column = RateColumn("texts")
    assert str(column.render(progress.tasks[0])) == "…"  # running, no rate yet
    progress.update(task, completed=10)
    assert str(column.render(progress.tasks[0])) == ""  # done too fast to measure
    assert "- texts/s" not in str(column.render(progress.tasks[0]))


def test_a_count_of_nothing_truncated_is_not_said(cli, built_home, tiny_bert, tmp_path):
    extra = tmp_path / "extra.txt"
    extra.write_text("A short new document.\n", encoding="utf-8")
    for done in (cli("add", extra, "--name", "docs"),
                 cli("build", extra, "--name", "short", "--model", tiny_bert, "--calibrator", "none"),
                 cli("encode", extra, "--out", tmp_path / "v.npy", "--model", tiny_bert)):
        assert done.returncode == 0, done.stderr
        assert "truncated" not in done.stderr and "cut into passages" not in done.stderr, done.stderr
    built = cli("build", extra, "--name", "again", "--model", tiny_bert, "--calibrator", "none")
    assert "encoding took" in built.stderr  # what the line said besides


def test_search_results_are_readable_at_80_columns(cli, tmp_path, tiny_bert, monkeypatch):
    """Ids as long as the width leaves no room for a readable text beside them: the id goes on its own line above
    the text, whole, and the text takes the width (was: 20 columns, `fileinput.filelinen…`)."""
    import cli.index_commands as commands

    monkeypatch.setattr(commands, "stdout", Console(width=80, soft_wrap=True))
    text = ("Return the line number in the current file. Before the first line has been read, returns 0. After "
            "the last line of the last file has been read, returns the line number of that line.")
    corpus = tmp_path / "py.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"library/fileinput.html#fileinput.filelineno-{i}",
                                          "title": f"fileinput.filelineno{i}()", "text": text}) + "\n"
                              for i in range(3)))
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none").returncode == 0
    for mode in ("dense", "hybrid"):
        done = cli("search", "line number", "--name", "py", "--mode", mode)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert max(len(line) for line in lines) <= 80, done.stdout
        for i in range(3):  # every id whole, on one line
            assert any(f"library/fileinput.html#fileinput.filelineno-{i}" in line for line in lines), done.stdout
        assert sum("fileinput.filelineno0() Return the line number" in line for line in lines) == 1, done.stdout
    short = cli("search", "line number", "--name", "py", "--mode", "dense", "--full")
    words = short.stdout.replace("│", " ").split()
    assert all(word in words for word in ("Return", "returns", "that", "line.")) and "…" not in short.stdout


def test_a_default_build_of_120_documents_warns_of_no_rejected_candidate(cli, tmp_path):
    """auto fits its candidates on 120 MiniLM vectors of 384 dimensions: whitening's covariance is singular for
    each, and each said so, though auto rejects most and its check measured the one it keeps. Nothing to act on:
    not said."""
    from tests.helpers import sentences

    corpus = tmp_path / "notes.txt"
    corpus.write_text("\n".join(sentences(120).values()) + "\n", encoding="utf-8")
    done = cli("build", corpus)
    assert done.returncode == 0, done.stderr
    assert "covariance is singular" not in done.stderr and "warning:" not in done.stderr, done.stderr
    assert "calibrator: auto: " in done.stderr


def test_a_misspelt_index_name_or_filter_field_says_what_was_meant(cli, built_home, tiny_bert, tmp_path):
    import json

    assert_one_line_error(cli("search", "lamp", "--name", "dcos"), f"no index named 'dcos' in {built_home} (did you "
                                                                   "mean 'docs'?)")
    records = tmp_path / "meta.jsonl"
    records.write_text("".join(json.dumps({"_id": f"m{i}", "text": text, "metadata": {"category": "notes"}}) + "\n"
                               for i, text in enumerate(TEXTS)))
    assert cli("build", records, "--model", tiny_bert, "--calibrator", "none").returncode == 0
    found = cli("search", "lamp", "--name", "meta", "--where", json.dumps({"cateogry": "notes"}))
    assert found.stderr.count("no document has the field 'cateogry' (did you mean 'category'?)") == 1  # once


def test_a_script_s_search_warns_of_a_filter_on_a_field_no_document_has(tmp_path, tiny_bert):
    """The CLI, the server and the MCP tools said it; a script searching through `Index` got an empty answer and
    nothing else."""
    from retriever import FilterWarning, Index, NotFoundError

    records = [{"_id": f"m{i}", "text": text, "metadata": {"category": "notes", "year": 2020 + i}}
               for i, text in enumerate(TEXTS)]
    index = Index.build(records, "meta", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu").open()
    with pytest.warns(FilterWarning, match=r"no document has the field 'cateogry' \(did you mean 'category'\?\)"):
        assert index.search("lamp", k=3, where={"cateogry": "notes"}) == []
    with pytest.warns(FilterWarning, match="'year' holds numbers"):
        index.search(["lamp", "tea"], k=3, where={"year": "2021"}, mode="keyword")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(index.search("lamp", k=3, where={"category": "notes"})) == 3
    # the notes are worked out once per version and filter: a search in a loop reads the fields' kinds once
    read = []
    kinds = index.snapshot.field_kinds
    index.snapshot.field_kinds = lambda paths: (read.append(paths), kinds(paths))[1]
    for _ in range(3):
        index.search("lamp", k=3, where={"year": {"$gte": 2021}})
    assert len(read) == 1
    # listing and deleting by filter say it too; a delete that selects nothing names the field in its error
    with pytest.warns(FilterWarning, match="'cateogry'"):
        assert index.documents(where={"cateogry": "notes"}) == []
    with pytest.warns(FilterWarning), pytest.raises(NotFoundError, match=r"nothing deleted \(no document has the "
                                                                         r"field 'cateogry'"):
        index.delete(where={"cateogry": "notes"})


def test_full_shows_a_long_document_s_match_in_its_context_and_a_hit_s_repr_stays_short(cli, tmp_path, tiny_bert,
                                                                                       monkeypatch):
    """`--full` on a page of 4,000 words printed it all from its start; now the words around the match, and where to
    read the rest. A SearchHit's repr left out the text (tens of KB for one hit)."""
    import cli.index_commands as commands
    from retriever.index import Index

    monkeypatch.setattr(commands, "stdout", Console(width=100, soft_wrap=True))
    words = [f"filler{i}" for i in range(4000)]
    words[2500:2502] = ["zebra", "crossing"]
    corpus = tmp_path / "manual.jsonl"
    corpus.write_text(json.dumps({"_id": "manual", "text": " ".join(words)}) + "\n"
                      + json.dumps({"_id": "note", "text": "a short note on zebra stripes"}) + "\n")
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--max-length", "32").returncode == 0
    done = cli("search", "zebra crossing", "--mode", "keyword", "--full")
    assert done.returncode == 0, done.stderr
    shown = done.stdout.replace("│", " ").split()
    assert "zebra" in shown and "filler0" not in shown and "filler3999" not in shown
    assert sum(word.startswith("filler") for word in shown) < 250  # 600 characters either side, not 4,000 words
    assert "stripes" in shown  # the short note, whole
    assert "retriever show manual DOC_ID" in done.stderr
    with Index.open("manual") as index:
        hit = index.search("zebra crossing", mode="keyword", k=1)[0]
    assert hit.doc_id == "manual" and len(hit.text) > 30_000 and len(repr(hit)) < 1_000 and "zebra" in repr(hit)


def test_a_hybrid_table_says_what_its_scores_are_and_never_shows_minus_zero(cli, tmp_path, tiny_bert, monkeypatch):
    """Fused scores of a small filtered candidate set read as -0.000, 1.000 and negatives with nothing to say what
    they are; the table now says it under the scores, and a zero is 0.000."""
    import cli.index_commands as commands

    monkeypatch.setattr(commands, "stdout", Console(width=200, soft_wrap=True))
    corpus = tmp_path / "few.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": text, "metadata": {"group": i % 2}}) + "\n"
                              for i, text in enumerate(["red apples and green pears", "a red bicycle",
                                                        "green tea leaves", "red wine from old vines"])))
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none").returncode == 0
    done = cli("search", "red apples", "--where", '{"group": 0}')
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "score: fused, 0." in said and "x dense + 0." in said and "it orders this answer" in said
    assert "-0.000" not in done.stdout
    assert "score:" not in cli("search", "red apples", "--mode", "dense").stdout  # a cosine says what it is


def test_a_zero_score_is_shown_as_zero(monkeypatch):
    import cli.index_commands as commands
    from retriever.search.results import SearchHit, search_record

    monkeypatch.setattr(commands, "stdout", Console(width=120, record=True))
    hit = SearchHit(1, "a", -1e-9, None, "text", passage="text", span=(0, 4))
    commands._hits_table("q", [hit], full=False, mode="hybrid", scores="fused")
    shown = commands.stdout.export_text()
    assert "0.000" in shown and "-0.000" not in shown
    assert str(search_record(None, "q", [SearchHit(1, "a", -0.0, None, "t")])["results"][0]["score"]) == "0.0"


def test_list_at_80_columns_never_breaks_a_name_mid_word(cli, tmp_path, tiny_bert, monkeypatch):
    """Names longer than the room beside the other columns ('python-doc' / 'umentation') go on a line of their own
    above their model, whole; names too long even for that column make each index a block of its own lines; wide
    enough, each name keeps its column. No line is wider than the terminal."""
    import cli.index_commands as commands

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "hello world"}\n{"_id": "b", "text": "goodbye moon"}\n')
    names = ["python-documentation", "cranfield-abstracts-2026", "notes"]
    for name in names:
        assert cli("build", corpus, "--name", name, "--model", tiny_bert, "--calibrator", "none").returncode == 0

    def shown(width: int) -> list[str]:
        monkeypatch.setattr(commands, "stdout", Console(width=width))
        lines = cli("list").stdout.splitlines()
        assert max(len(line) for line in lines) <= width, "\n".join(lines)
        return lines

    stacked = shown(80)
    cells = [line.split("│")[1].strip() for line in stacked if line.count("│") == 6]
    assert "name / model" in "\n".join(stacked) and all(name in cells for name in names), stacked
    wide = shown(140)
    assert all(any(line.split("│")[1].strip() == name for line in wide if line.count("│") == 7) for name in names)
    long_name = "archive-of-the-project-documentation-2024"
    assert cli("build", corpus, "--name", long_name, "--model", tiny_bert, "--calibrator", "none").returncode == 0
    blocks = shown(80)
    assert all(name in [line.strip() for line in blocks] for name in [*names, long_name]), blocks
    assert not any("│" in line for line in blocks)

def test_info_counts_a_deleted_document_s_vectors_as_vectors(cli, tmp_path, tiny_bert, monkeypatch):
    """From a QA run: after a delete, info said 'N of them deleted' of the vectors with N the deleted documents; a
    long document deleted holds a vector per passage until compaction."""
    import cli.index_commands as commands

    monkeypatch.setattr(commands, "stdout", Console(width=200, soft_wrap=True))
    corpus = tmp_path / "long.jsonl"
    notes = [{"_id": f"note{i}", "text": f"a short note {i}"} for i in range(5)]  # the manual: a sixth of the rows,
    corpus.write_text("".join(json.dumps(record) + "\n" for record in [  # too few for the delete to rewrite them
        {"_id": "manual", "text": " ".join(f"filler{i}" for i in range(300))}, *notes]))
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--max-length", "32").returncode == 0
    info = json.loads(cli("info", "--json").stdout)
    assert cli("delete", "manual").returncode == 0
    shown = " ".join(cli("info").stdout.replace("│", " ").split())
    held = info["passages"] - len(notes)  # the manual's passages
    assert held > 1 and f"{held} of them held for 1 deleted document until compaction" in shown, shown


def test_a_file_name_holding_a_line_break_shows_on_one_line(cli, tmp_path, tiny_bert, monkeypatch):
    """From a QA run: a file named "line\\nbreak.md" printed as two lines in search's table and show's id."""
    import cli.index_commands as commands

    monkeypatch.setattr(commands, "stdout", Console(width=200, soft_wrap=True))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "line\nbreak.md").write_text("hello newline file\n", encoding="utf-8")
    assert cli("build", tmp_path / "notes", "--model", tiny_bert, "--calibrator", "none").returncode == 0
    table = cli("search", "hello newline", "-k", "1").stdout
    shown = cli("show", "line\nbreak.md").stdout
    assert "line\\nbreak.md" in table and "line\\nbreak.md" in shown
    assert not any(line.strip("│ ").startswith("break.md") for line in table.splitlines())
