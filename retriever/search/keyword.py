"""The keyword side: BM25 top lists over every segment of one version (`retriever.store.keywords` scores), and
what hybrid search needs of this side (a candidate's score, a query's score distribution)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retriever.errors import DamagedIndexError
from retriever.search.fusion import top_list
from retriever.search.plan import Matches
from retriever.store.keywords import KeywordScorer, QueryMatches
from retriever.versions.layout import SEGMENTS
from retriever.versions.snapshot import Snapshot


@dataclass
class KeywordList:
    """One query's keyword side: its BM25 matches (to score any document) and its top list, best first."""

    matches: QueryMatches
    rowids: np.ndarray
    scores: np.ndarray


class KeywordSearcher:
    """The keyword side over SNAPSHOT's segments. Safe to share between threads: the scorer (the version's BM25
    statistics) is built once, under a lock, and never changes."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self._scorer: KeywordScorer | None = None
        self._lock = threading.Lock()

    def scorer(self) -> KeywordScorer:
        """BM25 over this version's live documents (built on first use, then kept: a version never changes)."""
        scorer = self._scorer
        if scorer is None:
            with self._lock:
                if self._scorer is None:
                    snapshot = self.snapshot
                    try:  # the segments' statistics, read at open: only their disagreeing is the files' fault
                        self._scorer = KeywordScorer([segment.keywords for segment in snapshot.segments],
                                                     snapshot.live_masks())
                    except DamagedIndexError as error:
                        raise snapshot.damaged(SEGMENTS, error) from error
                scorer = self._scorer
        return scorer

    def lists(self, texts: Sequence[str], depth: int, stop_words: bool,
              matches: Matches | None = None) -> list[KeywordList]:
        """Each text's keyword top DEPTH (with MATCHES, among those row ids), with its matches kept for scoring
        other candidates. STOP_WORDS: leave out a query's stop words where it has other words."""
        scorer = self.scorer()
        sides = []
        for text in texts:
            # The postings are read here (SQLite and their arrays): damaged ones are one line naming the index.
            with self.snapshot.reading(SEGMENTS, errors=(sqlite3.DatabaseError,)):
                query = scorer.match(text, stop_words)
            sides.append(KeywordList(query, *self._top(query, depth, matches)))
        return sides

    def _top(self, query: QueryMatches, count: int, matches: Matches | None) -> tuple[np.ndarray, np.ndarray]:
        """The COUNT best keyword matches over all segments: (row ids, BM25 scores), best first; with MATCHES, among
        those row ids only (every match scored, then filtered: the scores are the unfiltered index's)."""
        segments, positions, scores = query.candidates(count) if matches is None else query.every_match()
        rowids = np.empty(len(positions), np.int64)
        for number, segment in enumerate(self.snapshot.segments):
            mine = segments == number
            rowids[mine] = np.asarray(segment.rowids)[positions[mine]]
        if matches is not None:
            kept = matches.contains(rowids)
            rowids, scores = rowids[kept], scores[kept]
        best = top_list(scores, rowids, count)
        return rowids[best], scores[best]

    def scores_of(self, query: QueryMatches, rowids: np.ndarray) -> np.ndarray:
        """QUERY's BM25 score of each of ROWIDS (0 where no query term occurs)."""
        scores = np.zeros(len(rowids), np.float32)
        for number, segment in enumerate(self.snapshot.segments):
            mine = segment.contains(rowids)
            if mine.any():
                scores[mine] = query.scores(number, np.searchsorted(segment.rowids, rowids[mine]))
        return scores
