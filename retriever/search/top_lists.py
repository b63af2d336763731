"""Per-segment top lists and their merge, in one place (tantivy's per-segment collector and `merge_fruits`).

A version's segments are searched one by one (`segment_top_lists`: each its own top list, re-ranked exactly from
the raw vectors where its codes are compressed) and the lists merged into each query's top k in segment order
(`merge_top_lists`), so ties fall the same way wherever the segments were searched: in this process, or on a
distributed server's shards (`retriever.serve.shards`), which answer with these same functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from retriever.numeric import find_in, product, row_dots
from retriever.search.plan import DensePlan
from retriever.store.passages import PASSAGE_BITS, document_scores
from retriever.store.segment import Segment
from retriever.versions.snapshot import Snapshot

TopList = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # (segment number, scores, row ids, best passages' keys)
# A segment whose documents are cut into passages is asked for this many times the passages as documents wanted,
# then for WIDEN times more for the queries whose passages still named fewer documents.
FIRST_PASSAGES, WIDEN = 2, 4


@dataclass(frozen=True)
class PassageVectors:
    """Vectors of documents' passages in the index's space: each row's document (OWNERS), vector key, vector and
    its document's coverage (`passages.coverages`). A document's passages are one run of rows, its first passage
    first (`passage_vectors` reads them document by document, in key order)."""

    owners: np.ndarray
    keys: np.ndarray
    vectors: np.ndarray
    coverage: np.ndarray

    @classmethod
    def join(cls, parts: Iterable[PassageVectors], dim: int) -> PassageVectors:
        parts = list(parts)
        if not parts:
            return cls(np.empty(0, np.int64), np.empty(0, np.int64), np.empty((0, dim), np.float32),
                       np.empty(0, np.float32))
        if len(parts) == 1:  # one segment's: megabytes of a hybrid search's long pages, not copied
            return parts[0]
        return cls(*(np.concatenate([getattr(part, name) for part in parts])
                     for name in ("owners", "keys", "vectors", "coverage")))

    def best(self, query: np.ndarray, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each of ROWIDS' score for QUERY (`passages.document_scores`: its first passage and its best passage,
        weighed by coverage; a document of one passage, that passage's cosine) and its best passage's key; (0, -1)
        for a row id without vectors."""
        return best_of([self], query, rowids)


def best_of(parts: Sequence[PassageVectors], query: np.ndarray, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`PassageVectors.best` over PARTS taken together (no document split between two), their vectors read where
    they lie: a hybrid search scores the long documents it keeps in memory without copying them."""
    scores = np.zeros(len(rowids), np.float32)
    keys = np.full(len(rowids), -1, np.int64)
    parts = [part for part in parts if len(part.owners)]
    if not parts:
        return scores, keys
    owners = np.concatenate([part.owners for part in parts])
    passage_scores = np.concatenate([row_dots(part.vectors, query) for part in parts])
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    highest = np.maximum.reduceat(passage_scores, starts)
    best = document_scores(passage_scores[starts], highest, np.concatenate([part.coverage for part in parts])[starts])
    # The first passage reaching its document's best, per run.
    runs = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(owners)]))
    reaching = np.flatnonzero(passage_scores == highest[runs])
    first = reaching[np.unique(runs[reaching], return_index=True)[1]]
    at, found = find_in(rowids, owners[starts])
    scores[found] = best[at[found]]
    keys[found] = np.concatenate([part.keys for part in parts])[first[at[found]]]
    return scores, keys


def segment_top_lists(snapshot: Snapshot, numbers: Iterable[int], queries: np.ndarray, plan: DensePlan,
                      includes: dict[int, np.ndarray] | None = None) -> list[TopList]:
    """The top list of each of SNAPSHOT's segments NUMBERS for calibrated, L2-normalized QUERIES, as PLAN asks:
    deleted documents excluded, or with INCLUDES only those live row ids (per segment number; a segment without
    any is skipped). A cut document scores from its first and best passages (`passages.document_scores`), and
    each list names plan.k distinct documents where the segment has them (`_passage_top`)."""
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
    """A split segment's top plan.k documents (of its DOCUMENTS searched), each scored from its first and best
    passages (`passages.document_scores`): (scores, row ids, best passage keys). Each query asks for
    FIRST_PASSAGES x the candidates in passages, and WIDEN x more while its answer is not sure: a document none of
    whose passages came back scores at most the last passage's score (a document's score is never above its best
    passage's), so the answer is the top k once its k-th score reaches that, or every passage came back: exact on
    flat (and wherever PLAN asks for exact search). An approximate walk widens only while it names fewer than k
    documents: on hnsw the beam widens with the passages asked; on IVF a query whose probed buckets gave fewer
    passages than asked has no more to give."""
    available = len(include) if include is not None else len(segment.keys) - len(exclude)
    k = plan.k
    wanted = min(k, documents)
    scores = np.full((len(queries), k), -np.inf, np.float32)
    rowids = np.full((len(queries), k), -1, np.int64)
    keys = np.full((len(queries), k), -1, np.int64)
    rows = np.arange(len(queries))
    asked = min(plan.candidates * FIRST_PASSAGES, max(available, 1))
    exhaustive = plan.exact or segment.vectors.spec.kind.name == "flat"
    while len(rows):
        # hnsw: the beam is at least as wide as the passages asked for (it widens with them)
        graph = segment.vectors.spec.kind.graph
        beam = max(plan.ef_search or segment.vectors.spec.search_ef, asked) if graph else plan.ef_search
        found_scores, found_keys = segment.vectors.search(queries[rows], asked, exclude, plan.nprobe, beam, include,
                                                          plan.exact)
        if plan.rerank > 1:
            found_scores, found_keys = _rerank(snapshot, segment, queries[rows], found_keys, asked)
        best = _documents_of_passages(snapshot, segment, queries[rows], found_scores, found_keys, k)
        scores[rows], rowids[rows], keys[rows] = best
        returned = (found_keys >= 0).sum(axis=1)
        short = (best[1] >= 0).sum(axis=1) < wanted
        if exhaustive:  # an approximate walk is not made exact by asking for more: only a short answer widens it
            floor = np.where(returned > 0, found_scores[np.arange(len(rows)), np.maximum(returned - 1, 0)], -np.inf)
            short |= (best[0][:, wanted - 1] if wanted else np.full(len(rows), np.inf, np.float32)) < floor
        if not graph:
            short &= returned == asked
        if asked >= available or not short.any():
            break
        rows, asked = rows[short], min(asked * WIDEN, available)
    return scores, rowids, keys


def _documents_of_passages(snapshot: Snapshot, segment: Segment, queries: np.ndarray, found_scores: np.ndarray,
                           found_keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query's top K documents among those its FOUND passages (scores and keys, best first, -1 padding) name:
    (scores, row ids, best passage keys), padded with -inf / -1. A document's best passage is its first found;
    its first passage is scored from its vector when the search did not return it."""
    documents = segment.documents_of(found_keys)
    held = np.unique(documents[documents >= 0])
    firsts = held << PASSAGE_BITS
    first_scores = product(queries, _vectors(snapshot, segment, firsts).T) if len(held) else np.empty((len(queries), 0))
    coverage = segment.coverage_of(firsts)
    out_scores = np.full((len(queries), k), -np.inf, np.float32)
    out_ids = np.full((len(queries), k), -1, np.int64)
    out_keys = np.full((len(queries), k), -1, np.int64)
    for row in range(len(queries)):
        valid = documents[row] >= 0
        ids, passage_scores, passage_keys = documents[row][valid], found_scores[row][valid], found_keys[row][valid]
        order = np.argsort(-passage_scores, kind="stable")
        unique, first = np.unique(ids[order], return_index=True)
        at = np.searchsorted(held, unique)
        combined = document_scores(first_scores[row, at], passage_scores[order][first], coverage[at])
        # Best first, ties to the document whose best passage came first.
        ranking = np.lexsort((first, -combined))[:k]
        out_scores[row, : len(ranking)] = combined[ranking]
        out_ids[row, : len(ranking)] = unique[ranking]
        out_keys[row, : len(ranking)] = passage_keys[order][first][ranking]
    return out_scores, out_ids, out_keys


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
        parts.append(PassageVectors(segment.documents_of(keys), keys, _vectors(snapshot, segment, keys),
                                    segment.coverage_of(keys)))
    return PassageVectors.join(parts, snapshot.manifest.dim)


def _vectors(snapshot: Snapshot, segment: Segment, keys: np.ndarray) -> np.ndarray:
    """SEGMENT's vectors of KEYS in the index's space: those a search scores (flat, hnsw), else the raw vectors
    calibrated as at build (IVF types keep no float vectors)."""
    found = segment.vectors.vectors_of(keys)
    return np.asarray(found if found is not None else snapshot.calibrate(snapshot.raw_of(segment, keys)), np.float32)


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
