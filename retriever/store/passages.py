"""Passage keys: how a segment's vectors name the passages of its documents.

A segment whose documents are each one passage keys its vectors by row id, as every segment did before passages.
A segment where some document is cut into passages (`retriever.encode.passages`) keys each vector by
`row id << PASSAGE_BITS | passage number`, and keeps two files beside its raw vectors, row for row:

    passages.npy   PASSAGES: the passage keys, ascending (document by document, each in text order)
    spans.npy      SPANS: each passage's character span (start, end) in its document's text

So a key says its document without a lookup (`document_of`), a document's keys are one contiguous run of the
sorted keys (`KeyRuns.keys_of`), and tombstones and filters, which name documents, reach every passage.

A cut document is scored from two pieces of evidence (`document_scores`): its own vector, what the encoder reads of
it (its first passage), and its best passage. Each weighs by how much of the document it speaks for: the first
passage by its COVERAGE, the share of the text it spans, the best passage by the rest. A document a little longer
than the encoder reads is scored mostly as a whole (one sentence past the read should not outweigh the read); a
page ten times longer mostly by its best passage. A document that is one passage has coverage 1.
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


def document_runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each document's run of passages starts and ends in KEYS (ascending passage keys, at least one)."""
    owners = document_of(keys)
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    return starts, np.r_[starts[1:], len(keys)]


def cut_positions(keys: np.ndarray) -> np.ndarray:
    """The positions in KEYS (ascending passage keys) of the passages of documents cut into more than one: the
    units of a segment's keyword index of passages (a document that is one passage scores as a whole document, so
    a unit of its own would only repeat it)."""
    keys = np.asarray(keys, np.int64)
    if not len(keys):
        return np.empty(0, np.int64)
    starts, ends = document_runs(keys)
    return np.flatnonzero(np.repeat(ends - starts > 1, ends - starts)).astype(np.int64)


def document_scores(first: np.ndarray, best: np.ndarray, coverage: np.ndarray) -> np.ndarray:
    """Cut documents' scores: their first passage's score FIRST weighed by its COVERAGE of the document, their best
    passage's BEST by the rest (float32). Between the two, float rounding too (the keyword side's search relies on a
    document never scoring below its FIRST where BEST is higher), and equal to BEST where the document is one
    passage."""
    coverage = np.asarray(coverage, np.float32)
    first, best = np.asarray(first, np.float32), np.asarray(best, np.float32)
    mixed = (coverage * first + (1 - coverage) * best).astype(np.float32)
    return np.clip(mixed, np.minimum(first, best), np.maximum(first, best))


def coverages(keys: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Each passage's document's coverage (float32, row for row with KEYS, ascending passage keys, and their SPANS):
    the share of the document's text its first passage spans, up to where its last passage ends."""
    keys, spans = np.asarray(keys, np.int64), np.asarray(spans, np.int64).reshape(-1, 2)
    if not len(keys):
        return np.empty(0, np.float32)
    starts, ends = document_runs(keys)
    share = spans[starts, 1] / np.maximum(spans[ends - 1, 1], 1)
    return np.repeat(np.minimum(share, 1.0), ends - starts).astype(np.float32)
