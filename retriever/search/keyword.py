"""The keyword side: BM25 top lists over every segment of one version (`retriever.store.keywords` scores), and
what hybrid search needs of this side (a candidate's score, a query's score distribution).

A document is scored whole, by BM25 over the version's documents: its length normalisation is the right evidence
for documents of a few hundred words. A document cut into passages has a second piece of evidence, its best
passage, scored as a document of the passage's length would be (the documents' statistics); the two weigh as on
the dense side (`store.passages.document_scores`): the document by the share of its text the encoder reads of it,
its best (the better of itself and its best passage) by the rest. A document a little longer than the encoder
reads is scored about as before; a page far longer than the rest, which its length normalisation buries below
short paragraphs sharing a word, competes at a passage's length through its best passage (Callan, SIGIR 1994:
passage evidence helps combined with the document's). A document that is one passage scores its BM25 exactly.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retriever.errors import DamagedIndexError
from retriever.numeric import find_in
from retriever.search.plan import Matches
from retriever.search.top_lists import FIRST_PASSAGES, WIDEN
from retriever.store.keywords import KeywordScorer, QueryMatches
from retriever.store.passages import document_scores
from retriever.store.segment import Segment
from retriever.versions.layout import SEGMENTS
from retriever.versions.snapshot import Snapshot


@dataclass
class KeywordQuery:
    """One query's BM25 matches over the version's documents, and over the passages of its segments where
    documents are cut (None where none is: each document is then scored whole only)."""

    documents: QueryMatches
    passages: QueryMatches | None


@dataclass
class KeywordList:
    """One query's keyword side: its BM25 matches (to score any document) and its top list of documents, best
    first, with their scores and KEYS, each one's best passage's vector key (-1 where it is one passage)."""

    matches: KeywordQuery
    rowids: np.ndarray
    scores: np.ndarray
    keys: np.ndarray


@dataclass
class _Found:
    """Documents among one side's best units: row ids, each one's best unit score there and that unit's key, and
    FLOOR, a score no unit left out reaches (0 where every matching unit was read)."""

    rowids: np.ndarray
    scores: np.ndarray
    keys: np.ndarray
    floor: float


class KeywordSearcher:
    """The keyword side over SNAPSHOT's segments. Safe to share between threads: the scorers (the version's BM25
    statistics) are built once, under a lock, and never change."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._scorers: tuple[KeywordScorer, KeywordScorer | None] | None = None
        self._lock = threading.Lock()
        # The segments whose documents are cut, in the passages' scorer's order.
        self._split = [number for number, segment in enumerate(snapshot.segments) if segment.split]

    def scorers(self) -> tuple[KeywordScorer, KeywordScorer | None]:
        """BM25 over this version's live documents, and over the live passages of its segments where documents
        are cut, scored with the documents' statistics (None where no document is cut); built on first use, then
        kept: a version never changes."""
        scorers = self._scorers
        if scorers is None:
            with self._lock:
                if self._scorers is None:
                    snapshot, segments = self.snapshot, self.snapshot.segments
                    try:  # the segments' statistics, read at open: only their disagreeing is the files' fault
                        documents = KeywordScorer([segment.keywords for segment in segments],
                                                  [snapshot.live_documents(segment) for segment in segments])
                        passages = None
                        if self._split:
                            passages = KeywordScorer([segments[number].passage_keywords for number in self._split],
                                                     [self._live_units(segments[number]) for number in self._split],
                                                     statistics=documents)
                    except DamagedIndexError as error:
                        raise snapshot.damaged(SEGMENTS, error) from error
                    self._scorers = (documents, passages)
                scorers = self._scorers
        return scorers

    def _live_units(self, segment: Segment) -> np.ndarray:
        """SEGMENT's mask of passage keyword units whose documents are not deleted."""
        return ~np.isin(segment.documents_of(segment.passage_unit_keys), self.snapshot.tombstones)

    def lists(self, texts: Sequence[str], depth: int, stop_words: bool, matches: Matches | None = None,
              spread: bool = True) -> list[KeywordList]:
        """Each text's keyword top DEPTH (with MATCHES, among those row ids), with its matches kept for scoring
        other candidates. STOP_WORDS: leave out a query's stop words where it has other words. SPREAD: search a
        large segment on every core (`QueryMatches.candidates`)."""
        documents, passages = self.scorers()
        sides = []
        for text in texts:
            # The postings are read here (SQLite and their arrays): damaged ones are one line naming the index.
            with self.snapshot.reading(SEGMENTS, errors=(sqlite3.DatabaseError,)):
                whole = documents.match(text, stop_words, spread)
                query = KeywordQuery(whole, passages.weighted(whole) if passages is not None else None)
            sides.append(KeywordList(query, *self._top(query, depth, matches)))
        return sides

    def _top(self, query: KeywordQuery, count: int,
             matches: Matches | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The COUNT best documents over all segments: (row ids, scores, best passage keys), best first, ties to
        the lower row id (as `fusion.top_list` breaks them); with MATCHES, among those row ids only (every match
        scored, then filtered: the scores are the unfiltered index's). The documents' best are read, as many as
        wanted, and the passages' best units, twice as many, then WIDEN x more until the answer is sure: a
        document neither side read scores at most the higher of the two sides' floors (its score is never above
        its best unit's), so the answer stands once its last score reaches that (the threshold algorithm, Fagin et
        al., PODS 2001), or every matching unit was read. The documents either side read are scored exactly."""
        asked, every = count * FIRST_PASSAGES, matches is not None
        # The documents' side is read to COUNT: each of those documents scores at least its BM25, so its floor
        # never stands above the COUNT-th best score, and never makes the answer wait (one unit per document).
        whole = self._best(query.documents, count, every)
        while True:
            if query.passages is None:
                rowids, scores, keys, floor = whole.rowids, whole.scores, np.full(len(whole.rowids), -1), whole.floor
            else:
                # A document scores at least its own BM25 and at most the higher of that and its best passage's:
                # the COUNT-th best document score is reached by COUNT documents, so a passage below it cannot
                # lift its document among the best, and the passages' MaxScore starts from it.
                parts = self._best(query.passages, asked, every, self._split, floor=_kth(whole.scores, count))
                rowids = np.union1d(whole.rowids, parts.rowids)
                scores, keys = self._combined(query, rowids, whole, parts)
                floor = max(whole.floor, parts.floor)
            if matches is not None:
                kept = matches.contains(rowids)
                rowids, scores, keys = rowids[kept], scores[kept], keys[kept]
            order = np.lexsort((rowids, -scores))[:count]
            if every or floor == 0 or (len(order) == count and float(scores[order[-1]]) >= floor):
                return rowids[order], scores[order], keys[order]
            asked *= WIDEN

    def _best(self, query: QueryMatches, asked: int, every: bool, numbers: list[int] | None = None,
              floor: float = 0.0) -> _Found:
        """The documents of QUERY's best ASKED units (EVERY: of every matching unit) of those scoring at least
        FLOOR, each by its best unit there: the documents' units, or with NUMBERS (the version's segments QUERY's
        scorer reads, in its order), the passages'."""
        if every:
            segments, positions, scores = query.every_match()
            floor = 0.0
        else:
            segments, positions, scores = query.candidates(asked, floor)
        keys = np.full(len(positions), -1, np.int64)
        rowids = np.empty(len(positions), np.int64)
        for number in range(len(query.scorer.segments)):
            mine = segments == number
            if numbers is None:
                rowids[mine] = np.asarray(self.snapshot.segments[number].rowids)[positions[mine]]
            else:
                segment = self.snapshot.segments[numbers[number]]
                keys[mine] = segment.passage_unit_keys[positions[mine]]
                rowids[mine] = segment.documents_of(keys[mine])
        # Every match read, or only the best ASKED units of the version are sure to be among these (a segment
        # prunes below an earlier one's ASKED-th score): documents come from those alone, and no unit left out
        # scores above the last of them.
        # Below FLOOR no unit was read.
        complete = every or not any((segments == number).sum() == asked for number in range(len(query.scorer.segments)))
        if not complete and len(scores) >= asked:
            floor = max(floor, float(np.partition(scores, len(scores) - asked)[len(scores) - asked]))
            sure = scores >= floor
            rowids, scores, keys = rowids[sure], scores[sure], keys[sure]
        if numbers is None:  # a unit is a document: each is here once
            return _Found(rowids, scores, keys, floor)
        # A document's best unit is its first by score, ties to the lower key.
        order = np.lexsort((keys, -scores, rowids))
        grouped = rowids[order]
        best = order[np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])] if len(order) else order
        return _Found(rowids[best], scores[best], keys[best], floor)

    def _combined(self, query: KeywordQuery, rowids: np.ndarray, whole: _Found | None = None,
                  parts: _Found | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each of ROWIDS' score (`store.passages.document_scores`) and best passage's key (-1 where the document
        is one passage, or no passage of it holds a query term); WHOLE, PARTS: each side's best units already read
        and scored (a document among PARTS has its best passage there: MaxScore reads every unit that can reach its
        threshold, with a margin for float rounding, so none of its passages left out scores above the one read)."""
        if whole is None:
            document = self.document_scores(query.documents, rowids)
        else:
            document = _known(rowids, whole.rowids, whole.scores,
                              lambda missing: self.document_scores(query.documents, missing))
        if parts is None:
            passage, keys = self.best_passages(query.passages, rowids)
        else:
            passage, keys = np.zeros(len(rowids), np.float32), np.full(len(rowids), -1, np.int64)
            at, held = find_in(rowids, parts.rowids)
            passage[held], keys[held] = parts.scores[at[held]], parts.keys[at[held]]
            if not held.all():
                passage[~held], keys[~held] = self.best_passages(query.passages, rowids[~held])
        coverage = self.coverages(rowids)
        # Where it matched: its best passage (a query term in it), whichever scored higher.
        return document_scores(document, np.maximum(document, passage), coverage), keys

    def scores_of(self, query: KeywordQuery, rowids: np.ndarray) -> np.ndarray:
        """QUERY's score of each of ROWIDS (0 where no query term occurs in it)."""
        if query.passages is None:
            return self.document_scores(query.documents, rowids)
        return self._combined(query, rowids)[0]

    def document_scores(self, query: QueryMatches, rowids: np.ndarray) -> np.ndarray:
        """QUERY's BM25 of the documents ROWIDS, each whole."""
        scores = np.zeros(len(rowids), np.float32)
        for number, segment in enumerate(self.snapshot.segments):
            mine = segment.contains(rowids)
            if mine.any():
                scores[mine] = query.scores(number, segment.positions_of(rowids[mine]))
        return scores

    def coverages(self, rowids: np.ndarray) -> np.ndarray:
        """Each of ROWIDS' coverage (`passages.coverages`; 1 in a segment where no document is cut)."""
        coverage = np.ones(len(rowids), np.float32)
        for version_number in self._split:
            segment = self.snapshot.segments[version_number]
            mine = segment.contains(rowids)
            if mine.any():
                coverage[mine] = segment.document_coverage(rowids[mine])
        return coverage

    def best_passages(self, query: QueryMatches, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """QUERY's best passage of each of ROWIDS: (its BM25, its key); (0, -1) for a document in a segment where
        none is cut."""
        scores = np.zeros(len(rowids), np.float32)
        keys = np.full(len(rowids), -1, np.int64)
        for number, version_number in enumerate(self._split):
            segment = self.snapshot.segments[version_number]
            mine = segment.contains(rowids)
            if mine.any():
                scores[mine], keys[mine] = _best_of_documents(segment, query, number, rowids[mine])
        return scores, keys

    def null(self, query: KeywordQuery) -> tuple[float, float]:
        """The mean and standard deviation of QUERY's score over every live document (0 where no query term
        occurs): every matching unit is scored."""
        if query.passages is None:
            return query.documents.null()
        documents = query.documents.scorer.documents
        if not documents:
            return 0.0, 1.0
        rowids = np.union1d(self._best(query.documents, 0, True).rowids,
                            self._best(query.passages, 0, True, self._split).rowids)
        scores = self.scores_of(query, rowids).astype(np.float64)
        mean = float(scores.sum()) / documents
        squares = float(np.square(scores).sum()) / documents
        return mean, float(np.sqrt(max(squares - mean * mean, 0.0)))


def _kth(scores: np.ndarray, count: int) -> float:
    """The COUNT-th highest of SCORES (0 where there are fewer)."""
    if count <= 0 or len(scores) < count:
        return 0.0
    return float(np.partition(scores, len(scores) - count)[len(scores) - count])


def _best_of_documents(segment: Segment, query: QueryMatches, number: int,
                       rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best passage (score, key) of each of ROWIDS, all in SEGMENT (number NUMBER of QUERY's scorer); (0, -1)
    where no passage of it holds a query term."""
    documents = np.unique(rowids)
    # A document's passages are one run of units (keys ascend, grouped by document). A document that is one
    # passage has none.
    best, units = query.best_in_runs(number, *segment.unit_runs(documents))
    keys = np.full(len(units), -1, np.int64)
    found = units >= 0  # a segment compaction left split may hold no passage unit at all
    keys[found] = segment.passage_unit_keys[units[found]]
    at = np.searchsorted(documents, rowids)
    return best[at], keys[at]


def _known(rowids: np.ndarray, found: np.ndarray, scores: np.ndarray, score_missing) -> np.ndarray:
    """Each of ROWIDS' score: from SCORES where FOUND (row for row) holds it, else SCORE_MISSING(those row ids)."""
    result = np.zeros(len(rowids), np.float32)
    at, held = find_in(rowids, found)
    result[held] = scores[at[held]]
    if (~held).any():
        result[~held] = score_missing(rowids[~held])
    return result
