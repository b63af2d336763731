"""The documents of one segment in SQLite: one row per document, whose row id is its id in the vector index.

Row ids are handed out by the index (its manifest counts them), never by SQLite, so an id is unique across all
segments and never reused. A segment is written once (`DocumentTable.create`, `insert` chunk by chunk, `finish`)
and then only read: readers open it with SQLite's `immutable` flag (no locks, no journal files), which is safe
because no one writes a finished segment again. The doc_id index is built by `finish`, after the bulk insert:
sorting once is much faster than keeping a b-tree ordered through millions of inserts, and a duplicate id is
reported there with the lines it came from. Source file names are stored once each, not once per row.

Metadata is stored twice: as the JSON the user gave (returned as given), and flattened into a `fields` table, one
row per value (`retriever.metadata.flattened`: path, kind, value, document), which filters read. Its rows are its
key, in that order (a WITHOUT ROWID table: no second copy as an index), and each path is a number (`paths`), so
a value costs a few bytes. Rows are staged in a temporary table while the segment is written and put in order
once, by `finish`. Values are compared as SQLite's own values, never through its JSON functions, which end a
string at a NUL character. A table written before the fields table existed gets one in this connection's
temporary storage, built from its JSON the first time it is filtered.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from retriever.corpus import Document
from retriever.errors import DamagedIndexError, RetrieverError
from retriever.filters import Filter, FilterError
from retriever.metadata import OBJECT, flattened

COLUMNS = ("rowid", "doc_id", "title", "text", "source", "line", "metadata")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS documents (
    rowid INTEGER PRIMARY KEY,
    doc_id TEXT NOT NULL,
    title TEXT,
    text TEXT NOT NULL,
    source INTEGER REFERENCES sources(id),
    line INTEGER,
    metadata TEXT
);
CREATE TABLE IF NOT EXISTS paths (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE);
"""
_DOC_ID_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS documents_doc_id ON documents (doc_id)"
_STAGED = "CREATE TEMP TABLE IF NOT EXISTS staged_fields (doc INTEGER, path INTEGER, kind INTEGER, value)"
_FIELDS = ("CREATE TABLE IF NOT EXISTS {schema}.fields (path INTEGER NOT NULL, kind INTEGER NOT NULL, value NOT NULL, "
           "doc INTEGER NOT NULL, PRIMARY KEY (path, kind, value, doc)) WITHOUT ROWID")
# Ids given by users are bound one parameter each, a chunk at a time: through a JSON array a NUL would end them.
_IDS_PER_STATEMENT = 500

# Id lists travel as one JSON array expanded by json_each: one statement for any number of ids, with no limit on
# bound variables.
_ROWIDS_IN = "d.rowid IN (SELECT value FROM json_each(?))"
_SELECT = {"rowid": "d.rowid", "doc_id": "d.doc_id", "title": "d.title", "text": "d.text", "source": "s.path",
           "line": "d.line", "metadata": "d.metadata"}
_FROM = "documents d LEFT JOIN sources s ON s.id = d.source"
_SHOWN = 5
# A filter runs over every document of a segment once per opened version; past this it is refused, so that no
# client's filter can hold a server's search thread.
FILTER_SECONDS = 10.0


class DocumentTable:
    def __init__(self, connection: sqlite3.Connection, path: Path, writable: bool):
        self.db = connection
        self.path = path
        self.writable = writable
        self._source_ids: dict[str, int] = {}
        # Tables written before metadata existed have no metadata column: they read as documents without any.
        self.has_metadata = any(row[1] == "metadata" for row in connection.execute("PRAGMA table_info(documents)"))
        self._select = {**_SELECT, "metadata": "d.metadata" if self.has_metadata else "NULL"}
        self._has_fields = _has_table(connection, "fields")
        self._fields_lock = threading.Lock()
        self._path_ids: dict[str, int] = {}
        # One filter at a time per connection: setting a progress handler holds the GIL while it waits for the
        # connection, whose query's handler waits for the GIL (two threads' filters would deadlock).
        self._filter_lock = threading.Lock()

    @classmethod
    def create(cls, path: str | Path) -> DocumentTable:
        """A new, empty table at PATH (an existing file there is replaced), to fill and then `finish`."""
        path = Path(path)
        path.unlink(missing_ok=True)
        # Not tied to this thread: a build reads the table on the thread that tokenizes ahead of the encoder (one
        # thread at a time uses it).
        connection = sqlite3.connect(path, check_same_thread=False)
        # A segment being written is private to its writer until the version holding it is committed, and that
        # commit fsyncs every file: no journal is needed for its durability, and inserts run much faster without.
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA cache_size=-65536")  # 64 MiB: bounded, and enough to sort the doc_id index
        connection.executescript(_SCHEMA)
        connection.execute(_STAGED)
        return cls(connection, path, writable=True)

    @classmethod
    def reopen(cls, path: str | Path) -> DocumentTable:
        """Reopen an unfinished table (a resumed build) to keep writing it."""
        connection = cls._connect(Path(path), readonly=False)
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")
        if not any(row[1] == "metadata" for row in connection.execute("PRAGMA table_info(documents)")):
            connection.execute("ALTER TABLE documents ADD COLUMN metadata TEXT")  # a build killed before metadata
        connection.executescript(_SCHEMA)
        connection.execute(_STAGED)
        table = cls(connection, Path(path), writable=True)
        with connection:  # the staged fields died with the process that wrote them: staged again from the JSON
            table._stage(table._stored_metadata(), "main")
        return table

    @classmethod
    def open(cls, path: str | Path) -> DocumentTable:
        """A finished table, read-only."""
        return cls(cls._connect(Path(path), readonly=True), Path(path), writable=False)

    @staticmethod
    def _connect(path: Path, readonly: bool) -> sqlite3.Connection:
        if not path.is_file():
            raise RetrieverError(f"{path}: no document database there")
        uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1" if readonly else f"{path.resolve().as_uri()}?mode=rw"
        try:
            connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as error:
            raise RetrieverError(f"{path}: cannot open document database ({error})") from None
        if "documents" not in tables:
            connection.close()
            raise RetrieverError(f"{path}: not a retriever document database (no documents table)")
        return connection

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> DocumentTable:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- writing ---------------------------------------------------------------------------------------------

    def insert(self, rowids: np.ndarray, documents: Sequence[Document]) -> None:
        """Insert DOCUMENTS under ROWIDS in one transaction (ids are checked for uniqueness by `finish`)."""
        self._check_writable()
        if len(rowids) != len(documents):
            raise RetrieverError(f"{len(documents)} documents but {len(rowids)} row ids")
        ids = np.asarray(rowids).tolist()
        with self.db:
            rows = ((rowid, d.doc_id, d.title, d.text, self._source_id(d.source), d.line,
                     json.dumps(d.metadata, ensure_ascii=False) if d.metadata else None)
                    for rowid, d in zip(ids, documents))
            self.db.executemany("INSERT INTO documents (rowid, doc_id, title, text, source, line, metadata) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            self._stage(((rowid, d.metadata) for rowid, d in zip(ids, documents) if d.metadata), "main")

    def _stage(self, metadata: Iterable[tuple[int, dict]], schema: str) -> None:
        """Stage the fields rows of METADATA ((row id, metadata) pairs), numbering new paths in SCHEMA's paths."""
        self.db.executemany("INSERT INTO temp.staged_fields (doc, path, kind, value) VALUES (?, ?, ?, ?)",
                            ((rowid, self._path_id(path, schema), kind, value) for rowid, fields in metadata
                             for path, kind, value in flattened(fields)))

    def _path_id(self, path: str, schema: str) -> int:
        known = self._path_ids.get(path)
        if known is None:
            found = self.db.execute(f"SELECT id FROM {schema}.paths WHERE path = ?", (path,)).fetchone()
            known = found[0] if found else self.db.execute(f"INSERT INTO {schema}.paths (path) VALUES (?)",
                                                           (path,)).lastrowid
            self._path_ids[path] = known
        return known

    def _put_in_order(self, schema: str) -> None:
        """The staged fields rows, sorted once, into SCHEMA's fields table (a repeated row is one: a list holding
        a value twice matches as once)."""
        self.db.execute(_FIELDS.format(schema=schema))
        self.db.execute(f"INSERT OR IGNORE INTO {schema}.fields (path, kind, value, doc) SELECT path, kind, value, "
                        "doc FROM temp.staged_fields ORDER BY path, kind, value, doc")
        self.db.execute("DELETE FROM temp.staged_fields")

    def _stored_metadata(self, source: str = "documents", dropped: str = "[]") -> Iterator[tuple[int, dict]]:
        """(row id, metadata) of SOURCE's documents that have some, except the row ids in DROPPED (a JSON array)."""
        cursor = self.db.execute(f"SELECT rowid, metadata FROM {source} WHERE metadata IS NOT NULL AND rowid NOT IN "
                                 "(SELECT value FROM json_each(?))", (dropped,))
        return ((rowid, json.loads(metadata)) for rowid, metadata in cursor.fetchall())

    def copy_from(self, other: DocumentTable, dropped: np.ndarray) -> int:
        """Copy OTHER's rows, except the row ids in DROPPED, in row id order (SQLite streams it); returns the count."""
        self._check_writable()
        self.db.execute("ATTACH DATABASE ? AS other", (f"{other.path.resolve().as_uri()}?mode=ro&immutable=1",))
        dropped_ids = json.dumps(np.asarray(dropped, dtype=np.int64).tolist())
        try:
            with self.db:
                self.db.execute("INSERT OR IGNORE INTO sources (path) SELECT path FROM other.sources")
                cursor = self.db.execute(
                    "INSERT INTO documents (rowid, doc_id, title, text, source, line, metadata) "
                    "SELECT d.rowid, d.doc_id, d.title, d.text, (SELECT m.id FROM main.sources m WHERE m.path = s.path), "
                    f"d.line, {'d.metadata' if other.has_metadata else 'NULL'} "
                    "FROM other.documents d LEFT JOIN other.sources s ON s.id = d.source "
                    "WHERE d.rowid NOT IN (SELECT value FROM json_each(?)) ORDER BY d.rowid", (dropped_ids,))
                copied = cursor.rowcount
                if _has_table(self.db, "fields", "other"):  # its path numbers are its own: matched by path
                    kept = "f.doc NOT IN (SELECT value FROM json_each(?))"
                    self.db.execute("INSERT OR IGNORE INTO main.paths (path) SELECT DISTINCT p.path FROM other.fields "
                                    f"f JOIN other.paths p ON p.id = f.path WHERE {kept}", (dropped_ids,))
                    self.db.execute("INSERT INTO temp.staged_fields (doc, path, kind, value) SELECT f.doc, m.id, "
                                    "f.kind, f.value FROM other.fields f JOIN other.paths p ON p.id = f.path JOIN "
                                    f"main.paths m ON m.path = p.path WHERE {kept}", (dropped_ids,))
                    self._path_ids.clear()
                elif other.has_metadata:  # a segment from before the fields table
                    self._stage(self._stored_metadata("other.documents", dropped_ids), "main")
        finally:
            self.db.execute("DETACH DATABASE other")
        self._source_ids.clear()
        return copied

    def finish(self) -> None:
        """Build the doc_id index; a repeated id is refused here with the lines of its first two occurrences."""
        self._check_writable()
        try:
            with self.db:
                self.db.execute(_DOC_ID_INDEX)
        except sqlite3.IntegrityError:
            raise RetrieverError(self._duplicates_message()) from None
        with self.db:
            self._put_in_order("main")
        self.db.execute("ANALYZE")

    def discard_after(self, rowid: int) -> None:
        """Drop rows with ids above ROWID (what a killed writer inserted after its last recorded chunk)."""
        self._check_writable()
        with self.db:
            self.db.execute("DELETE FROM documents WHERE rowid > ?", (int(rowid),))
            self.db.execute("DELETE FROM temp.staged_fields WHERE doc > ?", (int(rowid),))

    def _duplicates_message(self) -> str:
        cursor = self.db.execute(
            "SELECT d.doc_id, min(d.line), (SELECT line FROM documents e WHERE e.doc_id = d.doc_id "
            "ORDER BY e.rowid LIMIT 1 OFFSET 1), s.path FROM documents d LEFT JOIN sources s ON s.id = d.source "
            "GROUP BY d.doc_id HAVING count(*) > 1 ORDER BY min(d.rowid) LIMIT ?",
            (_SHOWN + 1,),
        )
        rows = cursor.fetchall()
        listed = [f"{doc_id!r} (lines {first} and {second})" for doc_id, first, second, _ in rows[:_SHOWN]]
        more = " and more" if len(rows) > _SHOWN else ""
        return f"{rows[0][3]}: duplicate ids: {', '.join(listed)}{more}"

    def _source_id(self, path: str) -> int:
        known = self._source_ids.get(path)
        if known is None:
            self.db.execute("INSERT OR IGNORE INTO sources (path) VALUES (?)", (path,))
            known = self.db.execute("SELECT id FROM sources WHERE path = ?", (path,)).fetchone()[0]
            self._source_ids[path] = known
        return known

    def _check_writable(self) -> None:
        if not self.writable:
            raise RetrieverError(f"{self.path}: opened read-only")

    # --- reading ---------------------------------------------------------------------------------------------

    def get(self, rowids: Sequence[int] | np.ndarray, columns: Sequence[str] = COLUMNS) -> list[dict]:
        """The rows for ROWIDS, in the same order (repeats allowed); every id must be here."""
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown:
            raise RetrieverError(f"unknown document columns {unknown}; known: {', '.join(COLUMNS)}")
        wanted = np.asarray(rowids, dtype=np.int64).ravel().tolist()
        selected = ["rowid", *(c for c in columns if c != "rowid")]
        cursor = self.db.execute(
            f"SELECT {', '.join(self._select[c] for c in selected)} FROM {_FROM} WHERE {_ROWIDS_IN}",
            [json.dumps(wanted)]
        )
        by_rowid = {row[0]: dict(zip(selected, row)) for row in cursor}
        if "metadata" in selected:
            for row in by_rowid.values():
                row["metadata"] = json.loads(row["metadata"]) if row["metadata"] else None
        missing = [r for r in wanted if r not in by_rowid]
        if missing:
            raise DamagedIndexError(
                f"{self.path}: {len(missing)} vector ids have no document row, e.g. {missing[:_SHOWN]}"
            )
        return [by_rowid[r] for r in wanted]

    def matching(self, where: Filter, seconds: float = FILTER_SECONDS) -> np.ndarray:
        """Row ids (int64, ascending) of the documents WHERE selects (`retriever.filters`); a filter SQLite cannot
        run, or one still running after SECONDS, is refused as the filter's problem (FilterError)."""
        self._ensure_fields()
        with self._filter_lock:
            deadline = time.monotonic() + seconds
            self.db.set_progress_handler(lambda: time.monotonic() > deadline, 100_000)  # nonzero: interrupt
            try:
                cursor = self.db.execute(f"SELECT d.rowid FROM {_FROM} WHERE {where.sql} ORDER BY d.rowid",
                                         where.parameters)
                return np.fromiter((row[0] for row in cursor), dtype=np.int64)
            except sqlite3.OperationalError as error:
                if time.monotonic() > deadline:
                    raise FilterError(f"still running after {seconds:g} s over {self.count():,} documents; make "
                                      "it simpler") from None
                raise FilterError(f"cannot be run ({error})") from None
            finally:
                self.db.set_progress_handler(None, 0)

    def _ensure_fields(self) -> None:
        """Give a table from before the fields table one, in this connection's temporary storage (it is opened
        read-only)."""
        if self._has_fields:
            return
        with self._fields_lock:
            if not self._has_fields:
                self.db.execute("CREATE TEMP TABLE IF NOT EXISTS paths (id INTEGER PRIMARY KEY, path TEXT NOT NULL "
                                "UNIQUE)")
                self.db.execute(_STAGED)
                with self.db:
                    if self.has_metadata:
                        self._stage(self._stored_metadata(), "temp")
                    self._put_in_order("temp")
                self._has_fields = True

    def field_kinds(self, paths: list[str]) -> dict[str, set[int]]:
        """The kinds of value (`retriever.metadata`: NULL ... OBJECT) each of PATHS holds here; a path no document
        has is left out."""
        self._ensure_fields()
        found: dict[str, set[int]] = {}
        with self._filter_lock:
            for path in paths:
                # One seek of the (path, kind, ...) key per kind: a path a million documents hold costs no scan.
                kinds = {kind for kind in range(OBJECT + 1) if self.db.execute(
                    "SELECT EXISTS (SELECT 1 FROM fields WHERE path = (SELECT id FROM paths WHERE path = ?) AND "
                    "kind = ?)", (path, kind)).fetchone()[0]}
                if kinds:
                    found[path] = kinds
        return found

    def metadata_fields(self) -> list[str]:
        """Every metadata path (`retriever.metadata.flattened`) some document here has, sorted."""
        self._ensure_fields()
        return [row[0] for row in self.db.execute(
            "SELECT p.path FROM paths p WHERE EXISTS (SELECT 1 FROM fields f WHERE f.path = p.id) ORDER BY p.path")]

    def text_lengths(self, rowids: np.ndarray) -> np.ndarray:
        """The length in characters of the text of each of ROWIDS (all here), in order."""
        wanted = np.asarray(rowids, dtype=np.int64).tolist()
        # Counted here, not by SQLite's length(), which stops at a NUL character.
        cursor = self.db.execute(f"SELECT d.rowid, d.text FROM documents d WHERE {_ROWIDS_IN}", [json.dumps(wanted)])
        lengths = {rowid: len(text) for rowid, text in cursor}
        return np.fromiter((lengths[rowid] for rowid in wanted), np.int64, len(wanted))

    def rowids_for(self, doc_ids: Iterable[str]) -> dict[str, int]:
        """doc_id -> row id for those of DOC_IDS stored here (compared exactly: each id is its own parameter)."""
        wanted = list(dict.fromkeys(doc_ids))
        found: dict[str, int] = {}
        for start in range(0, len(wanted), _IDS_PER_STATEMENT):
            chunk = wanted[start:start + _IDS_PER_STATEMENT]
            found.update(self.db.execute(f"SELECT doc_id, rowid FROM documents WHERE doc_id IN "
                                         f"({', '.join('?' * len(chunk))})", chunk).fetchall())
        return found

    def count(self) -> int:
        return self.db.execute("SELECT count(*) FROM documents").fetchone()[0]

    def max_rowid(self) -> int:
        return self.db.execute("SELECT coalesce(max(rowid), 0) FROM documents").fetchone()[0]

    def rowids(self) -> np.ndarray:
        """All row ids (int64), ascending."""
        cursor = self.db.execute("SELECT rowid FROM documents ORDER BY rowid")
        return np.fromiter((row[0] for row in cursor), dtype=np.int64)

    def doc_ids(self) -> list[str]:
        """All document ids, in row id order."""
        return [row[0] for row in self.db.execute("SELECT doc_id FROM documents ORDER BY rowid")]

    def documents(self, after_rowid: int = 0, batch: int = 4096) -> Iterator[tuple[int, Document]]:
        """(row id, document) in row id order, from the first id above AFTER_ROWID; read in batches."""
        columns = f"d.rowid, d.doc_id, d.text, d.title, s.path, d.line, {self._select['metadata']}"
        for rowid, doc_id, text, title, source, line, metadata in self._paged(columns, _FROM, after_rowid, batch):
            yield rowid, Document(doc_id, text, title, source, line, json.loads(metadata) if metadata else None)

    def documents_to_encode(self, after_rowid: int = 0, batch: int = 4096) -> Iterator[tuple[int, Document]]:
        """`documents`, with only what the encoder reads of each: id, title and text. Their source is "", line 0
        and metadata None, not the stored ones (which a build's encoding would read and parse for every document,
        and drop)."""
        for rowid, doc_id, text, title in self._paged("d.rowid, d.doc_id, d.text, d.title", "documents d",
                                                      after_rowid, batch):
            yield rowid, Document(doc_id, text, title, "", 0)

    def _paged(self, columns: str, source: str, after_rowid: int, batch: int) -> Iterator[tuple]:
        """COLUMNS of SOURCE's rows (the documents as `d`) in row id order, the row id first, BATCH at a time."""
        last = after_rowid
        while rows := self.db.execute(f"SELECT {columns} FROM {source} WHERE d.rowid > ? ORDER BY d.rowid LIMIT ?",
                                      (last, batch)).fetchall():
            yield from rows
            last = rows[-1][0]


def _has_table(connection: sqlite3.Connection, name: str, schema: str = "main") -> bool:
    return connection.execute(f"SELECT count(*) FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?",
                              (name,)).fetchone()[0] > 0
