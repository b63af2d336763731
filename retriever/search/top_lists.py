"""Per-segment top lists and their merge, in one place (tantivy's per-segment collector and `merge_fruits`).

A version's segments are searched one by one (`segment_top_lists`: each its own top list, re-ranked exactly from
the raw vectors where its codes are compressed) and the lists merged into each query's top k in segment order
(`merge_top_lists`), so ties fall the same way wherever the segments were searched: in this process, or on a
distributed server's shards (`retriever.serve.shards`), which answer with these same functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from retriever.search.plan import DensePlan
from retriever.store.passages import best_per_document
from retriever.store.segment import Segment
from retriever.versions.snapshot import Snapshot

TopList = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # (segment number, scores, row ids, best passages' keys)
# A segment whose documents are cut into passages is asked for this many times the passages as documents wanted,
# then for WIDEN times more for the queries whose passages still named fewer documents.
FIRST_PASSAGES, WIDEN = 2, 4


@dataclass(frozen=True)
class PassageVectors:
    """Vectors of documents' passages in the index's space: each row's document (OWNERS), vector key and vector."""

    owners: np.ndarray
    keys: np.ndarray
    vectors: np.ndarray

    @classmethod
    def join(cls, parts: Iterable[PassageVectors], dim: int) -> PassageVectors:
        parts = list(parts)
        if not parts:
            return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, dim), np.float32))
        return cls(*(np.concatenate([getattr(part, name) for part in parts])
                     for name in ("owners", "keys", "vectors")))

    def best(self, query: np.ndarray, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each of ROWIDS' best passage for QUERY: (its cosine, its key); (0, -1) for a row id without vectors.
        A document's passages are one run of rows (`passage_vectors` reads them document by document)."""
        scores = np.zeros(len(rowids), np.float32)
        keys = np.full(len(rowids), -1, np.int64)
        if not len(self.owners):
            return scores, keys
        passage_scores = self.vectors @ query
        starts = np.flatnonzero(np.r_[True, self.owners[1:] != self.owners[:-1]])
        best = np.maximum.reduceat(passage_scores, starts)
        # The first passage reaching its document's best, per run.
        runs = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(self.owners)]))
        reaching = np.flatnonzero(passage_scores == best[runs])
        first = reaching[np.unique(runs[reaching], return_index=True)[1]]
        documents = self.owners[starts]
        order = np.argsort(documents, kind="stable")
        at = np.searchsorted(documents, rowids, sorter=order)
        at = order[np.minimum(at, len(order) - 1)]
        found = documents[at] == rowids
        scores[found] = best[at[found]]
        keys[found] = self.keys[first[at[found]]]
        return scores, keys


def segment_top_lists(snapshot: Snapshot, numbers: Iterable[int], queries: np.ndarray, plan: DensePlan,
                      includes: dict[int, np.ndarray] | None = None) -> list[TopList]:
    """The top list of each of SNAPSHOT's segments NUMBERS for calibrated, L2-normalized QUERIES, as PLAN asks:
    deleted documents excluded, or with INCLUDES only those live row ids (per segment number; a segment without
    any is skipped). A document scores by its best passage, and each list names plan.k distinct documents where
    the segment has them (`_passage_top`)."""
    lists = []
    for number in numbers:
        segment = snapshot.segments[number]
        include = None if includes is None else includes.get(number, np.empty(0, np.int64))
        if include is not None and not len(include):
            continue
        # An include list holds live rows only: no tombstones to exclude on top.
        include_keys = None if include is None else segment.keys_of(include, remember=True)
        exclude_keys = segment.keys_of(snapshot.tombstones, remember=True) if include is None else None
        if segment.split:
            # The documents it can answer with: the filter's here, or its live ones (the manifest counts them).
            entry = snapshot.manifest.segments[number]
            documents = len(include) if include is not None else len(segment) - (
                entry.deleted if entry.deleted is not None
                else int(np.count_nonzero(segment.contains(snapshot.tombstones))))
            lists.append((number, *_passage_top(snapshot, segment, queries, plan, include_keys, exclude_keys,
                                                documents)))
            continue
        scores, ids = segment.vectors.search(queries, plan.candidates, exclude_keys, plan.nprobe, plan.ef_search,
                                             include_keys, plan.exact)
        if plan.candidates > plan.k:
            scores, ids = _rerank(snapshot, segment, queries, ids, plan.k)
        lists.append((number, scores, ids, ids))
    return lists


def _passage_top(snapshot: Snapshot, segment: Segment, queries: np.ndarray, plan: DensePlan,
                 include: np.ndarray | None, exclude: np.ndarray | None,
                 documents: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A split segment's top plan.k documents (of its DOCUMENTS searched), each by its best passage: (scores, row
    ids, passage keys). Each query asks for FIRST_PASSAGES x the candidates in passages, and WIDEN x more while its
    passages name fewer than k documents and the segment holds more: exact on flat (k documents among the top
    passages are the top k documents); on hnsw the beam widens with them; on IVF a query whose probed buckets gave
    fewer passages than asked has no more to give."""
    available = len(include) if include is not None else len(segment.keys) - len(exclude)
    k = plan.k
    wanted = min(k, documents)
    scores = np.full((len(queries), k), -np.inf, np.float32)
    rowids = np.full((len(queries), k), -1, np.int64)
    keys = np.full((len(queries), k), -1, np.int64)
    rows = np.arange(len(queries))
    asked = min(plan.candidates * FIRST_PASSAGES, max(available, 1))
    while len(rows):
        # hnsw: the beam is at least as wide as the passages asked for (it widens with them)
        graph = segment.vectors.spec.kind.graph
        beam = max(plan.ef_search or segment.vectors.spec.search_ef, asked) if graph else plan.ef_search
        found_scores, found_keys = segment.vectors.search(queries[rows], asked, exclude, plan.nprobe, beam, include,
                                                          plan.exact)
        if plan.rerank > 1:
            found_scores, found_keys = _rerank(snapshot, segment, queries[rows], found_keys, asked)
        best = best_per_document(found_scores, found_keys, k)
        scores[rows], rowids[rows], keys[rows] = best
        short = (best[1] >= 0).sum(axis=1) < wanted
        if not graph:
            short &= (found_keys >= 0).sum(axis=1) == asked
        if asked >= available or not short.any():
            break
        rows, asked = rows[short], min(asked * WIDEN, available)
    return scores, rowids, keys


def merge_top_lists(lists: Iterable[TopList], k: int, queries: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments' top lists merged into each query's top-k documents, in segment order (so ties fall the same way
    wherever the segments were searched): (scores, row ids, best passages' keys), padded with id -1 (score -inf)
    where fewer than k were found."""
    lists = sorted(lists, key=lambda found: found[0])
    if not lists:
        empty = np.full((queries, k), -1, np.int64)
        return np.full((queries, k), -np.inf, np.float32), empty, empty.copy()
    scores, ids, keys = (np.concatenate([found[column] for found in lists], axis=1) for column in (1, 2, 3))
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return tuple(np.take_along_axis(values, order, axis=1) for values in (scores, ids, keys))


def passage_vectors(snapshot: Snapshot, rowids: np.ndarray, numbers: Iterable[int] | None = None) -> PassageVectors:
    """The vectors of ROWIDS' passages (one each where a document is one passage) in the index's space: the
    stored vectors a search scores (flat, hnsw), else their raw vectors calibrated as at build (IVF types keep no
    float vectors). NUMBERS: only those segments are read."""
    wanted = None if numbers is None else set(numbers)
    rowids = np.asarray(rowids, np.int64)
    parts = []
    for number, segment in enumerate(snapshot.segments):
        if wanted is not None and number not in wanted:
            continue
        mine = np.unique(rowids[segment.contains(rowids)])
        if not len(mine):
            continue
        keys = segment.keys_of(mine)
        found = segment.vectors.vectors_of(keys)
        vectors = found if found is not None else snapshot.calibrate(snapshot.raw_of(segment, keys))
        parts.append(PassageVectors(segment.documents_of(keys), keys, np.asarray(vectors, np.float32)))
    return PassageVectors.join(parts, snapshot.manifest.dim)


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
