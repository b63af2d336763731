"""The compiled BM25 loops give NumPy's numbers exactly: sorted or unsorted positions, present or not."""

import numpy as np
import pytest

from retriever.store import keyword_kernels as kernels

WEIGHT, K1_PLUS_1 = np.float32(1.7), np.float32(2.2)


def contribution(counts: np.ndarray, norm: np.ndarray) -> np.ndarray:
    tf = counts.astype(np.float32)
    return WEIGHT * tf * K1_PLUS_1 / (tf + norm)


@pytest.fixture
def segment():
    generator = np.random.default_rng(7)
    documents = 5000
    norm = (0.3 + 0.9 * generator.random(documents)).astype(np.float32)
    held = np.sort(generator.choice(documents, 1200, replace=False)).astype(np.int32)
    counts = generator.integers(1, 9, len(held)).astype(np.uint16)
    return generator, documents, norm, held, counts


@pytest.mark.parametrize("order", ["ascending", "shuffled", "descending"])
def test_looked_up_contributions_match_a_search_in_the_postings(segment, order):
    generator, documents, norm, held, counts = segment
    positions = np.sort(generator.choice(documents, 900, replace=False)).astype(np.int32)
    positions = {"ascending": positions, "shuffled": generator.permutation(positions),
                 "descending": positions[::-1].copy()}[order]
    at = np.minimum(np.searchsorted(held, positions), len(held) - 1)
    hit = held[at] == positions
    expected = np.zeros(len(positions))
    expected[hit] += contribution(counts[at[hit]], norm[positions[hit]])
    total = np.zeros(len(positions))
    kernels.add_looked_up(total, positions, held, counts, WEIGHT, K1_PLUS_1, norm)
    assert hit.any() and not hit.all()
    np.testing.assert_array_equal(total, expected)
    dense = np.zeros(documents, np.uint16)
    dense[held] = counts
    by_count = np.zeros(len(positions))
    kernels.add_counted(by_count, positions, dense, WEIGHT, K1_PLUS_1, norm)
    np.testing.assert_array_equal(by_count, expected)


def test_summed_postings_touch_each_live_document_once_and_keep_those_in_reach(segment):
    generator, documents, norm, held, counts = segment
    other = np.sort(generator.choice(documents, 800, replace=False)).astype(np.int32)
    other_counts = generator.integers(1, 4, len(other)).astype(np.uint16)
    dead = np.array([held[0], other[-1]], np.int32)
    sums = np.zeros(documents)
    sums[dead] = -np.inf
    touched = np.empty(len(held) + len(other), np.int32)
    count = kernels.add_postings(sums, touched, 0, held, counts, WEIGHT, K1_PLUS_1, norm)
    count = kernels.add_postings(sums, touched, count, other, other_counts, WEIGHT, K1_PLUS_1, norm)
    expected = np.zeros(documents)
    expected[held] += contribution(counts, norm[held])
    expected[other] += contribution(other_counts, norm[other])
    live = np.setdiff1d(np.union1d(held, other), dead)
    assert np.array_equal(np.sort(touched[:count]), live)
    minimum = float(np.median(expected[live]))
    chosen, values = kernels.in_reach(touched[:count], sums, minimum)
    assert np.array_equal(np.sort(chosen), live[expected[live] >= minimum])
    np.testing.assert_array_equal(values, expected[chosen])
