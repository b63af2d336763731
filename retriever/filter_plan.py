"""How to search when a filter leaves MATCHES of an index's LIVE documents: exactly over just those, or through
the index's ANN with a selector and a search breadth raised as the filter narrows.

An ANN walk with a selector still visits documents the filter drops; among the candidates it keeps, only the
filter's share match. To meet about as many matching candidates as the unfiltered search meets results, the hnsw
beam grows as ef / share (at least FILTER_MARGIN x k matching candidates), and IVF probes more buckets as the
nearest matching documents lie further away. Both cost more as the filter narrows; an exact scan over the
matches costs less. So each plan compares the two costs in one unit, vectors scored:
- exact: MATCHES vectors (their stored or calibrated vectors, then one matrix product);
- hnsw: GRAPH_VECTORS_PER_EF x ef. The measured flat/hnsw crossover gives the constant: a walk at the default ef
  costs about as much as an exact scan of FLAT_MAX_DOCUMENTS vectors (benchmarks/results/hnsw_crossover_cpu.md);
- ivf/ivfpq: the vectors in the buckets probed, LIVE x nprobe / nlist, a PQ code counted as IVF_CODE_COST of a
  float vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from retriever.store.vectors import DEFAULT_EF_SEARCH, FLAT_MAX_DOCUMENTS, IndexSpec

GRAPH_VECTORS_PER_EF = FLAT_MAX_DOCUMENTS / DEFAULT_EF_SEARCH
FILTER_MARGIN = 4  # matching candidates a walk should meet per result asked for
MAX_EF_SEARCH = 16_384
IVF_CODE_COST = {"ivf": 1.0, "ivfpq": 0.25}  # scoring a stored code, against a float vector


@dataclass(frozen=True)
class FilterPlan:
    exact: bool  # score the matching documents' vectors directly
    ef_search: int | None = None  # hnsw: the raised beam
    nprobe: int | None = None  # ivf/ivfpq: the raised probe count

    def describe(self) -> str:
        if self.exact:
            return "exact over the matches"
        return f"ann with a selector ({f'ef_search {self.ef_search}' if self.ef_search else f'nprobe {self.nprobe}'})"


def plan_filtered_search(matches: int, live: int, k: int, spec: IndexSpec, ef_search: int | None = None,
                         nprobe: int | None = None) -> FilterPlan:
    """The cheaper of an exact scan over MATCHES and the index's ANN restricted to them, for top-K among LIVE
    documents; EF_SEARCH / NPROBE: the search's own settings (else the index's), raised for the filter."""
    if matches == 0 or not (spec.kind.graph or spec.kind.trained):  # flat: exact either way
        return FilterPlan(exact=True)
    share = min(1.0, matches / max(live, 1))
    if spec.kind.graph:
        ef = min(MAX_EF_SEARCH, max(ef_search or spec.search_ef, math.ceil(FILTER_MARGIN * k / share)))
        return FilterPlan(exact=True) if matches <= GRAPH_VECTORS_PER_EF * ef else FilterPlan(False, ef_search=ef)
    nlist = spec.nlist or 1
    base = nprobe or spec.search_nprobe
    # The nearest matching documents are about 1/share times further down the ranking: probe more buckets, by the
    # square root of that (the buckets a ranking's head falls in grow slower than the head).
    raised = min(nlist, math.ceil(base / math.sqrt(share)))
    scanned = live * raised / nlist * IVF_CODE_COST.get(spec.type, 1.0)
    return FilterPlan(exact=True) if matches <= scanned else FilterPlan(False, nprobe=raised)
