"""The compiled BM25 loops give NumPy's numbers exactly: documents looked up, runs of passages, MaxScore's best."""

import numpy as np
import pytest

from retriever.store import keyword_kernels as kernels

WEIGHT, K1_PLUS_1 = np.float32(1.7), np.float32(2.2)


def exact_scores(lists, counts, weights, norm, documents):
    """Every document's score, the terms in their own order, float32 each into a float64 sum (as the kernels)."""
    exact = np.zeros(documents)
    for held, found, weight in zip(lists, counts, weights):
        tf = found.astype(np.float32)
        exact[held] += weight * tf * K1_PLUS_1 / (tf + norm[held])
    return exact


@pytest.fixture
def postings():
    generator = np.random.default_rng(11)
    documents = 5000
    norm = (0.3 + 0.9 * generator.random(documents)).astype(np.float32)
    lists = [np.sort(generator.choice(documents, size, replace=False)).astype(np.int32) for size in (40, 1200, 4900)]
    counts = [generator.integers(1, 9, len(held)).astype(np.uint16) for held in lists]
    weights = np.array([2.5, 1.1, 0.1], np.float32)
    starts = np.cumsum([0] + [len(held) for held in lists])[:-1].astype(np.int64)
    ends = starts + np.array([len(held) for held in lists], np.int64)
    arrays = (np.concatenate(lists), np.concatenate(counts), starts, ends, weights)
    return generator, documents, norm, arrays, exact_scores(lists, counts, weights, norm, documents)


def test_scores_at_given_documents_are_the_sums_of_their_terms_contributions(postings):
    generator, documents, norm, arrays, exact = postings
    wanted = np.sort(generator.choice(documents, 900, replace=False)).astype(np.int32)
    total = kernels.scores_at(*arrays, K1_PLUS_1, norm, wanted)
    assert (exact[wanted] == 0).any() and (exact[wanted] > 0).any()
    np.testing.assert_array_equal(total, exact[wanted])


def test_best_in_runs_takes_each_runs_best_and_the_first_unit_reaching_it(postings):
    generator, documents, norm, arrays, exact = postings
    # Runs of units, some empty (a document that is one passage has none).
    lows = np.array([10, 20, 20, 100, 4990], np.int64)
    highs = np.array([14, 20, 60, 100, 5000], np.int64)
    rounded = exact.astype(np.float32)
    best, units = kernels.best_in_runs(*arrays, K1_PLUS_1, norm, lows, highs)
    for run, (low, high) in enumerate(zip(lows, highs)):
        scores = rounded[low:high]
        if not len(scores) or scores.max() == 0:
            assert (best[run], units[run]) == (0, -1)
        else:
            assert best[run] == scores.max() and units[run] == low + int(np.argmax(scores))
    assert (units >= 0).sum() >= 2


def test_best_in_runs_gives_a_tie_to_the_first_unit_reaching_the_best():
    norm = np.full(10, 0.8, np.float32)  # units alike: equal counts score equal
    positions, counts = np.array([2, 3, 5, 6, 8], np.int32), np.array([1, 2, 2, 1, 2], np.uint16)
    arrays = (positions, counts, np.array([0], np.int64), np.array([5], np.int64), np.array([1.5], np.float32))
    best, units = kernels.best_in_runs(*arrays, K1_PLUS_1, norm, np.array([0, 4], np.int64), np.array([4, 10], np.int64))
    assert units.tolist() == [3, 5]  # 3 and 5 tie in their runs with 8: the first wins
    assert best[0] == best[1] == np.float32(exact_scores([positions], [counts], [1.5], norm, 10)[3])


@pytest.mark.parametrize("documents", [4000, 150_000])  # one window, and windows of growing width
@pytest.mark.parametrize("count", [1, 10, 60])
def test_max_score_finds_the_best_of_every_document_with_ties_going_to_the_lower_position(documents, count):
    """Whole, and in three slices side by side, merged (`keywords.max_score_in_slices`)."""
    from retriever.store import keywords
    generator = np.random.default_rng(count)
    terms = 6
    norm = np.round(0.3 + 0.9 * generator.random(documents), 1).astype(np.float32)  # few lengths: many ties
    lists = [np.sort(generator.choice(documents, int(share * documents), replace=False)).astype(np.int32)
             for share in (0.01, 0.0375, 0.15, 0.375, 0.75, 0.975)]
    counts = [generator.integers(1, 4, len(held)).astype(np.uint16) for held in lists]
    weights = np.array([3.1, 2.4, 1.5, 0.9, 0.2, 0.05], np.float32)[generator.permutation(terms)]
    dead = np.sort(generator.choice(documents, documents // 13, replace=False)).astype(np.int32)
    exact = exact_scores(lists, counts, weights, norm, documents).astype(np.float32)
    live = np.setdiff1d(np.arange(documents), dead)
    live = live[exact[live] > 0]
    best = live[np.lexsort((live, -exact[live]))][:count]
    assert len(np.unique(exact[live])) < len(live)  # ties exist
    ceilings = weights.astype(np.float64) * float(K1_PLUS_1) * (1 + 1e-5)
    order = np.argsort(ceilings, kind="stable")
    starts = np.cumsum([0] + [len(held) for held in lists])[:-1][order]
    ends = starts + np.array([len(held) for held in lists])[order]
    for floor in (0.0, float(exact[best[-1]])):  # none, and the exact COUNT-th best score
        arguments = (np.concatenate(lists), np.concatenate(counts), starts, ends, weights[order], ceilings[order],
                     order.astype(np.int64), K1_PLUS_1, norm, dead, count, floor)
        for found, scores in (kernels.max_score(*arguments, 0, documents),
                              keywords.max_score_in_slices(arguments, [0, documents // 5, documents // 2, documents])):
            ranked = np.lexsort((found, -scores))
            assert found[ranked].tolist() == best.tolist()
            np.testing.assert_array_equal(scores, exact[found])


def test_the_kernels_compile_where_no_cache_folder_can_be_written(monkeypatch):
    import importlib

    from numba.core import caching

    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])  # what a read-only install without a home has
    try:
        fresh = importlib.reload(kernels)
        total = fresh.scores_at(np.array([1, 3, 4], np.int32), np.array([1, 2, 1], np.uint16), np.array([0], np.int64),
                                np.array([3], np.int64), np.array([WEIGHT]), K1_PLUS_1, np.ones(8, np.float32),
                                np.array([3, 5], np.int32))
        assert total[1] == 0 and total[0] == pytest.approx(1.7 * 2 * 2.2 / 3)
    finally:
        monkeypatch.undo()
        importlib.reload(kernels)


def test_slices_merged_give_a_tie_to_the_lower_position():
    """Every document scoring alike, searched in three slices: the best are the first documents, as one search
    over the whole segment finds them."""
    from retriever.store import keywords

    documents, count = 3000, 10
    positions, counts = np.arange(documents, dtype=np.int32), np.ones(documents, np.uint16)
    arguments = (positions, counts, np.array([0], np.int64), np.array([documents], np.int64),
                 np.array([WEIGHT], np.float32), np.array([WEIGHT * float(K1_PLUS_1) * (1 + 1e-5)]),
                 np.array([0], np.int64), K1_PLUS_1, np.ones(documents, np.float32), np.array([5], np.int32), count,
                 0.0)
    found, scores = keywords.max_score_in_slices(arguments, [0, 1000, 2000, documents])
    assert sorted(found.tolist()) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10]  # 5 is deleted
    assert len(set(scores.tolist())) == 1
