"""Hybrid search: each query's dense and keyword top lists fused into one ranking (`retriever.search.fusion`).

The candidates are the union of both lists, each scored on both sides (a dense score as the dense search gave
it, or from the stored vector; a keyword score from the query's postings), so a fusion never guesses a missing
score; the fused top k is taken with ties broken by row id.
"""

from __future__ import annotations

import numpy as np

from retriever.numeric import find_in
from retriever.search.dense import DenseSearcher
from retriever.search.fusion import Candidates, make_fusion, top_list
from retriever.search.keyword import KeywordList, KeywordSearcher
from retriever.search.options import SearchOptions
from retriever.search.results import Ranked


def fuse(queries: np.ndarray, dense_scores: np.ndarray, dense_ids: np.ndarray, dense_keys: np.ndarray,
         sides: list[KeywordList], options: SearchOptions, dense: DenseSearcher,
         keyword: KeywordSearcher) -> list[list[Ranked]]:
    """Each query's top options.k documents by OPTIONS' fusion of its dense top list (DENSE_SCORES, DENSE_IDS and
    their best passages' DENSE_KEYS for the calibrated QUERIES) and its keyword top list (SIDES), the dense side
    weighing options' weight; each hit's passage is its best for the query's vector."""
    fusion = make_fusion(options.fusion_name)
    null = dense.null(queries) if fusion.needs_null else [(0.0, 1.0)] * len(sides)
    found = []
    for number, side in enumerate(sides):
        candidates, keys = _candidates(queries[number], dense_scores[number], dense_ids[number], dense_keys[number],
                                       side, null[number], fusion.needs_null, dense, keyword)
        if not len(candidates.rowids):  # nothing on either side (a filter nothing matches): nothing to fuse
            found.append([])
            continue
        fused = fusion.scores(candidates, options.dense_weight)
        held = np.arange(len(fused))
        if options.min_score is not None:
            # The k best of the candidates whose dense score reaches the floor (`results.at_least`): held to it
            # after the top k were taken, a fused list kept fewer than k where more candidates reach it.
            held = np.flatnonzero(candidates.dense >= options.min_score)
        found.append([Ranked(int(candidates.rowids[i]), float(fused[i]), float(candidates.dense[i]),
                             float(candidates.keyword[i]), int(candidates.dense_rank[i]) or None,
                             int(candidates.keyword_rank[i]) or None, int(keys[i]))
                      for i in held[top_list(fused[held], candidates.rowids[held], options.k)].tolist()])
    return found


def _candidates(query: np.ndarray, dense_scores: np.ndarray, dense_ids: np.ndarray, dense_keys: np.ndarray,
                side: KeywordList, dense_null: tuple[float, float], with_null: bool, dense: DenseSearcher,
                keyword: KeywordSearcher) -> tuple[Candidates, np.ndarray]:
    """One query's candidates: the union of the dense top list (DENSE_IDS, DENSE_SCORES, DENSE_KEYS) and the
    keyword top list (SIDE), each scored on both sides (as each side scores a document); and each candidate's best
    passage key."""
    listed = dense_ids[dense_ids >= 0]
    union = np.union1d(listed, side.rowids)
    dense_rank, keyword_rank = ranks(union, listed), ranks(union, side.rowids)
    dense_part = np.zeros(len(union), np.float32)
    keys = np.full(len(union), -1, np.int64)
    dense_part[dense_rank > 0] = dense_scores[dense_rank[dense_rank > 0] - 1]
    keys[dense_rank > 0] = dense_keys[dense_rank[dense_rank > 0] - 1]
    dense_part[dense_rank == 0], keys[dense_rank == 0] = dense.scores_of(query, union[dense_rank == 0])
    # Where it matched: the keyword side's best passage wherever that side listed the document with a passage
    # holding query words (what a reader looks for in it), else the dense side's. By the better rank instead, a
    # 60,000-word page showed the query's own sentence in 50 of 80 hybrid hits against 70 of 80 keyword hits.
    listed = keyword_rank > 0
    keyword_keys = np.full(len(union), -1, np.int64)
    keyword_keys[listed] = side.keys[keyword_rank[listed] - 1]
    keys = np.where(keyword_keys >= 0, keyword_keys, keys)
    keyword_part = np.zeros(len(union), np.float32)
    keyword_part[keyword_rank > 0] = side.scores[keyword_rank[keyword_rank > 0] - 1]
    keyword_part[keyword_rank == 0] = keyword.scores_of(side.matches, union[keyword_rank == 0])
    keyword_null = keyword.null(side.matches) if with_null else (0.0, 1.0)
    return Candidates(union, dense_part, keyword_part, dense_rank, keyword_rank, dense_null, keyword_null), keys


def ranks(rowids: np.ndarray, listed: np.ndarray) -> np.ndarray:
    """The 1-based position of each of ROWIDS in LISTED (best first), 0 where it is not there."""
    at, found = find_in(rowids, listed)
    return np.where(found, at + 1, 0)
