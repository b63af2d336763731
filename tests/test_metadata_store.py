import sqlite3

import numpy as np
import pytest

from retriever.corpus import Document
from retriever.errors import RetrieverError
from retriever.store.metadata import MetadataStore


def docs(*ids, source="corpus.jsonl"):
    """Documents with the given ids; "b" has no title."""
    return [
        Document(doc_id=d, text=f"text of {d}", title=None if d == "b" else f"Title {d}", source=source, line=i + 1)
        for i, d in enumerate(ids)
    ]


@pytest.fixture
def store(tmp_path):
    with MetadataStore(tmp_path / "metadata.db") as opened:
        yield opened


def test_add_returns_consecutive_rowids_and_get_preserves_order(store):
    rowids = store.add(docs("a", "b", "c", "d"))
    assert rowids.dtype == np.int64 and rowids.tolist() == [1, 2, 3, 4]
    rows = store.get(np.array([3, 1, 4, 1]))  # any order, repeats allowed (one document hit by two queries)
    assert [row["doc_id"] for row in rows] == ["c", "a", "d", "a"]
    c = {"rowid": 3, "doc_id": "c", "title": "Title c", "text": "text of c", "source": "corpus.jsonl", "line": 3}
    b = {"rowid": 2, "doc_id": "b", "title": None, "text": "text of b", "source": "corpus.jsonl", "line": 2}
    assert rows[0] == c and store.get([2]) == [b]
    assert store.get([2, 1], columns=["doc_id", "title"]) == [
        {"rowid": 2, "doc_id": "b", "title": None},
        {"rowid": 1, "doc_id": "a", "title": "Title a"},
    ]
    assert store.count() == 4 and store.doc_ids() == ["a", "b", "c", "d"]
    assert store.add([]).tolist() == []


def test_get_refuses_unknown_rowids_and_columns(store):
    store.add(docs("a"))
    with pytest.raises(RetrieverError, match=r"2 vector ids have no metadata row, e.g. \[-1, 7\]"):
        store.get([1, -1, 7])
    with pytest.raises(RetrieverError, match="unknown metadata columns"):
        store.get([1], columns=["doc_id", "body"])


def test_duplicate_doc_ids_are_refused_and_nothing_is_inserted(store):
    store.add(docs("a", "b"))
    with pytest.raises(RetrieverError) as caught:
        store.add(docs("x", "b", "y", "a", source="more.jsonl"))
    assert str(caught.value) == "more.jsonl: 2 ids already in the index: 'b' (line 2), 'a' (line 4)"
    with pytest.raises(RetrieverError, match=r"more.jsonl: duplicate ids: 'z' \(lines 1 and 2\)"):
        store.add(docs("z", "z", source="more.jsonl"))
    assert store.doc_ids() == ["a", "b"]


def test_rowids_for_reports_missing(store):
    store.add(docs("a", "b", "c"))
    found, missing = store.rowids_for(["c", "nope", "a", "gone"])
    assert found == {"c": 3, "a": 1} and missing == ["nope", "gone"]


def test_delete_is_all_or_nothing_and_returns_rowids(store):
    store.add(docs("a", "b", "c", "d"))
    with pytest.raises(RetrieverError, match=r"1 ids not in the index: 'nope'"):
        store.delete(["a", "nope"])
    assert store.count() == 4
    assert sorted(store.delete(["d", "b"]).tolist()) == [2, 4]
    assert store.count() == 2 and store.doc_ids() == ["a", "c"] and store.rowids().tolist() == [1, 3]


def test_rowids_are_never_reused_after_delete_even_across_reopen(tmp_path):
    path = tmp_path / "metadata.db"
    with MetadataStore(path) as store:
        store.add(docs("a", "b", "c"))
        store.delete(["c", "b"])  # the highest ids are gone: max(rowid) is now 1
    with MetadataStore(path) as store:
        assert store.add(docs("d")).tolist() == [4]
        store.delete(["a", "d"])  # now empty
        assert store.add(docs("a")).tolist() == [5]  # a re-added document gets a new id too


def test_readonly_open(tmp_path):
    path = tmp_path / "metadata.db"
    with MetadataStore(path) as store:
        store.add(docs("a", "b"))
    with MetadataStore(path, readonly=True) as reader:
        assert [row["doc_id"] for row in reader.get([2, 1])] == ["b", "a"]
        with pytest.raises(RetrieverError, match="opened read-only"):
            reader.add(docs("c"))
        # Below the guard, SQLite itself refuses: the connection really is read-only.
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.db.execute("DELETE FROM documents")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata.db"]  # no journal or WAL files left behind


def test_readonly_open_of_missing_or_foreign_files(tmp_path):
    with pytest.raises(RetrieverError, match="no metadata database there"):
        MetadataStore(tmp_path / "missing.db", readonly=True)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE things (x)").connection.close()
    with pytest.raises(RetrieverError, match="not a retriever metadata database"):
        MetadataStore(other, readonly=True)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RetrieverError, match="cannot open metadata database"):
        MetadataStore(garbage)
