"""Records as users export them: metadata with lists, nested objects, keys named like the document's own fields and
strings holding any code point; filters over them (elements of lists, dotted paths, $all, $size), checked against
a plain Python reading of the language over random records and filters, in the document table, in every index type
and mode, and in delete by filter; ids compared exactly."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from retriever.corpus import Document
from retriever.filters import parse_where
from retriever.index import Index
from retriever.search.options import SearchOptions
from retriever.store.documents import DocumentTable
from tests.helpers import write_corpus

OWN = ("doc_id", "title", "text", "source")
# Strings drawn from few characters, so that filters often hit, among them the ones SQLite's JSON functions and C
# strings trip on.
ALPHABET = ["a", "b", "\x00", "\x01", "\n", "\t", "\x7f", "é", "\u2028", "\U0001f600", " ", "'", '"', "%"]
WORDS = ["tea", "rain", "ships", "maps", "harbour", "violin"]


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 3)))


def random_scalar(rng: random.Random):
    return rng.choice([
        lambda: random_string(rng), lambda: rng.randint(-3, 3), lambda: rng.choice([0.5, -1.5, 2.0]),
        lambda: rng.random() < 0.5, lambda: None, lambda: rng.choice([-2**63, 2**63 - 1]),
    ])()


def random_metadata(rng: random.Random) -> dict | None:
    metadata = {}
    if rng.random() < 0.8:
        metadata["tags"] = [random_scalar(rng) for _ in range(rng.randint(0, 4))] if rng.random() < 0.8 \
            else random_scalar(rng)
    if rng.random() < 0.6:
        metadata["origin"] = {"site": random_scalar(rng), **({"path": [random_string(rng)]} if rng.random() < .5
                                                             else {})}
    if rng.random() < 0.5:
        metadata["authors"] = [{"name": random_string(rng), "n": rng.randint(0, 2)} for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.5:
        metadata["title"] = random_scalar(rng)  # named like the document's own field: reached as metadata.title
    if rng.random() < 0.3:
        metadata["a.b"] = random_scalar(rng)  # a dotted key: the same field as {"a": {"b": ...}}
    elif rng.random() < 0.3:
        metadata["a"] = {"b": random_scalar(rng)}
    if rng.random() < 0.3:
        metadata["n"] = random_scalar(rng)
    return metadata or None


def random_records(count: int, seed: int) -> list[Document]:
    rng = random.Random(seed)
    return [Document(rng.choice(["", "n"]) + random_string(rng) + f"#{i}",
                     f"{rng.choice(WORDS)} {rng.choice(WORDS)} note {i}", rng.choice([None, random_string(rng)]),
                     "records.jsonl", i + 1, random_metadata(rng)) for i in range(count)]


PATHS = ["tags", "origin.site", "origin", "origin.path", "authors.name", "authors.n", "authors", "metadata.title",
         "a.b", "metadata.a.b", "n", "nope", "title", "doc_id"]


def random_filter(rng: random.Random, depth: int = 0) -> dict:
    if depth < 2 and rng.random() < 0.2:
        return {rng.choice(["$and", "$or"]): [random_filter(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    path = rng.choice(PATHS)
    op = rng.choice(["$eq", "plain", "$ne", "$in", "$nin", "$all", "$gt", "$gte", "$lt", "$lte", "$exists", "$size"])
    if op == "plain":
        return {path: random_scalar(rng)}
    if op in ("$in", "$nin", "$all"):
        return {path: {op: [random_scalar(rng) for _ in range(rng.randint(1, 3))]}}
    if op == "$exists":
        return {path: {op: rng.random() < 0.5}}
    if op == "$size":
        return {path: {op: rng.randint(0, 3)}}
    if op.startswith(("$g", "$l")):
        return {path: {op: rng.choice([random_string(rng), rng.randint(-3, 3), 0.5])}}
    return {path: {op: random_scalar(rng)}}


# --- the reference: the language read directly, over the record as given -------------------------------------

def values_at(value, parts: list[str]) -> list:
    """Every value at the dotted path PARTS under VALUE: keys matched whole or holding dots (`a.b` is one key or
    two), a list's elements (and theirs) standing at the list's own path, the list itself too."""
    if isinstance(value, list):
        found = [value] if not parts else []
        for item in value:
            found += values_at(item, parts) if isinstance(item, (list, dict)) or parts else [item]
        return found
    if not parts:
        return [value]
    if not isinstance(value, dict):
        return []
    found = []
    for taken in range(1, len(parts) + 1):
        key = ".".join(parts[:taken])
        if key in value:
            found += values_at(value[key], parts[taken:])
    return found


def same(stored, wanted) -> bool:
    kind = (lambda v: "null" if v is None else "bool" if isinstance(v, bool) else "str" if isinstance(v, str)
            else "num" if isinstance(v, (int, float)) else "container")
    return kind(stored) == kind(wanted) != "container" and stored == wanted


def holds(document: Document, clause: dict) -> bool:
    for key, condition in clause.items():
        if key == "$and":
            ok = all(holds(document, c) for c in condition)
        elif key == "$or":
            ok = any(holds(document, c) for c in condition)
        else:
            if key in OWN:
                own = {"doc_id": document.doc_id, "title": document.title, "text": document.text,
                       "source": document.source}[key]
                values, present = [own], own is not None
            else:
                path = key[len("metadata."):] if key.startswith("metadata.") else key
                values = values_at(document.metadata or {}, path.split("."))
                present = bool(values)
            ops = condition if isinstance(condition, dict) else {"$eq": condition}
            ok = all(holds_op(values, present, op, wanted) for op, wanted in ops.items())
        if not ok:
            return False
    return True


def holds_op(values: list, present: bool, op: str, wanted) -> bool:
    if op == "$exists":
        return present == wanted
    if op == "$size":
        return any(isinstance(v, list) and len(v) == wanted for v in values)
    if op in ("$eq", "$ne"):
        found = any(same(v, wanted) for v in values)
        return found if op == "$eq" else not found
    if op in ("$in", "$nin"):
        found = any(same(v, w) for v in values for w in wanted)
        return found if op == "$in" else not found
    if op == "$all":
        return all(any(same(v, w) for v in values) for w in wanted)
    compare = {"$gt": lambda a, b: a > b, "$gte": lambda a, b: a >= b, "$lt": lambda a, b: a < b,
               "$lte": lambda a, b: a <= b}[op]
    return any(not isinstance(v, (bool, list, dict)) and v is not None and isinstance(v, str) == isinstance(wanted, str)
               and compare(v, wanted) for v in values)


def selected(documents: list[Document], where: dict) -> set[str]:
    return {d.doc_id for d in documents if holds(d, where)}


# --- the tests --------------------------------------------------------------------------------------------------

RECORDS = random_records(300, seed=7)
FILTERS = [random_filter(random.Random(seed)) for seed in range(400)]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("records") / "documents.db"
    created = DocumentTable.create(path)
    created.insert(np.arange(1, len(RECORDS) + 1), RECORDS)
    created.finish()
    created.close()
    with DocumentTable.open(path) as opened:
        yield opened


def test_random_filters_over_random_records_select_what_the_language_says(table):
    hits = 0
    for where in FILTERS:
        found = {RECORDS[rowid - 1].doc_id for rowid in table.matching(parse_where(where)).tolist()}
        expected = selected(RECORDS, where)
        assert found == expected, json.dumps(where)
        hits += 0 < len(expected) < len(RECORDS)
    assert hits > 150  # most filters split the records: the comparison is not between empty sets


def test_records_are_stored_exactly_and_returned_as_given(table):
    rows = table.get(np.arange(1, len(RECORDS) + 1), ["doc_id", "title", "metadata"])
    assert [(r["doc_id"], r["title"], r["metadata"]) for r in rows] == [(d.doc_id, d.title, d.metadata)
                                                                        for d in RECORDS]
    assert table.rowids_for([d.doc_id for d in RECORDS]) == {d.doc_id: i + 1 for i, d in enumerate(RECORDS)}


def test_a_nul_compares_as_a_character_in_values_and_ids(tmp_path, tiny_bert):
    records = [Document("n\x00ul", "one", None, "c.jsonl", 1, {"page": "a\x00b", "tags": ["x\x00", "y"]}),
               Document("n", "two", None, "c.jsonl", 2, {"page": "a", "tags": ["x"]})]
    index = Index.build(records, "nul", tmp_path, calibrator="none", device="cpu", model=str(tiny_bert)).open()
    assert {d for d, _ in index.snapshot.live_rowids(["n", "n\x00ul"]).items()} == {"n", "n\x00ul"}
    for where, expected in [({"page": "a"}, ["n"]), ({"page": "a\x00b"}, ["n\x00ul"]), ({"page": {"$in": ["a"]}}, ["n"]),
                            ({"page": {"$lte": "a"}}, ["n"]), ({"page": {"$gt": "a"}}, ["n\x00ul"]),
                            ({"tags": "x"}, ["n"]), ({"tags": "x\x00"}, ["n\x00ul"])]:
        rows = index.snapshot.rows(index.snapshot.matching(parse_where(where)), ["doc_id"])
        assert sorted(row["doc_id"] for row in rows.values()) == expected, where
    assert index.document("n")["metadata"] == {"page": "a", "tags": ["x"]}
    assert index.document("n\x00ul")["metadata"] == {"page": "a\x00b", "tags": ["x\x00", "y"]}
    after = index.delete(where={"page": "a"}).open()
    assert after.document("n") is None and after.document("n\x00ul") is not None
    assert after.delete(["n\x00ul"]).open().document("n\x00ul") is None


@pytest.fixture(scope="module", params=["flat", "hnsw", "ivf", "ivfpq"])
def record_index(request, tmp_path_factory, tiny_bert):
    folder = tmp_path_factory.mktemp(f"records-{request.param}")
    options = {"ivf": {"nlist": 4}, "ivfpq": {"nlist": 4, "pq_m": 4}}.get(request.param, {})
    summary = Index.build(RECORDS, "r", folder, calibrator="none", index_type=request.param, index_options=options,
                          device="cpu", model=str(tiny_bert))
    return summary.open()


@pytest.mark.parametrize("mode", ["dense", "keyword", "hybrid"])
@pytest.mark.filterwarnings("ignore::retriever.filters.FilterWarning")  # random filters: some name no field
def test_filtered_search_in_every_type_and_mode_finds_exactly_the_matching_documents(record_index, mode):
    """Asked for every document, a filtered search returns the documents its unfiltered search returns that the
    filter selects: all of the matches in dense and hybrid search, those holding a query word in keyword search."""
    rng = random.Random(1)
    everything = len(RECORDS)
    for where in [FILTERS[i] for i in rng.sample(range(len(FILTERS)), 25)]:
        expected = selected(RECORDS, where)
        query = "tea harbour"
        options = dict(k=everything, mode=mode, nprobe=4)
        hits = record_index.search([query], SearchOptions(**options, where=where))[0]
        unfiltered = record_index.search([query], SearchOptions(**options))[0]
        assert {h.doc_id for h in hits} == {h.doc_id for h in unfiltered if h.doc_id in expected}, json.dumps(where)
        assert all(h.metadata == RECORDS[int(h.doc_id.rsplit("#", 1)[1])].metadata for h in hits)


def test_delete_by_filter_removes_exactly_the_matching_documents(tmp_path, tiny_bert):
    rng = random.Random(3)
    records = random_records(120, seed=11)
    index = Index.build(records, "d", tmp_path, calibrator="none", device="cpu", model=str(tiny_bert)).open()
    left = list(records)
    deleted = 0
    for where in (random_filter(rng) for _ in range(200)):
        doomed = selected(left, where)
        if not doomed or len(doomed) > len(left) // 4:  # many deletes of a few each
            continue
        index = index.delete(where=where).open()
        left = [d for d in left if d.doc_id not in doomed]
        assert {d for d, _ in index.snapshot.live_rowids([d.doc_id for d in records]).items()} == \
            {d.doc_id for d in left}, json.dumps(where)
        deleted += 1
    assert deleted >= 5


def test_an_export_with_lists_nested_objects_and_own_field_names_builds_and_filters(tmp_path, cli):
    corpus = write_corpus(tmp_path / "man.jsonl", [
        {"_id": "ls", "text": "ls lists directory contents", "metadata": {
            "tags": ["options", "files"], "source": "man1/ls.1", "origin": {"site": "s2", "section": 1},
            "authors": [{"name": "Richard"}, {"name": "David"}]}},
        {"_id": "cp", "text": "cp copies files and directories", "metadata": {
            "tags": ["files"], "source": "man1/cp.1", "origin": {"site": "s1", "section": 1}, "authors": []}},
        {"_id": "intro", "text": "intro introduces user commands", "metadata": {"tags": [], "title": "Intro"}},
    ])
    assert cli("build", corpus, "--name", "man", "--calibrator", "none").returncode == 0

    def found(where: dict) -> list[str]:
        done = cli("search", "files", "--name", "man", "--where", json.dumps(where), "--json", "-k", "5")
        assert done.returncode == 0, done.stderr
        return sorted(hit["doc_id"] for hit in json.loads(done.stdout)["results"])

    assert found({"tags": "options"}) == ["ls"]
    assert found({"tags": {"$in": ["options", "files"]}}) == ["cp", "ls"]
    assert found({"tags": {"$all": ["options", "files"]}}) == ["ls"]
    assert found({"tags": {"$size": 0}}) == ["intro"]
    assert found({"origin.site": "s2"}) == ["ls"]
    assert found({"origin.section": {"$gte": 1}, "authors.name": {"$nin": ["David"]}}) == ["cp"]
    assert found({"metadata.source": "man1/cp.1"}) == ["cp"]
    assert found({"metadata.title": "Intro"}) == ["intro"]
    assert found({"source": {"$exists": True}}) == ["cp", "intro", "ls"]  # the document's own: the corpus file
    shown = json.loads(cli("show", "ls", "--name", "man", "--json").stdout)
    assert shown["metadata"]["authors"] == [{"name": "Richard"}, {"name": "David"}]


def test_a_queries_file_whose_queries_carry_metadata_and_titles_is_searched(tmp_path, cli):
    corpus = write_corpus(tmp_path / "c.jsonl", [{"_id": "a", "text": "tea in the harbour"},
                                                 {"_id": "b", "text": "rain over the ships"}])
    queries = write_corpus(tmp_path / "queries.jsonl", [
        {"_id": "q1", "text": "tea", "title": ["not", "a", "title"], "metadata": {"evidence": [[1, 2], [3]]}},
        {"_id": "q2", "text": "ships", "metadata": {"evidence": list(range(5000)), "bad key\n": {"x": None}}},
        {"_id": "q3", "text": "rain", "metadata": ["a list"]},
    ])
    assert cli("build", corpus, "--name", "c", "--calibrator", "none").returncode == 0
    done = cli("search", "--queries", queries, "--name", "c", "--json", "-k", "1")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["query_id"] for line in done.stdout.splitlines()] == ["q1", "q2", "q3"]


def test_a_filter_on_a_field_no_document_has_is_said_and_still_runs(tmp_path, cli):
    corpus = write_corpus(tmp_path / "c.jsonl", [
        {"_id": "a", "text": "tea in the harbour", "metadata": {"lang": "en", "origin": {"site": "s1"}}},
        {"_id": "b", "text": "rain over the ships"}])
    assert cli("build", corpus, "--name", "c", "--calibrator", "none").returncode == 0
    done = cli("search", "tea", "--name", "c", "--where", '{"nope": {"$ne": 1}}', "--json")
    assert done.returncode == 0 and len(json.loads(done.stdout)["results"]) == 2  # it ran: $ne holds for both
    assert done.stderr.count("\n") == 1 and "'nope'" in done.stderr and "lang, origin, origin.site" in done.stderr
    quiet = cli("search", "tea", "--name", "c", "--where", '{"origin.site": "s1", "title": {"$exists": false}}')
    assert quiet.returncode == 0 and "no document has" not in quiet.stderr
    nothing = cli("search", "tea", "--name", "c", "--where", '{"nope": 1}')
    assert nothing.returncode == 0 and nothing.stdout.rstrip().endswith("no hits")  # said, not an empty table


def test_the_server_stores_records_as_exported_filters_them_and_warns_of_unknown_fields(tmp_path, tiny_bert):
    from fastapi.testclient import TestClient

    from retriever.serve.app import create_app

    Index.build([Document("seed", "tea in the harbour", None, "c.jsonl", 1, {"tags": ["x"]})], "docs", tmp_path,
                calibrator="none", device="cpu", model=str(tiny_bert))
    with TestClient(create_app(tmp_path, device="cpu"), base_url="http://127.0.0.1") as client:
        added = client.post("/indexes/docs/documents", json={"documents": [
            {"_id": "n\u0000ul", "text": "rain over the ships", "metadata": {"tags": ["y", "x\u0000"],
                                                                              "origin": {"site": "s2"}}}]})
        assert added.status_code == 201, added.text
        got = client.get("/indexes/docs/documents/n%00ul")
        assert got.status_code == 200 and got.json()["document"]["metadata"] == {"tags": ["y", "x\u0000"],
                                                                                 "origin": {"site": "s2"}}
        answer = client.post("/search", json={"index": "docs", "queries": ["rain"], "k": 5, "mode": "keyword",
                                              "where": {"origin.site": "s2", "tags": "x\u0000"}}).json()
        assert [hit["doc_id"] for hit in answer["queries"][0]["results"]] == ["n\u0000ul"]
        assert "warnings" not in answer
        warned = client.post("/search", json={"index": "docs", "queries": ["tea"], "k": 5, "mode": "keyword",
                                              "where": {"nope": {"$exists": False}}}).json()
        assert warned["queries"][0]["results"] and "'nope'" in warned["warnings"][0]
        refused = client.get("/search", params={"q": "tea", "k": 0, "index": "docs"})
        assert refused.status_code == 422 and refused.json()["code"] == "bad_input" and \
            refused.json()["parameter"] == "k"  # the shape of every other error
        assert client.delete("/indexes/docs/documents/n%00ul").status_code == 200
        assert client.get("/indexes/docs/documents/n%00ul").status_code == 404
        assert client.get("/indexes/docs/documents/seed").status_code == 200


def test_all_keeps_true_apart_from_1_and_takes_a_thousand_values(table):
    for where in ({"tags": {"$all": [1, True]}}, {"tags": {"$all": [True, 1]}}, {"tags": {"$all": [0, False, None]}},
                  {"tags": {"$all": [f"v{i}" for i in range(999)] + [1]}}):
        found = {RECORDS[rowid - 1].doc_id for rowid in table.matching(parse_where(where)).tolist()}
        assert found == selected(RECORDS, where), where


def test_keys_with_dots_at_their_edges_are_reachable(tmp_path):
    path = tmp_path / "edges.db"
    records = [Document("a", "t", None, "c.jsonl", 1, {"v1.": 1, ".x": {"y": 2}, "a..b": 3}),
               Document("b", "t", None, "c.jsonl", 2, {"v1": {"": 1}})]
    created = DocumentTable.create(path)
    created.insert(np.arange(1, 3), records)
    created.finish()
    created.close()
    with DocumentTable.open(path) as opened:
        for where, expected in [({"v1.": 1}, [1, 2]), ({".x.y": 2}, [1]), ({"a..b": 3}, [1]),
                                ({"metadata.v1.": {"$exists": True}}, [1, 2])]:
            assert opened.matching(parse_where(where)).tolist() == expected, where


def test_two_threads_filtering_one_table_at_once_both_finish(tmp_path):
    """Each filter sets a progress handler on the shared connection: unserialised, two threads' filters long enough
    for SQLite to call it deadlocked (the whole process: one of them holds the GIL)."""
    import threading

    path = tmp_path / "many.db"
    created = DocumentTable.create(path)
    created.insert(np.arange(1, 20_001), [Document(f"d{i}", f"{WORDS[i % 6]} note {i} " * 20, None, "c.jsonl", i + 1,
                                                   {"tags": [i % 7, "x"]}) for i in range(20_000)])
    created.finish()
    created.close()
    done = []
    with DocumentTable.open(path) as opened:
        def run(where):
            for _ in range(10):
                opened.matching(where)
            done.append(where)

        threads = [threading.Thread(target=run, args=(parse_where({"text": {"$gt": "m"}, "tags": {"$ne": i}}),),
                                    daemon=True) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert len(done) == 2


def test_a_resumed_table_and_a_compacted_one_filter_as_the_records_say(tmp_path, table):
    """A build killed mid-way loses its staged fields with its process: reopened, they are staged again from the
    stored JSON (past the last recorded chunk dropped); a compaction carries the fields of the rows it keeps."""
    half = len(RECORDS) // 2
    resumed = DocumentTable.create(tmp_path / "resumed.db")
    resumed.insert(np.arange(1, half + 11), RECORDS[:half + 10])
    resumed.close()  # killed: never finished
    resumed = DocumentTable.reopen(tmp_path / "resumed.db")
    resumed.discard_after(half)  # the last chunk recorded ended there
    resumed.insert(np.arange(half + 1, len(RECORDS) + 1), RECORDS[half:])
    resumed.finish()
    resumed.close()
    dropped = np.arange(1, len(RECORDS) + 1, 3)
    compacted = DocumentTable.create(tmp_path / "compacted.db")
    compacted.copy_from(table, dropped)
    compacted.finish()
    compacted.close()
    kept = [d for rowid, d in enumerate(RECORDS, start=1) if rowid not in set(dropped.tolist())]
    with DocumentTable.open(tmp_path / "resumed.db") as again, DocumentTable.open(tmp_path / "compacted.db") as merged:
        for where in FILTERS[:150]:
            compiled = parse_where(where)
            assert {RECORDS[r - 1].doc_id for r in again.matching(compiled).tolist()} == selected(RECORDS, where)
            assert {RECORDS[r - 1].doc_id for r in merged.matching(compiled).tolist()} == selected(kept, where)


def test_documents_given_in_python_take_defaults_get_their_metadata_checked_and_stray_keys_are_said(tmp_path,
                                                                                                  tiny_bert):
    """A `Document` needed the file and line it was read from; its metadata went unchecked; a record's key beside
    "metadata" ("lang") was dropped without a word."""
    import warnings

    from retriever.corpus import Document
    from retriever.errors import RetrieverError
    from retriever.index import Index

    index = Index.build([Document("d1", "a note about cats", metadata={"lang": "en"}), Document("d2", "dogs")],
                        "given", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu").open()
    assert [row["doc_id"] for row in index.documents(where={"lang": "en"})] == ["d1"]
    assert index.document("d2")["source"] == "records"
    with pytest.warns(UserWarning, match="records' keys 'lang', 'year' are not read: a record is read for"):
        index.add([{"_id": "e", "text": "extra", "lang": "en", "year": 3}, {"id": "f", "text": "plain"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index.add([{"_id": "g", "text": "kept", "title": "G", "metadata": {"lang": "de"}}])
    with pytest.raises(RetrieverError, match=r"^document 1 \('x'\): metadata 'a' is object"):
        index.add([Document("x", "text", metadata={"a": object()})])
    with pytest.raises(RetrieverError, match=r"duplicate ids: 'x' \(lines 1 and 2\)"):
        index.add([Document("x", "one"), Document("x", "two")])
