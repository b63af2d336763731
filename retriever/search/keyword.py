"""The keyword side: BM25 top lists over every segment of one version (`retriever.store.keywords` scores), and
what hybrid search needs of this side (a candidate's score, a query's score distribution)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retriever.errors import DamagedIndexError
from retriever.search.plan import Matches
from retriever.search.top_lists import FIRST_PASSAGES, WIDEN
from retriever.store.keywords import KeywordScorer, QueryMatches
from retriever.versions.layout import SEGMENTS
from retriever.versions.snapshot import Snapshot


@dataclass
class KeywordList:
    """One query's keyword side: its BM25 matches (to score any document) and its top list of documents, best
    first, each scored by its best passage (KEYS: that passage's vector key)."""

    matches: QueryMatches
    rowids: np.ndarray
    scores: np.ndarray
    keys: np.ndarray


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
                                                     [snapshot.live_vectors(segment) for segment in snapshot.segments])
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

    def _top(self, query: QueryMatches, count: int,
             matches: Matches | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The COUNT best documents over all segments, each by its best passage: (row ids, BM25 scores, passage
        keys), best first; with MATCHES, among those row ids only (every match scored, then filtered: the scores
        are the unfiltered index's). Passages are read twice as many as documents wanted, then WIDEN x more while
        they name fewer documents and more match (long documents whose passages crowd the top)."""
        asked, every = count * FIRST_PASSAGES, matches is not None
        while True:
            segments, positions, scores = query.every_match() if every else query.candidates(asked)
            keys = np.empty(len(positions), np.int64)
            rowids = np.empty(len(positions), np.int64)
            for number, segment in enumerate(self.snapshot.segments):
                mine = segments == number
                keys[mine] = np.asarray(segment.keys)[positions[mine]]
                rowids[mine] = segment.documents_of(keys[mine])
            if matches is not None:
                kept = matches.contains(rowids)
                rowids, scores, keys = rowids[kept], scores[kept], keys[kept]
            # Every match read, or only the best ASKED passages of the version are sure to be among these (a
            # segment prunes below an earlier one's ASKED-th score): documents come from those alone.
            complete = every or not any((segments == number).sum() == asked
                                        for number in range(len(self.snapshot.segments)))
            if not complete and len(scores) > asked:
                sure = scores >= np.partition(scores, len(scores) - asked)[len(scores) - asked]
                rowids, scores, keys = rowids[sure], scores[sure], keys[sure]
            # Best first, ties to the lower row id (as `fusion.top_list` breaks them); a document's first is its best.
            order = np.lexsort((keys, rowids, -scores))
            _, first = np.unique(rowids[order], return_index=True)
            best = order[np.sort(first)[:count]]
            if complete or len(best) == count:
                return rowids[best], scores[best], keys[best]
            asked *= WIDEN

    def scores_of(self, query: QueryMatches, rowids: np.ndarray) -> np.ndarray:
        """QUERY's BM25 score of each of ROWIDS, by its best passage (0 where no query term occurs)."""
        scores = np.zeros(len(rowids), np.float32)
        for number, segment in enumerate(self.snapshot.segments):
            mine = segment.contains(rowids)
            if not mine.any():
                continue
            keys = segment.keys_of(np.sort(rowids[mine]))
            passage_scores = query.scores(number, np.searchsorted(segment.keys, keys))
            # Keys are grouped by document, in row id order: each document's best is one reduction over its run.
            owners = segment.documents_of(keys)
            starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
            best = np.maximum.reduceat(passage_scores, starts) if len(keys) else passage_scores
            scores[mine] = best[np.searchsorted(owners[starts], rowids[mine])]
        return scores
