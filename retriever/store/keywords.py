"""The keyword index of one segment: the postings BM25 needs, with SQLite FTS5 as the tokenizer.

    segments/<name>/keywords.db   (SQLite, written once by `KeywordIndex.build`, then read-only)
        terms(term, positions, counts)   one row per term: the segment positions (int32, ascending: position i is
                                         the segment's i-th row id) of the documents holding it, and how often
                                         (uint16) in title and text together
        info(key, value)                 tokenizer, documents, tokens, lengths (uint32 tokens per position)

Text is tokenized by FTS5's own tokenizer (unicode61, diacritics removed, porter stemming by default), for the
documents when the segment is written and for every query, so both sides always agree. FTS5 indexes each segment's
documents once in a scratch table, and its term-by-document counts (`fts5vocab`) are stored as the postings above.
FTS5's `bm25()` is not used to rank: it takes its statistics from its own table, one segment, while a version's
ranking must read every term's document frequency and the average length from all of the version's live
documents (an index of three segments ranks exactly as the same documents in one), and it scores every match in
SQL, row by row. Postings as arrays are scored with global statistics in NumPy (`KeywordScorer`).

Scoring is Okapi BM25 (k1 1.2, b 0.75, the defaults of Lucene and FTS5; not tuned here) with Lucene's idf,
log(1 + (N - df + 0.5) / (df + 0.5)), which stays positive for terms in most documents.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError
from retriever.layout import KEYWORDS

DEFAULT_TOKENIZER = "porter unicode61 remove_diacritics 2"
K1, B = 1.2, 0.75
# Each term's postings are read from the scratch table into one row: positions and counts as comma-separated text,
# parsed by NumPy (the per-posting work stays in C; a Python loop over postings was several times slower).
_POSTINGS = """
SELECT term, group_concat(doc), group_concat(n) FROM
  (SELECT term, doc, count(*) AS n FROM temp.vocabulary GROUP BY term, doc ORDER BY term, doc)
GROUP BY term ORDER BY term
"""


class Tokenizer:
    """FTS5's tokenizer as a function: text -> {term: count}. Each thread gets its own in-memory FTS5 table (a
    SQLite connection is one thread's); a text is inserted, its terms read back from `fts5vocab`, and removed."""

    _shared: dict[str, Tokenizer] = {}
    _lock = threading.Lock()

    def __init__(self, spec: str = DEFAULT_TOKENIZER):
        self.spec = spec
        self._local = threading.local()

    @classmethod
    def get(cls, spec: str = DEFAULT_TOKENIZER) -> Tokenizer:
        with cls._lock:
            if spec not in cls._shared:
                cls._shared[spec] = cls(spec)
            return cls._shared[spec]

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(":memory:")
            try:
                connection.execute(f"CREATE VIRTUAL TABLE query USING fts5(text, tokenize={_quote(self.spec)})")
            except sqlite3.OperationalError as error:
                raise RetrieverError(f"SQLite FTS5 cannot make the tokenizer {self.spec!r} ({error})") from None
            connection.execute("CREATE VIRTUAL TABLE terms USING fts5vocab(query, 'row')")
            self._local.connection = connection
        return connection

    def __call__(self, text: str) -> dict[str, int]:
        connection = self._connection()
        with connection:
            connection.execute("INSERT INTO query (rowid, text) VALUES (1, ?)", (text,))
            terms = dict(connection.execute("SELECT term, cnt FROM terms"))
            connection.execute("DELETE FROM query")
        return terms


@dataclass(frozen=True)
class KeywordIndex:
    """The per-segment structure (`retriever.store.segment.STRUCTURES`): builds keywords.db from the segment's
    finished document table."""

    tokenizer: str = DEFAULT_TOKENIZER
    name: str = "keywords"
    files: tuple[str, ...] = (KEYWORDS,)

    def build(self, folder: Path, documents) -> None:
        """Write FOLDER/keywords.db for DOCUMENTS (a DocumentTable; positions follow its row id order). Written
        under a temporary name and renamed when whole, so a killed write leaves no half index behind."""
        path = folder / KEYWORDS
        partial = folder / (KEYWORDS + ".partial")
        partial.unlink(missing_ok=True)
        db = sqlite3.connect(partial)
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.executescript("CREATE TABLE terms (term TEXT PRIMARY KEY, positions BLOB NOT NULL, "
                             "counts BLOB NOT NULL) WITHOUT ROWID;"
                             "CREATE TABLE info (key TEXT PRIMARY KEY, value) WITHOUT ROWID;")
            # The scratch FTS5 table lives in memory: it is read once and never kept.
            db.execute("ATTACH DATABASE ':memory:' AS scratch")
            db.execute(f"CREATE VIRTUAL TABLE scratch.documents USING fts5(title, text, content='', "
                       f"tokenize={_quote(self.tokenizer)})")
            db.execute("CREATE VIRTUAL TABLE temp.vocabulary USING fts5vocab(scratch, documents, 'instance')")
            count = 0
            batch: list[tuple[int, str, str]] = []
            for _, document in documents.documents():
                batch.append((count, document.title or "", document.text))
                count += 1
                if len(batch) == 10000:
                    db.executemany("INSERT INTO scratch.documents (rowid, title, text) VALUES (?, ?, ?)", batch)
                    batch = []
            db.executemany("INSERT INTO scratch.documents (rowid, title, text) VALUES (?, ?, ?)", batch)
            lengths = np.zeros(count, np.int64)
            rows: list[tuple[str, bytes, bytes]] = []
            for term, positions_text, counts_text in db.execute(_POSTINGS):
                positions = np.array(positions_text.split(","), dtype=np.int32)
                counts = np.array(counts_text.split(","), dtype=np.int64)
                if len(positions) > 1 and np.any(np.diff(positions) <= 0):  # group_concat's order is SQLite's choice
                    order = np.argsort(positions, kind="stable")
                    positions, counts = positions[order], counts[order]
                lengths[positions] += counts
                rows.append((term, positions.tobytes(), np.minimum(counts, 65535).astype(np.uint16).tobytes()))
                if len(rows) == 10000:
                    db.executemany("INSERT INTO terms VALUES (?, ?, ?)", rows)
                    rows = []
            db.executemany("INSERT INTO terms VALUES (?, ?, ?)", rows)
            db.commit()
            db.execute("DROP TABLE temp.vocabulary")
            db.execute("DETACH DATABASE scratch")
            info = {"format": 1, "tokenizer": self.tokenizer, "documents": count, "tokens": int(lengths.sum()),
                    "lengths": lengths.astype(np.uint32).tobytes()}
            db.executemany("INSERT INTO info VALUES (?, ?)", info.items())
            db.commit()
        finally:
            db.close()
        partial.replace(path)


class KeywordSegment:
    """A segment's keywords.db, opened read-only: its statistics in memory, postings read per query."""

    def __init__(self, path: Path):
        self.path = path
        if not path.is_file():
            raise RetrieverError(f"{path}: no keyword index there")
        try:
            self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                                      check_same_thread=False)
            info = dict(self.db.execute("SELECT key, value FROM info"))
        except sqlite3.DatabaseError as error:
            raise RetrieverError(f"{path}: cannot open keyword index ({error})") from None
        if info.get("format") != 1:
            raise RetrieverError(f"{path}: not a keyword index this version reads (format {info.get('format')})")
        self.tokenizer = str(info["tokenizer"])
        self.documents = int(info["documents"])
        self.lengths = np.frombuffer(info["lengths"], dtype=np.uint32)
        if len(self.lengths) != self.documents:
            raise RetrieverError(f"{path}: {len(self.lengths)} lengths for {self.documents} documents")

    def postings(self, terms: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """term -> (positions int32, counts uint16) for those of TERMS this segment holds."""
        if not terms:
            return {}
        cursor = self.db.execute("SELECT term, positions, counts FROM terms WHERE term IN "
                                 "(SELECT value FROM json_each(?))", (json.dumps(list(terms)),))
        return {term: (np.frombuffer(positions, np.int32), np.frombuffer(counts, np.uint16))
                for term, positions, counts in cursor}

    def close(self) -> None:
        self.db.close()


@dataclass
class SegmentMatches:
    """One query's BM25 scores in one segment: the positions of the documents matching any term, ascending, and
    their scores (deleted documents excluded)."""

    positions: np.ndarray
    scores: np.ndarray

    def score_of(self, positions: np.ndarray) -> np.ndarray:
        """The scores of POSITIONS (0 where a document matches no term)."""
        at = np.minimum(np.searchsorted(self.positions, positions), max(len(self.positions) - 1, 0))
        found = (self.positions[at] == positions) if len(self.positions) else np.zeros(len(positions), bool)
        return np.where(found, self.scores[at] if len(self.scores) else 0.0, 0.0).astype(np.float32)


class KeywordScorer:
    """BM25 over a version's segments with the statistics of all its live documents. LIVE: each segment's mask of
    live positions (tombstoned rows are False); SEGMENTS: their KeywordSegments, in the same order."""

    def __init__(self, segments: Sequence[KeywordSegment], live: Sequence[np.ndarray], k1: float = K1, b: float = B):
        self.segments, self.live, self.k1, self.b = list(segments), list(live), k1, b
        tokenizers = {segment.tokenizer for segment in self.segments}
        if len(tokenizers) > 1:
            raise RetrieverError(f"segments tokenized differently ({', '.join(sorted(tokenizers))})")
        self.tokenizer = Tokenizer.get(tokenizers.pop() if tokenizers else DEFAULT_TOKENIZER)
        self.documents = int(sum(int(mask.sum()) for mask in self.live))
        tokens = sum(int(segment.lengths[mask].sum(dtype=np.int64)) for segment, mask in zip(self.segments, self.live))
        self.average_length = tokens / self.documents if self.documents else 0.0
        # BM25's length normalisation per position: k1 * (1 - b + b * length / average length)
        self._norms = [(k1 * (1 - b + b * segment.lengths.astype(np.float32) / max(self.average_length, 1e-9)))
                       .astype(np.float32) for segment in self.segments]

    def match(self, query: str) -> list[SegmentMatches]:
        """The query's matches in each segment (same order as the segments)."""
        terms = self.tokenizer(query)
        postings = [segment.postings(list(terms)) for segment in self.segments]
        frequency = {term: sum(int(mask[found[term][0]].sum()) for mask, found in zip(self.live, postings)
                               if term in found) for term in terms}
        n = self.documents
        weights = {term: count * float(np.log1p((n - frequency[term] + 0.5) / (frequency[term] + 0.5)))
                   for term, count in terms.items() if frequency[term]}
        results = []
        for found, mask, norm in zip(postings, self.live, self._norms):
            scores = np.zeros(len(mask), np.float32)
            for term, weight in weights.items():
                if term not in found:
                    continue
                positions, counts = found[term]
                tf = counts.astype(np.float32)
                scores[positions] += np.float32(weight) * tf * np.float32(self.k1 + 1) / (tf + norm[positions])
            scores[~mask] = 0.0
            matched = np.flatnonzero(scores)
            results.append(SegmentMatches(matched.astype(np.int32), scores[matched]))
        return results

    def null(self, matches: Sequence[SegmentMatches]) -> tuple[float, float]:
        """The mean and standard deviation of a query's BM25 score over every live document (0 where no term
        occurs), from its MATCHES."""
        if not self.documents:
            return 0.0, 1.0
        total = sum(float(found.scores.sum(dtype=np.float64)) for found in matches)
        squares = sum(float(np.square(found.scores, dtype=np.float64).sum()) for found in matches)
        mean = total / self.documents
        return mean, float(np.sqrt(max(squares / self.documents - mean * mean, 0.0)))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
