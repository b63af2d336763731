"""Passage keys: how a segment's vectors name the passages of its documents.

A segment whose documents are each one passage keys its vectors by row id, as every segment did before passages.
A segment where some document is cut into passages (`retriever.encode.passages`) keys each vector by
`row id << PASSAGE_BITS | passage number`, and keeps two files beside its raw vectors, row for row:

    passages.npy   PASSAGES: the passage keys, ascending (document by document, each in text order)
    spans.npy      SPANS: each passage's character span (start, end) in its document's text

So a key says its document without a lookup (`document_of`), a document's keys are one contiguous run of the
sorted keys (`KeyRuns.keys_of`), and tombstones and filters, which name documents, reach every passage.
"""

from __future__ import annotations

import numpy as np

PASSAGE_BITS = 16


def passage_keys(rowids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The keys of the passages of ROWIDS, COUNTS passages each, in order."""
    rowids, counts = np.asarray(rowids, np.int64), np.asarray(counts, np.int64)
    numbers = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return (np.repeat(rowids, counts) << PASSAGE_BITS) | numbers


def document_of(keys: np.ndarray) -> np.ndarray:
    """The row id of each passage key's document (-1, padding, stays -1)."""
    keys = np.asarray(keys, np.int64)
    return np.where(keys >= 0, keys >> PASSAGE_BITS, -1)


def passage_numbers(keys: np.ndarray) -> np.ndarray:
    """Each passage key's number within its document (0 for the first)."""
    return np.asarray(keys, np.int64) & ((1 << PASSAGE_BITS) - 1)


def keys_of(sorted_keys: np.ndarray, rowids: np.ndarray) -> np.ndarray:
    """The keys in SORTED_KEYS (ascending passage keys) of the documents ROWIDS, ascending."""
    rowids = np.unique(np.asarray(rowids, np.int64))
    if not len(rowids) or not len(sorted_keys):
        return np.empty(0, np.int64)
    lows = np.searchsorted(sorted_keys, rowids << PASSAGE_BITS)
    highs = np.searchsorted(sorted_keys, (rowids + 1) << PASSAGE_BITS)
    lengths = highs - lows
    total = int(lengths.sum())
    if not total:
        return np.empty(0, np.int64)
    positions = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths) + np.repeat(lows, lengths)
    return np.asarray(sorted_keys[positions], np.int64)


def best_per_document(scores: np.ndarray, keys: np.ndarray, k: int,
                      documents: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's top K documents from its passages' SCORES and KEYS (best first, padding id -1): a document scores
    by its best passage. Returns (scores, row ids, best passage keys), each (q, k), padded with -inf / -1.
    DOCUMENTS: the keys' documents where they are not `document_of(keys)` (a segment keyed by row id)."""
    documents = document_of(keys) if documents is None else documents
    rows = len(scores)
    out_scores = np.full((rows, k), -np.inf, np.float32)
    out_ids = np.full((rows, k), -1, np.int64)
    out_keys = np.full((rows, k), -1, np.int64)
    for row in range(rows):
        valid = documents[row] >= 0
        order = np.argsort(-scores[row][valid], kind="stable")
        ids = documents[row][valid][order]
        _, first = np.unique(ids, return_index=True)
        first = np.sort(first)[:k]
        out_scores[row, : len(first)] = scores[row][valid][order][first]
        out_ids[row, : len(first)] = ids[first]
        out_keys[row, : len(first)] = keys[row][valid][order][first]
    return out_scores, out_ids, out_keys
