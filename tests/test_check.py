"""The retrieval check: per-query nDCG@10 by the target's rank among the pool, the paired bootstrap, the comparison of candidates."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.calibration.check import CheckSet, compare, paired_bootstrap, score_queries, verdict


def identity(X):
    return np.asarray(X, np.float32)


def test_scores_are_the_targets_rank_in_the_top_ten():
    eye = np.eye(12, dtype=np.float32)
    # query 0 finds its target first; query 1's target is second (a distractor is closer); query 2's is absent
    queries = np.stack([eye[0], eye[1] + 0.9 * eye[2], eye[3]])
    targets = np.stack([eye[0], eye[1], -eye[3]])
    distractors = np.stack([eye[1] + eye[2]] + [eye[i] + 0.01 * eye[3] for i in range(4, 12)])
    check = CheckSet(queries, targets, ["span"] * 3, distractors)
    scores = score_queries(check, identity)
    assert scores.ndcg == pytest.approx([1.0, 1 / np.log2(3), 0.0])
    assert scores.reciprocal_rank == pytest.approx([1.0, 0.5, 0.0])


def test_a_tie_counts_against_the_target_and_the_ranks_are_an_exact_searchs():
    eye = np.eye(12, dtype=np.float32)
    # a distractor that is the target's twin ties with it and ranks ahead: the target second, not first
    twin = CheckSet(eye[:1], eye[:1], ["known-item"], np.stack([eye[0]] + [eye[i] for i in range(1, 12)]))
    assert score_queries(twin, identity).reciprocal_rank == pytest.approx([0.5])
    # a calibration that maps every document to one point gains nothing by it: every target falls below the top 10
    rng = np.random.default_rng(3)
    check = CheckSet(rng.normal(size=(20, 12)), rng.normal(size=(20, 12)), ["span"] * 20, rng.normal(size=(30, 12)))
    assert not score_queries(check, lambda X: np.ones((len(X), 12), np.float32)).ndcg.any()
    # elsewhere, each target's rank is where a flat FAISS inner-product index of the pool puts it
    import faiss

    from retriever.calibration.check import target_ranks
    from retriever.numeric import l2_normalize

    pool = l2_normalize(np.concatenate([check.targets, check.distractors]).astype(np.float32))
    index = faiss.IndexFlatIP(12)
    index.add(pool)
    _, ids = index.search(l2_normalize(check.queries.astype(np.float32)), len(pool))
    assert target_ranks(check, identity).tolist() == [int(np.flatnonzero(row == i)[0]) + 1 for i, row in enumerate(ids)]


def test_counting_stops_past_the_depth_read_and_agrees_with_a_whole_count_up_to_it(monkeypatch):
    import retriever.calibration.check as check_module
    from retriever.calibration.check import DEPTH, count_ahead, paired_scores

    rng = np.random.default_rng(5)
    # Small whole numbers: every product is exact in float32, whatever the matrix shapes a count is taken in, so
    # the counts compare exactly (not only up to rounding at the tie's edge).
    pool = rng.integers(-3, 4, size=(700, 8)).astype(np.float32)
    # queries near their targets (the first 300 rows), some near enough to be found, most not
    queries = (pool[:300] + rng.integers(-3, 4, size=(300, 8)) * (rng.random((300, 1)) < 0.5)).astype(np.float32)
    own = paired_scores(queries, pool[:300])
    whole = count_ahead(queries, own, pool, leave_out_own=True)
    assert (whole < DEPTH).any() and (whole > 5 * DEPTH).any()
    # queries and the pool's rows taken a few at a time: the target's own row falls in every part of the pool
    monkeypatch.setattr(check_module, "BLOCK", 7)
    monkeypatch.setattr(check_module, "POOL_ROWS", 64)
    assert np.array_equal(count_ahead(queries, own, pool, leave_out_own=True), whole)
    capped = count_ahead(queries, own, pool, leave_out_own=True, cap=DEPTH)
    assert np.array_equal(np.minimum(capped, DEPTH + 1), np.minimum(whole, DEPTH + 1))
    assert (capped < whole).any()  # it stopped counting somewhere


def test_scores_use_the_calibrator_on_queries_and_pool_alike():
    # meaning is isotropic; the stored vectors stretch it unequally and shift it into a cone
    rng = np.random.default_rng(0)
    scales = np.geomspace(50, 0.5, 8)
    meaning = rng.normal(size=(400, 8))

    def look(rows):
        return rows * scales + 40

    check = CheckSet(look(meaning[:100] + 0.3 * rng.normal(size=(100, 8))), look(meaning[:100]), ["span"] * 100,
                     look(meaning[100:]))
    raw = score_queries(check, identity).ndcg.mean()
    undone = score_queries(check, lambda X: ((X - 40) / scales).astype(np.float32)).ndcg.mean()
    assert undone > 0.95 and raw < 0.8


def test_the_bootstrap_interval_covers_the_mean_and_narrows_with_more_queries():
    rng = np.random.default_rng(1)
    few, many = rng.normal(0.3, 1, 100), rng.normal(0.3, 1, 10_000)
    narrow = paired_bootstrap(many, np.array(["span"] * len(many)), 0.95)
    wide = paired_bootstrap(few, np.array(["span"] * len(few)), 0.95)
    assert narrow[0] < many.mean() < narrow[1] and narrow[0] > 0
    assert wide[1] - wide[0] > 5 * (narrow[1] - narrow[0])


def test_the_bootstrap_keeps_each_kinds_share():
    # one kind always +1, the other always -1: any resample within kinds has mean exactly (1 * 30 - 70) / 100
    differences = np.r_[np.ones(30), -np.ones(70)]
    kinds = np.array(["title"] * 30 + ["span"] * 70)
    assert paired_bootstrap(differences, kinds, 0.95) == pytest.approx((-0.4, -0.4))


def test_more_candidates_widen_every_interval():
    rng = np.random.default_rng(2)
    base = rng.normal(size=(300, 6)).astype(np.float32)
    check = CheckSet(base + 0.5 * rng.normal(size=base.shape), base, ["span"] * 300, rng.normal(size=(500, 6)))
    baseline = score_queries(check, identity)
    candidate = score_queries(check, lambda X: np.asarray(X) * [1, 1, 1, 1, 0.3, 0.3])
    (alone,) = compare(check, baseline, [("c", candidate)])
    crowded = compare(check, baseline, [("c", candidate)] * 5)[0]
    assert crowded.difference == alone.difference
    assert crowded.low < alone.low and crowded.high > alone.high
    assert alone.record()["interval"] == [round(100 * alone.low, 2), round(100 * alone.high, 2)]


def test_a_round_of_a_check_settles_only_a_clear_answer():
    # shown at the interim confidence: settled, yes
    assert verdict(shown_low=0.01, low=0.02, high=0.06, size=250, planned=2000) is True
    # a candidate clearly worse (its upper end, were it the truth, too little for all 2,000 to show): settled, no
    assert verdict(shown_low=-0.07, low=-0.06, high=-0.01, size=250, planned=2000) is False
    assert verdict(shown_low=-0.05, low=-0.04, high=0.005, size=250, planned=2000) is False  # 0.005 < 0.0225 / sqrt(8)
    # borderline, above 0 or a little below: read on
    assert verdict(shown_low=-0.02, low=-0.01, high=0.03, size=250, planned=2000) is None
    assert verdict(shown_low=-0.05, low=-0.04, high=0.02, size=250, planned=2000) is None
