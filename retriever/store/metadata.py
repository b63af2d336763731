"""Document metadata in SQLite: one row per document, whose row id is the document's id in the vector store.

Row ids come from ``AUTOINCREMENT``, so an id is never handed out twice, even after deletes: a FAISS id always
means the same document. The database stays in rollback-journal mode (not WAL) so that, between writes, the file
is complete on its own: an index folder can be copied or swapped whole, and searchers open it read-only without
needing write access to create ``-wal``/``-shm`` files.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import sqlite_utils

from retriever.corpus import Document, check_unique_ids
from retriever.errors import RetrieverError

COLUMNS = ("rowid", "doc_id", "title", "text", "source", "line")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    rowid INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_id TEXT NOT NULL UNIQUE,
    title TEXT,
    text TEXT NOT NULL,
    source TEXT,
    line INTEGER
)
"""

# Id lists travel as one JSON array expanded by json_each: one statement for any number of ids, with no
# limit on bound variables.
_ROWIDS_IN = "rowid IN (SELECT value FROM json_each(?))"
_DOC_IDS_IN = "doc_id IN (SELECT value FROM json_each(?))"

_SHOWN = 5


class MetadataStore:
    def __init__(self, path: str | Path, readonly: bool = False):
        """Open (creating it unless ``readonly``) the metadata database at ``path``."""
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.is_file():
            raise RetrieverError(f"{self.path}: no metadata database there")
        try:
            if readonly:
                connection = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            else:
                connection = sqlite3.connect(self.path)
        except sqlite3.Error as error:
            raise RetrieverError(f"{self.path}: cannot open metadata database ({error})") from None
        self.db = sqlite_utils.Database(connection, execute_plugins=False)
        try:
            if not readonly:
                self.db.execute("PRAGMA journal_mode=DELETE")
                self.db.execute(_SCHEMA)
            elif "documents" not in self.db.table_names():
                raise RetrieverError(f"{self.path}: not a retriever metadata database (no documents table)")
        except sqlite3.DatabaseError as error:
            self.db.close()
            raise RetrieverError(f"{self.path}: cannot open metadata database ({error})") from None
        except RetrieverError:
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, docs: Iterable[Document]) -> np.ndarray:
        """Insert ``docs`` in one transaction; returns their new row ids (int64), in the order given.

        Refuses (inserting nothing) ids repeated within ``docs`` or already stored.
        """
        self._check_writable()
        docs = list(docs)
        if not docs:
            return np.empty(0, dtype=np.int64)
        check_unique_ids(docs)
        with self.db.atomic():
            found, _missing = self.rowids_for([doc.doc_id for doc in docs])
            check_unique_ids(docs, existing=set(found))
            # Ids are assigned here rather than read back after inserting, so they are known without a query.
            # AUTOINCREMENT records the highest one in sqlite_sequence, so deleted ids are never handed out again.
            start = self._next_rowid()
            rowids = np.arange(start, start + len(docs), dtype=np.int64)
            # Plain executemany: measured 3x faster than Table.insert_all (200k rows: 0.8 s against 2.4 s).
            self.db.conn.executemany(
                "INSERT INTO documents (rowid, doc_id, title, text, source, line) VALUES (?, ?, ?, ?, ?, ?)",
                ((rowid, d.doc_id, d.title, d.text, d.source, d.line) for rowid, d in zip(rowids.tolist(), docs)),
            )
        return rowids

    def get(self, rowids: Sequence[int] | np.ndarray, columns: Sequence[str] = COLUMNS) -> list[dict]:
        """The rows for ``rowids``, in the same order (repeats allowed); every id must exist.

        Search results padded with -1 must have those dropped first. ``columns`` picks a subset
        (e.g. leave out ``text`` for a listing); ``rowid`` is always included.
        """
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise RetrieverError(f"unknown metadata columns {unknown}; known: {', '.join(COLUMNS)}")
        wanted = np.asarray(rowids, dtype=np.int64).ravel().tolist()
        selected = ["rowid", *(c for c in columns if c != "rowid")]
        cursor = self.db.execute(
            f"SELECT {', '.join(selected)} FROM documents WHERE {_ROWIDS_IN}", [json.dumps(wanted)]
        )
        by_rowid = {row[0]: dict(zip(selected, row)) for row in cursor}
        missing = [r for r in wanted if r not in by_rowid]
        if missing:
            raise RetrieverError(
                f"index is inconsistent: {len(missing)} vector ids have no metadata row, e.g. {missing[:_SHOWN]}"
            )
        return [by_rowid[r] for r in wanted]

    def rowids_for(self, doc_ids: Iterable[str]) -> tuple[dict[str, int], list[str]]:
        """(doc_id → row id for the stored ones, the ones not stored in the order given)."""
        doc_ids = list(doc_ids)
        cursor = self.db.execute(f"SELECT doc_id, rowid FROM documents WHERE {_DOC_IDS_IN}", [json.dumps(doc_ids)])
        found = dict(cursor.fetchall())
        return found, [d for d in doc_ids if d not in found]

    def delete(self, doc_ids: Iterable[str]) -> np.ndarray:
        """Delete documents by id, all or nothing; returns their row ids (to remove from the vector store)."""
        self._check_writable()
        with self.db.atomic():
            found, missing = self.rowids_for(doc_ids)
            if missing:
                shown = ", ".join(repr(d) for d in missing[:_SHOWN])
                more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
                raise RetrieverError(f"{len(missing)} ids not in the index: {shown}{more}")
            rowids = np.fromiter(found.values(), dtype=np.int64, count=len(found))
            self.db.execute(f"DELETE FROM documents WHERE {_ROWIDS_IN}", [json.dumps(rowids.tolist())])
        return rowids

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM documents").fetchone()[0]

    def doc_ids(self) -> list[str]:
        """All document ids, in insertion order."""
        return [row[0] for row in self.db.execute("SELECT doc_id FROM documents ORDER BY rowid")]

    def rowids(self) -> np.ndarray:
        """All row ids (int64), ascending; should equal the vector store's ids as a set."""
        cursor = self.db.execute("SELECT rowid FROM documents ORDER BY rowid")
        return np.fromiter((row[0] for row in cursor), dtype=np.int64)

    def _check_writable(self) -> None:
        if self.readonly:
            raise RetrieverError(f"{self.path}: opened read-only")

    def _next_rowid(self) -> int:
        # sqlite_sequence holds the largest id ever used (AUTOINCREMENT); max(rowid) covers a fresh table.
        return self.db.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'documents'), 0),"
            " coalesce((SELECT max(rowid) FROM documents), 0)) + 1"
        ).fetchone()[0]
