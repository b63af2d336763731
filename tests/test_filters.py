"""Metadata and filters: what documents carry, the filter language's meaning and refusals, filtered search in every
index type and mode (no hit outside the filter; k hits whenever k documents match; the exact answer where the plan
is exact), delete by filter, and an index of before metadata."""

from __future__ import annotations

import json
import math
import sys
import threading

import numpy as np
import pytest

from retriever.corpus import Document, read_corpus
from retriever.errors import RetrieverError
from retriever.search.plan import BEAM_EXPONENT, plan_filtered_search
from retriever.filters import FilterError, parse_where
from retriever.index import Index
from retriever.search.options import SearchOptions
from retriever.search.searcher import Searcher
from retriever.search.top_lists import passage_vectors
from retriever.versions.snapshot import Snapshot
from retriever.store.documents import DocumentTable
from retriever.store.spec import IndexSpec
from tests.helpers import write_corpus

LANGS = ("en", "de", "fr")


def notes(count: int) -> list[Document]:
    """COUNT documents whose metadata has known selectivities: group = i % 100, lang cycles over 3, even alternates;
    every tenth has no year."""
    return [Document(f"n{i}", f"note {i} on {['tea', 'rain', 'ships', 'maps'][i % 4]} and the number {i}", None,
                     "notes.jsonl", i + 1,
                     {"group": i % 100, "lang": LANGS[i % 3], "even": i % 2 == 0,
                      **({"year": 2000 + i % 25} if i % 10 else {})})
            for i in range(count)]


def selected(documents: list[Document], where: dict) -> set[str]:
    """The ids WHERE selects, by a direct reading of the language (the reference the SQL must equal)."""
    def holds(metadata: dict, clause: dict) -> bool:
        for key, condition in clause.items():
            if key == "$and":
                if not all(holds(metadata, c) for c in condition):
                    return False
                continue
            if key == "$or":
                if not any(holds(metadata, c) for c in condition):
                    return False
                continue
            if key == "$not":
                if holds(metadata, condition):
                    return False
                continue
            ops = condition if isinstance(condition, dict) else {"$eq": condition}
            present, value = key in metadata, metadata.get(key)
            for op, wanted in ops.items():
                same_kind = present and isinstance(value, bool) == isinstance(wanted, bool) and (
                    isinstance(value, str) == isinstance(wanted, str))
                equal = same_kind and value == wanted
                ok = {"$eq": lambda: equal, "$ne": lambda: not equal,
                      "$in": lambda: any(same_kind_of(value, present, w) for w in wanted),
                      "$nin": lambda: not any(same_kind_of(value, present, w) for w in wanted),
                      "$exists": lambda: present == wanted,
                      "$gt": lambda: same_kind and value > wanted, "$gte": lambda: same_kind and value >= wanted,
                      "$lt": lambda: same_kind and value < wanted, "$lte": lambda: same_kind and value <= wanted}[op]()
                if not ok:
                    return False
        return True
    return {d.doc_id for d in documents if holds(d.metadata or {}, where)}


def same_kind_of(value, present: bool, wanted) -> bool:
    return (present and isinstance(value, bool) == isinstance(wanted, bool)
            and isinstance(value, str) == isinstance(wanted, str) and value == wanted)


WHERES = [
    {"lang": "en"}, {"group": 7}, {"group": {"$lt": 10}}, {"group": {"$gte": 50}, "lang": {"$ne": "fr"}},
    {"year": {"$exists": False}}, {"lang": {"$in": ["de", "fr"]}}, {"group": {"$nin": [1, 2, 3]}},
    {"even": True}, {"$or": [{"group": 1}, {"$and": [{"lang": "de"}, {"group": {"$lte": 3}}]}]},
    {"year": {"$gt": 2020}}, {"lang": {"$gt": "e"}}, {"year": {"$gt": "2020"}},  # a string against numbers: none
    # $not: the complement, missing fields included (Haystack's NOT), and nested under $or
    {"$not": {"year": {"$gt": 2020}}}, {"$not": {"group": {"$lt": 50}, "lang": "en"}},
    {"$or": [{"$not": {"even": True}}, {"group": 2}]},
]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("filters") / "documents.db"
    documents = notes(600)
    created = DocumentTable.create(path)
    created.insert(np.arange(1, 601), documents)
    created.finish()
    created.close()
    with DocumentTable.open(path) as opened:
        yield opened, documents


@pytest.mark.parametrize("where", WHERES, ids=[json.dumps(w) for w in WHERES])
def test_each_filter_selects_what_the_language_says(table, where):
    opened, documents = table
    rowids = opened.matching(parse_where(where))
    assert {documents[rowid - 1].doc_id for rowid in rowids.tolist()} == selected(documents, where)


def test_document_fields_are_filterable_too(table):
    opened, _ = table
    assert opened.matching(parse_where({"doc_id": {"$in": ["n3", "n5"]}})).tolist() == [4, 6]
    assert len(opened.matching(parse_where({"source": "notes.jsonl", "title": {"$exists": False}}))) == 600


@pytest.mark.parametrize("where,problem", [
    ('{"lang": ', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"lang": {"$regex": "e"}}', "unknown operator '$regex'"),
    ('{"$nor": [{"lang": "en"}]}', "unknown operator '$nor'"),
    ('{"$not": [{"lang": "en"}]}', "$not takes one object of conditions, got a list"),
    ('{"group": {"$gt": true}}', "$gt compares with a number or a string"),
    ('{"group": {"$in": []}}', "$in takes a non-empty list of values, got an empty list"),
    ('{"group": {"$in": 3}}', "$in takes a non-empty list"),
    ('{"group": {"$exists": 1}}', "$exists takes true or false"),
    ('{"tags": ["a"]}', "compares with a string, number, true/false or null, got a list"),
    ("{}", "an empty object"),
    ('{"$or": []}', "$or takes a non-empty list"),
    ('{"x": {"$eq": NaN}}', "numbers must be finite"),
    ('{"x": ' + "1" * 5000 + "}", "an integer too long to read"),
    ('{"tags": {"$size": 100000000000000000000}}', "$size takes a whole number of elements from 0 to 1,000"),
    ('{"\\ud800": 1}', "a field name holds an invalid character"),
    ({1: "x"}, "the int 1 is not a field name"),  # a Python dict's key, not text
    ('{"year": 2001, "year": 2002}', 'the key "year" is given twice in one object'),  # the last one won
    ('{"tags": {"$all": [' + ", ".join(['"x"'] * 1001) + "]}}", "list 1,001 values"),
])
def test_a_filter_that_cannot_be_compiled_is_one_line_naming_the_problem(where, problem):
    with pytest.raises(FilterError, match=None) as caught:
        parse_where(where)
    message = str(caught.value)
    assert problem in message and "\n" not in message and message.startswith("where: ")


def test_hostile_keys_and_values_are_parameters_never_sql(table):
    """The server takes filters from clients: quotes, comments and statements in keys or values are compared as
    data (a key is any text, so none of these names a field) or fail to name one (one line); the table is
    untouched."""
    opened, _ = table
    for key in ("lang'); DROP TABLE documents; --", 'a"b', "x\\y", "lang[0]", "lang' OR '1'='1"):
        assert len(opened.matching(parse_where({key: 1}))) == 0
        assert len(opened.matching(parse_where({key: {"$exists": False}}))) == 600
    for key in ("", "metadata."):
        with pytest.raises(FilterError, match="not a field name"):
            parse_where({key: 1})
    for value in ("en' OR '1'='1", "'); DROP TABLE documents; --", '" OR 1=1 --', "%", "*"):
        assert len(opened.matching(parse_where({"lang": value}))) == 0
        assert len(opened.matching(parse_where({"lang": {"$ne": value}}))) == 600
    deep = {"lang": "en"}
    for _ in range(20):
        deep = {"$and": [deep]}
    with pytest.raises(FilterError, match="nested more than"):
        parse_where(deep)
    assert opened.count() == 600


def test_metadata_from_jsonl_and_typed_csv_columns(tmp_path):
    jsonl = write_corpus(tmp_path / "c.jsonl", [
        {"_id": "a", "text": "first", "metadata": {"year": 2019, "lang": "en", "draft": False, "score": 0.5}},
        {"_id": "b", "text": "second"}])
    assert [d.metadata for d in read_corpus(jsonl)] == [{"year": 2019, "lang": "en", "draft": False, "score": 0.5},
                                                         None]
    table = tmp_path / "c.csv"
    table.write_text("id,text,year,ratio,code,Page Name\nx,one,2019,0.25,007x,tar\ny,two,,1e3,12,\n",
                     encoding="utf-8")
    assert [d.metadata for d in read_corpus(table)] == [
        {"year": 2019, "ratio": 0.25, "code": "007x", "Page Name": "tar"}, {"ratio": 1000.0, "code": 12}]


@pytest.mark.parametrize("metadata,problem", [
    ([1, 2], '"metadata" must be an object'),
    ({"a\nb": 1}, "is not a key"),
    ({"": 1}, "is not a key"),
    ({"deep": [[[[[[[[["x"]]]]]]]]]}, "more than 8 deep"),
    ({"many": list(range(1001))}, "more than 1,000 values"),
    ({"big": 2**70}, "outside 64 bits"),
    ({"big": -2**63 - 1}, "outside 64 bits"),
    ({"nested": {"inner": float("nan")}}, "numbers must be finite"),
])
def test_bad_metadata_is_one_line_with_the_line(tmp_path, metadata, problem):
    corpus = write_corpus(tmp_path / "bad.jsonl", [{"_id": "a", "text": "t"}, {"_id": "b", "text": "u",
                                                                             "metadata": metadata}])
    with pytest.raises(RetrieverError, match="line 2") as caught:
        read_corpus(corpus)
    assert problem in str(caught.value)


@pytest.fixture(scope="module", params=["flat", "hnsw", "ivfpq"])
def filtered_index(request, tmp_path_factory):
    """3,000 notes with random 48-d vectors (a model-free index: the vectors are given), one index per type."""
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp(f"filtered-{request.param}")
    documents = notes(3000)
    vectors = rng.standard_normal((3000, 48)).astype(np.float32)
    options = {"nlist": 16, "pq_m": 8} if request.param == "ivfpq" else {}
    Index.build(documents, "f", folder, vectors=vectors, calibrator="none", index_type=request.param,
                index_options=options, device="cpu", model=str(tiny_model(tmp_path_factory)))
    # Searched by vector: the model folder holds a config and no weights, so nothing encodes text here.
    searcher = Searcher(Snapshot.open("f", folder, device="cpu"))
    return searcher, documents, rng.standard_normal((12, 48)).astype(np.float32)


def tiny_model(tmp_path_factory):
    """A config-only 48-d BERT folder: builds from vectors read the encoder's record from it, and load nothing."""
    folder = tmp_path_factory.getbasetemp() / "bert-48"
    if not (folder / "config.json").is_file():
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps({
            "model_type": "bert", "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": 100}))
    return folder


@pytest.mark.parametrize("where", [{"group": 7}, {"group": {"$lt": 3}}, {"lang": "en"}, {"even": True},
                                   {"group": {"$lt": 97}}])
def test_filtered_dense_search_keeps_to_the_filter_and_returns_k(filtered_index, where):
    searcher, documents, queries = filtered_index
    allowed = selected(documents, where)
    vectors = searcher.snapshot.calibrate(queries)
    options = SearchOptions(k=10, mode="dense", where=where)
    found = searcher.search(["q"] * len(queries), vectors, options)
    assert all(len(hits) == min(10, len(allowed)) for hits in found)
    assert all(hit.doc_id in allowed for hits in found for hit in hits)
    # Against exact search over the matching documents' vectors: equal where the plan is exact, close otherwise.
    exact = exact_filtered(searcher.snapshot, vectors, allowed, 10)
    recall = np.mean([len({h.doc_id for h in hits} & set(row)) / 10 for hits, row in zip(found, exact)])
    assert recall == 1.0 if searcher.plan(options).dense.exact else recall >= 0.8  # ivfpq: codes pick the candidates


def exact_filtered(snapshot, vectors: np.ndarray, allowed: set[str], k: int) -> list[list[str]]:
    """Each query's top K among the ALLOWED documents, by every one's stored vector: exact filtered search."""
    ids = np.array(sorted(int(doc_id[1:]) + 1 for doc_id in allowed))  # notes' row ids: n0 is row 1
    stored = passage_vectors(snapshot, ids)  # notes are short: one passage each, in row id order
    assert stored.owners.tolist() == ids.tolist()
    best = ids[np.argsort(-(vectors @ stored.vectors.T), axis=1, kind="stable")[:, :k]]
    return [[f"n{rowid - 1}" for rowid in row] for row in best.tolist()]


@pytest.mark.parametrize("filtered_index", ["flat"], indirect=True)
def test_eight_threads_with_different_filters_each_get_their_own_filter_s_answer(filtered_index):
    """One store searched from 8 threads at once, each with its own filter, switching threads as often as Python
    can: every answer equals exact filtered search. (Each store caches its last filter's selection; a cache read
    twice could hand one thread another's filter.)"""
    searcher, documents, queries = filtered_index
    vectors = searcher.snapshot.calibrate(queries)
    filters = [{"group": {"$in": [g, g + 8, g + 16]}} for g in range(8)]
    expected = [exact_filtered(searcher.snapshot, vectors, selected(documents, where), 10) for where in filters]
    barrier, wrong = threading.Barrier(8), []

    def run(number: int) -> None:
        barrier.wait()
        for _ in range(25):
            found = searcher.search(["q"] * len(queries), vectors, SearchOptions(k=10, mode="dense",
                                                                                 where=filters[number]))
            if [[hit.doc_id for hit in hits] for hits in found] != expected[number]:
                wrong.append(number)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(number,)) for number in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(thread.is_alive() for thread in threads)
    assert not wrong, f"{len(wrong)} answers of threads {sorted(set(wrong))} were not their filter's"


def test_keyword_hybrid_and_raw_searches_filter_too(filtered_index):
    searcher, documents, queries = filtered_index
    where = {"lang": "de", "group": {"$lt": 40}}
    allowed = selected(documents, where)
    keyword = searcher.search(["tea rain"], None, SearchOptions(k=10, mode="keyword", where=where))[0]
    assert keyword and all(hit.doc_id in allowed for hit in keyword)
    hybrid = searcher.search(["tea rain"], searcher.snapshot.calibrate(queries[:1]),
                             SearchOptions(k=10, mode="hybrid", where=where))
    assert len(hybrid[0]) == 10 and all(hit.doc_id in allowed for hit in hybrid[0])
    raw = searcher.search_raw(queries[:2], SearchOptions(k=10, space="raw", where=where))
    assert all(len(hits) == 10 and all(hit.doc_id in allowed for hit in hits) for hits in raw)
    assert all(hit.metadata["lang"] == "de" for hit in keyword + hybrid[0])


def test_a_filter_that_matches_nothing_answers_nothing_without_a_warning(filtered_index, recwarn):
    searcher, _, queries = filtered_index
    where = {"group": {"$gt": 10_000}}
    for mode in ("dense", "keyword", "hybrid"):
        found = searcher.search(["tea rain"], None if mode == "keyword" else searcher.snapshot.calibrate(queries[:1]),
                                SearchOptions(k=10, mode=mode, where=where))
        assert found == [[]], mode
    assert not [str(warning.message) for warning in recwarn.list]  # numpy's "Mean of empty slice" and the like


def test_the_plan_scans_few_matches_and_widens_the_ann_for_many():
    hnsw, ivfpq = IndexSpec(type="hnsw"), IndexSpec(type="ivfpq", nlist=1024)
    assert plan_filtered_search(500, 1_000_000, 10, hnsw).exact
    wide = plan_filtered_search(500_000, 1_000_000, 10, hnsw)  # half match: a beam 2 ** 0.45 times as wide
    assert not wide.exact and wide.ef_search == math.ceil(hnsw.search_ef / 0.5**BEAM_EXPONENT)
    narrower = plan_filtered_search(100_000, 1_000_000, 10, hnsw)  # a tenth: wider still, cheaper than the scan
    assert not narrower.exact and wide.ef_search < narrower.ef_search == math.ceil(hnsw.search_ef / 0.1**BEAM_EXPONENT)
    assert plan_filtered_search(20_000, 200_000, 10, hnsw).exact  # the same share of fewer: the scan is cheaper
    probe = plan_filtered_search(500_000, 1_000_000, 10, ivfpq)
    assert not probe.exact and ivfpq.search_nprobe < probe.nprobe < 1024
    few = plan_filtered_search(20_000, 1_000_000, 10, ivfpq)  # every bucket probed: every match's code scored
    assert not few.exact and few.nprobe == 1024
    assert plan_filtered_search(3, 10, 10, IndexSpec(type="flat")).exact


def test_delete_by_filter_and_fields_in_info_and_list(tmp_path, tmp_path_factory):
    documents = notes(200)
    vectors = np.random.default_rng(1).standard_normal((200, 48)).astype(np.float32)
    summary = Index.build(documents, "d", tmp_path, vectors=vectors, calibrator="none", device="cpu",
                          model=str(tiny_model(tmp_path_factory)))
    index = summary.open()
    assert index.info()["metadata_fields"] == ["even", "group", "lang", "year"]
    removed = index.delete(where={"lang": "fr"})
    assert removed.changed == len(selected(documents, {"lang": "fr"})) == 66
    after = removed.open()
    assert len(after) == 134 and not len(after.snapshot.matching(parse_where({"lang": "fr"})))
    with pytest.raises(RetrieverError, match="matches the filter; nothing deleted"):
        after.delete(where={"lang": "fr"})
    with pytest.raises(RetrieverError, match="not both"):
        after.delete(["n1"], where={"lang": "en"})
    from retriever.versions.catalog import describe_indexes

    assert describe_indexes(tmp_path)[0]["fields"] == ["even", "group", "lang", "year"]


def test_long_in_lists_are_one_bound_array_and_the_budget_is_per_filter(table):
    opened, documents = table
    values = list(range(1000))  # one expression per kind, however long the list (SQLite caps expression depth)
    assert len(opened.matching(parse_where({"group": {"$in": values}}))) == 600
    mixed = {"lang": {"$in": ["en", 1, True, None]}}  # each kind compared with its own: 1 is not true
    assert {documents[r - 1].doc_id for r in opened.matching(parse_where(mixed)).tolist()} == selected(
        documents, {"lang": "en"})
    with pytest.raises(FilterError, match="list 1,001 values; at most 1,000 in one filter"):
        parse_where({"$or": [{"group": {"$in": values[:600]}}, {"year": {"$nin": values[:401]}}]})


def test_csv_digits_a_number_would_change_stay_text():
    from retriever.metadata import typed_field

    assert [typed_field(field) for field in ("02139", "0", "-0.5", "1234567890123456789", "12", "1e3", "")] == \
        ["02139", 0, -0.5, "1234567890123456789", 12, 1000.0, None]


@pytest.mark.parametrize("filtered_index", ["ivfpq"], indirect=True)
def test_a_filter_that_matches_k_gets_k_even_where_the_probes_find_fewer(filtered_index):
    """ivfpq probing 2 of 16 buckets meets about 190 of the 1,500 matches; asking for 300, the short queries
    score every match instead."""
    searcher, documents, queries = filtered_index
    plan = searcher.plan(SearchOptions(k=300, mode="dense", nprobe=1, where={"even": True}))
    assert not plan.dense.exact
    scores, ids = searcher.dense.top(searcher.snapshot.calibrate(queries), plan.dense, plan.matches)
    assert (ids >= 0).sum(axis=1).tolist() == [300] * len(queries) and np.isin(ids, plan.matches.rowids).all()


def test_a_value_of_a_kind_the_field_never_holds_is_named_with_its_fix():
    from retriever.filters import kind_mismatch_note
    from retriever.metadata import LIST, NUMBER, STRING

    held = {"year": {NUMBER}, "tags": {LIST, STRING}, "mixed": {NUMBER, STRING}}
    asked: list = []

    def kinds(paths):
        asked.append(paths)
        return {path: held[path] for path in paths if path in held}

    note = kind_mismatch_note(parse_where({"year": "2020"}), kinds)
    assert "'year' holds numbers" in note and note.endswith("write 2020")
    assert "write \"7\"" in kind_mismatch_note(parse_where({"tags": {"$in": ["a", 7]}}), kinds)
    assert "write" not in kind_mismatch_note(parse_where({"year": {"$gte": "soon"}}), kinds)  # no number reads so
    for fine in ({"year": {"$gte": 2020}}, {"tags": "a"}, {"mixed": "x"}, {"missing": "x"}, {"year": None},
                 {"year": {"$exists": True}}, {"title": "x"}):
        assert kind_mismatch_note(parse_where(fine), kinds) is None, fine
    asked.clear()
    assert kind_mismatch_note(parse_where({"year": {"$exists": True}}), kinds) is None and not asked  # no value: no look


def test_a_script_is_warned_only_of_a_missing_field_its_filter_requires():
    """$ne, $nin, $exists false and $not select the documents without the path (Haystack's `== None` is such an
    $or): no warning that the filter selects nothing; the CLI and the server still note any field no document has."""
    from retriever.filters import unknown_fields_note

    fields = ["year"]
    for everything in ({"x": {"$ne": 1}}, {"x": {"$nin": [1]}}, {"x": {"$exists": False}}, {"$not": {"x": 1}},
                       {"$or": [{"x": None}, {"x": {"$exists": False}}]}, {"$or": [{"year": 1}, {"x": 2}]}):
        assert unknown_fields_note(parse_where(everything), fields, required_only=True) is None, everything
        assert "no document has the field 'x'" in unknown_fields_note(parse_where(everything), fields)
    for nothing in ({"x": 1}, {"x": {"$exists": True}}, {"x": {"$gt": 3, "$ne": 5}}, {"year": 1, "x": None},
                    {"$and": [{"year": 1}, {"x": {"$in": [1]}}]}, {"$or": [{"x": 1}, {"x": {"$gt": 4}}]}):
        assert "no document has the field 'x'" in unknown_fields_note(parse_where(nothing), fields,
                                                                      required_only=True), nothing
