"""build / search / add / delete / compact / refit / info / verify through the CLI entry point, and every bad
input as one line."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import TEXTS, assert_one_line_error, assert_usage_error


@pytest.fixture()
def built(tmp_path, tiny_bert, cli):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    index_dir = tmp_path / "indexes"
    done = cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--index-dir", index_dir)
    assert done.returncode == 0, done.stderr
    return index_dir


def test_build_names_the_index_after_the_corpus_and_search_prints_json(built, cli):
    done = cli("search", TEXTS[2], "--name", "docs", "-k", "2", "--json", "--index-dir", built)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)  # one line: the same record as each line of a --queries search
    assert len(done.stdout.splitlines()) == 1 and set(record) == {"query_id", "query", "mode", "results"}
    assert record["query_id"] is None and record["query"] == TEXTS[2] and record["mode"] == "hybrid"
    hits = record["results"]
    assert [set(hit) for hit in hits] == [{"rank", "doc_id", "score", "dense_score", "keyword_score", "dense_rank", "keyword_rank", "title", "text", "metadata", "passage", "span", "page", "length"}] * 2
    assert hits[0]["doc_id"] == "docs.txt:3" and hits[0]["text"] == TEXTS[2] and hits[0]["rank"] == 1  # FILE:LINE


def test_search_queries_file_gives_one_json_line_per_query(built, cli, tmp_path):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"_id": "q1", "text": "%s"}\n{"_id": "q2", "text": "%s"}\n' % (TEXTS[0], TEXTS[3]))
    done = cli("search", "--queries", queries, "--name", "docs", "-k", "3", "--json", "--index-dir", built)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["query_id"] for r in records] == ["q1", "q2"]
    assert [r["results"][0]["doc_id"] for r in records] == ["docs.txt:1", "docs.txt:4"]
    assert [r["query"] for r in records] == [TEXTS[0], TEXTS[3]]
    assert all(len(r["results"]) == 3 and set(r["results"][0]) == {"rank", "doc_id", "score", "dense_score", "keyword_score", "dense_rank", "keyword_rank", "title", "text", "metadata", "passage", "span", "page", "length"}
               for r in records)


def test_search_table_add_delete_info(built, cli, tmp_path):
    table = cli("search", TEXTS[1], "--name", "docs", "--index-dir", built)
    assert table.returncode == 0 and "onion" in table.stdout and "rank" in table.stdout
    extra = tmp_path / "extra.csv"
    extra.write_text("id,text\nnew-1,A kitten plays with yarn.\n", encoding="utf-8")
    assert cli("add", extra, "--name", "docs", "--index-dir", built).returncode == 0
    assert cli("delete", "docs.txt:2", "--name", "docs", "--index-dir", built).returncode == 0
    info = json.loads(cli("info", "--name", "docs", "--json", "--index-dir", built).stdout)
    assert info["documents"] == 4 and info["manifest"]["calibrator"] == {"name": "none"}
    assert info["search_modes"] == ["dense", "keyword", "hybrid"] and info["default_mode"] == "hybrid"
    shown = " ".join(cli("info", "--name", "docs", "--index-dir", built).stdout.replace("│", " ").split())
    assert "(5 vectors in 2 segments, 1 of them held for 1 deleted document until compaction" in shown, shown
    assert cli("refit", "--name", "docs", "-c", "whitening", "--index-dir", built).returncode == 0
    info = cli("info", "--name", "docs", "--index-dir", built)
    assert info.returncode == 0 and "whitening" in info.stdout and "isotropy" in info.stdout
    assert "dense, keyword, hybrid; default hybrid" in info.stdout


def test_bad_inputs_are_one_line_errors(built, cli, tmp_path, tiny_bert):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    assert_one_line_error(cli("build", blank, "--index-dir", built), "blank.txt")

    binary = tmp_path / "latin.txt"
    binary.write_bytes(b"fine line\ncaf\xe9 au lait\n")
    assert_one_line_error(cli("build", binary, "--index-dir", built), "latin.txt", "line 2", "--encoding")
    done = cli("build", binary, "--encoding", "latin-1", "--model", tiny_bert, "--calibrator", "none",
                   "--index-dir", built)
    assert done.returncode == 0, done.stderr

    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"_id": "a", "text": "ok"}\n{"_id": "b", "text": \n')
    assert_one_line_error(cli("build", broken, "--index-dir", built), "broken.jsonl", "line 2")
    textless = tmp_path / "textless.jsonl"
    textless.write_text('{"_id": "a", "title": "no text"}\n')
    assert_one_line_error(cli("build", textless, "--index-dir", built), "textless.jsonl", "line 1")
    duplicated = tmp_path / "dups.jsonl"
    duplicated.write_text('{"_id": "a", "text": "x"}\n{"_id": "a", "text": "y"}\n')
    assert_one_line_error(cli("build", duplicated, "--index-dir", built), "'a'")

    assert_one_line_error(cli("search", "q", "--name", "absent", "--index-dir", built),
                          "no index named 'absent'", f"retriever build CORPUS --name absent --index-dir {built}")
    assert_one_line_error(cli("build", blank.with_name("nothing.txt"), "--index-dir", built), "nothing.txt")
    good = tmp_path / "docs.txt"
    assert_one_line_error(cli("build", good, "--calibrator", "magic", "--index-dir", built), "unknown calibrator")
    assert_one_line_error(cli("build", good, "--layers", "0,99", "--model", tiny_bert, "--index-dir", built,
                              "--replace"), "layer 99 does not exist")


def test_an_index_whose_model_is_gone_says_so(built, cli, tmp_path, tiny_bert):
    moved = tmp_path / "moved-model"
    shutil.copytree(tiny_bert, moved)
    corpus = tmp_path / "docs.txt"
    assert cli("build", corpus, "--name", "orphan", "--model", moved, "--calibrator", "none",
                   "--index-dir", built).returncode == 0
    shutil.rmtree(moved)
    assert_one_line_error(cli("search", "q", "--name", "orphan", "--index-dir", built),
                          "index 'orphan' cannot encode text with the model it was built with", "moved-model")


def test_a_damaged_index_is_refused(built, cli):
    documents = built / "docs" / "segments" / "000001" / "documents.db"
    size = documents.stat().st_size
    documents.write_bytes(b"X" * size)  # same size: opening cannot tell, verify can
    assert_one_line_error(cli("verify", "--name", "docs", "--index-dir", built),
                          "segments/000001/documents.db does not match its manifest checksum")
    documents.write_bytes(b"not a database")
    assert_one_line_error(cli("search", "q", "--name", "docs", "--index-dir", built),
                          "documents.db has 14 bytes, its manifest says")


def test_verify_compact_and_search_options(built, cli, tmp_path, tiny_bert):
    done = cli("verify", "docs", "--index-dir", built)
    assert done.returncode == 0 and "index 'docs' is intact" in done.stderr
    assert cli("delete", "docs.txt:1", "--name", "docs", "--index-dir", built).returncode == 0
    done = cli("compact", "--name", "docs", "--index-dir", built)
    assert done.returncode == 0 and "compacted index 'docs': 3 documents" in done.stderr, done.stderr
    # compact again: nothing to merge or drop, so no new version, and the one before stays kept (a QA run)
    kept = json.loads(cli("versions", "docs", "--json", "--index-dir", built).stdout)["versions"]
    done = cli("compact", "--name", "docs", "--index-dir", built)
    assert done.returncode == 0 and done.stderr.strip() == ("index 'docs' is compact already (1 segment, no deleted "
                                                             "document): no new version")
    assert json.loads(cli("versions", "docs", "--json", "--index-dir", built).stdout)["versions"] == kept
    corpus = tmp_path / "many.txt"
    corpus.write_text("".join(f"document number {i} about topic {i % 7}\n" for i in range(300)), encoding="utf-8")
    done = cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--index-type", "ivf",
               "--index-dir", built)
    assert done.returncode == 0, done.stderr
    done = cli("search", "document number 5 about topic 5", "--name", "many", "--nprobe", "2", "--json",
               "--index-dir", built)
    assert done.returncode == 0 and json.loads(done.stdout)["results"][0]["doc_id"] == "many.txt:6"
    assert_one_line_error(cli("search", "q", "--name", "many", "--nprobe", "0", "--index-dir", built),
                          "nprobe must be at least 1")
    assert_one_line_error(cli("search", "q", "--name", "many", "--nprobe", "9" * 20, "--index-dir", built),
                          "--nprobe is at most 1,000,000")  # it overflowed FAISS's size_t: a traceback
    assert_usage_error(cli("build", corpus, "--index-type", "annoy", "--index-dir", built),
                       "invalid value for --index-type: 'annoy' is not one of auto, flat, hnsw, ivf, ivfpq")
    assert_one_line_error(cli("build", corpus, "--fit-sample", "1", "--index-dir", built),
                          "--fit-sample must be at least 2")


def test_build_from_vectors_made_by_encode(cli, tmp_path, tiny_bert):
    import gzip

    corpus = tmp_path / "docs.jsonl.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as file:
        for number, text in enumerate(TEXTS):
            file.write(json.dumps({"_id": f"t{number}", "title": "Title", "text": text}) + "\n")
    vectors = tmp_path / "vectors.npy"
    done = cli("encode", corpus, "--out", vectors, "--model", tiny_bert)
    assert done.returncode == 0, done.stderr
    index_dir = tmp_path / "indexes"
    done = cli("build", corpus, "--vectors", vectors, "--model", tiny_bert, "--calibrator", "none",
               "--index-dir", index_dir)
    assert done.returncode == 0 and "built index 'docs': 4 documents (4 indexed)" in done.stderr, done.stderr
    done = cli("search", f"Title {TEXTS[2]}", "--json", "--index-dir", index_dir)
    best = json.loads(done.stdout)["results"][0]
    assert best["doc_id"] == "t2" and best["title"] == "Title" and best["score"] > 0.999
    assert_one_line_error(cli("build", corpus, "--vectors", tmp_path / "none.npy", "--index-dir", index_dir),
                          "none.npy: no such file or folder")


def test_add_counts_documents_cut_into_passages(built, cli, tmp_path):
    more = tmp_path / "more.txt"  # a second .txt file: its ids (more.txt:1, ...) do not clash with docs.txt's
    more.write_text("A short new document.\n" + "word " * 2000 + "\n", encoding="utf-8")
    done = cli("add", more, "--name", "docs", "--index-dir", built)
    assert done.returncode == 0, done.stderr
    assert "6 documents (2 added)" in done.stderr
    assert "1 document longer than the encoder reads cut into passages (" in done.stderr  # tiny_bert reads 512


def test_commands_without_name_pick_the_index(built, cli, tmp_path, tiny_bert):
    done = cli("search", TEXTS[0], "--json", "--index-dir", built)  # the only index: docs
    assert done.returncode == 0 and json.loads(done.stdout)["results"][0]["doc_id"] == "docs.txt:1"
    assert "using index 'docs'" in done.stderr
    newer = tmp_path / "newer.txt"
    newer.write_text("A brand new document.\n", encoding="utf-8")
    assert cli("build", newer, "--model", tiny_bert, "--calibrator", "none", "--index-dir", built).returncode == 0
    done = cli("search", "anything", "--json", "--index-dir", built)  # reads take the latest built
    assert done.returncode == 0 and json.loads(done.stdout)["results"][0]["text"] == "A brand new document."
    assert_one_line_error(cli("delete", "docs.txt:1", "--index-dir", built), "newer, docs", "--name")  # writes never guess
    assert_one_line_error(cli("search", "q", "--index-dir", tmp_path / "empty"), "no index in", "retriever build")


def test_max_length_past_the_model_positions_is_refused(built, cli, tmp_path, tiny_bert):
    """It used to build, then every long query or added document failed (tensor a (3002) vs (512))."""
    corpus = tmp_path / "docs.txt"
    assert_one_line_error(cli("build", corpus, "--name", "long", "--model", tiny_bert, "--max-length", "1000000000",
                              "--calibrator", "none", "--index-dir", built),
                          "--max-length 1,000,000,000 is more than model", "at most 512 tokens")
    done = cli("search", "word " * 3000, "--name", "docs", "--json", "--index-dir", built)
    assert done.returncode == 0 and len(json.loads(done.stdout)["results"]) == 4


@pytest.mark.parametrize(
    "k, fragments",
    [
        ("1000000000", ["10000"]),  # it allocated 7.45 GiB, then a traceback; the message names the bound
        ("10001", ["10000"]),
        ("0", []),
        ("-3", []),
        ("true", []),  # not taken as 1
        ("1e9", []),
    ],
)
def test_k_out_of_bounds_is_a_usage_error(built, cli, k, fragments):
    """A usage error (exit 2) on one line, naming the option and its bounds."""
    assert_usage_error(cli("search", "q", "--name", "docs", "-k", k, "--index-dir", built),
                       f"invalid value for -k: '{k}' is not a whole number from 1 to 10000", *fragments)


def test_k_up_to_the_bound_is_cut_to_the_index_size(built, cli):
    from retriever.search.options import MAX_K

    done = cli("search", "q", "--name", "docs", "-k", MAX_K, "--json", "--index-dir", built)
    assert done.returncode == 0 and [hit["rank"] for hit in json.loads(done.stdout)["results"]] == [1, 2, 3, 4]


def test_search_modes_on_the_command_line(built, cli):
    keyword = cli("search", "onion kitchen", "--name", "docs", "--mode", "keyword", "--json", "--index-dir", built)
    assert keyword.returncode == 0, keyword.stderr
    record = json.loads(keyword.stdout)
    assert record["mode"] == "keyword" and [hit["doc_id"] for hit in record["results"]] == ["docs.txt:2"]
    assert record["results"][0]["keyword_rank"] == 1 and record["results"][0]["dense_score"] is None
    dense = json.loads(cli("search", TEXTS[1], "--name", "docs", "--mode", "dense", "--json", "--index-dir",
                           built).stdout)
    assert dense["mode"] == "dense" and all(hit["keyword_score"] is None for hit in dense["results"])
    hybrid = cli("search", TEXTS[1], "--name", "docs", "--fusion", "rrf", "--weight", "0.3", "--index-dir", built)
    assert hybrid.returncode == 0 and "d/k" in hybrid.stdout
    assert_usage_error(cli("search", "x", "--name", "docs", "--mode", "fuzzy", "--index-dir", built),
                       "'fuzzy' is not one of dense, keyword, hybrid")
    assert_usage_error(cli("search", "x", "--name", "docs", "--weight", "2", "--index-dir", built), "--weight")


def test_every_command_names_its_index_with_name(built, cli, tmp_path, tiny_bert):
    """One rule: --name works on every command (show and remove also take the index as an argument, as before)."""
    other = tmp_path / "other.txt"
    other.write_text("A different note.\nAnother one.\n", encoding="utf-8")
    assert cli("build", other, "--model", tiny_bert, "--calibrator", "none", "--index-dir", built).returncode == 0
    by_name = cli("show", "docs.txt:3", "--name", "docs", "--json", "--index-dir", built)
    assert by_name.returncode == 0 and json.loads(by_name.stdout)["text"] == TEXTS[2]
    assert json.loads(cli("show", "docs", "docs.txt:3", "--json", "--index-dir", built).stdout)["text"] == TEXTS[2]
    latest = cli("show", "other.txt:1", "--json", "--index-dir", built)  # unnamed: the latest built, said so
    assert json.loads(latest.stdout)["text"] == "A different note." and "using index 'other'" in latest.stderr
    assert_one_line_error(cli("show", "docs", "docs.txt:3", "--name", "other", "--index-dir", built),
                          "two different indexes named")
    for command in ("check", "verify", "versions", "info"):
        done = cli(command, "--name", "docs", "--index-dir", built, *(["--json"] if command != "verify" else []))
        assert done.returncode == 0, (command, done.stderr)
    assert_one_line_error(cli("remove", "--yes", "--index-dir", built), "say which index to remove")
    assert cli("remove", "--name", "other", "--yes", "--index-dir", built).returncode == 0
    listed = json.loads(cli("list", "--json", "--index-dir", built).stdout)["indexes"]
    assert [record["name"] for record in listed] == ["docs"]


def test_tables_and_help_read_well_at_80_columns(built, cli):
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80"}
    listed = subprocess.run([sys.executable, "-m", "cli.main", "list", "--index-dir", str(built)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    header = next((line for line in listed.stdout.splitlines() if "name" in line), listed.stdout + listed.stderr)
    assert all(column in header for column in ("documents", "model", "type", "written (UTC)", "calibrator")), listed.stdout
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80, listed.stdout
    cells = [line.split("│")[6].strip() for line in listed.stdout.splitlines() if line.count("│") == 7]
    assert cells[0].startswith(("auto: ", "none", "flow", "whitening")) and cells[1].startswith("hybrid 0.")
    assert "(" not in "".join(cells)  # auto's evidence is under the table, whole, not folded into a narrow column
    info = subprocess.run([sys.executable, "-m", "cli.main", "info", "--name", "docs", "--index-dir", str(built)],
                          env=env, capture_output=True, text=True, timeout=120)
    folder = json.loads(cli("info", "--name", "docs", "--json", "--index-dir", built).stdout)["folder"]
    assert "…" not in info.stdout and folder.replace("/", "") in "".join(
        line.split("│")[2].strip() for line in info.stdout.splitlines() if line.count("│") == 3).replace("/", "")
    assert cli("refit", "--name", "docs", "-c", "whitening", "--index-dir", built).returncode == 0
    versions = subprocess.run([sys.executable, "-m", "cli.main", "versions", "--name", "docs", "--index-dir",
                               str(built)], env=env, capture_output=True, text=True, timeout=120)
    kept = [record["version"] for record in json.loads(cli("versions", "--name", "docs", "--json",
                                                             "--index-dir", built).stdout)["versions"]]
    assert max(len(line) for line in versions.stdout.splitlines()) <= 80, versions.stdout
    assert all(str(version) in versions.stdout for version in kept) and "whitening" in versions.stdout  # unwrapped
    for command in ("search", "build", "list"):
        assert "<bool>" not in cli(command, "--help").stdout  # on/off flags show bare
    # a command's description wraps at the terminal's width, not where its docstring's lines end
    described = subprocess.run([sys.executable, "-m", "cli.main", "build", "--help"], env=env, capture_output=True,
                               text=True, timeout=120).stdout
    prose = [line.strip() for line in described.split("╭")[0].splitlines()]
    assert max(len(line) for line in described.splitlines()) <= 80
    assert all(len(line) >= 60 for line, after in zip(prose, prose[1:]) if line and after), described
    assert "retriever[ray]" in cli("build", "--help").stdout.replace("\n", "").replace("│", "").replace(" ", "")


def test_info_on_an_uncalibrated_index_reads_the_same_before_and_after(built, cli):
    shown = cli("info", "--name", "docs", "--json", "--index-dir", built).stdout
    assert shown.count("\n") == 1  # one line, as every --json (it was indented over many)
    isotropy = json.loads(shown)["isotropy"]
    assert isotropy["raw"] == isotropy["calibrated"] and isotropy["raw"]


def test_search_in_the_raw_space_compares_with_the_calibrated_ranking(built, cli):
    """--space raw: the uncalibrated ranking (exact), as the server's space=raw; dense only."""
    from retriever.index import Index
    from tests.helpers import encoder_of, raw_hits

    index = Index.open("docs", built, device="cpu")
    raw = raw_hits(index, encoder_of(index).encode([TEXTS[1]]), 3)[0]
    assert [hit.doc_id for hit in index.search(TEXTS[1], 3, space="raw")] == [hit.doc_id for hit in raw]
    done = cli("search", TEXTS[1], "--name", "docs", "-k", "3", "--space", "raw", "--json", "--index-dir", built)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["mode"] == "dense" and [r["doc_id"] for r in record["results"]] == [hit.doc_id for hit in raw]
    assert_one_line_error(cli("search", TEXTS[1], "--name", "docs", "--space", "raw", "--mode", "hybrid",
                              "--index-dir", built), "--space raw", "--mode dense only")


def test_add_upsert_replaces_taken_ids_and_without_it_says_how(built, cli, tmp_path):
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps({"_id": "docs.txt:1", "text": "A rewritten first note."}) + "\n", encoding="utf-8")
    assert_one_line_error(cli("add", again, "--name", "docs", "--index-dir", built),
                          "1 id is already in the index", "add with --upsert")
    done = cli("add", again, "--name", "docs", "--upsert", "--index-dir", built)
    assert done.returncode == 0, done.stderr
    assert "replaced 1 document whose id was already in the index" in done.stderr
    shown = json.loads(cli("show", "docs.txt:1", "--name", "docs", "--json", "--index-dir", built).stdout)
    assert shown["text"] == "A rewritten first note."
    assert json.loads(cli("info", "--name", "docs", "--json", "--index-dir", built).stdout)["documents"] == len(TEXTS)


def test_search_min_score_says_when_nothing_is_a_good_match(built, cli):
    """--min-score: the table keeps only hits with that cosine or more, and says so when none has it."""
    done = cli("search", TEXTS[1], "--name", "docs", "--min-score", "0.5", "--json", "--index-dir", built)
    assert done.returncode == 0, done.stderr
    kept = json.loads(done.stdout)["results"]
    assert kept and all(hit["dense_score"] >= 0.5 for hit in kept)
    none = cli("search", "quarterly tax filing deadlines", "--name", "docs", "--min-score", "0.99",
               "--index-dir", built)
    assert none.returncode == 0 and "no good match: no hit has a dense score of at least 0.99" in none.stdout
    assert_one_line_error(cli("search", TEXTS[1], "--name", "docs", "--mode", "keyword", "--min-score", "0.2",
                              "--index-dir", built), "--min-score", "keyword search has none")


def test_search_where_and_delete_where_on_the_command_line(tmp_path, tiny_bert, cli):
    corpus = tmp_path / "pages.csv"
    corpus.write_text("id,title,text,section,year\n"
                      "tar,tar,tar creates and extracts archives,1,2019\n"
                      "gzip,gzip,gzip compresses files,1,2015\n"
                      "open,open,open a file and return a descriptor,2,2020\n"
                      "read,read,read from a file descriptor,2,2018\n", encoding="utf-8")
    index_dir = tmp_path / "indexes"
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--index-dir", index_dir).returncode == 0
    done = cli("search", "a file", "--name", "pages", "--where", '{"section": 2, "year": {"$gte": 2019}}', "--json",
               "--index-dir", index_dir)
    assert done.returncode == 0, done.stderr
    assert [(hit["doc_id"], hit["metadata"]) for hit in json.loads(done.stdout)["results"]] == [
        ("open", {"section": 2, "year": 2020})]
    assert_one_line_error(cli("search", "a file", "--name", "pages", "--where", '{"year": {"$after": 1}}',
                              "--index-dir", index_dir), "--where: field 'year': unknown operator '$after'")
    shown = cli("show", "tar", "--name", "pages", "--index-dir", index_dir)
    assert "section" in shown.stdout and "2019" in shown.stdout
    listed = cli("list", "--index-dir", index_dir)
    assert "'pages' metadata fields (--where): section, year" in listed.stdout
    assert cli("delete", "--where", '{"section": 1}', "--name", "pages", "--index-dir", index_dir).returncode == 0
    info = json.loads(cli("info", "--name", "pages", "--json", "--index-dir", index_dir).stdout)
    assert info["documents"] == 2
    assert_one_line_error(cli("delete", "--where", '{"section": 1}', "--name", "pages", "--index-dir", index_dir),
                          "matches the filter; nothing deleted")
    misspelt = cli("delete", "--where", '{"sectoin": 1}', "--name", "pages", "--index-dir", index_dir)
    assert misspelt.returncode != 0 and misspelt.stderr.count("no document has the field 'sectoin'") == 1  # once
    # a filter that selects every document: the index is emptied, and the way back is said (from a CLI QA run)
    emptied = cli("delete", "--where", '{"section": {"$exists": true}}', "--name", "pages", "--index-dir", index_dir)
    assert emptied.returncode == 0 and emptied.stderr.strip().splitlines()[-1] == (
        f"index 'pages' holds no document now; the version before is kept until the next write: retriever rollback "
        f"2 --name pages --index-dir {index_dir}")
    assert cli("rollback", "2", "--name", "pages", "--index-dir", index_dir).returncode == 0
    assert json.loads(cli("info", "--name", "pages", "--json", "--index-dir", index_dir).stdout)["documents"] == 2


def test_a_one_off_search_encodes_from_the_kept_kit_without_loading_the_model(built, cli, tmp_path, monkeypatch,
                                                                               onnx_graphs):
    """auto encodes queries on ONNX Runtime; the first search on this machine loads the model (and keeps the graph
    and its kit), a later one-off search loads no model at all (`encode.query_kit`) and answers the same as PyTorch;
    --runtime chooses."""
    import shutil

    from retriever.encode.encoder import Encoder

    used, init = [], Encoder.__init__
    monkeypatch.setattr(Encoder, "__init__", lambda self, *args, **kw: init(self, *args, **kw) or used.append(self.runtime))
    queries = tmp_path / "queries.txt"
    queries.write_text(f"{TEXTS[0]}\n{TEXTS[3]}\n", encoding="utf-8")
    shutil.rmtree(onnx_graphs / "kits", ignore_errors=True)  # as on a machine where nothing was kept yet
    answers = {}
    for label, args, runtime in (("first", (TEXTS[1],), ["onnx"]), ("kit", (TEXTS[1],), []),
                                 ("file", ("--queries", queries), []),
                                 ("torch", (TEXTS[1], "--runtime", "torch"), ["torch"]),
                                 ("file-torch", ("--queries", queries, "--runtime", "torch"), ["torch"])):
        used.clear()
        done = cli("search", *args, "--name", "docs", "--mode", "dense", "--json", "--index-dir", built)
        assert done.returncode == 0, done.stderr
        assert used == runtime, label
        answers[label] = [json.loads(line)["results"] for line in done.stdout.splitlines()]
    for label, reference in (("first", "torch"), ("kit", "torch"), ("file", "file-torch")):
        for got, expected in zip(answers[label], answers[reference]):
            assert [hit["doc_id"] for hit in got] == [hit["doc_id"] for hit in expected], label
            assert [hit["score"] for hit in got] == pytest.approx([hit["score"] for hit in expected], abs=1e-4)


def test_a_query_keyword_search_cannot_read_says_so(built, cli):
    """From a text QA run: a query of punctuation or symbols said "no hits" in keyword mode, as for words nothing
    holds, and in hybrid mode was ranked by the dense side alone without a word."""
    keyword = cli("search", "🍕 !!!", "--mode", "keyword", "--name", "docs", "--index-dir", built)
    assert keyword.returncode == 0 and "no hits" in keyword.stdout
    assert keyword.stderr.strip().endswith("note: the query holds no word keyword search reads (only punctuation or "
                                           "symbols)")
    hybrid = cli("search", "🍕", "--name", "docs", "--index-dir", built)
    assert hybrid.stderr.strip().endswith("; ranked by the dense side alone")
    assert "keyword search reads" not in cli("search", "a guitar", "--name", "docs", "--index-dir", built).stderr
