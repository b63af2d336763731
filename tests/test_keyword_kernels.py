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


@pytest.mark.parametrize("documents", [4000, 150_000])  # one window, and windows of growing width
@pytest.mark.parametrize("count", [1, 10, 60])
def test_max_score_finds_the_best_of_every_document_with_ties_going_to_the_lower_position(documents, count):
    generator = np.random.default_rng(count)
    terms = 6
    norm = np.round(0.3 + 0.9 * generator.random(documents), 1).astype(np.float32)  # few lengths: many ties
    lists = [np.sort(generator.choice(documents, int(share * documents), replace=False)).astype(np.int32)
             for share in (0.01, 0.0375, 0.15, 0.375, 0.75, 0.975)]
    counts = [generator.integers(1, 4, len(held)).astype(np.uint16) for held in lists]
    weights = np.array([3.1, 2.4, 1.5, 0.9, 0.2, 0.05], np.float32)[generator.permutation(terms)]
    dead = np.sort(generator.choice(documents, documents // 13, replace=False)).astype(np.int32)
    exact = np.zeros(documents)  # the query's terms in their own order, float32 each into a float64 sum
    for held, found, weight in zip(lists, counts, weights):
        tf = found.astype(np.float32)
        exact[held] += weight * tf * K1_PLUS_1 / (tf + norm[held])
    exact = exact.astype(np.float32)
    live = np.setdiff1d(np.arange(documents), dead)
    live = live[exact[live] > 0]
    best = live[np.lexsort((live, -exact[live]))][:count]
    assert len(np.unique(exact[live])) < len(live)  # ties exist
    ceilings = weights.astype(np.float64) * float(K1_PLUS_1) * (1 + 1e-5)
    order = np.argsort(ceilings, kind="stable")
    starts = np.cumsum([0] + [len(held) for held in lists])[:-1][order]
    ends = starts + np.array([len(held) for held in lists])[order]
    for floor in (0.0, float(exact[best[-1]])):  # none, and the exact COUNT-th best score
        found, scores = kernels.max_score(np.concatenate(lists), np.concatenate(counts), starts, ends,
                                          weights[order], ceilings[order], order.astype(np.int64), K1_PLUS_1, norm,
                                          dead, count, floor)
        ranked = np.lexsort((found, -scores))
        assert found[ranked].tolist() == best.tolist()
        np.testing.assert_array_equal(scores, exact[found])


def test_the_kernels_compile_where_no_cache_folder_can_be_written(monkeypatch):
    import importlib

    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])  # what a read-only install without a home has
    try:
        fresh = importlib.reload(kernels)
        total = np.zeros(2)
        fresh.add_looked_up(total, np.array([3, 5], np.int32), np.array([1, 3, 4], np.int32),
                            np.array([1, 2, 1], np.uint16), WEIGHT, K1_PLUS_1, np.ones(8, np.float32))
        assert total[1] == 0 and total[0] == pytest.approx(1.7 * 2 * 2.2 / 3)
    finally:
        monkeypatch.undo()
        importlib.reload(kernels)
