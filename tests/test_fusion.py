"""The fusions (retriever.search.fusion): each formula on hand-made candidates, the weight's two ends, and top lists that
do not depend on the order documents arrive in."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.search.fusion import Candidates, Fusion, make_fusion, top_list


def candidates() -> Candidates:
    # rows 10, 11, 12, 13: 10 is first in dense only, 11 first in keyword only, 12 second in both, 13 in neither list
    return Candidates(rowids=np.array([10, 11, 12, 13]), dense=np.array([0.9, 0.2, 0.7, 0.1], np.float32),
                      keyword=np.array([0.0, 9.0, 5.0, 1.0], np.float32), dense_rank=np.array([1, 0, 2, 0]),
                      keyword_rank=np.array([0, 1, 2, 0]), dense_null=(0.1, 0.2), keyword_null=(0.5, 2.0))


def test_reciprocal_rank_fusion_adds_each_listed_side():
    scores = make_fusion("rrf").scores(candidates(), 0.5)
    assert scores == pytest.approx([0.5 / 61, 0.5 / 61, 0.5 / 62 + 0.5 / 62, 0.0])
    assert make_fusion("rrf").scores(candidates(), 1.0) == pytest.approx([1 / 61, 0, 1 / 62, 0])


def test_zscore_standardises_each_side_by_its_own_listed_scores():
    scores = make_fusion("zscore").scores(candidates(), 0.25)
    dense = (np.array([0.9, 0.2, 0.7, 0.1]) - 0.8) / 0.1  # listed dense: 0.9, 0.7
    keyword = (np.array([0.0, 9.0, 5.0, 1.0]) - 7.0) / 2.0  # listed keyword: 9, 5
    assert scores == pytest.approx(0.25 * dense + 0.75 * keyword, rel=1e-5)


def test_zscore_union_standardises_both_sides_over_the_same_candidates():
    scores = make_fusion("zscore-union").scores(candidates(), 0.25)
    dense, keyword = np.array([0.9, 0.2, 0.7, 0.1]), np.array([0.0, 9.0, 5.0, 1.0])
    expected = 0.25 * (dense - dense.mean()) / dense.std() + 0.75 * (keyword - keyword.mean()) / keyword.std()
    assert scores == pytest.approx(expected, rel=1e-5)


def test_zscore_union_gives_a_side_that_scores_every_candidate_alike_no_say():
    """No query word occurs in any candidate (the keyword side's scores are all 0): the dense side alone orders
    them, at any weight, and nothing is divided by a vanishing spread."""
    found = Candidates(np.array([1, 2, 3]), np.array([0.2, 0.6, 0.4], np.float32), np.zeros(3, np.float32),
                       np.array([3, 1, 2]), np.zeros(3, int))
    fused = make_fusion("zscore-union").scores(found, 0.3)
    assert np.argsort(-fused).tolist() == [1, 2, 0] and np.all(np.abs(fused) < 10)


def test_null_reads_each_score_against_its_distribution_over_the_index():
    scores = make_fusion("null").scores(candidates(), 0.5)
    expected = 0.5 * (np.array([0.9, 0.2, 0.7, 0.1]) - 0.1) / 0.2 + 0.5 * (np.array([0, 9, 5, 1]) - 0.5) / 2.0
    assert scores == pytest.approx(expected, rel=1e-5)
    assert make_fusion("null").needs_null and not make_fusion("zscore").needs_null


@pytest.mark.parametrize("name", sorted(Fusion.registry))
def test_weight_one_is_the_dense_order_and_zero_the_keyword_order(name):
    found = candidates()
    dense_first = np.argsort(-make_fusion(name).scores(found, 1.0), kind="stable")[:2]
    keyword_first = np.argsort(-make_fusion(name).scores(found, 0.0), kind="stable")[:2]
    assert found.rowids[dense_first].tolist() == [10, 12] and found.rowids[keyword_first].tolist() == [11, 12]


@pytest.mark.parametrize("name", sorted(Fusion.registry))
def test_scores_at_several_weights_are_each_weights_own(name):
    fusion, weights = make_fusion(name), (0.0, 0.3, 0.5, 0.9, 1.0)
    for weight, fused in zip(weights, fusion.scores_by_weight(candidates(), weights)):
        assert np.array_equal(fused, fusion.scores(candidates(), weight))


def test_a_side_with_nothing_listed_leaves_the_other_to_decide():
    found = Candidates(np.array([1, 2]), np.array([0.3, 0.6], np.float32), np.zeros(2, np.float32),
                       np.array([2, 1]), np.zeros(2, int))
    for name in Fusion.registry:
        assert np.argmax(make_fusion(name).scores(found, 0.5)) == 1


def test_top_lists_break_ties_by_row_id_whatever_the_order():
    scores = np.array([1.0, 3.0, 3.0, 2.0, 3.0], np.float32)
    keys = np.array([50, 40, 30, 20, 10])
    assert keys[top_list(scores, keys, 2)].tolist() == [10, 30]
    shuffled = np.array([4, 2, 0, 3, 1])
    assert keys[shuffled][top_list(scores[shuffled], keys[shuffled], 4)].tolist() == [10, 30, 40, 20]
    assert top_list(scores, keys, 10).tolist() == [4, 2, 1, 3, 0]


def test_unknown_fusions_are_refused():
    with pytest.raises(RetrieverError, match="unknown fusion 'max'; known: null, rrf, zscore"):
        make_fusion("max")


def test_zscore_with_one_keyword_match_keeps_the_scores_on_one_scale():
    """A narrow filter or a rare word leaves one document in the keyword list: its spread is zero, and dividing by
    a floor of 1e-6 made every other candidate's fused score about -500,000. The candidates' spread is used instead."""
    candidates = Candidates(rowids=np.array([1, 2, 3]), dense=np.array([0.7, 0.1, 0.08], np.float32),
                            keyword=np.array([1.8, 0.0, 0.0], np.float32), dense_rank=np.array([1, 2, 3]),
                            keyword_rank=np.array([1, 0, 0]))
    fused = make_fusion("zscore").scores(candidates, 0.7)
    assert np.all(np.abs(fused) < 10) and fused[0] > fused[1] > fused[2]
