"""Fusing a dense and a keyword ranking into one: hybrid search.

Each side gives its top candidates (`options.HYBRID_CANDIDATES`, or k when larger: `retriever.search.hybrid`);
for every candidate in the union both scores are known exactly (a dense score is the cosine of its stored vector;
a keyword score, BM25, is 0 where no query term occurs), so a fusion never has to guess a missing score. A `Fusion` maps one query's `Candidates` and the
dense side's WEIGHT (the keyword side gets 1 - WEIGHT) to one fused score per candidate:

- `rrf`: reciprocal rank fusion (Cormack et al. 2009), WEIGHT / (60 + dense rank) + (1 - WEIGHT) / (60 + keyword
  rank), a side contributing nothing where the candidate is not in its top list; scores never meet.
- `zscore`: each side's scores standardised by the mean and spread of that side's own top list for this query,
  then weighted: a score reads as "how far above this query's typical candidate".
- `zscore-union`: each side's scores standardised by their mean and spread over every candidate, the union of
  both lists: both sides read against the same documents, so a z-score means the same on each side (the default:
  `benchmarks/results/fusion_adaptive.md`).
- `null`: each score read against its distribution over the whole index for this query (mean and spread of the
  query's score over every live document, `Candidates.dense_null` and `keyword_null`): "how far above a random
  document". For calibrated vectors (isotropic, unit length) the dense null is the known N(0, 1/d); for raw
  vectors it is estimated from the version's own documents.

Which is the default, and its weight, is a measured choice (`benchmarks/hybrid.py`, `benchmarks/fusion_adaptive.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retriever.defaults import DEFAULT_FUSION, DEFAULT_WEIGHT
from retriever.errors import RetrieverError, param

RRF_K = 60


@dataclass
class Candidates:
    """One query's candidates, the union of both sides' top lists, in any order."""

    rowids: np.ndarray  # int64
    dense: np.ndarray  # float32: cosine in the index's space
    keyword: np.ndarray  # float32: BM25 over title and text (0: no query term)
    dense_rank: np.ndarray  # int: 1-based rank in the dense top list, 0 where not in it
    keyword_rank: np.ndarray  # the same for the keyword top list
    dense_null: tuple[float, float] = (0.0, 1.0)  # mean and standard deviation over every live document
    keyword_null: tuple[float, float] = (0.0, 1.0)


class Fusion(ABC):
    name: str
    # What the fused score is, for a person reading it (`score_meaning`): "{dense}" and "{keyword}" are the weights.
    meaning: str
    needs_null = False  # reads Candidates.dense_null (an estimate the dense side makes only when asked)
    registry: dict[str, type[Fusion]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        Fusion.registry[cls.name] = cls

    @abstractmethod
    def scores(self, candidates: Candidates, weight: float) -> np.ndarray:
        """The fused score of each candidate (higher is better)."""

    def scores_by_weight(self, candidates: Candidates, weights: Sequence[float]) -> list[np.ndarray]:
        """`scores` at each of WEIGHTS, the same figures: a fusion that reads each side once overrides it."""
        return [self.scores(candidates, weight) for weight in weights]


class ReciprocalRank(Fusion):
    name = "rrf"
    meaning = ("reciprocal-rank fusion, {dense} / (60 + dense rank) + {keyword} / (60 + keyword rank): it orders "
               "this answer; each side's own score compares across queries")

    def scores(self, candidates: Candidates, weight: float) -> np.ndarray:
        def part(ranks: np.ndarray) -> np.ndarray:
            return np.where(ranks > 0, 1.0 / (RRF_K + np.maximum(ranks, 1)), 0.0)
        return weight * part(candidates.dense_rank) + (1 - weight) * part(candidates.keyword_rank)


class ListZScore(Fusion):
    name = "zscore"
    meaning = ("fused, {dense} x dense + {keyword} x keyword, each side's score in standard deviations above its "
               "own top list's mean for this query: it orders this answer; each side's own score compares across "
               "queries")

    def scores(self, candidates: Candidates, weight: float) -> np.ndarray:
        def standard(scores: np.ndarray, ranks: np.ndarray) -> np.ndarray:
            listed = scores[ranks > 0]
            if len(listed) == 0:
                return np.zeros(len(scores))
            spread = float(listed.std())
            if spread <= 1e-6:  # one listed document (a narrow filter, a rare word): the candidates' spread instead
                spread = float(scores.std())
            return (scores - listed.mean()) / max(spread, 1e-6)
        return (weight * standard(candidates.dense, candidates.dense_rank)
                + (1 - weight) * standard(candidates.keyword, candidates.keyword_rank))


class UnionZScore(Fusion):
    name = "zscore-union"
    meaning = ("fused, {dense} x dense + {keyword} x keyword, each side's score in standard deviations above its "
               "mean over this query's candidates: it orders this answer (0: a typical candidate); each side's own "
               "score compares across queries")

    def scores(self, candidates: Candidates, weight: float) -> np.ndarray:
        return self.scores_by_weight(candidates, [weight])[0]

    def scores_by_weight(self, candidates: Candidates, weights: Sequence[float]) -> list[np.ndarray]:
        dense, keyword = self._standard(candidates.dense), self._standard(candidates.keyword)
        return [weight * dense + (1 - weight) * keyword for weight in weights]

    @staticmethod
    def _standard(scores: np.ndarray) -> np.ndarray:
        spread = float(scores.std()) if len(scores) else 0.0
        if spread <= 1e-6:  # one candidate, or a side that scores them all alike (no query word occurs): no say
            return np.zeros(len(scores))
        return (scores - scores.mean()) / spread


class NullZScore(Fusion):
    name = "null"
    meaning = ("fused, {dense} x dense + {keyword} x keyword, each side's score in standard deviations above a "
               "random document of the index for this query")
    needs_null = True

    def scores(self, candidates: Candidates, weight: float) -> np.ndarray:
        (dense_mean, dense_std), (keyword_mean, keyword_std) = candidates.dense_null, candidates.keyword_null
        return (weight * (candidates.dense - dense_mean) / max(dense_std, 1e-6)
                + (1 - weight) * (candidates.keyword - keyword_mean) / max(keyword_std, 1e-6))


def make_fusion(name: str) -> Fusion:
    try:
        return Fusion.registry[name]()
    except KeyError:
        raise RetrieverError(f"unknown {param('fusion')} {name!r}; known: {', '.join(sorted(Fusion.registry))}") from None


def top_list(scores: np.ndarray, keys: np.ndarray, count: int) -> np.ndarray:
    """Indices of the COUNT highest SCORES, best first, ties broken by the lower KEY (a row id): the same documents
    in any order or split give the same list."""
    chosen = np.arange(len(scores))
    if count < len(scores):
        threshold = -np.partition(-scores, count - 1)[count - 1]
        chosen = np.flatnonzero(scores >= threshold)  # every tie at the threshold, so the keys can decide
    return chosen[np.lexsort((keys[chosen], -scores[chosen]))[:count]]


def scored_candidates(dense: np.ndarray, keyword: np.ndarray, count: int) -> Candidates:
    """The candidates of one query whose every document is scored on both sides (DENSE and KEYWORD, document for
    document; a keyword score of 0 where no query term occurs): the union of each side's top COUNT, ties to the
    lower position, as hybrid search reads an index's lists (a side that matches nothing lists nothing)."""
    keys = np.arange(len(dense))
    dense_top = top_list(dense, keys, count)
    keyword_top = top_list(keyword, keys, count) if keyword.any() else np.empty(0, np.int64)
    union = np.union1d(dense_top, keyword_top)
    dense_rank, keyword_rank = np.zeros(len(dense), np.int64), np.zeros(len(dense), np.int64)
    dense_rank[dense_top] = np.arange(1, len(dense_top) + 1)
    keyword_rank[keyword_top] = np.arange(1, len(keyword_top) + 1)
    return Candidates(union, dense[union], keyword[union], dense_rank[union], keyword_rank[union])


def score_meaning(options) -> str:
    """What a hit's score is under OPTIONS (`SearchOptions`, resolved for the index: its mode, and for hybrid search
    its fusion and the dense side's weight), in words for the person or program reading it."""
    if options.mode == "dense":
        space = "the raw (uncalibrated) vectors" if options.space == "raw" else "the index's calibrated space"
        return f"cosine similarity in {space} (1: the same direction as the query)"
    if options.mode == "keyword":
        return "BM25 over title and text (0: no query word; higher as more of the query's rarer words occur)"
    weight = DEFAULT_WEIGHT if options.weight is None else options.weight
    return Fusion.registry[options.fusion or DEFAULT_FUSION].meaning.format(dense=f"{weight:.2f}",
                                                                          keyword=f"{1 - weight:.2f}")
