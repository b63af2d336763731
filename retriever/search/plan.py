"""A query plan: what each side of a search is asked for, before anything is searched (`plan_query`).

The dense side asks every segment for its top list (`DensePlan`: how many, how broad a walk, exact or not); the
keyword side for its top list; hybrid search asks both for at least `HYBRID_CANDIDATES` each and fuses them. A
filter's matches (`Matches`, found once and remembered by the searcher) bound both sides.

How to search when a filter leaves MATCHES of an index's LIVE documents: by scoring exactly every match, or
through the index's ANN with a selector and a search breadth raised as the filter narrows.

An ANN walk with a selector still visits documents the filter drops; among the candidates it keeps, only the
filter's share match, and the nearest matching documents lie further down the ranking. Both breadths grow slower
than 1 / share (the buckets, or graph neighbourhoods, a ranking's head falls in grow slower than the head): IVF's
probes as nprobe / sqrt(share), the hnsw beam as ef / share ** BEAM_EXPONENT, as wide as keeps a filtered walk's
recall@10 at the unfiltered walk's own. Measured at a 10% filter with the default ef of 256 (300 questions): on
200,000 passages a beam of 643 kept 0.983 (unfiltered: 0.983), on 500,000 one of 720 kept 0.972 (unfiltered:
0.972), 643 only 0.970; 720 = 256 / 0.1 ** 0.45. Wider costs more for little: ef / share (2,560 at 500,000) cost 3x
more than 800 for 0.989 against 0.976. Both cost more as the filter narrows; scoring the matches costs less.
So each plan compares the two costs in one unit, vectors scored:
- flat and hnsw keep float vectors: scoring every match (each stored vector scored where it lies, from a list of
  the matches' positions) costs MATCHES; a walk costs GRAPH_VECTORS_PER_EF x ef. The measured flat/hnsw crossover
  gives the constant: a walk at the default ef costs about as much as an exact scan of FLAT_MAX_DOCUMENTS
  vectors (benchmarks/results/hnsw_crossover_cpu.md);
- ivf/ivfpq keep codes: probing every bucket with the selector scores every match's code (then the re-rank) and
  only checks the others' bits; the raised probes score the codes in the buckets probed, LIVE x nprobe / nlist.
  Every bucket is probed when that scores no more codes than the raised probes would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from retriever.search.options import SearchOptions
from retriever.store.spec import DEFAULT_EF_SEARCH, FLAT_MAX_DOCUMENTS, IndexSpec

GRAPH_VECTORS_PER_EF = FLAT_MAX_DOCUMENTS / DEFAULT_EF_SEARCH
BEAM_EXPONENT = 0.45  # see the module docstring: set on 200,000 and 500,000 passages
MAX_EF_SEARCH = 16_384


@dataclass(frozen=True)
class FilterPlan:
    exact: bool  # score every matching document's stored vector (flat, hnsw)
    ef_search: int | None = None  # hnsw: the raised beam
    nprobe: int | None = None  # ivf/ivfpq: the raised probe count

    def describe(self) -> str:
        if self.exact:
            return "every match scored"
        return f"ann with a selector ({f'ef_search {self.ef_search}' if self.ef_search else f'nprobe {self.nprobe}'})"


def plan_filtered_search(matches: int, live: int, k: int, spec: IndexSpec, ef_search: int | None = None,
                         nprobe: int | None = None) -> FilterPlan:
    """The cheaper way to the top-K among MATCHES of LIVE documents (see the module docstring); EF_SEARCH /
    NPROBE: the search's own settings (else the index's), raised for the filter."""
    if matches == 0 or not (spec.kind.graph or spec.kind.trained):  # flat: exact either way
        return FilterPlan(exact=True)
    share = min(1.0, matches / max(live, 1))
    if spec.kind.graph:
        base = max(ef_search or spec.search_ef, k)
        ef = min(MAX_EF_SEARCH, math.ceil(base / share**BEAM_EXPONENT))
        return FilterPlan(exact=True) if matches <= GRAPH_VECTORS_PER_EF * ef else FilterPlan(False, ef_search=ef)
    nlist = spec.nlist or 1
    base = nprobe or spec.search_nprobe
    # The nearest matching documents are about 1/share times further down the ranking: probe more buckets, by the
    # square root of that (the buckets a ranking's head falls in grow slower than the head).
    raised = min(nlist, math.ceil(base / math.sqrt(share)))
    every = matches <= live * raised / nlist
    return FilterPlan(False, nprobe=nlist if every else raised)


@dataclass(frozen=True)
class DensePlan:
    """What the dense side asks of every segment: its top K (re-ranked from K x RERANK candidates where the codes
    are compressed), with the walk's breadth (NPROBE, EF_SEARCH: None, the index's own) or, EXACT, every included
    vector scored (IVF types: every bucket probed). Sent as it is to a distributed server's shards."""

    k: int
    rerank: int = 1
    nprobe: int | None = None
    ef_search: int | None = None
    exact: bool = False

    @property
    def candidates(self) -> int:
        """What each segment's index is asked for before the re-rank."""
        return self.k * self.rerank


@dataclass(frozen=True)
class Matches:
    """The live documents a filter selects: their row ids (ascending) and the same split by segment."""

    rowids: np.ndarray
    by_segment: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return len(self.rowids)

    def contains(self, rowids: np.ndarray) -> np.ndarray:
        """Which of ROWIDS the filter selects (a boolean mask)."""
        if not len(self.rowids):
            return np.zeros(len(rowids), bool)
        positions = np.minimum(np.searchsorted(self.rowids, rowids), len(self.rowids) - 1)
        return self.rowids[positions] == rowids


@dataclass(frozen=True)
class QueryPlan:
    """One search, planned: the OPTIONS resolved for the index (mode set), each side's list DEPTH, the filter's
    MATCHES (None: no filter), and the dense side's plan (None for keyword search)."""

    options: SearchOptions
    depth: int
    matches: Matches | None = None
    dense: DensePlan | None = None

    @property
    def mode(self) -> str:
        return self.options.mode


def plan_query(options: SearchOptions, spec: IndexSpec, live: int, matches: Matches | None = None) -> QueryPlan:
    """How to run OPTIONS (resolved: `SearchOptions.resolved`) over an index of SPEC holding LIVE documents, with a
    filter's MATCHES: each side's depth, and for the dense side what every segment is asked (a filter raises the
    walk's breadth or scores its matches exactly: `plan_filtered_search`)."""
    depth = options.depth
    if options.mode == "keyword":
        return QueryPlan(options, depth, matches)
    # Only compressed codes are re-ranked (a rerank given for another index type changes nothing).
    rerank = (options.rerank or spec.search_rerank) if spec.kind.compressed else 1
    if matches is None:
        return QueryPlan(options, depth, None, DensePlan(depth, rerank, options.nprobe, options.ef_search))
    filtered = plan_filtered_search(len(matches), live, depth, spec, options.ef_search, options.nprobe)
    return QueryPlan(options, depth, matches,
                     DensePlan(depth, rerank, filtered.nprobe or options.nprobe, filtered.ef_search or options.ef_search,
                               filtered.exact))


def exhaustive(plan: DensePlan, spec: IndexSpec) -> DensePlan:
    """PLAN scoring every included vector (flat, hnsw) or probing every bucket (IVF types): what a filtered query
    falls back on where the walk found fewer than k of the filter's matches."""
    return DensePlan(plan.k, plan.rerank, spec.nlist, None, exact=True)
