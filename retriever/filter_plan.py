"""How to search when a filter leaves MATCHES of an index's LIVE documents: by scoring exactly every match, or
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

from retriever.store.vectors import DEFAULT_EF_SEARCH, FLAT_MAX_DOCUMENTS, IndexSpec

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
