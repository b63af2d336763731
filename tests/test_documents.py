import sqlite3

import numpy as np
import pytest

from retriever.corpus import Document
from retriever.errors import RetrieverError
from retriever.store.documents import DocumentTable


def docs(*ids, source="corpus.jsonl"):
    """Documents with the given ids; "b" has no title."""
    return [
        Document(doc_id=d, text=f"text of {d}", title=None if d == "b" else f"Title {d}", source=source, line=i + 1)
        for i, d in enumerate(ids)
    ]


def table_of(path, *ids, first=1, source="corpus.jsonl"):
    table = DocumentTable.create(path)
    table.insert(np.arange(first, first + len(ids)), docs(*ids, source=source))
    table.finish()
    return table


def test_get_preserves_order_and_repeats_and_picks_columns(tmp_path):
    table = table_of(tmp_path / "documents.db", "a", "b", "c", "d")
    rows = table.get(np.array([3, 1, 4, 1]))  # any order, repeats allowed (one document hit by two queries)
    assert [row["doc_id"] for row in rows] == ["c", "a", "d", "a"]
    c = {"rowid": 3, "doc_id": "c", "title": "Title c", "text": "text of c", "source": "corpus.jsonl", "line": 3,
         "metadata": None}
    b = {"rowid": 2, "doc_id": "b", "title": None, "text": "text of b", "source": "corpus.jsonl", "line": 2,
         "metadata": None}
    assert rows[0] == c and table.get([2]) == [b]
    assert table.get([2, 1], columns=["doc_id", "title"]) == [
        {"rowid": 2, "doc_id": "b", "title": None},
        {"rowid": 1, "doc_id": "a", "title": "Title a"},
    ]
    assert table.count() == 4 and table.doc_ids() == ["a", "b", "c", "d"] and table.rowids().tolist() == [1, 2, 3, 4]
    assert [(rowid, d.doc_id) for rowid, d in table.documents(after_rowid=2, batch=1)] == [(3, "c"), (4, "d")]


def test_get_refuses_unknown_rowids_and_columns(tmp_path):
    table = table_of(tmp_path / "documents.db", "a")
    with pytest.raises(RetrieverError, match=r"2 vector ids have no document row, e.g. \[-1, 7\]"):
        table.get([1, -1, 7])
    with pytest.raises(RetrieverError, match="unknown document columns"):
        table.get([1], columns=["doc_id", "body"])


def test_a_repeated_id_is_refused_by_finish_with_its_lines(tmp_path):
    table = DocumentTable.create(tmp_path / "documents.db")
    table.insert(np.arange(1, 4), docs("x", "z", "y", source="more.jsonl"))
    table.insert(np.arange(4, 6), [Document("z", "again", None, "more.jsonl", 9), Document("w", "w", None, "more.jsonl", 10)])
    with pytest.raises(RetrieverError, match=r"^more.jsonl: duplicate ids: 'z' \(lines 2 and 9\)$"):
        table.finish()


def test_rowids_for_finds_only_stored_ids(tmp_path):
    table = table_of(tmp_path / "documents.db", "a", "b", "c", first=10)
    assert table.rowids_for(["c", "nope", "a"]) == {"c": 12, "a": 10}


def test_copy_from_keeps_rows_and_sources_but_the_dropped(tmp_path):
    first = table_of(tmp_path / "one.db", "a", "b", "c", source="one.jsonl")
    second = table_of(tmp_path / "two.db", "d", "e", first=4, source="two.jsonl")
    merged = DocumentTable.create(tmp_path / "merged.db")
    assert merged.copy_from(first, np.array([2])) == 2
    assert merged.copy_from(second, np.array([2])) == 2
    merged.finish()
    assert merged.doc_ids() == ["a", "c", "d", "e"]
    assert [row["source"] for row in merged.get([1, 5])] == ["one.jsonl", "two.jsonl"]


def test_discard_after_drops_what_a_killed_writer_left(tmp_path):
    table = DocumentTable.create(tmp_path / "documents.db")
    table.insert(np.arange(1, 5), docs("a", "b", "c", "d"))
    table.discard_after(2)
    table.finish()
    assert table.doc_ids() == ["a", "b"]


def test_a_finished_table_opens_read_only_and_leaves_no_files(tmp_path):
    path = tmp_path / "documents.db"
    table_of(path, "a", "b").close()
    with DocumentTable.open(path) as reader:
        assert [row["doc_id"] for row in reader.get([2, 1])] == ["b", "a"]
        with pytest.raises(RetrieverError, match="opened read-only"):
            reader.insert(np.array([3]), docs("c"))
        with pytest.raises(sqlite3.OperationalError, match="readonly"):  # SQLite itself refuses too
            reader.db.execute("DELETE FROM documents")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["documents.db"]  # no journal or WAL files left behind


def test_open_of_missing_or_foreign_files(tmp_path):
    with pytest.raises(RetrieverError, match="no document database there"):
        DocumentTable.open(tmp_path / "missing.db")
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE things (x)").connection.close()
    with pytest.raises(RetrieverError, match="not a retriever document database"):
        DocumentTable.open(other)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RetrieverError, match="cannot open document database"):
        DocumentTable.open(garbage)
