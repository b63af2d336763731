"""The hybrid check (`retriever.search.fusion_check`): each side on the corpus's pseudo-queries, and the weight."""

import numpy as np
import pytest

from retriever.calibration.check import CheckSet
from retriever.corpus import Document
from retriever.defaults import DEFAULT_FUSION, DEFAULT_WEIGHT
from retriever.index import Index
from retriever.search.fusion_check import (
    DENSE_LEANING_WEIGHT,
    EVEN_WEIGHT,
    MIN_QUERIES,
    PoolBM25,
    decision,
    WEIGHTS,
    hybrid_check,
    query_results,
    recorded_hybrid,
)
from retriever.numeric import l2_normalize_in_place
from retriever.search.fusion import make_fusion, scored_candidates, top_list
from retriever.search.options import SearchOptions

WORDS = [f"w{i:03d}" for i in range(400)]


def check_set(dense_finds: bool | list[bool], words_find: bool | list[bool], kinds: list[str],
              seed: int = 0) -> CheckSet:
    """A check set of one query per target: its vector is its target's (DENSE_FINDS, for all or per query) or
    noise, and its words are its target's own rare ones (WORDS_FIND) or words no document holds."""
    rng = np.random.default_rng(seed)
    count, dim = len(kinds), 16
    dense_finds = np.broadcast_to(dense_finds, count)
    words_find = np.broadcast_to(words_find, count)
    targets = rng.standard_normal((count, dim)).astype(np.float32)
    distractors = rng.standard_normal((200, dim)).astype(np.float32)
    queries = np.where(dense_finds[:, None], targets + 0.05 * rng.standard_normal((count, dim)),
                       rng.standard_normal((count, dim))).astype(np.float32)
    texts = [" ".join(rng.choice(WORDS[:300], 8, replace=False)) + f" unique{i}x unique{i}y" for i in range(count)]
    pool = texts + [" ".join(rng.choice(WORDS[:300], 8, replace=False)) for _ in range(200)]
    query_texts = [f"unique{i}x unique{i}y" if words_find[i] else f"absent{i} nowhere{i}" for i in range(count)]
    return CheckSet(queries, targets, kinds, distractors, query_texts, pool)


def kinds(meaning: int, known: int) -> list[str]:
    return ["span"] * meaning + ["known-item"] * known


def identity(x: np.ndarray) -> np.ndarray:
    return x


def test_pool_bm25_ranks_as_bm25_does():
    bm25 = PoolBM25(["apple banana", "apple apple cherry", "cherry date elderberry fig", "grape"])
    scores = bm25.scores("apple")
    assert scores[1] > scores[0] > 0 and scores[2] == scores[3] == 0  # more occurrences, shorter text: higher
    rare = bm25.scores("grape")
    common = bm25.scores("cherry")
    assert rare.max() > common.max()  # a rarer term weighs more (idf)
    assert not bm25.scores("nothing here").any()


def test_pool_bm25_is_the_keyword_indexs_bm25_text_by_text():
    """Tokenized all at once (one FTS5 table), the pool scores exactly as BM25 over each text's own terms does."""
    from retriever.demo_corpus import documents
    from retriever.store.keywords import B, K1, Tokenizer

    texts = [f"{d['title']} {d['text']}" for d in documents(200)]
    pool = PoolBM25(texts)
    tokenize = Tokenizer.get()
    terms = [tokenize(text) for text in texts]
    lengths = np.array([sum(t.values()) for t in terms], np.float64)
    for query in ("read a file line by line", "random number generator", "zzz nothing"):
        expected = np.zeros(len(texts))
        for term, count in tokenize(query).items():
            held = [i for i, t in enumerate(terms) if term in t]
            idf = np.log1p((len(texts) - len(held) + 0.5) / (len(held) + 0.5))
            for i in held:
                tf = terms[i][term]
                expected[i] += count * idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * lengths[i] / lengths.mean()))
        assert np.allclose(pool.scores(query), expected, rtol=1e-5, atol=1e-6), query


def reference_ndcg(scores: np.ndarray, keys: np.ndarray, target: int) -> float:
    """nDCG@10 of TARGET as a search ranks it: the top 10 by `fusion.top_list`, then where the target is."""
    order = keys[top_list(scores, keys, 10)].tolist()
    return 1.0 / np.log2(order.index(target) + 2) if target in order else 0.0


def test_each_pseudo_querys_ndcg_is_its_targets_place_in_the_searchs_own_top_lists():
    # Vectors and words drawn from few values, so that many documents tie on both sides and the ties decide
    rng = np.random.default_rng(3)
    count, dim = 40, 4
    targets = rng.integers(-1, 2, (count, dim)).astype(np.float32)
    distractors = rng.integers(-1, 2, (160, dim)).astype(np.float32)
    queries = np.where(rng.random((count, 1)) < 0.5, targets, rng.integers(-1, 2, (count, dim))).astype(np.float32)
    pool_texts = [" ".join(rng.choice(WORDS[:6], 3)) for _ in range(count + 160)]
    query_texts = [" ".join(rng.choice(WORDS[:8], 2)) for _ in range(count)]
    check = CheckSet(queries.copy(), targets, ["span"] * count, distractors, query_texts, pool_texts)
    found = query_results(check, identity)

    pool = l2_normalize_in_place(np.concatenate([targets, distractors]))
    keys = np.arange(len(pool))
    fusion, bm25 = make_fusion(DEFAULT_FUSION), PoolBM25(pool_texts)
    for number, dense in enumerate(l2_normalize_in_place(queries.copy()) @ pool.T):  # one batch, as scored there
        keyword = bm25.scores(query_texts[number])
        assert found["dense"][number] == reference_ndcg(dense, keys, number)
        assert found["keyword"][number] == (reference_ndcg(keyword, keys, number) if keyword.any() else 0.0)
        candidates = scored_candidates(dense, keyword, 100)
        for weight in WEIGHTS:
            assert found[f"{fusion.name}@{weight}"][number] == reference_ndcg(
                fusion.scores(candidates, weight), candidates.rowids, number)
    assert 0 < found["dense"].mean() < 1 and 0 < found["keyword"].mean() < 1  # ties were there to break


def test_a_dense_side_that_finds_nothing_gives_both_sides_the_same_weight():
    made = hybrid_check(check_set(dense_finds=False, words_find=True, kinds=kinds(60, 60)), identity)
    assert made["weight"] == EVEN_WEIGHT and "encoder reads this corpus poorly" in made["reason"]
    meaning = made["evidence"]["groups"]["meaning"]
    assert meaning["queries"] == 60 and meaning["dense_minus_keyword"]["interval"][1] < 0
    assert meaning["ndcg@10"]["keyword"] == 100.0


def test_a_keyword_side_that_finds_nothing_lets_the_dense_side_lead():
    made = hybrid_check(check_set(dense_finds=True, words_find=False, kinds=kinds(60, 60)), identity)
    assert made["weight"] == DENSE_LEANING_WEIGHT and "keyword side reads this corpus poorly" in made["reason"]
    assert made["evidence"]["groups"]["known-item"]["ndcg@10"]["dense"] == 100.0


def test_dense_search_better_on_meaning_and_keywords_on_known_items_keep_the_measured_default():
    # as on the corpora the default was measured on: the meaning queries' words miss, the known items' vectors miss
    made = hybrid_check(check_set(dense_finds=[True] * 60 + [False] * 60, words_find=[False] * 60 + [True] * 60,
                                  kinds=kinds(60, 60)), identity)
    assert made["weight"] == DEFAULT_WEIGHT and "measured default" in made["reason"]
    assert made["evidence"]["groups"]["meaning"]["ndcg@10"][f"{DEFAULT_FUSION}@0.7"] == 100.0


def test_dense_search_not_shown_better_on_meaning_gives_both_sides_the_same_weight():
    # both sides find every target: dense reads meaning no better than keywords here
    made = hybrid_check(check_set(dense_finds=True, words_find=True, kinds=kinds(60, 60)), identity)
    assert made["weight"] == EVEN_WEIGHT and "not shown better than keywords" in made["reason"]


def gaps(meaning: list[float], known: list[float]) -> dict:
    def group(interval):
        return {"queries": 100, "dense_minus_keyword": {"difference": sum(interval) / 2, "interval": interval}}
    return {"pseudo_queries": 200, "groups": {"meaning": group(meaning), "known-item": group(known)}}


@pytest.mark.parametrize("meaning, known, weight", [
    ([-3.0, -1.0], [-30.0, -20.0], EVEN_WEIGHT),  # dense loses on meaning
    ([-0.5, 1.5], [-30.0, -20.0], EVEN_WEIGHT),  # dense not shown better on meaning
    ([0.0, 2.0], [-30.0, -20.0], EVEN_WEIGHT),  # an interval reaching 0 shows nothing
    ([0.5, 2.0], [-30.0, -20.0], DEFAULT_WEIGHT),  # as where the default was measured
    ([2.0, 5.0], [1.0, 3.0], DENSE_LEANING_WEIGHT),  # keywords lose even on known items
    ([-0.5, 1.5], [1.0, 3.0], EVEN_WEIGHT),  # neither side shown better: the same share
])
def test_the_rule_reads_the_intervals(meaning, known, weight):
    assert decision(gaps(meaning, known))["weight"] == weight


def test_too_few_pseudo_queries_move_nothing():
    made = hybrid_check(check_set(dense_finds=False, words_find=True, kinds=kinds(MIN_QUERIES - 1, 60)), identity)
    assert made["weight"] == DEFAULT_WEIGHT and "too few" in made["reason"]
    assert "dense_minus_keyword" not in made["evidence"]["groups"]["meaning"]
    assert decision(None)["weight"] == DEFAULT_WEIGHT and "not checked" in decision(None)["reason"]
    # no texts (vectors given alone) or no check: the default, said so
    bare = check_set(True, True, kinds(40, 40))
    bare.query_texts = bare.pool_texts = None
    assert hybrid_check(bare, identity) == decision(None) == hybrid_check(None, identity)


def test_the_check_uses_the_calibrators_space():
    check = check_set(dense_finds=True, words_find=False, kinds=kinds(60, 60))
    scrambled = hybrid_check(check, lambda x: np.sin(97 * x))  # a map that keeps no neighbourhood
    assert scrambled["evidence"]["groups"]["known-item"]["ndcg@10"]["dense"] < 20


def test_a_search_takes_the_recorded_weight_unless_it_names_one():
    recorded = {"fusion": "zscore", "weight": EVEN_WEIGHT, "reason": "test"}
    assert SearchOptions().resolved("i", True, recorded).dense_weight == EVEN_WEIGHT
    assert SearchOptions(weight=0.8).resolved("i", True, recorded).dense_weight == 0.8
    assert SearchOptions(mode="dense").resolved("i", True, recorded).weight is None
    assert SearchOptions().resolved("i", True, None).dense_weight == DEFAULT_WEIGHT
    assert recorded_hybrid(None)["weight"] == DEFAULT_WEIGHT and "before" in recorded_hybrid(None)["reason"]


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert):
    """An index built with auto on 300 real documents."""
    from retriever.demo_corpus import documents

    home = tmp_path_factory.mktemp("hybrid") / "indexes"
    docs = [Document(d["_id"], d["text"], d.get("title"), "", n) for n, d in enumerate(documents(300), start=1)]
    Index.build(docs, "docs", home, model=str(tiny_bert), device="cpu")
    return home


def test_an_index_searches_with_the_weight_its_manifest_records(built):
    with Index.open("docs", built, device="cpu") as index:
        hybrid = index.snapshot.manifest.hybrid
        assert hybrid["evidence"]["pseudo_queries"] > 0
        weight = hybrid["weight"]
        default = index.search("read a file", 10)
        named = index.search("read a file", 10, weight=weight)
        other = index.search("read a file", 10, weight=0.0)
        assert [h.doc_id for h in default] == [h.doc_id for h in named]
        assert [h.score for h in default] == [h.score for h in named]
        assert [h.score for h in default] != [h.score for h in other]
        assert index.info()["hybrid"] == hybrid
