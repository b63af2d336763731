"""Retrieval evaluation: BEIR-style sets, metrics checked against trec_eval (pytrec_eval), the index path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pytrec_eval

from retriever.errors import RetrieverError
from retriever.evaluation.retrieval import (RetrievalSet, evaluate_run, evaluate_through_index, load_beir, per_query,
                                            ranked)
from retriever.evaluation.retrieval_tasks import duplicate_retrieval, qnli_retrieval


def reference(run, qrels) -> dict[str, float]:
    """trec_eval's nDCG@10 and Recall@100, and recip_rank over the top 10 (MRR@10), x100, via pytrec_eval."""
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"})
    scores = evaluator.evaluate(run)
    top10 = {q: {d: docs[d] for d in ranked(docs, q, ignore_identical=False)[:10]} for q, docs in run.items()}
    reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    queries = list(qrels)
    mean = lambda values: 100 * float(np.mean(values))  # noqa: E731
    return {"ndcg@10": mean([scores.get(q, {}).get("ndcg_cut_10", 0.0) for q in queries]),
            "recall@100": mean([scores.get(q, {}).get("recall_100", 0.0) for q in queries]),
            "mrr@10": mean([reciprocal.get(q, {}).get("recip_rank", 0.0) for q in queries])}


def random_case(seed: int):
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(300)]
    qrels = {f"q{i}": {str(d): int(g) for d, g in zip(rng.choice(docs, rng.integers(1, 6), replace=False),
                                                          rng.integers(1, 4, 6))} for i in range(40)}
    # Scores rounded to 2 decimals, so ties happen and their order is tested too.
    run = {q: {str(d): float(np.round(s, 2)) for d, s in zip(rng.choice(docs, 150, replace=False), rng.random(150))}
           for q in list(qrels)[:37]}  # three queries retrieve nothing
    for q in list(run)[:10]:  # plant some relevant documents high up
        for d in list(qrels[q])[:2]:
            run[q][d] = 1.5
    return run, qrels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_trec_eval_on_fixed_runs(seed):
    run, qrels = random_case(seed)
    ours, theirs = evaluate_run(run, qrels, ignore_identical=False), reference(run, qrels)
    for metric in theirs:
        assert ours[metric] == pytest.approx(theirs[metric], abs=1e-9), metric


def test_per_query_scores_follow_the_qrels_order_and_skip_queries_without_a_relevant_document():
    run, qrels = random_case(0)
    qrels["unjudged"] = {"d1": 0}  # no relevant document: not a query of the mean, nor of the per-query scores
    scores = per_query(run, qrels, ignore_identical=False)
    single = per_query({"q5": run["q5"]}, {"q5": qrels["q5"]}, ignore_identical=False)
    assert len(scores["ndcg@10"]) == 40 and scores["ndcg@10"][5] == single["ndcg@10"][0]
    assert scores["mrr@10"][-1] == 0.0  # q39 retrieves nothing
    ours = evaluate_run(run, qrels, ignore_identical=False)
    assert {metric: float(values.mean()) for metric, values in scores.items()} == ours


def test_a_hit_identical_to_the_query_is_ignored():
    qrels = {"a": {"b": 1}}
    run = {"a": {"a": 0.99, "x": 0.5, "b": 0.4}}
    assert evaluate_run(run, qrels)["mrr@10"] == pytest.approx(50.0)  # b is second once a itself is dropped
    assert evaluate_run(run, qrels, ignore_identical=False)["mrr@10"] == pytest.approx(100 / 3)


def test_load_beir_reads_graded_qrels_and_skips_unjudged(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"_id": "d1", "title": "T", "text": "one"}, {"_id": "d2", "text": "two"}, {"_id": 3, "text": "three"}]))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "first"}) + "\n"
                                            + json.dumps({"_id": "q2", "text": "second"}) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\t3\t1\nq2\td2\t0\n")
    loaded = load_beir(tmp_path)
    assert loaded.qrels == {"q1": {"d1": 2, "3": 1}} and loaded.queries == {"q1": "first"}
    assert loaded.corpus["d1"] == ("T", "one") and loaded.corpus["d2"] == (None, "two")
    with pytest.raises(RetrieverError, match="not a BEIR folder: no qrels/dev.tsv"):
        load_beir(tmp_path, split="dev")
    for score in ("1.5", "abc", ""):  # a traceback from int() (a QA run)
        (tmp_path / "qrels" / "test.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t{score}\n")
        with pytest.raises(RetrieverError, match=f"test.tsv line 3: the score must be a whole number \\(got '{score}'\\)"):
            load_beir(tmp_path)


def test_a_document_that_only_shares_the_query_number_counts_and_one_without_text_stays_relevant(tmp_path):
    """The classic collections number queries and documents from 1 alike: document 2 answering query 2 is a hit,
    not the query itself. A document without text is left out of the corpus (no index holds it) but stays judged."""
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"_id": "1", "text": "what is lift"}, {"_id": "2", "text": "lift of a wing in a slipstream"},
        {"_id": "3", "title": "", "text": ""}]))
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "1", "text": "what is lift"}) + "\n"
                                            + json.dumps({"_id": "2", "text": "wing lift"}) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\t2\t1\n2\t2\t1\n2\t3\t1\n")
    loaded = load_beir(tmp_path)
    assert loaded.ignore_identical == frozenset({"1"})  # document 1 holds query 1's text: it is the query itself
    assert "3" not in loaded.corpus and loaded.skipped == 1 and loaded.qrels["2"] == {"2": 1, "3": 1}
    run = {"1": {"1": 0.9, "2": 0.8}, "2": {"2": 0.9, "1": 0.5}}
    scores = per_query(run, loaded.qrels, loaded.ignore_identical)
    assert scores["mrr@10"].tolist() == [100.0, 100.0]  # query 2's hit on document 2 counts
    assert scores["recall@100"].tolist() == [100.0, 50.0]  # document 3 is never found


def test_the_classic_collections_load_as_published(shared_data):
    from retriever.evaluation.registry import resolve_tasks

    found = {task.name: task.load(shared_data) for task in resolve_tasks("ir-classic")}
    assert {name: (len(rset.queries), sum(map(len, rset.qrels.values()))) for name, rset in found.items()} == {
        "cranfield": (225, 1612), "cisi": (76, 3114), "cacm": (52, 796)}
    cranfield = found["cranfield"]
    assert len(cranfield.corpus) == 1398 and cranfield.skipped == 2  # documents 471 and 995 are empty
    assert cranfield.qrels["225"]["225"] == 2 and "225" not in cranfield.ignore_identical
    assert all(not rset.ignore_identical for rset in found.values())


def test_built_in_sets_from_the_shared_data(shared_data):
    qnli = qnli_retrieval(shared_data)
    assert qnli.describe()["queries"] == len(qnli.qrels) > 2000
    assert all(doc in qnli.corpus for found in qnli.qrels.values() for doc in found)
    stsb = duplicate_retrieval("stsb", shared_data)
    # Pairs scored >= 4 on STS-B test, both ways; every query is a corpus sentence under the same id.
    assert all(query in stsb.corpus and query not in found for query, found in stsb.qrels.items())
    assert 300 < len(stsb.queries) < len(stsb.corpus)
    assert duplicate_retrieval("sickr", shared_data).describe()["documents"] > 4000


def test_evaluation_through_the_index_finds_exact_duplicates(tiny_bert):
    from retriever.encode.encoder import Encoder

    texts = [f"Sentence number {i} talks about {topic}." for i, topic in
             enumerate(["boats", "trains", "bread", "music", "rain", "chess", "gardens", "maps"] * 6)]
    corpus = {f"d{i}": (None, text) for i, text in enumerate(texts)}
    queries = {f"q{i}": texts[i] for i in range(0, 48, 3)}
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(0, 48, 3)}
    encoder = Encoder(str(tiny_bert), device="cpu")
    for calibrator in ("none", "sn"):
        scores = evaluate_through_index(RetrievalSet("tiny", corpus, queries, qrels), encoder.encode, encoder,
                                        calibrator)
        assert scores == {"ndcg@10": pytest.approx(100.0), "recall@100": pytest.approx(100.0),
                          "mrr@10": pytest.approx(100.0)}
