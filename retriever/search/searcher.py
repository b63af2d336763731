"""The search path over one opened version: options -> plan -> each side -> fusion -> hits with their documents.

    searcher = Searcher(snapshot)
    hits = searcher.search(texts, snapshot.calibrate(raw), SearchOptions(k=10, mode="hybrid"))

`Index.search` encodes and calibrates texts and comes here; so do a server's batches (one encoder call for many
requests), the benchmarks and the evaluation, so every one of them searches exactly alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from retriever.errors import RetrieverError, param
from retriever.search.dense import DenseSearcher, RemoteSegments, search_raw
from retriever.search.hybrid import fuse
from retriever.search.keyword import KeywordSearcher
from retriever.search.matches import MatchCache
from retriever.search.options import SearchOptions
from retriever.search.plan import QueryPlan, plan_query
from retriever.search.results import Ranked, SearchHit, dense_hits, ranked_hits
from retriever.versions.snapshot import Snapshot


class Searcher:
    """Searches SNAPSHOT: its vectors here, or through REMOTE (a distributed server's shards); keyword search,
    documents and fusion stay here.

    Safe to share between threads: every cache it keeps (the filters' matches, the BM25 statistics, the dense
    null, each vector store's per-filter selection) is built once and read as one immutable value."""

    def __init__(self, snapshot: Snapshot, remote: RemoteSegments | None = None):
        self.snapshot = snapshot
        self.dense = DenseSearcher(snapshot, remote)
        self.keyword = KeywordSearcher(snapshot)
        self.matches = MatchCache(snapshot)

    def resolve(self, options: SearchOptions) -> SearchOptions:
        """OPTIONS for this version: the mode set, and for hybrid search the version's own fusion and weight where
        OPTIONS leave them unset (`SearchOptions.resolved`)."""
        return options.resolved(self.snapshot.name, self.snapshot.has_keywords, self.snapshot.manifest.hybrid)

    def plan(self, options: SearchOptions) -> QueryPlan:
        """How OPTIONS run over this version (`plan.plan_query`), with the filter's matches found (or remembered)."""
        options = self.resolve(options)
        matches = self.matches.matches(options.where) if options.where is not None else None
        return plan_query(options, self.snapshot.spec, len(self.snapshot), matches)

    def search(self, texts: Sequence[str], vectors: np.ndarray | None,
               options: SearchOptions) -> list[list[SearchHit]]:
        """Each text's top options.k: TEXTS with their VECTORS already in the index's space (`Snapshot.calibrate`;
        None for keyword search). min_score is left to the caller (`results.cut`)."""
        plan = self.plan(options)
        if plan.options.space == "raw":
            raise RetrieverError(f"{param('space', 'raw')} ranks raw vectors: search them with `search_raw`")
        if plan.mode != "keyword" and vectors is None:
            raise RetrieverError(f"{plan.mode} search needs the queries' vectors")
        if plan.mode == "dense":
            return dense_hits(self.snapshot, *self.dense.top_passages(vectors, plan.dense, plan.matches))
        if plan.mode == "keyword":
            sides = self.keyword.lists(texts, plan.depth, plan.options.drops_stop_words, plan.matches)
            return ranked_hits(self.snapshot, [
                [Ranked(int(rowid), float(score), keyword_score=float(score), keyword_rank=rank, passage=int(key))
                 for rank, (rowid, score, key) in enumerate(zip(side.rowids.tolist(), side.scores.tolist(),
                                                               side.keys.tolist()), start=1)]
                for side in sides])
        # Hybrid: the two sides one after the other (measured on 2 cores, a thread for the keyword side gained
        # nothing beside the dense search and lost beside the encoder: benchmarks/results/README.md, hybrid at 1M),
        # and the keyword side on this thread alone: the dense search's FAISS threads spin on the other cores a
        # while after it, and a slice handed there waits for them.
        dense_scores, dense_ids, dense_keys = self.dense.top_passages(vectors, plan.dense, plan.matches)
        sides = self.keyword.lists(texts, plan.depth, plan.options.drops_stop_words, plan.matches, spread=False)
        return ranked_hits(self.snapshot, fuse(vectors, dense_scores, dense_ids, dense_keys, sides, plan.options,
                                               self.dense, self.keyword))

    def dense_top(self, vectors: np.ndarray, options: SearchOptions) -> tuple[np.ndarray, np.ndarray]:
        """The dense side alone for calibrated VECTORS: each query's top options.k as (scores, row ids), padded with
        id -1, no document read (what the benchmarks time and measure recall on)."""
        plan = self.plan(replace(options, mode="dense"))
        return self.dense.top(vectors, plan.dense, plan.matches)

    def search_raw(self, raw: np.ndarray, options: SearchOptions) -> list[list[SearchHit]]:
        """The exact ranking in the uncalibrated space (`dense.search_raw`) of RAW encoder outputs, with OPTIONS'
        k and filter: what the index would return without calibration, to compare with."""
        plan = self.plan(options)
        return dense_hits(self.snapshot, *search_raw(self.snapshot, raw, plan.options.k, plan.matches))
