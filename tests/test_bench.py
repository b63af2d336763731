"""`retriever bench`: the runner on the real encode path, the JSON schema, the embedding cache, fit sets, errors.

Scores are not checked here (random models); the pipeline, record shapes and bookkeeping are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retriever.encode.encoder import Encoder
from retriever.errors import RetrieverError
from retriever.evaluation.cache import CachedEncoder
from retriever.evaluation.runner import plan_benchmark, run_benchmark, score_table

RECORD_KEYS = {"dataset", "split", "calibrator", "metric", "aggregation", "score"}
STSB_PAIRS = {"train": 5749, "dev": 1500, "test": 1379}  # the task checks these counts at load time


def run_cli(*args, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "cli.main", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def fake_data(tmp_path_factory) -> Path:
    """A data folder in the real STS-B layout and pair counts, made of few distinct short sentences so that
    encoding is cheap: train, dev and test draw on disjoint sentence pools (16, 8 and 8 sentences)."""
    root = tmp_path_factory.mktemp("data")
    (root / "stsb").mkdir()
    rng = np.random.default_rng(0)
    subjects = ["A man", "A woman", "The dog", "A child", "The cat", "A chef", "Two birds", "The band"]
    actions = ["is running", "plays a guitar", "eats an apple", "sleeps", "is swimming", "reads a book",
               "slices an onion", "dances"]
    sentences = [f"{s} {a}." for s in subjects for a in actions]
    pools = {"train": sentences[:16], "dev": sentences[16:24], "test": sentences[24:32]}
    for split, pairs in STSB_PAIRS.items():
        pool = pools[split]
        rows = []
        for index in range(pairs):
            first, second = rng.choice(len(pool), size=2, replace=False)
            score = rng.uniform(0, 5)
            rows.append(f"main-captions\tMSRvid\t2012test\t{index:04d}\t{score:.3f}\t{pool[first]}\t{pool[second]}")
        (root / "stsb" / f"sts-{split}.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def random_bert_base(shared_data, tmp_path_factory) -> Path:
    """bert-base-uncased's shape with random weights, saved with its tokenizer (the real weights are not here)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    config_dir = shared_data.parent / "models" / "bert-base-uncased-config"
    folder = tmp_path_factory.mktemp("random-bert-base")
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(config_dir)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(folder)
    return folder


def test_paper_setting_on_real_data_with_random_bert_base(shared_data, random_bert_base, tmp_path):
    """first-last-avg, none and flow, STS-B + STS13 (two aggregations) + QNLI (AUC), first 8 pairs of each file."""
    plan = plan_benchmark("stsb,sts13,qnli", "none,flow", data_dir=shared_data, limit=8)
    encoder = CachedEncoder(Encoder(str(random_bert_base), "first-last-avg", max_length=64, device="cpu"), tmp_path)
    report = run_benchmark(plan, encoder, progress=False)

    assert encoder.dim == 768 and encoder.encode(["A man is playing a flute."]).shape == (1, 768)
    got = {(r["dataset"], r["calibrator"], r["metric"], r["aggregation"], r["split"]) for r in report.results}
    assert got == {
        (dataset, calibrator, metric, aggregation, split)
        for calibrator in ("none", "flow")
        for dataset, metric, aggregation, split in [
            ("stsb", "spearman", "test", "test"),
            ("sts13", "spearman", "wmean", "test"),
            ("sts13", "spearman", "all", "test"),
            ("qnli", "auc", "dev", "dev"),
        ]
    }
    assert len(report.results) == len(got)
    for record in report.results:
        assert set(record) == RECORD_KEYS
        assert isinstance(record["score"], float) and -100 <= record["score"] <= 100

    settings = report.settings
    assert settings["model"] == str(random_bert_base)
    assert (settings["pooling"], settings["layers"], settings["max_length"]) == ("first-last-avg", None, 64)
    assert settings["limit"] == 8 and settings["fit_on"] == "target"
    # Target fit set: distinct sentences of every split (STS-B: 8 pairs of each of train, dev and test).
    assert 24 < report.fit_sets["stsb"]["sentences"] <= 48 and report.fit_sets["qnli"]["sentences"] == 16
    assert set(report.data_checksums) >= {"stsb/sts-train.csv", "stsb/sts-test.csv", "qnli/dev.tsv",
                                          "sts13/STS.gs.FNWN.txt"}
    document = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert set(document["versions"]) == {"torch", "transformers", "numpy", "retriever", "python"}

    headers, rows = score_table(report.results)
    assert headers == ["calibrator", "STS-B", "STS-13 wmean", "STS-13 all", "avg", "QNLI (AUC)"]
    assert [row[0] for row in rows] == ["none", "flow"]
    stsb, sts13_wmean = rows[0][1], rows[0][2]
    assert rows[0][4] == pytest.approx((stsb + sts13_wmean) / 2)  # average of the main aggregations


def test_cli_json_is_one_object_with_the_schema(fake_data, tiny_bert, tmp_path, cli):
    figure = tmp_path / "figure.png"
    done = cli(
        "bench", "stsb", "--model", tiny_bert, "--data-dir", fake_data, "--calibrator", "none,flow,whitening",
        "--json", "--lexical", "--plot", figure, "--cache-dir", tmp_path / "cache", "--max-length", "16",
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # the whole of stdout is one JSON object; logs went to stderr
    required = {"model", "pooling", "layers", "max_length", "seed", "versions", "data_checksums", "results"}
    assert required <= set(document)
    assert document["max_length"] == 16 and document["seed"] == 0 and document["pooling"] == "last-avg"
    assert document["calibrators"]["whitening"] == {"name": "whitening"}
    assert document["calibrators"]["flow"]["name"] == "flow" and document["calibrators"]["flow"]["seed"] == 0
    assert set(document["versions"]) == {"torch", "transformers", "numpy", "retriever", "python"}
    import hashlib

    assert document["data_checksums"] == {
        f"stsb/sts-{split}.csv": hashlib.sha256((fake_data / "stsb" / f"sts-{split}.csv").read_bytes()).hexdigest()
        for split in STSB_PAIRS
    }
    results = document["results"]
    assert [r["calibrator"] for r in results] == ["none", "flow", "whitening"]
    for record in results:
        assert set(record) == RECORD_KEYS
        assert (record["dataset"], record["split"], record["metric"], record["aggregation"]) == (
            "stsb", "test", "spearman", "test")
        assert isinstance(record["score"], float)

    lexical = document["lexical"]
    assert (lexical["dataset"], lexical["split"], lexical["pairs"]) == ("stsb", "dev", 1500)
    assert [row["similarity"] for row in lexical["rows"]] == ["gold", "none", "flow", "whitening"]
    assert lexical["rows"][0]["gold"] == pytest.approx(100.0)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_second_run_encodes_nothing_and_gives_identical_results(fake_data, tiny_bert, tmp_path, monkeypatch):
    encoded = []
    real_encode = Encoder.encode

    def counting_encode(self, texts, *args, **kwargs):
        encoded.append(len(texts))
        return real_encode(self, texts, *args, **kwargs)

    monkeypatch.setattr(Encoder, "encode", counting_encode)
    plan = plan_benchmark("stsb", "none,flow,sn+natsv-2", data_dir=fake_data)

    def run():
        encoder = CachedEncoder(Encoder(str(tiny_bert), max_length=16, device="cpu"), tmp_path / "cache")
        return encoder, run_benchmark(plan, encoder, progress=False)

    first_encoder, first = run()
    assert sum(encoded) == first_encoder.encoded == 32  # each distinct sentence once, for three calibrators
    encoded.clear()
    second_encoder, second = run()
    assert encoded == [] and second_encoder.encoded == 0 and second_encoder.hits > 0
    assert second.results == first.results

    # Interrupted writes leave only temporary files, which are ignored; so are unreadable shards.
    folder = second_encoder.folder
    (folder / ".shard-interrupted.npz.tmp").write_bytes(b"partial")
    (folder / "shard-damaged.npz").write_bytes(b"not an npz")
    third = CachedEncoder(Encoder(str(tiny_bert), max_length=16, device="cpu"), tmp_path / "cache")
    assert third.encode(["The dog sleeps."]).shape == (1, 32) and third.encoded == 0
    # Another max_length gives other vectors, so another cache folder.
    other = CachedEncoder(Encoder(str(tiny_bert), max_length=8, device="cpu"), tmp_path / "cache")
    assert other.folder != folder and other.encode(["The dog sleeps."]).shape == (1, 32) and other.encoded == 1


def test_fit_on_target_train_and_file_use_different_sentences(fake_data, tiny_bert, tmp_path):
    fit_file = tmp_path / "sentences.txt"
    fit_file.write_text("One unlabeled line.\n\nAnother line.\nOne unlabeled line.\n  A third line. \n", "utf-8")
    encoder = CachedEncoder(Encoder(str(tiny_bert), max_length=16, device="cpu"))
    fitted_rows = {}
    for fit_on in ("target", "train", str(fit_file)):
        plan = plan_benchmark("stsb", "whitening-4", data_dir=fake_data, fit_on=fit_on)
        report = run_benchmark(plan, encoder, progress=False)
        fitted_rows[fit_on] = report.fit_sets["stsb"]["sentences"]
        assert report.fit_sets["stsb"]["source"] == fit_on and len(report.results) == 1
    # Target: all 32 distinct sentences of train+dev+test; train: its 16; the file: 3 distinct non-blank lines.
    assert fitted_rows == {"target": 32, "train": 16, str(fit_file): 3}

    with pytest.raises(RetrieverError, match="sts12, qnli have no train split"):
        plan_benchmark("sts12,qnli", data_dir=fake_data, fit_on="train")
    with pytest.raises(RetrieverError, match="not a file"):
        plan_benchmark("stsb", data_dir=fake_data, fit_on=str(tmp_path / "missing.txt"))


def test_bad_names_are_one_line_errors(fake_data):
    with pytest.raises(RetrieverError, match="unknown calibrator 'flw'"):
        plan_benchmark("stsb", "none,flw", data_dir=fake_data)
    with pytest.raises(RetrieverError, match="unknown layout 'tokenized'"):
        plan_benchmark("stsb", data_dir=fake_data, layout="tokenized")
    with pytest.raises(RetrieverError, match="unknown pooling 'max'"):
        Encoder(pooling="max")
    with pytest.raises(RetrieverError, match="^fit_queries applies to retrieval tasks"):
        plan_benchmark("stsb", data_dir=fake_data, fit_queries=True)
    # a figure's path, before the run (a folder was written beside as FOLDER.png, a .txt refused after it)
    with pytest.raises(RetrieverError, match="is a folder; name the figure's file, e.g. "):
        plan_benchmark("stsb", data_dir=fake_data, plot=fake_data)
    with pytest.raises(RetrieverError, match="out.txt: its extension names the figure.s format, one of .*[.]png"):
        plan_benchmark("stsb", data_dir=fake_data, plot="out.txt")


def test_cli_errors_exit_1_with_one_line(fake_data, tmp_path, cli):
    unknown = cli("bench", "sts17", "--data-dir", fake_data)
    missing = cli("bench", "stsb", "--data-dir", tmp_path / "nowhere")
    # The paper's model is not available offline: the encoder's one-line message, fast, no traceback.
    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    paper = run_cli("bench", "stsb", "--model", "bert-base-uncased", "--pooling", "first-last-avg",
                    "--data-dir", fake_data, "--no-cache", env=offline)
    for done, phrase in [(unknown, "unknown dataset 'sts17'"), (missing, "nowhere is not a folder"),
                         (paper, "'bert-base-uncased' is not in the local Hugging Face cache")]:
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().count("\n") == 0 and phrase in done.stderr
        assert done.stdout == ""


@pytest.fixture()
def beir_folder(tmp_path) -> Path:
    """A small BEIR folder: 60 documents, 12 queries, each the exact text of one document (graded 2) plus a
    judged-irrelevant (0) one, so an exact encoder must find every relevant document first."""
    folder = tmp_path / "tiny-beir"
    (folder / "qrels").mkdir(parents=True)
    topics = ["boats", "trains", "bread", "music", "rain", "chess", "gardens", "maps", "owls", "clocks"]
    docs = [{"_id": f"d{i}", "title": f"note {i}", "text": f"Day {i}: a story about {topics[i % 10]} and {topics[i // 10]}."}
            for i in range(60)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = [{"_id": f"q{i}", "text": f"note {i} Day {i}: a story about {topics[i % 10]} and {topics[i // 10]}."}
               for i in range(0, 60, 5)]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    rows = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t2\nq{i}\td{(i + 1) % 60}\t0" for i in range(0, 60, 5)]
    (folder / "qrels" / "test.tsv").write_text("\n".join(rows) + "\n")
    return folder


def test_bench_beir_folder_through_the_index(beir_folder, tiny_bert, tmp_path, cli):
    done = cli("bench", "beir", beir_folder, "--model", tiny_bert, "--calibrator", "none,sn", "--json",
                   "--cache-dir", tmp_path / "cache", "--max-length", "32")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1  # one JSON line, as every other --json (it was indented: a QA run)
    document = json.loads(done.stdout)
    records = document["results"]
    assert {(r["calibrator"], r["metric"]) for r in records} == {
        (c, m) for c in ("none", "sn") for m in ("ndcg@10", "recall@100", "mrr@10")}
    assert all(set(r) == RECORD_KEYS | {"mode"} and r["dataset"] == "tiny-beir" and r["mode"] == "dense"
               for r in records)
    none = {r["metric"]: r["score"] for r in records if r["calibrator"] == "none"}
    assert none == {"ndcg@10": pytest.approx(100.0), "recall@100": pytest.approx(100.0), "mrr@10": pytest.approx(100.0)}
    assert document["fit_sets"]["tiny-beir"] == {"source": "corpus", "sentences": 60, "documents": 60, "queries": 12,
                                                 "relevant": 12}
    table = cli("bench", "beir", beir_folder, "--model", tiny_bert, "--calibrator", "none",
                    "--cache-dir", tmp_path / "cache", "--max-length", "32")
    assert table.returncode == 0 and "tiny-beir nDCG@10" in table.stdout and "tiny-beir MRR@10" in table.stdout
    # A retrieval-only run prints one table: its numbers once, under a retrieval caption, not Spearman/AUC's.
    assert table.stdout.count("tiny-beir nDCG@10") == 1 and "Spearman" not in table.stdout


def test_bench_scores_every_search_mode_on_the_same_index(beir_folder, tiny_bert, tmp_path, cli):
    done = cli("bench", "beir", beir_folder, "--model", tiny_bert, "--calibrator", "none", "--json",
                   "--mode", "dense,keyword,hybrid", "--cache-dir", tmp_path / "cache", "--max-length", "32")
    assert done.returncode == 0, done.stderr
    scores = {r["mode"]: r["score"] for r in json.loads(done.stdout)["results"] if r["metric"] == "ndcg@10"}
    assert set(scores) == {"dense", "keyword", "hybrid"}
    assert scores["keyword"] == pytest.approx(100.0)  # every query holds its document's words
    table = cli("bench", "beir", beir_folder, "--model", tiny_bert, "--calibrator", "none", "--mode",
                    "keyword,hybrid", "--cache-dir", tmp_path / "cache", "--max-length", "32")
    assert table.returncode == 0 and "none (keyword)" in table.stdout and "none (hybrid)" in table.stdout
    refused = cli("bench", "beir", beir_folder, "--mode", "dense,fuzzy")
    assert refused.returncode == 1 and "--mode: fuzzy; known: dense, keyword, hybrid" in refused.stderr


def test_bench_fit_queries_and_auto_decisions_are_recorded(beir_folder, tiny_bert, tmp_path, cli):
    done = cli("bench", "beir", beir_folder, "--model", tiny_bert, "--calibrator", "none,auto", "--json",
                   "--fit-queries", "--cache-dir", tmp_path / "cache", "--max-length", "32")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["fit_queries"] is True
    assert document["fit_sets"]["tiny-beir"]["source"] == "corpus+queries"
    assert document["fit_sets"]["tiny-beir"]["sentences"] == 60 + 12
    decision = document["decisions"]["tiny-beir"]["auto"]
    assert set(decision) == {"chosen", "reason", "evidence", "check"} and decision["evidence"]["rows"] == 72
    assert decision["check"]["pseudo_queries"] > 0 and decision["check"]["pool"] == 60  # the corpus's own documents
    assert f"tiny-beir: auto chose {decision['chosen']['name']}" in done.stderr


def test_retrieval_tasks_resolve_and_refuse_bad_input(tmp_path, cli):
    from retriever.evaluation.registry import resolve_tasks

    assert [t.name for t in resolve_tasks("retrieval")] == ["qnli-retrieval", "stsb-dup", "sickr-dup"]
    assert "beir:PATH" in cli("bench", "nope").stderr
    assert "needs a folder" in cli("bench", "beir").stderr
    assert "is not a folder" in cli("bench", "beir", tmp_path / "missing").stderr
    assert "not a BEIR folder" in cli("bench", "beir", tmp_path, "--limit", "5").stderr
