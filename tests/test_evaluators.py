"""Evaluators, aggregations, data-folder resolution and the lexical analysis, on small fixed inputs."""

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score
from sklearn.metrics.pairwise import cosine_similarity

from retriever.errors import RetrieverError
from retriever.evaluation import data
from retriever.evaluation.data import PairSubset, resolve_data_dir
from retriever.evaluation.evaluators import (
    cosine_rows,
    embed_pairs,
    evaluate,
    roc_auc_x100,
    spearman_x100,
    sts_records,
)
from retriever.evaluation.lexical import lexical_analysis, word_edit_distances
from retriever.evaluation.registry import get_task

SCORES = np.array([0.91, 0.15, 0.40, 0.40, 0.77, -0.20, 0.05, 0.66])
GOLD = np.array([4.6, 1.0, 2.4, 3.0, 4.0, 0.0, 1.0, 2.2])
LABELS = np.array([1, 0, 0, 1, 1, 0, 1, 0])


def subset(name, labels):
    sent1, sent2 = [f"{name}-a{i}" for i in range(len(labels))], [f"{name}-b{i}" for i in range(len(labels))]
    return PairSubset(name, sent1, sent2, np.asarray(labels))


def test_metrics_equal_scipy_and_sklearn():
    assert spearman_x100(SCORES, GOLD) == pytest.approx(spearmanr(SCORES, GOLD).statistic * 100)
    assert roc_auc_x100(SCORES, LABELS) == pytest.approx(roc_auc_score(LABELS, SCORES) * 100)
    # Hand check of the AUC: 16 positive/negative pairs, the positive scores higher in 11.5 (one tie at 0.40).
    assert roc_auc_x100(SCORES, LABELS) == pytest.approx(11.5 / 16 * 100)


def test_cosine_rows():
    a = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 1.0], [0.0, 0.0]])
    b = np.array([[1.0, 1.0], [-3.0, -4.0], [2.0, 2.0], [1.0, 0.0]])
    np.testing.assert_allclose(cosine_rows(a, b), [1 / np.sqrt(2), -1.0, 1.0, 0.0])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 8)), rng.normal(size=(20, 8))
    np.testing.assert_allclose(cosine_rows(x, y), np.diag(cosine_similarity(x, y)))


def test_evaluate_single_file_tasks_on_fixed_vectors():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(8, 5)), rng.normal(size=(8, 5))
    cosines = np.diag(cosine_similarity(x, y))
    sts = evaluate(get_task("stsb"), [subset("test", GOLD)], [(x, y)])
    assert sts == [
        {"dataset": "stsb", "split": "test", "metric": "spearman", "aggregation": "test",
         "score": pytest.approx(spearmanr(cosines, GOLD).statistic * 100)}
    ]
    qnli = evaluate(get_task("qnli"), [subset("dev", LABELS)], [(x, y)])
    assert qnli == [
        {"dataset": "qnli", "split": "dev", "metric": "auc", "aggregation": "dev",
         "score": pytest.approx(roc_auc_score(LABELS, cosines) * 100)}
    ]


def test_wmean_and_all_aggregations_by_hand():
    # Subset A (3 pairs): similarity follows gold exactly, Spearman +1.
    # Subset B (4 pairs): similarity exactly reverses gold, Spearman -1.
    a = subset("A", [1.0, 2.0, 3.0])
    b = subset("B", [4.0, 3.0, 2.0, 1.0])
    sims = [np.array([0.10, 0.20, 0.30]), np.array([0.05, 0.15, 0.25, 0.35])]
    # wmean = (3 * 1 + 4 * -1) / 7.
    wmean = -100 / 7
    # all: pooled similarity ranks are [2, 4, 6, 1, 3, 5, 7]; pooled gold [1, 2, 3, 4, 3, 2, 1] has tied ranks
    # [1.5, 3.5, 5.5, 7, 5.5, 3.5, 1.5]. Deviations from the mean rank 4 give sum(dx*dy) = -10.5,
    # sum(dx^2) = 28, sum(dy^2) = 26.5, so rho = -10.5 / sqrt(28 * 26.5) ≈ -0.3855.
    pooled = -10.5 / np.sqrt(28 * 26.5) * 100
    records = sts_records("sts12", "test", [a, b], sims, per_subset=True)
    assert [(r["aggregation"], r["score"]) for r in records] == [
        ("wmean", pytest.approx(wmean)),
        ("all", pytest.approx(pooled)),
        ("subset:A", pytest.approx(100.0)),
        ("subset:B", pytest.approx(-100.0)),
    ]
    assert {(r["dataset"], r["split"], r["metric"]) for r in records} == {("sts12", "test", "spearman")}


def test_embed_pairs_embeds_each_distinct_sentence_once():
    vectors = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0]}
    calls = []

    def embed(texts):
        calls.append(list(texts))
        return np.array([vectors[t] for t in texts])

    subsets = [
        PairSubset("x", ["a", "a", "b"], ["b", "c", "c"], np.array([1.0, 2.0, 3.0])),
        PairSubset("y", ["c", "b", "c"], ["a", "a", "c"], np.array([3.0, 1.0, 5.0])),
    ]
    pairs = embed_pairs(subsets, embed)
    assert calls == [["a", "b", "c"]]
    np.testing.assert_array_equal(pairs[0][1], [[0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    np.testing.assert_array_equal(pairs[1][0], [[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]])
    # The callable and the precomputed form give the same records.
    task = get_task("sts12")
    assert evaluate(task, subsets, embed) == evaluate(task, subsets, pairs)


def test_misaligned_inputs_are_rejected():
    with pytest.raises(ValueError, match="3 similarities for 2 pairs"):
        sts_records("stsb", "test", [subset("test", [1.0, 2.0])], [np.zeros(3)])
    with pytest.raises(ValueError, match="embed\\(\\) returned shape"):
        embed_pairs([subset("test", [1.0, 2.0])], lambda texts: np.zeros((1, 4)))


# --- data folder resolution -------------------------------------------------------------------------------


def test_explicit_dir_wins_over_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RETRIEVER_DATA", str(tmp_path / "nowhere"))
    assert resolve_data_dir(str(tmp_path)) == tmp_path


def test_env_var_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("RETRIEVER_DATA", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path


def test_default_dir_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv("RETRIEVER_DATA", raising=False)
    monkeypatch.setattr(data, "DEFAULT_DATA_DIR", tmp_path)
    assert resolve_data_dir(None) == tmp_path


def test_default_is_the_shared_folder_next_to_the_repo():
    repo = data._REPO_ROOT
    assert (repo / "retriever" / "evaluation" / "data.py").is_file()
    assert data.DEFAULT_DATA_DIR == repo.parent / "shared" / "data"


@pytest.mark.parametrize(
    "explicit,env,expected",
    [
        ("missing", None, r"^data folder .*missing is not a folder; pass data_dir or set RETRIEVER_DATA=DIR"),
        (None, "missing", r"^RETRIEVER_DATA points to .*missing is not a folder; pass data_dir or set"),
        (None, None, r"^no evaluation data found: default data folder .*absent is not a folder; pass data_dir"),
    ],
)
def test_missing_data_dir_messages(tmp_path, monkeypatch, explicit, env, expected):
    monkeypatch.setattr(data, "DEFAULT_DATA_DIR", tmp_path / "absent")
    if env:
        monkeypatch.setenv("RETRIEVER_DATA", str(tmp_path / env))
    else:
        monkeypatch.delenv("RETRIEVER_DATA", raising=False)
    with pytest.raises(RetrieverError, match=expected) as error:
        resolve_data_dir(str(tmp_path / explicit) if explicit else None)
    assert "\n" not in str(error.value)


# --- lexical analysis -------------------------------------------------------------------------------------


def test_word_edit_distance_counts_whole_words():
    sent1 = ["A cat sat.", "a cat sat", "the cat sat", "one two three"]
    sent2 = ["a cat sat .", "a dog sat", "a cat sat down", "four"]
    # Case and spacing around punctuation do not count; "cat"->"dog" is 1 edit; "the"->"a" + "down" is 2;
    # 3 substitutions/deletions turn three words into one.
    np.testing.assert_array_equal(word_edit_distances(sent1, sent2), [0, 1, 2, 3])


def test_lexical_analysis():
    sent1 = ["a b c d", "a b c d", "a b c d", "a b c d", "a b c d"]
    sent2 = ["a b c d", "a b c x", "a b y x", "a z y x", "w z y x"]  # distances 0, 1, 2, 3, 4
    gold = np.array([5.0, 4.5, 2.0, 3.0, 0.5])
    lexical = np.array([0.9, 0.8, 0.7, 0.6, 0.5])  # falls exactly with distance
    semantic = np.array([0.2, 0.9, 0.1, 0.5, 0.3])
    result = lexical_analysis(sent1, sent2, gold, {"lexical": lexical, "semantic": semantic})
    distances = np.arange(5)
    assert result == {
        "gold": pytest.approx(spearmanr(gold, distances).statistic * 100),  # -90
        "lexical": pytest.approx(-100.0),
        "semantic": pytest.approx(spearmanr(semantic, distances).statistic * 100),
    }
    assert result["gold"] == pytest.approx(-90.0)
    near = lexical_analysis(sent1, sent2, gold, {"semantic": semantic}, max_distance=2)
    assert near["gold"] == pytest.approx(-100.0)  # gold 5.0, 4.5, 2.0 over distances 0, 1, 2
    assert near["semantic"] == pytest.approx(spearmanr(semantic[:3], distances[:3]).statistic * 100)
