"""The retrieval check: how well each calibrator lets pseudo-queries find their targets, measured without labels.

A `CheckSet` is pseudo-queries cut out of corpus documents (`retriever.calibration.pseudo_queries`), as raw vectors: each
query, its target (the source document without the query, encoded again, or for a known-item query the document
as stored), and distractors (other documents of the corpus, as stored). A calibrator is scored exactly as search
would use it: pool = targets + distractors, calibrated and L2-normalized as an index stores them; queries calibrated
the same way; each target ranked among the pool by inner product, as exact search ranks it (a tie counts against
the target); top 10.
Per pseudo-query, nDCG@10 (one relevant document: 1 / log2(rank + 1)) and reciprocal rank.

A score is the mean over all pseudo-queries; the corpus decides how many of each kind it gives, and
`make_pseudo_queries` balances them as far as it allows. A difference between two calibrators comes with a paired
bootstrap interval over pseudo-queries, resampled within each kind so every resample keeps the kinds' shares
(Efron & Tibshirani 1993; for IR evaluation: Sakai, SIGIR 2006; Smucker et al., CIKM 2007).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from retriever.numeric import l2_normalize

DEPTH = 10
# A pool vector scoring within TIE of a query's target counts ahead of it. The scores are float32 inner products of
# unit vectors, good to a few 1e-7 over a few hundred dimensions, and computed in more than one matrix product: a
# closer score is a tie, and a tie is no evidence that a calibration finds the target (nor may one that maps
# documents together gain by it).
TIE = 1e-6
# Queries scored against a pool at a time, POOL_ROWS of its rows at a time (the scores held: BLOCK x POOL_ROWS,
# 8 MB, within reach of the cache where a whole pool's would not be).
BLOCK = 256
POOL_ROWS = 8192
# Bootstrap resamples: the intervals' ends are tail quantiles (0.5% and 99.5% with five candidates), which need
# thousands of resamples to be stable.
RESAMPLES = 2000
# Family-wise confidence of the intervals of all candidates together (each gets 1 - (1 - CONFIDENCE) / m).
CONFIDENCE = 0.95
# A check read in rounds (`pseudo_queries.CheckRounds`) may stop before its last round on a difference shown only at
# this confidence: of 2,000 pseudo-queries, three interim looks (250, 500, 1,000) at 1% each add at most 3% to the
# last round's 5% chance of showing a difference that is not there (Bonferroni).
INTERIM_CONFIDENCE = 0.99


@dataclass
class CheckSet:
    """Pseudo-queries as raw vectors; row i of `targets` is the one relevant document of query i."""

    queries: np.ndarray  # (p, d)
    targets: np.ndarray  # (p, d)
    kinds: np.ndarray  # (p,) str: each query's kind
    distractors: np.ndarray  # (m, d): other corpus documents
    # The texts, for the hybrid check's keyword side (`retriever.search.fusion_check`); None where only vectors
    # were given. pool_texts: the targets' texts then the distractors', as the vectors are ordered.
    query_texts: list[str] | None = None
    pool_texts: list[str] | None = None
    # Each query's target's rank among the pool by a calibrator's transform (1: first; exact to DEPTH, past it some
    # number above DEPTH), where something keeps what ranking them needs (a check read in rounds scores each
    # pseudo-query against the distractors that every round shares once per transform, not once a round:
    # `pseudo_queries.CheckRounds`); None: ranked here (`target_ranks`). It answers for these queries and this
    # pool: a copy holding other rows must drop it.
    kept_ranks: Callable[[Callable[[np.ndarray], np.ndarray]], np.ndarray] | None = None

    def __post_init__(self) -> None:
        self.kinds = np.asarray(self.kinds, dtype=str)
        if not (len(self.queries) == len(self.targets) == len(self.kinds)):
            raise ValueError("a check set needs one target and one kind per query")
        if (self.query_texts is None) != (self.pool_texts is None) or (self.query_texts is not None and (
                len(self.query_texts) != len(self.queries) or len(self.pool_texts) != self.pool_size)):
            raise ValueError("a check set's texts need one per query and one per pool document")

    def __len__(self) -> int:
        return len(self.queries)

    def pool(self, transform: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Targets then distractors, passed through TRANSFORM and L2-normalized (row by row, as an index stores
        them)."""
        return np.concatenate([l2_normalize(transform(self.targets)), l2_normalize(transform(self.distractors))])

    def counts(self) -> dict[str, int]:
        names, counts = np.unique(self.kinds, return_counts=True)
        return {str(name): int(count) for name, count in zip(names, counts)}

    @property
    def pool_size(self) -> int:
        return len(self.targets) + len(self.distractors)


@dataclass
class QueryScores:
    """One calibrator's per-pseudo-query scores."""

    ndcg: np.ndarray  # (p,) nDCG@10
    reciprocal_rank: np.ndarray  # (p,) RR@10


def score_queries(check: CheckSet, transform: Callable[[np.ndarray], np.ndarray]) -> QueryScores:
    """Rank every pseudo-query's target among the pool by inner product, all vectors passed through TRANSFORM (a
    calibrator's) and L2-normalized as the index stores them, and score the top DEPTH."""
    return scores_at(check.kept_ranks(transform) if check.kept_ranks is not None
                     else target_ranks(check, transform, DEPTH))


def scores_at(rank: np.ndarray) -> QueryScores:
    """Each pseudo-query's scores from its target's RANK (1: first): nDCG@DEPTH and reciprocal rank, 0 below DEPTH."""
    rank = np.where(rank <= DEPTH, rank, 0)  # 0: not in the top DEPTH
    hit = rank > 0
    ndcg = np.where(hit, 1.0 / np.log2(np.maximum(rank, 1) + 1.0), 0.0)
    reciprocal = np.where(hit, 1.0 / np.maximum(rank, 1), 0.0)
    return QueryScores(ndcg, reciprocal)


def target_ranks(check: CheckSet, transform: Callable[[np.ndarray], np.ndarray],
                 depth: int | None = None) -> np.ndarray:
    """Each query's target's rank among CHECK's whole pool by TRANSFORM (1: first), as an exact inner-product search
    ranks it, a tie against the target (`count_ahead`); with DEPTH, exact to it only (a rank past DEPTH is some
    number above it)."""
    queries, pool = l2_normalize(transform(check.queries)), check.pool(transform)
    # the targets lead the pool: row i is query i's own
    return 1 + count_ahead(queries, paired_scores(queries, pool[: len(queries)]), pool, leave_out_own=True,
                           cap=depth)


def paired_scores(queries: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Each query's score for its own target (row i with row i), from matrix products as every other score is."""
    return np.concatenate([np.diagonal(queries[start : start + BLOCK] @ targets[start : start + BLOCK].T)
                           for start in range(0, len(queries), BLOCK)] or [np.empty(0, np.float32)])


def count_ahead(queries: np.ndarray, target_scores: np.ndarray, rows: np.ndarray,
                leave_out_own: bool = False, cap: int | None = None) -> np.ndarray:
    """Per query (L2-normalized, as ROWS are), how many ROWS rank ahead of its target, whose score is
    TARGET_SCORES: those scoring above it or tied with it (within `TIE`). LEAVE_OUT_OWN: row i is query i's
    target itself, not counted. CAP: counting stops for a query once more than CAP rows are ahead of it (its count
    is then some number above CAP; to CAP it is exact): the check reads ranks to DEPTH only, and most of a pool's
    rows come after a target not found has fallen below it."""
    ahead = np.zeros(len(queries), np.int64)
    for start in range(0, len(queries), BLOCK):
        asked = np.arange(start, min(start + BLOCK, len(queries)))
        for low in range(0, len(rows), POOL_ROWS):
            if not len(asked):
                break
            scores = queries[asked] @ rows[low : low + POOL_ROWS].T
            beats = scores >= target_scores[asked, None] - TIE
            if leave_out_own:
                own = (asked >= low) & (asked < low + scores.shape[1])
                beats[np.flatnonzero(own), asked[own] - low] = False
            ahead[asked] += beats.sum(1)
            if cap is not None:
                asked = asked[ahead[asked] <= cap]
    return ahead


def paired_bootstrap(differences: np.ndarray, kinds: np.ndarray, confidence: float, resamples: int = RESAMPLES,
                     seed: int = 0) -> tuple[float, float]:
    """A percentile interval for the mean of per-query DIFFERENCES (candidate minus baseline), resampling the
    pseudo-queries with replacement within each kind."""
    rng = np.random.default_rng(seed)
    totals = np.zeros(resamples)
    for kind in np.unique(kinds):
        group = differences[kinds == kind]
        totals += group[rng.integers(0, len(group), size=(resamples, len(group)))].sum(1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(totals / len(differences), [tail, 1.0 - tail])
    return float(low), float(high)


@dataclass
class CandidateResult:
    """A calibrator's check score and its difference from the baseline (`none`), in points (x100)."""

    name: str
    ndcg: float
    mrr: float
    by_kind: dict[str, float]  # nDCG@10 per kind
    difference: float | None = None  # nDCG@10 minus the baseline's; None for the baseline itself
    low: float | None = None
    high: float | None = None

    def record(self) -> dict:
        record = {"name": self.name, "ndcg@10": _points(self.ndcg), "mrr@10": _points(self.mrr),
                  "ndcg@10_by_kind": {kind: _points(value) for kind, value in self.by_kind.items()}}
        if self.difference is not None:
            record.update(difference=_points(self.difference), interval=[_points(self.low), _points(self.high)])
        return record


def compare(check: CheckSet, baseline: QueryScores, candidates: Sequence[tuple[str, QueryScores]],
            confidence: float = CONFIDENCE, seed: int = 0) -> list[CandidateResult]:
    """Each candidate against BASELINE: its score and a paired bootstrap interval of the difference, at CONFIDENCE
    for all candidates together (Bonferroni: each interval at 1 - (1 - CONFIDENCE) / number of candidates)."""
    each = 1.0 - (1.0 - confidence) / max(1, len(candidates))
    results = []
    for name, scores in candidates:
        difference = scores.ndcg - baseline.ndcg
        low, high = paired_bootstrap(difference, check.kinds, each, seed=seed)
        results.append(_result(name, scores, check.kinds, float(difference.mean()), low, high))
    return results


def verdict(shown_low: float, low: float, high: float, size: int, planned: int) -> bool | None:
    """Is a mean difference above 0, asked of a round of SIZE of a check's PLANNED pseudo-queries? True: shown,
    the lower end of its interval at `INTERIM_CONFIDENCE` (SHOWN_LOW) is above 0; False: not even the upper end of
    its interval at the check's confidence (LOW to HIGH), were it the true difference, would be shown by all
    PLANNED (whose interval would reach below it by this one's half-width, narrowed as one over the square root of
    the pseudo-queries read); None: only more pseudo-queries can tell. A borderline difference is read to the end:
    a round stops only where the answer is clear either way."""
    if shown_low > 0:
        return True
    reach = (high - low) / 2 * math.sqrt(size / max(planned, size))
    return False if high - reach <= 0 else None


def baseline_result(name: str, check: CheckSet, scores: QueryScores) -> CandidateResult:
    return _result(name, scores, check.kinds)


def _result(name: str, scores: QueryScores, kinds: np.ndarray, difference: float | None = None,
            low: float | None = None, high: float | None = None) -> CandidateResult:
    by_kind = {str(kind): float(scores.ndcg[kinds == kind].mean()) for kind in np.unique(kinds)}
    return CandidateResult(name, float(scores.ndcg.mean()), float(scores.reciprocal_rank.mean()), by_kind,
                           difference, low, high)


def _points(value: float | None) -> float | None:
    return None if value is None else round(100.0 * value, 2)
