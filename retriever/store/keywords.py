"""The keyword index of one segment: the postings BM25 needs, with SQLite FTS5 as the tokenizer.

    segments/<name>/keywords.db          (SQLite) the term dictionary, terms(term, start, count): where each
                                         term's postings are in the two arrays below; info(key, value):
                                         tokenizer, documents, tokens, lengths (uint32 tokens per position)
                    keyword-postings.npy the segment positions (int32; position i is the segment's i-th document,
                                         in row id order) of the units holding each term, ascending within a term
                    keyword-counts.npy   how often (uint16) the term occurs there, in title and text together
                    keyword-passage*     the same three for the segment's passages (position i is its i-th vector
                                         key), where some document here is cut into passages

Each set is written once by a `KeywordIndex` and then only read; the arrays are memory-mapped, so a term's
postings are a view, whatever their length.

Text is tokenized by FTS5's own tokenizer (unicode61, diacritics removed, combining marks kept in their words,
porter stemming by default), for the documents when the segment is written and for every query, so both sides
always agree. A version whose segments were written with different tokenizers (an index from before marks were
kept, then added to) reads a query's terms under each: the terms of English text are the same under both, and
`compact` rewrites every segment with today's. FTS5 indexes each segment's
documents once in a scratch table, and its term-by-document counts (`fts5vocab`) are stored as the postings above.
FTS5's `bm25()` is not used to rank: it takes its statistics from its own table, one segment, while a version's
ranking must read every term's document frequency and the average length from all of the version's live
documents (an index of three segments ranks exactly as the same documents in one), and it scores every match in
SQL, row by row. Postings as arrays are scored with global statistics (`KeywordScorer`), the per-posting loops
compiled (`retriever.store.keyword_kernels`).

Scoring is Okapi BM25 (k1 1.2, b 0.75, the defaults of Lucene and FTS5; not tuned here) with Lucene's idf,
log(1 + (N - df + 0.5) / (df + 0.5)), which stays positive for terms in most documents.

Every document is scored whole, with the documents' statistics: BM25's length normalisation is the right evidence
for documents of a few hundred words, and on real questions it beat scoring documents by their best passage
(`benchmarks/results/passages_real.md`). Where documents are cut into passages (`retriever.encode.passages`), the
passages are a second index, scored with the documents' statistics (`KeywordScorer.weighted`: a passage scores as a
document of its length would), and a cut document's score weighs in its best passage
(`retriever.search.keyword`): a page far longer than the rest, which its length normalisation buries below short
paragraphs sharing a word, competes at a passage's length (Callan, SIGIR 1994: passage evidence helps combined with
the document's, not instead of it).
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever.errors import DamagedIndexError, RetrieverError
from retriever.processes import available_cpus, shared_thread_pool
from retriever.store.layout import (COUNTS, KEYWORDS, PASSAGE_COUNTS, PASSAGE_KEYWORDS, PASSAGE_POSTINGS,
                                    PASSAGES, POSTINGS, SPANS)
from retriever.store.arrays import NpyAppender, load_npy
from retriever.store.passages import document_of

# The tokenizer before combining marks were kept, and where this SQLite's unicode61 has no `categories` option.
PLAIN_TOKENIZER = "porter unicode61 remove_diacritics 2"
# Combining marks as word characters (unicode61's own default leaves them out): a Hindi or Thai vowel sign, a Hebrew
# or Arabic vowel point stays in its word, which they cut into pieces before. English text, and Latin accents
# (removed either way), tokenize as before. A segment records the tokenizer it was written with.
MARKS_TOKENIZER = PLAIN_TOKENIZER + " categories 'L* N* Co M*'"
K1, B = 1.2, 0.75
# Lucene's English stop words (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET). Dropped from queries that hold other
# words (`KeywordScorer.match`): the documents keep them, and a query of nothing else still finds them.
STOP_WORDS = ("a an and are as at be but by for if in into is it no not of on or such that the their then there "
              "these they this to was will with").split()
# Each term's occurrences are read from the scratch table as one row, the documents holding it once per occurrence
# as comma-separated text (fts5vocab yields them in term, then document order: no sort in SQL), and rows are
# parsed and counted in NumPy a few million occurrences at a time: the per-posting work stays in C. Terms that are
# no word (`is_word`) are left out, of a text's length too, as a query's terms leave them out.
_OCCURRENCES = "SELECT term, count(*), group_concat(doc) FROM temp.vocabulary GROUP BY term"
_OCCURRENCES_PER_CHUNK = 4_000_000
# A segment remembers where this many terms' postings lie (a megabyte or two: an index of many segments keeps one
# such record per segment and side), then starts over.
TERM_PLACES = 1 << 13
# A segment is searched in a slice per this many units, up to one per core (`slices_for`): a search of this many
# costs far more than handing it to another thread.
SLICE_UNITS = 1 << 17
_UNKNOWN = object()


def is_word(term: str | None) -> bool:
    """Whether a term FTS5 read back is a word. Not one: combining marks alone (the tokenizer that keeps marks makes
    a token of an accent after a space, or of the variation selector that follows an emoji, which is no token
    character: every coloured emoji was one term), or nothing at all (an accent's token emptied by diacritic
    removal, which FTS5 reads back as NULL)."""
    return bool(term) and (term[0] < "\u0300" or not all(unicodedata.category(c)[0] == "M" for c in term))


def fts5_text(data: bytes) -> str:
    """A term as FTS5 stored it, as text. FTS5 cuts a token at 32,768 bytes, inside a character where a text holds
    no separator for that long (10,923 Chinese characters), and SQLite then fails to read the term as UTF-8: the
    character cut is dropped, and a query's tokenizer reads the same run the same way."""
    return data.decode("utf-8", "ignore")


class Tokenizer:
    """FTS5's tokenizer as a function: text -> {term: count}. Each thread gets its own in-memory FTS5 table (a
    SQLite connection is one thread's) of one row: a text replaces the one before (FTS5 drops the old row's terms
    from its index) and its terms are read back from `fts5vocab`."""

    _shared: dict[str, Tokenizer] = {}
    _lock = threading.Lock()

    def __init__(self, spec: str):
        self.spec = spec
        self._local = threading.local()

    @classmethod
    def get(cls, spec: str | None = None) -> Tokenizer:
        """The tokenizer of SPEC (the default a new keyword index is written with), one per setting."""
        spec = spec or default_tokenizer()
        with cls._lock:
            if spec not in cls._shared:
                cls._shared[spec] = cls(spec)
            return cls._shared[spec]

    def _connection(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(":memory:", isolation_level=None)  # no BEGIN: each statement commits alone
            connection.text_factory = fts5_text
            try:
                connection.execute(f"CREATE VIRTUAL TABLE query USING fts5(text, tokenize={_quote(self.spec)})")
            except sqlite3.OperationalError as error:
                raise RetrieverError(f"SQLite FTS5 cannot make the tokenizer {self.spec!r} ({error})") from None
            connection.execute("CREATE VIRTUAL TABLE terms USING fts5vocab(query, 'row')")
            self._local.connection = connection
        return connection

    def __call__(self, text: str) -> dict[str, int]:
        connection = self._connection()
        # The table holds one row, the last text: replacing it drops the text before from FTS5's index.
        connection.execute("INSERT OR REPLACE INTO query (rowid, text) VALUES (1, ?)", (text,))
        return {term: count for term, count in connection.execute("SELECT term, cnt FROM terms") if is_word(term)}


@functools.cache
def default_tokenizer() -> str:
    """The tokenizer a new keyword index is written with: MARKS_TOKENIZER where this SQLite's FTS5 can make it, else
    PLAIN_TOKENIZER."""
    try:
        Tokenizer.get(MARKS_TOKENIZER)("x")
    except RetrieverError:
        return PLAIN_TOKENIZER
    return MARKS_TOKENIZER


DOCUMENT_FILES = (KEYWORDS, POSTINGS, COUNTS)
PASSAGE_FILES = (PASSAGE_KEYWORDS, PASSAGE_POSTINGS, PASSAGE_COUNTS)


@dataclass(frozen=True)
class KeywordIndex:
    """A per-segment structure (`retriever.store.segment.STRUCTURES`): the keyword index of the segment's
    documents (UNITS "documents", a unit per document in row id order), or of its passages ("passages", a unit per
    passage of a cut document in key order, each with its document's title; written only where some document is
    cut), from the segment's finished document table."""

    tokenizer: str | None = None  # None: `default_tokenizer()`
    name: str = "keywords"
    files: tuple[str, ...] = DOCUMENT_FILES
    units: str = "documents"

    @property
    def needs_passages(self) -> bool:
        """Whether it is built from the segment's passages (known once its documents are encoded), not its documents
        alone."""
        return self.units == "passages"

    def build(self, folder: Path, documents) -> None:
        """Write this keyword index into FOLDER for DOCUMENTS (a DocumentTable). Each file is written under a
        temporary name and renamed when whole, the term dictionary last: a killed write leaves no half index
        behind, and the index is whole once its database is there."""
        if self.units == "passages" and not (folder / PASSAGES).is_file():
            return  # every document here is one passage: the documents' index is the passages' too
        tokenizer = self.tokenizer or default_tokenizer()
        partial = {name: folder / (name + ".partial") for name in self.files}
        for path in partial.values():
            path.unlink(missing_ok=True)
        database, postings_name, counts_name = self.files
        db = sqlite3.connect(partial[database])
        db.text_factory = fts5_text
        postings = NpyAppender(partial[postings_name], None, "int32")
        counts_file = NpyAppender(partial[counts_name], None, "uint16")
        try:
            db.execute("PRAGMA journal_mode=OFF")
            db.execute("PRAGMA synchronous=OFF")
            db.executescript("CREATE TABLE terms (term TEXT PRIMARY KEY, start INTEGER NOT NULL, "
                             "count INTEGER NOT NULL) WITHOUT ROWID;"
                             "CREATE TABLE info (key TEXT PRIMARY KEY, value) WITHOUT ROWID;")
            # The scratch FTS5 table lives in memory: it is read once and never kept.
            db.execute("ATTACH DATABASE ':memory:' AS scratch")
            db.execute(f"CREATE VIRTUAL TABLE scratch.documents USING fts5(title, text, content='', "
                       f"tokenize={_quote(tokenizer)})")
            db.execute("CREATE VIRTUAL TABLE temp.vocabulary USING fts5vocab(scratch, documents, 'instance')")
            count = 0
            batch: list[tuple[int, str, str]] = []
            for title, text in (_passages(folder, documents) if self.units == "passages" else
                                (((document.title or ""), document.text) for _, document in documents.documents())):
                batch.append((count, title, text))
                count += 1
                if len(batch) == 10000:
                    db.executemany("INSERT INTO scratch.documents (rowid, title, text) VALUES (?, ?, ?)", batch)
                    batch = []
            db.executemany("INSERT INTO scratch.documents (rowid, title, text) VALUES (?, ?, ?)", batch)
            lengths = np.zeros(count, np.int64)
            cursor = db.execute(_OCCURRENCES)
            while chunk := _next_chunk(cursor):
                terms, positions, counts, held = _postings_of(chunk)
                lengths += np.bincount(positions, weights=counts, minlength=count).astype(np.int64)
                starts = postings.rows + np.concatenate([[0], np.cumsum(held)[:-1]])
                db.executemany("INSERT INTO terms VALUES (?, ?, ?)", zip(terms, starts.tolist(), held.tolist()))
                postings.append(positions)
                counts_file.append(np.minimum(counts, 65535))
            db.commit()
            db.execute("DROP TABLE temp.vocabulary")
            db.execute("DETACH DATABASE scratch")
            info = {"format": 2, "tokenizer": tokenizer, "documents": count, "tokens": int(lengths.sum()),
                    "lengths": lengths.astype(np.uint32).tobytes()}
            db.executemany("INSERT INTO info VALUES (?, ?)", info.items())
            db.commit()
        finally:
            db.close()
            postings.close()
            counts_file.close()
        for name in (*self.files[1:], self.files[0]):
            partial[name].replace(folder / name)


def text_postings(texts: list[str], tokenizer: str | None = None
                  ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """The postings of TEXTS, in memory, tokenized as a keyword index tokenizes (one FTS5 table for all of them,
    as `KeywordIndex.build` does: a text at a time costs ten times more): {term: (positions int32 ascending,
    counts)} and each text's length in tokens."""
    db = sqlite3.connect(":memory:")
    db.text_factory = fts5_text
    try:
        db.execute(f"CREATE VIRTUAL TABLE documents USING fts5(text, content='', "
                   f"tokenize={_quote(tokenizer or default_tokenizer())})")
        db.execute("CREATE VIRTUAL TABLE temp.vocabulary USING fts5vocab(main, documents, 'instance')")
        db.executemany("INSERT INTO documents (rowid, text) VALUES (?, ?)", enumerate(texts))
        postings: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        lengths = np.zeros(len(texts), np.int64)
        cursor = db.execute(_OCCURRENCES)
        while chunk := _next_chunk(cursor):
            terms, positions, counts, held = _postings_of(chunk)
            lengths += np.bincount(positions, weights=counts, minlength=len(texts)).astype(np.int64)
            for term, at, many in zip(terms, np.split(positions, np.cumsum(held)[:-1]),
                                      np.split(counts, np.cumsum(held)[:-1])):
                postings[term] = (at, many)
        return postings, lengths
    finally:
        db.close()


def _passages(folder: Path, documents) -> Iterator[tuple[str, str]]:
    """(title, text) of each passage of the segment in FOLDER's cut documents (`passages.cut_positions`), in key
    order."""
    spans = load_npy(folder / SPANS, mmap_mode="r")
    owners = document_of(load_npy(folder / PASSAGES, mmap_mode="r"))
    position = 0
    for rowid, document in documents.documents():
        end = int(np.searchsorted(owners, rowid, side="right"))
        if end - position > 1:
            title = document.title or ""
            for start, stop in np.asarray(spans[position:end]).tolist():
                yield title, document.text[start:stop]
        position = end


class KeywordSegment:
    """A segment's keyword index (its FILES: `DOCUMENT_FILES` or `PASSAGE_FILES`), opened read-only: its
    statistics in memory, its postings mapped."""

    def __init__(self, folder: Path, files: tuple[str, ...] = DOCUMENT_FILES):
        path = folder / files[0]
        self.path = path
        if not path.is_file():
            raise RetrieverError(f"{path}: no keyword index there")
        self.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
        try:
            self._open(folder, path, files)
        except BaseException as error:
            self.db.close()
            if isinstance(error, sqlite3.DatabaseError):
                raise RetrieverError(f"{path}: cannot open keyword index ({error})") from None
            raise

    def _open(self, folder: Path, path: Path, files: tuple[str, ...]) -> None:
        info = dict(self.db.execute("SELECT key, value FROM info"))
        if info.get("format") != 2:
            raise RetrieverError(f"{path}: not a keyword index this version reads (format {info.get('format')})")
        self.tokenizer = str(info["tokenizer"])
        self.documents = int(info["documents"])
        self.lengths = np.frombuffer(info["lengths"], dtype=np.uint32)
        if len(self.lengths) != self.documents:
            raise RetrieverError(f"{path}: {len(self.lengths)} lengths for {self.documents} documents")
        # Mapped, and seen as plain arrays: a query slices them per term, and slicing a np.memmap costs 6x more.
        self.positions = np.asarray(load_npy(folder / files[1], mmap_mode="r"))
        self.counts = np.asarray(load_npy(folder / files[2], mmap_mode="r"))
        if self.positions.dtype != np.int32 or self.counts.dtype != np.uint16 or len(self.positions) != len(self.counts):
            raise RetrieverError(f"{folder}: keyword postings and counts do not match")
        self._places: dict[str, tuple[int, int] | None] = {}  # term -> (start, count), None: not here
        self._costs: np.ndarray | None = None

    def cuts(self, slices: int) -> list[int]:
        """The unit positions cutting this segment into SLICES slices of about equal search cost, from 0 to the
        number of units. A unit costs its length plus the mean length: a query walks postings, which long units
        hold more of, and visits units, long or short. (Slices of equal unit counts were far apart in work where
        long units cluster, and the slowest sets the pace.)"""
        costs = self._costs
        if costs is None:  # once per segment (two racing threads compute the same array)
            lengths = self.lengths.astype(np.float64)
            costs = self._costs = np.cumsum(lengths + (lengths.mean() if len(lengths) else 0.0))
        if slices <= 1 or not len(costs):
            return [0, len(costs)]
        inner = np.searchsorted(costs, costs[-1] * np.arange(1, slices) / slices).tolist()
        return [0, *inner, len(costs)]

    def postings(self, terms: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
        """term -> (positions int32, counts uint16, where they start in the maps) for those of TERMS this segment
        holds (views of the maps). Where a term's postings lie is looked up in SQLite once, then remembered
        (`TERM_PLACES` terms at most): queries share most of their words, and the segment never changes."""
        if not terms:
            return {}
        places = self._places
        known = {term: places.get(term, _UNKNOWN) for term in terms}  # one lookup each: another thread may clear
        missing = [term for term, place in known.items() if place is _UNKNOWN]
        if missing:
            found: dict[str, tuple[int, int] | None] = dict.fromkeys(missing)
            cursor = self.db.execute("SELECT term, start, count FROM terms WHERE term IN "
                                     "(SELECT value FROM json_each(?))", (json.dumps(missing),))
            for term, start, count in cursor:
                # Cheap checks of what a damaged file would make (a full re-hash is `verify`'s): postings inside
                # the arrays, first and last positions inside the segment.
                if start < 0 or count < 1 or start + count > len(self.positions) or not (
                        0 <= self.positions[start] <= self.positions[start + count - 1] < self.documents):
                    raise DamagedIndexError(f"{self.path}: the postings of {term!r} are out of range")
                found[term] = (start, count)
            if len(places) + len(found) > TERM_PLACES:
                places.clear()
            places.update(found)
            known.update(found)
        return {term: (self.positions[place[0] : place[0] + place[1]], self.counts[place[0] : place[0] + place[1]],
                       place[0])
                for term, place in known.items() if place is not None}

    def close(self) -> None:
        self.db.close()
        self.positions = self.counts = None


@dataclass
class TermPostings:
    """One query term: its BM25 weight (query count x idf) and its postings in each segment (None: not there)."""

    term: str
    weight: np.float32
    postings: list[tuple[np.ndarray, np.ndarray] | None]  # per segment: positions (int32), counts (uint16)
    starts: list[int | None]  # per segment: where those start in the segment's maps


class QueryMatches:
    """One query's BM25 over a version's segments: its terms' postings, scored when asked, so that finding the
    best documents touches the long postings of common terms only where it must.

    A document's score adds its terms' contributions in one fixed order whichever way it is computed, so any split
    of the documents into segments gives the same numbers."""

    def __init__(self, scorer: KeywordScorer, terms: list[TermPostings], spread: bool = True):
        self.scorer, self.terms = scorer, terms
        self.spread = spread  # a large segment's best searched in slices on every core (`candidates`)
        self._arrays: list[tuple[np.ndarray, ...] | None] = [None] * len(scorer.segments)

    def scores(self, segment: int, positions: np.ndarray) -> np.ndarray:
        """The exact scores of the documents at POSITIONS of segment number SEGMENT (0 where no term occurs): each
        term's contribution looked up in its postings and added in the terms' order (float64, then float32), the
        same numbers whichever way the documents were found."""
        # Ascending, each term's postings are searched from the last find on.
        ascending = np.asarray(positions, dtype=np.int32)
        order = None if bool(np.all(ascending[1:] >= ascending[:-1])) else np.argsort(ascending)
        if order is not None:
            ascending = ascending[order]
        total = _kernels().scores_at(*self._postings_of(segment), self.scorer.k1_plus_1, self.scorer.norms[segment],
                                     ascending).astype(np.float32)
        if order is None:
            return total
        scores = np.empty(len(ascending), np.float32)
        scores[order] = total
        return scores

    def best_in_runs(self, segment: int, lows: np.ndarray, highs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each run of positions LOWS[r]..HIGHS[r] of segment number SEGMENT, its best exact score (as `scores`
        gives it) and the first position reaching it (0 and -1 where no term occurs in the run). The runs must be
        disjoint and in ascending order: each term's postings are read once, forward."""
        return _kernels().best_in_runs(*self._postings_of(segment), self.scorer.k1_plus_1,
                                       self.scorer.norms[segment], np.asarray(lows, np.int64),
                                       np.asarray(highs, np.int64))

    def _postings_of(self, segment: int) -> tuple[np.ndarray, ...]:
        """The terms held in segment number SEGMENT, in the query's order, as the kernels take them: the segment's
        postings and counts, each term's (start, end) in them, and its weight."""
        if self._arrays[segment] is None:
            here = [term for term in self.terms if term.postings[segment] is not None]
            starts = np.array([term.starts[segment] for term in here], np.int64)
            ends = starts + np.array([len(term.postings[segment][0]) for term in here], np.int64)
            keywords = self.scorer.segments[segment]
            self._arrays[segment] = (keywords.positions, keywords.counts, starts, ends,
                                     np.array([term.weight for term in here], np.float32))
        return self._arrays[segment]

    def _contribution(self, term: TermPostings, segment: int, positions: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """What TERM adds to the documents at POSITIONS where it occurs COUNTS times (as the kernels compute it)."""
        tf = np.asarray(counts, dtype=np.float32)
        return term.weight * tf * self.scorer.k1_plus_1 / (tf + self.scorer.norms[segment][positions])

    def candidates(self, count: int, floor: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(segment numbers, positions, exact scores) of matching live documents, sure to hold the COUNT best
        (ties: the lower position first) of those scoring at least FLOOR, found by MaxScore in each segment
        (`keyword_kernels.max_score`; a large segment in slices on every core where this query spreads). A
        segment's COUNT-th best score is a floor for the next segments': a document below it cannot be among the
        COUNT best of the version."""
        if not self.terms:
            return np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32)
        floor = float(floor)
        segments, positions, scores = [], [], []
        for number, (keywords, norm, dead) in enumerate(zip(self.scorer.segments, self.scorer.norms,
                                                            self.scorer.dead)):
            _, _, starts, ends, weights = self._postings_of(number)  # the terms here, in the query's order
            if not len(starts):
                continue
            # A term adds less than weight x (k1 + 1) to any document; a little more, for float32 rounding.
            ceilings = weights.astype(np.float64) * float(self.scorer.k1_plus_1) * (1 + 1e-5)
            order = np.argsort(ceilings, kind="stable")
            arguments = (keywords.positions, keywords.counts, starts[order], ends[order], weights[order],
                         ceilings[order], order, self.scorer.k1_plus_1, norm, dead, count, floor)
            slices = slices_for(len(norm)) if self.spread else 1
            found, exact = max_score_in_slices(arguments, keywords.cuts(slices))
            segments.append(np.full(len(found), number, np.int32))
            positions.append(found)
            scores.append(exact)
            if len(found) == count:
                floor = max(floor, float(exact.min()))
        if not positions:
            return np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32)
        return np.concatenate(segments), np.concatenate(positions), np.concatenate(scores)

    def every_match(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(segment numbers, positions, exact scores) of every matching live document: each term's contributions
        added in one pass over its postings (`np.bincount`, in the terms' order)."""
        segments, positions, scores = [], [], []
        for number, (norm, dead) in enumerate(zip(self.scorer.norms, self.scorer.dead)):
            parts = [(term.postings[number][0], self._contribution(term, number, *term.postings[number]))
                     for term in self.terms if term.postings[number] is not None]
            if not parts:
                continue
            sums = np.bincount(np.concatenate([held for held, _ in parts]),
                               weights=np.concatenate([part for _, part in parts]).astype(np.float64),
                               minlength=len(norm))
            if len(dead):
                sums[dead] = 0.0
            held = np.flatnonzero(sums).astype(np.int32)
            segments.append(np.full(len(held), number, np.int32))
            positions.append(held)
            scores.append(sums[held].astype(np.float32))
        if not positions:
            return np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32)
        return np.concatenate(segments), np.concatenate(positions), np.concatenate(scores)

    def null(self) -> tuple[float, float]:
        """The mean and standard deviation of this query's score over every live document (0 where no term
        occurs): every matching document is scored."""
        documents = self.scorer.documents
        if not documents:
            return 0.0, 1.0
        scores = self.every_match()[2]
        mean = float(scores.sum(dtype=np.float64)) / documents
        squares = float(np.square(scores, dtype=np.float64).sum()) / documents
        return mean, float(np.sqrt(max(squares - mean * mean, 0.0)))


class KeywordScorer:
    """BM25 over a version's segments with the statistics of all its live documents. LIVE: each segment's mask of
    live positions (tombstoned rows are False); SEGMENTS: their KeywordSegments, in the same order. STATISTICS: the
    scorer whose documents' statistics these units are scored with (their number, average length and each term's
    weight): passages are scored as documents of their own length would be (`weighted`)."""

    def __init__(self, segments: Sequence[KeywordSegment], live: Sequence[np.ndarray], k1: float = K1, b: float = B,
                 statistics: KeywordScorer | None = None):
        self.segments, self.k1, self.b = list(segments), k1, b
        self.k1_plus_1 = np.float32(k1 + 1)
        # Where segments were written with different tokenizers (an index written before marks were kept, added to
        # since), a query's terms are each one's.
        self.tokenizers = [Tokenizer.get(spec) for spec in sorted({segment.tokenizer for segment in self.segments})
                           or [None]]
        self.stop_terms = {term for tokenizer in self.tokenizers for term in tokenizer(" ".join(STOP_WORDS))}
        self.documents = int(sum(int(mask.sum()) for mask in live))
        tokens = sum(int(segment.lengths[mask].sum(dtype=np.int64)) for segment, mask in zip(self.segments, live))
        self.average_length = tokens / self.documents if self.documents else 0.0
        if statistics is not None:
            self.documents, self.average_length = statistics.documents, statistics.average_length
        self.dead = [np.flatnonzero(~np.asarray(mask)).astype(np.int32) for mask in live]  # tombstoned positions
        # BM25's length normalisation per position: k1 * (1 - b + b * length / average length)
        self.norms = [(k1 * (1 - b + b * segment.lengths.astype(np.float32) / max(self.average_length, 1e-9)))
                      .astype(np.float32) for segment in self.segments]

    def match(self, query: str, stop_words: bool = True, spread: bool = True) -> QueryMatches:
        """The query's terms, weighted by the version's live documents, with their postings. STOP_WORDS: leave out
        the query's stop words (as the tokenizer stems them) when it has other terms. SPREAD: search a large
        segment on every core (`QueryMatches.candidates`)."""
        terms = self.terms(query)
        if stop_words:
            kept = {term: count for term, count in terms.items() if term not in self.stop_terms}
            terms = kept or terms
        postings = [segment.postings(list(terms)) for segment in self.segments]
        n = self.documents
        found = []
        for term, count in terms.items():
            frequency = sum(len(held[term][0]) - _count_in(dead, held[term][0])
                            for dead, held in zip(self.dead, postings) if term in held)
            if frequency:
                weight = np.float32(count * np.log1p((n - frequency + 0.5) / (frequency + 0.5)))
                found.append(TermPostings(term, weight, [held[term][:2] if term in held else None for held in postings],
                                          [held[term][2] if term in held else None for held in postings]))
        return QueryMatches(self, found, spread)

    def terms(self, text: str) -> dict[str, int]:
        """TEXT's terms and their counts, as the segments' tokenizers read it (where they differ, each one's
        terms: a term counts as often as the tokenizer finding it most often finds it)."""
        if len(self.tokenizers) == 1:
            return self.tokenizers[0](text)
        found: dict[str, int] = {}
        for tokenizer in self.tokenizers:
            for term, count in tokenizer(text).items():
                found[term] = max(count, found.get(term, 0))
        return found

    def weighted(self, query: QueryMatches) -> QueryMatches:
        """QUERY's terms, with the weights QUERY gives them (its scorer's statistics), over these segments, searched
        as QUERY is (its spread)."""
        terms = [term.term for term in query.terms]
        postings = [segment.postings(terms) for segment in self.segments]
        found = [TermPostings(term.term, term.weight, [held[term.term][:2] if term.term in held else None
                                                       for held in postings],
                              [held[term.term][2] if term.term in held else None for held in postings])
                 for term in query.terms if any(term.term in held for held in postings)]
        return QueryMatches(self, found, query.spread)


def _next_chunk(cursor: sqlite3.Cursor) -> list[tuple[str, int, str]]:
    """The next (term, occurrences, documents) rows of `_OCCURRENCES`, about _OCCURRENCES_PER_CHUNK occurrences."""
    chunk, occurrences = [], 0
    while occurrences < _OCCURRENCES_PER_CHUNK and (row := cursor.fetchone()) is not None:
        if is_word(row[0]):
            chunk.append(row)
        occurrences += row[1]
    return chunk


def _postings_of(chunk: list[tuple[str, int, str]]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Terms' occurrence rows -> (terms, positions int32, counts int64, postings per term): for each term, the
    documents holding it, ascending, and how often."""
    terms = [term for term, _, _ in chunk]
    occurrences = np.array([number for _, number, _ in chunk], np.int64)
    documents = np.array(",".join(text for _, _, text in chunk).split(","), dtype=np.int64)
    if len(documents) != occurrences.sum():
        raise RetrieverError("FTS5 listed a term's documents inconsistently")  # never seen; checked, not assumed
    term_of = np.repeat(np.arange(len(chunk)), occurrences)
    key = term_of * (int(documents.max(initial=0)) + 1) + documents
    if np.any(np.diff(key) < 0):  # group_concat's order within a term is SQLite's choice: sorted if not ascending
        order = np.argsort(key, kind="stable")
        key, term_of, documents = key[order], term_of[order], documents[order]
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    counts = np.diff(np.append(starts, len(key)))
    held = np.bincount(term_of[starts], minlength=len(chunk))
    return terms, documents[starts].astype(np.int32), counts, held


def slices_for(units: int) -> int:
    """How many slices a segment of UNITS units is searched in: one per SLICE_UNITS units, up to one per core."""
    return max(1, min(available_cpus(), units // SLICE_UNITS))


def max_score_in_slices(arguments: tuple, cuts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """`keyword_kernels.max_score` (ARGUMENTS, then a slice's first and last) over the slices between CUTS, side by
    side (the kernel releases the GIL; this thread searches the first), their bests merged with ties to the lower
    position, as the kernel breaks them. Each slice's threshold rises on its own: a shared one cost more than it
    saved."""
    kernels = _kernels()
    if len(cuts) == 2:
        return kernels.max_score(*arguments, cuts[0], cuts[1])
    # Threads for the slices: one per core but this thread's own.
    pool = shared_thread_pool("keyword-slice", max(1, available_cpus() - 1))
    others = [pool.submit(kernels.max_score, *arguments, first, last) for first, last in zip(cuts[1:-1], cuts[2:])]
    parts = [kernels.max_score(*arguments, cuts[0], cuts[1]), *(other.result() for other in others)]
    positions = np.concatenate([found for found, _ in parts])
    scores = np.concatenate([exact for _, exact in parts])
    best = np.lexsort((positions, -scores))[: arguments[10]]  # the kernel's COUNT
    return positions[best], scores[best]


def _kernels():
    """The compiled loops, imported at the first keyword search: Numba takes ~0.3 s to import, which commands that
    never score keywords (`list`, `info`, a dense search) should not wait for."""
    from retriever.store import keyword_kernels

    return keyword_kernels


def _count_in(sorted_items: np.ndarray, positions: np.ndarray) -> int:
    """How many of SORTED_ITEMS are in POSITIONS (ascending)."""
    if not len(sorted_items) or not len(positions):
        return 0
    at = np.minimum(np.searchsorted(positions, sorted_items), len(positions) - 1)
    return int(np.count_nonzero(positions[at] == sorted_items))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
