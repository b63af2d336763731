"""Per-segment top lists and their merge, in one place (tantivy's per-segment collector and `merge_fruits`).

A version's segments are searched one by one (`segment_top_lists`: each its own top list, re-ranked exactly from
the raw vectors where its codes are compressed) and the lists merged into each query's top k in segment order
(`merge_top_lists`), so ties fall the same way wherever the segments were searched: in this process, or on a
distributed server's shards (`retriever.serve.shards`), which answer with these same functions.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from retriever.search.plan import DensePlan
from retriever.store.segment import Segment
from retriever.versions.snapshot import Snapshot

TopList = tuple[int, np.ndarray, np.ndarray]  # (segment number, scores (q, k), row ids (q, k))


def segment_top_lists(snapshot: Snapshot, numbers: Iterable[int], queries: np.ndarray, plan: DensePlan,
                      includes: dict[int, np.ndarray] | None = None) -> list[TopList]:
    """The top list of each of SNAPSHOT's segments NUMBERS for calibrated, L2-normalized QUERIES, as PLAN asks:
    deleted documents excluded, or with INCLUDES only those live row ids (per segment number; a segment without
    any is skipped)."""
    lists = []
    for number in numbers:
        segment = snapshot.segments[number]
        include = None if includes is None else includes.get(number, np.empty(0, np.int64))
        if include is not None and not len(include):
            continue
        # An include list holds live rows only: no tombstones to exclude on top.
        scores, ids = segment.vectors.search(queries, plan.candidates, snapshot.tombstones if include is None else None,
                                             plan.nprobe, plan.ef_search, include, plan.exact)
        if plan.candidates > plan.k:
            scores, ids = _rerank(snapshot, segment, queries, ids, plan.k)
        lists.append((number, scores, ids))
    return lists


def merge_top_lists(lists: Iterable[TopList], k: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """Segments' top lists merged into each query's top-k, in segment order (so ties fall the same way wherever
    the segments were searched); rows padded with id -1 (score -inf) where fewer than k were found."""
    lists = sorted(lists, key=lambda found: found[0])
    if not lists:
        return np.full((queries, k), -np.inf, np.float32), np.full((queries, k), -1, np.int64)
    scores = np.concatenate([found[1] for found in lists], axis=1)
    ids = np.concatenate([found[2] for found in lists], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)


def space_vectors(snapshot: Snapshot, rowids: np.ndarray, numbers: Iterable[int] | None = None) -> np.ndarray:
    """ROWIDS' vectors in the index's space: the stored vectors a search scores (flat, hnsw), else their raw
    vectors calibrated as at build (IVF types keep no float vectors). NUMBERS: only those segments are read
    (rows of the others stay zero)."""
    vectors = np.zeros((len(rowids), snapshot.manifest.dim), np.float32)
    wanted = None if numbers is None else set(numbers)
    for number, segment in enumerate(snapshot.segments):
        if wanted is not None and number not in wanted:
            continue
        mine = segment.contains(rowids)
        if mine.any():
            found = segment.vectors.vectors_of(rowids[mine])
            vectors[mine] = found if found is not None else snapshot.calibrate(snapshot.raw_of(segment, rowids[mine]))
    return vectors


def _rerank(snapshot: Snapshot, segment: Segment, queries: np.ndarray, ids: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact scores for approximate candidates: their raw vectors, calibrated as at build, against the query."""
    found = ids >= 0
    unique = np.unique(ids[found])
    exact = np.full(ids.shape, -np.inf, dtype=np.float32)
    if len(unique):
        vectors = snapshot.calibrate(snapshot.raw_of(segment, unique))
        positions = np.searchsorted(unique, ids[found])
        rows = np.nonzero(found)[0]
        exact[found] = np.einsum("ij,ij->i", queries[rows], vectors[positions])
    order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
    scores, best = np.take_along_axis(exact, order, axis=1), np.take_along_axis(ids, order, axis=1)
    best[np.isneginf(scores)] = -1
    return scores, best
