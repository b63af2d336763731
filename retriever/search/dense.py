"""The dense side: top lists by cosine in the index's space, over every segment of one version, with or without
a filter; the exact ranking in the raw space (to compare); and what hybrid search needs of this side (a
candidate's score, a query's score distribution over the whole index)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol

import numpy as np

from retriever.search.plan import DensePlan, Matches, exhaustive
from retriever.search.top_lists import (PassageVectors, TopList, best_of, merge_top_lists, passage_vectors,
                                        segment_top_lists)
from retriever.store.passages import document_scores
from retriever.numeric import l2_normalize
from retriever.versions.snapshot import Snapshot

NULL_SAMPLE = 4096  # stored vectors sampled for the dense score's distribution (fusion "null")
# Documents of at least this many passages keep their vectors in memory once read (`DenseSearcher.scores_of`):
# hybrid search scores each keyword candidate from its passages, and long documents, which hold many words, are
# keyword candidates again and again. At most LONG_DOCUMENT_BYTES of them are kept (the least recent go).
LONG_DOCUMENT_PASSAGES = 32
LONG_DOCUMENT_BYTES = 256 * 2**20
RAW_BLOCK = 65536  # raw vectors scored at a time by the raw-space ranking


class RemoteSegments(Protocol):
    """Where a version's vectors are searched when not in this process: a distributed server's shards
    (`retriever.serve.shards`). Each answers with `top_lists.segment_top_lists` / `passage_vectors` of the same
    version."""

    def top_lists(self, snapshot: Snapshot, queries: np.ndarray, plan: DensePlan,
                  includes: dict[int, np.ndarray] | None) -> list[TopList]: ...

    def passage_vectors(self, snapshot: Snapshot, rowids: np.ndarray) -> PassageVectors: ...


class DenseSearcher:
    """The dense side over SNAPSHOT's segments, searched here or by REMOTE. Safe to share between threads: what it
    estimates once (the null's moments) and the long documents' vectors it keeps are read and written under a
    lock."""

    def __init__(self, snapshot: Snapshot, remote: RemoteSegments | None = None):
        self.snapshot, self.remote = snapshot, remote
        self._moments: tuple[np.ndarray, np.ndarray] | None = None
        self._lock = threading.Lock()
        self._long: OrderedDict[int, PassageVectors] = OrderedDict()  # row id -> its passages' vectors
        self._long_bytes = 0

    def top(self, queries: np.ndarray, plan: DensePlan,
            matches: Matches | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Each query's top plan.k documents (scores, row ids) for calibrated, L2-normalized QUERIES (`top_passages`
        without the passages)."""
        scores, ids, _ = self.top_passages(queries, plan, matches)
        return scores, ids

    def top_passages(self, queries: np.ndarray, plan: DensePlan,
                     matches: Matches | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each query's top plan.k documents for calibrated, L2-normalized QUERIES, each scored from its first and
        best passages (`passages.document_scores`): (scores, row ids, the best passage's vector key), deleted
        documents excluded (with MATCHES, among
        those only); rows padded with id -1 where fewer exist. A filter that matches k documents gets k: where the
        walk found fewer among the matches (they lay outside the buckets probed or the beam), those queries score
        every match."""
        includes = None if matches is None else dict(enumerate(matches.by_segment))
        scores, ids, keys = self._search(queries, plan, includes)
        if matches is not None and not plan.exact:
            short = (ids >= 0).sum(axis=1) < min(plan.k, len(matches))
            if short.any():
                scores[short], ids[short], keys[short] = self._search(
                    queries[short], exhaustive(plan, self.snapshot.spec), includes)
        return scores, ids, keys

    def _search(self, queries: np.ndarray, plan: DensePlan,
                includes: dict[int, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.remote is not None:
            lists = self.remote.top_lists(self.snapshot, queries, plan, includes)
        else:
            lists = segment_top_lists(self.snapshot, range(len(self.snapshot.segments)), queries, plan, includes)
        return merge_top_lists(lists, plan.k, len(queries))

    def scores_of(self, query: np.ndarray, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each of ROWIDS' score for QUERY in the index's space (`passages.document_scores`: a document of one
        passage, its cosine) and its best passage's vector key."""
        if not len(rowids):
            return np.zeros(0, np.float32), np.zeros(0, np.int64)
        return best_of(self._passage_vectors(rowids), query, rowids)

    def _passage_vectors(self, rowids: np.ndarray) -> list[PassageVectors]:
        """ROWIDS' passages' vectors, in parts: long documents' from memory where read before (each its own part,
        never copied), the others read now."""
        with self._lock:
            held = {rowid: self._long[rowid] for rowid in rowids.tolist() if rowid in self._long}
            for rowid in held:
                self._long.move_to_end(rowid)
        missing = rowids[~np.isin(rowids, np.fromiter(held, np.int64, len(held)))] if held else rowids
        read = PassageVectors.join([], self.snapshot.manifest.dim)
        if len(missing):
            read = (self.remote.passage_vectors(self.snapshot, missing) if self.remote is not None
                    else passage_vectors(self.snapshot, missing))
            self._remember_long(read)
        return [*held.values(), read]

    def _remember_long(self, read: PassageVectors) -> None:
        owners = read.owners
        if len(owners) < LONG_DOCUMENT_PASSAGES:
            return
        starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
        ends = np.r_[starts[1:], len(owners)]
        with self._lock:
            for start, end in zip(starts.tolist(), ends.tolist()):
                if end - start >= LONG_DOCUMENT_PASSAGES and int(owners[start]) not in self._long:
                    part = PassageVectors(owners[start:end], read.keys[start:end],
                                          np.ascontiguousarray(read.vectors[start:end]), read.coverage[start:end])
                    self._long[int(owners[start])] = part
                    self._long_bytes += part.vectors.nbytes
            while self._long and self._long_bytes > LONG_DOCUMENT_BYTES:
                _, dropped = self._long.popitem(last=False)
                self._long_bytes -= dropped.vectors.nbytes

    def null(self, queries: np.ndarray) -> list[tuple[float, float]]:
        """Each query's dense score over every document: mean and standard deviation, from the mean and covariance
        of a sample of the stored vectors in the index's space (estimated once per version)."""
        moments = self._moments
        if moments is None:
            with self._lock:
                if self._moments is None:
                    sample = self.snapshot.calibrate(self.snapshot.raw_sample(NULL_SAMPLE, seed=0))
                    if len(sample) < 2:
                        sample = (np.vstack([sample, -sample]) if len(sample) else
                                  np.eye(2, queries.shape[1], dtype=np.float32))
                    self._moments = (sample.mean(0), np.cov(sample, rowvar=False).astype(np.float32))
                moments = self._moments
        mean, covariance = moments
        means = queries @ mean
        spreads = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", queries, covariance, queries), 0.0))
        return list(zip(means.tolist(), spreads.tolist()))


def search_raw(snapshot: Snapshot, raw: np.ndarray, k: int,
               matches: Matches | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact cosine ranking in the uncalibrated space: RAW encoder outputs of queries against every stored raw
    vector, a cut document scored from its first and best passages as in the index's space
    (`passages.document_scores`; deleted documents excluded; with MATCHES, only those): (scores, row ids, best
    passages' keys). What the index would return without calibration, to compare with."""
    queries = l2_normalize(np.asarray(raw, dtype=np.float32))
    best = (np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64),
            np.full((len(queries), k), -1, np.int64))
    for segment in snapshot.segments:
        # From the mapping, not the file path: a server may still answer from a version since pruned.
        all_keys = segment.keys
        owners_all = segment.documents_of(np.asarray(all_keys))
        start = 0
        while start < len(all_keys):
            # Blocks end between documents: a document's passages are scored together.
            end = min(start + RAW_BLOCK, len(all_keys))
            if end < len(all_keys):
                end = int(np.searchsorted(owners_all, owners_all[end - 1], side="right"))
            keys, owners = np.asarray(all_keys[start:end]), owners_all[start:end]
            block = np.asarray(segment.raw[start:end], dtype=np.float32)
            start = end
            keep = ~np.isin(owners, snapshot.tombstones) if matches is None else matches.contains(owners)
            if not keep.any():
                continue
            keys, owners = keys[keep], owners[keep]
            scores = queries @ l2_normalize(block[keep]).T
            runs = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
            highest = np.maximum.reduceat(scores, runs, axis=1)
            documents = document_scores(scores[:, runs], highest, segment.coverage_of(keys[runs])[None, :])
            # Each document's best passage: the first reaching its highest score.
            lengths = np.diff(np.r_[runs, len(owners)])
            reaching = scores == np.repeat(highest, lengths, axis=1)
            position = np.where(reaching, np.arange(len(owners))[None, :], len(owners))
            best_keys = keys[np.minimum.reduceat(position, runs, axis=1)]
            merged_scores = np.concatenate([best[0], documents], axis=1)
            merged_ids = np.concatenate([best[1], np.broadcast_to(owners[runs], documents.shape)], axis=1)
            merged_keys = np.concatenate([best[2], best_keys], axis=1)
            order = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
            best = tuple(np.take_along_axis(values, order, axis=1)
                         for values in (merged_scores, merged_ids, merged_keys))
    return best
