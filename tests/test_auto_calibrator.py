"""`auto`: a candidate only where it beats the raw vectors with confidence on a retrieval check made from the
corpus itself; the decision, the spectrum and every candidate's check score saved and shown; and `--fit-queries`,
which fits the calibrator on documents plus example queries."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retriever.calibration import load_calibrator, make_calibrator
from retriever.calibration.auto import AutoCalibrator
from retriever.calibration.check import CheckSet
from retriever.calibration.flow import FlowCalibrator
from retriever.calibration.linear import Identity, Whitening
from retriever.errors import RetrieverError


def space(n: int, dim: int, distorted: bool, seed: int = 0) -> tuple[np.ndarray, CheckSet]:
    """Corpus vectors and a check set whose meaning is an isotropic Gaussian: each pseudo-query and its target are
    noisy copies of one document's meaning. DISTORTED stretches the dimensions unequally and shifts them all into
    a narrow cone (what a raw transformer layer does), so raw cosine finds targets poorly until calibrated."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(8.0, 0.25, dim) if distorted else np.ones(dim)
    offset = 6.0 if distorted else 0.0

    def look(meaning: np.ndarray) -> np.ndarray:
        return (meaning * scales + offset).astype(np.float32)

    meaning = rng.normal(size=(n, dim))
    picked = rng.choice(n, 400, replace=False)

    def noisy(rows: np.ndarray) -> np.ndarray:
        return rows + 0.6 * rng.normal(size=rows.shape)

    check = CheckSet(look(noisy(meaning[picked])), look(noisy(meaning[picked])), np.array(["span", "known-item"] * 200),
                     look(np.delete(meaning, picked, 0)))
    return look(meaning), check


def test_a_distorted_space_gets_the_candidate_that_wins_the_check():
    X, check = space(3000, 16, distorted=True)
    auto = make_calibrator("auto").fit(X, check=check)
    record = auto.decision["check"]
    assert auto.chosen.name != "none" and auto.decision["chosen"]["name"] == auto.chosen.name
    winner = next(c for c in record["candidates"] if c["name"] == auto.chosen.name)
    assert winner["interval"][0] > 0  # it beat the raw vectors with confidence...
    assert winner["ndcg@10"] == max(c["ndcg@10"] for c in record["candidates"] if c["interval"][0] > 0)  # ...best
    assert record["pseudo_queries"] == 400 and record["kinds"] == {"known-item": 200, "span": 200}
    assert record["pool"] == 400 + 2600 and record["none"]["ndcg@10"] < winner["ndcg@10"]
    assert "beat the raw vectors" in auto.decision["reason"] and "400 pseudo-queries" in auto.decision["reason"]
    # every candidate: the flow, and flow-K and whitening-K at the 95% and 99% variance cuts
    evidence = auto.decision["evidence"]
    ks = sorted(set(evidence["directions"].values()))
    assert [c["name"] for c in record["candidates"]] == ["flow", *(f"{kind}-{k}" for k in ks
                                                                  for kind in ("flow", "whitening"))]
    assert np.array_equal(auto.transform(X), auto.chosen.transform(X))


def test_an_isotropic_space_keeps_its_raw_vectors():
    X, check = space(3000, 16, distorted=False)
    auto = make_calibrator("auto").fit(X, check=check)
    assert isinstance(auto.chosen, Identity) and auto.decision["chosen"] == {"name": "none"}
    assert all(c["interval"][0] <= 0 for c in auto.decision["check"]["candidates"])
    assert auto.decision["reason"].startswith("no candidate beat the raw vectors with confidence")
    assert np.array_equal(auto.transform(X), X)


def test_no_single_kind_of_pseudo_query_decides():
    # known-item queries gain much from calibrating this distorted space; the span and title queries sit a tiny
    # step from a stored document along its low-variance directions, which raw cosine ignores and calibration
    # (equalizing the directions) blows up. The pooled score still favours calibrating; most kinds do not.
    X, check = space(3000, 16, distorted=True)
    rng = np.random.default_rng(1)
    picks = rng.choice(len(check.distractors), 200, replace=False)
    targets = check.distractors[picks]
    queries = targets + 0.4 * rng.normal(size=(200, 16)) * (np.arange(16) >= 8)
    mixed = CheckSet(np.r_[check.queries, queries].astype(np.float32), np.r_[check.targets, targets],
                     np.array(["known-item"] * 400 + ["span"] * 100 + ["title"] * 100),
                     np.delete(check.distractors, picks, 0))
    auto = make_calibrator("auto").fit(X, check=mixed)
    record = auto.decision["check"]
    flow = next(c for c in record["candidates"] if c["name"] == "flow")
    assert flow["interval"][0] > 0 and flow["kinds_improved"] == ["known-item"]
    assert record["voting_kinds"] == ["known-item", "span", "title"]
    assert auto.decision["chosen"] == {"name": "none"} and "no single kind decides" in auto.decision["reason"]
    # the same known-item queries alone (one kind, which then decides) do calibrate
    alone = CheckSet(check.queries, check.targets, np.array(["known-item"] * 400), check.distractors)
    assert make_calibrator("auto").fit(X, check=alone).chosen.name != "none"


def test_without_pseudo_queries_auto_keeps_the_raw_vectors_and_says_why():
    X, _ = space(500, 16, distorted=True)
    auto = make_calibrator("auto").fit(X)
    assert auto.decision["chosen"] == {"name": "none"} and "no pseudo-queries" in auto.decision["reason"]
    X, check = space(500, 16, distorted=True)
    few = CheckSet(check.queries[:10], check.targets[:10], check.kinds[:10], check.distractors)
    auto = make_calibrator("auto").fit(X, check=few)
    assert auto.decision["chosen"] == {"name": "none"} and "only 10 pseudo-queries" in auto.decision["reason"]


def test_the_decision_and_the_check_are_saved_and_loaded_with_the_chosen_weights(tmp_path):
    X, check = space(2000, 16, distorted=True)
    auto = make_calibrator("auto", seed=3).fit(X, check=check)
    auto.save(tmp_path)
    record = json.loads((tmp_path / "calibrator.json").read_text())
    assert record["name"] == "auto" and record["seed"] == 3 and record["decision"] == auto.decision
    loaded = load_calibrator(tmp_path, expected_dim=16)
    assert isinstance(loaded, AutoCalibrator) and loaded.decision == auto.decision
    assert np.array_equal(loaded.transform(X), auto.transform(X))
    assert loaded.describe().startswith(f"auto chose {auto.chosen.name}: it beat the raw vectors")


def test_a_seed_the_check_cannot_take_is_refused_at_once():
    for seed in (-1, 2**64, 1.5, True):
        with pytest.raises(RetrieverError, match="auto option seed must be an integer from 0 to 2\\*\\*64 - 1"):
            make_calibrator("auto", seed=seed)


def test_same_seed_same_decision_and_vectors():
    X, check = space(1500, 16, distorted=True)
    first, second = make_calibrator("auto").fit(X, check=check), make_calibrator("auto").fit(X, check=check)
    assert first.decision == second.decision and np.array_equal(first.transform(X), second.transform(X))


def test_candidates_need_enough_vectors_to_be_fitted():
    _, check = space(1000, 32, distorted=True)  # a flow on 32 dims needs 33 vectors; flow-K for small K fits
    auto = AutoCalibrator()
    evidence = {"top_direction_share": 0.5, "directions": {"95%": 6, "99%": 30}}
    names = [c.name for c in auto.candidates(evidence, 20, 32, check)[0]]
    assert names == ["flow-6", "whitening-6", "whitening-30"]  # flow and flow-30 need 33 and 31 vectors


@pytest.mark.parametrize("X, reason", [
    (np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32) + 5, "too few dimensions for a flow"),
    (np.ones((500, 8), dtype=np.float32), "all vectors are identical"),
])
def test_spaces_no_flow_can_take_are_left_as_they_are(X, reason):
    check = CheckSet(X[:100], X[100:200], np.array(["span"] * 100), X[200:])
    auto = make_calibrator("auto").fit(X, check=check)
    assert auto.decision["chosen"] == {"name": "none"} and reason in auto.decision["reason"]


def test_auto_takes_no_flow_options():
    from retriever.errors import RetrieverError

    with pytest.raises(RetrieverError, match="auto"):
        make_calibrator("auto", width=8)


def test_a_one_document_corpus_builds_with_auto_choosing_none_quietly(cli, tmp_path, tiny_bert):
    one = tmp_path / "one.txt"
    one.write_text("The only document.\n")
    done = cli("build", one, "--model", tiny_bert)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    manifest = json.loads(cli("info", "--name", "one", "--json").stdout)["manifest"]
    assert manifest["calibrator"]["decision"]["chosen"] == {"name": "none"}
    assert "pseudo-queries" in manifest["calibrator"]["decision"]["reason"]


@pytest.fixture(scope="module")
def prose_corpus(tmp_path_factory):
    """600 real documents with titles and several sentences (standard-library docstrings)."""
    from retriever.demo_corpus import documents

    corpus = tmp_path_factory.mktemp("prose") / "docs.jsonl"
    corpus.write_text("".join(json.dumps(doc) + "\n" for doc in documents(600)), encoding="utf-8")
    return corpus


def test_build_defaults_to_auto_and_info_list_and_check_show_the_retrieval_check(prose_corpus, tiny_bert, cli,
                                                                                   tmp_path):
    home = tmp_path / "indexes"
    done = cli("build", prose_corpus, "--model", tiny_bert, "--index-dir", home)
    assert done.returncode == 0, done.stderr
    assert "Encoding pseudo-queries" in done.stderr
    details = json.loads(cli("info", "--name", "docs", "--json", "--index-dir", home).stdout)
    calibrator = details["manifest"]["calibrator"]
    decision = calibrator["decision"]
    # 600 pseudo-queries made, one per document; read in rounds (250, 500, 600) until the choice is settled
    read = decision["check"]["pseudo_queries"]
    assert calibrator["name"] == "auto" and decision["check"]["planned"] == 600 and read in (250, 500, 600)
    assert set(decision["check"]["kinds"]) == {"title", "sentence", "span", "known-item"}
    chosen = decision["chosen"]["name"]
    counted = f"{read} of 600 pseudo-queries" if read < 600 else "600 pseudo-queries"
    shown = cli("info", "--name", "docs", "--index-dir", home).stdout
    assert f"auto chose {chosen}" in shown and counted in shown and "auto check" in shown
    listed = json.loads(cli("list", "--json", "--index-dir", home).stdout)["indexes"][0]["calibrator"]
    assert listed.startswith(f"auto: {chosen} (") and f"on {counted}" in listed
    # `check` runs the same check on the stored index and says what auto would choose now
    checked = cli("check", "docs", "--index-dir", home, "--json")
    assert checked.returncode == 0, checked.stderr
    record = json.loads(checked.stdout)
    assert record["index"] == "docs" and record["pseudo_queries"] == read and record["planned"] == 600
    assert record["current"]["calibrator"] == "auto" and record["current"]["name"] == chosen
    assert [c["name"] for c in record["candidates"]] == [c["name"] for c in decision["check"]["candidates"]]
    table = cli("check", "docs", "--index-dir", home)
    assert f"retrieval check of index 'docs': {counted}" in table.stdout and "…" not in table.stdout
    assert f"auto would choose {record['auto']['chosen']}" in table.stderr
    # hybrid search's weight, decided on the same pseudo-queries at build and again by check, shown by all three
    hybrid = details["hybrid"]
    assert hybrid == details["manifest"]["hybrid"] and hybrid["fusion"] == "zscore-union"
    assert hybrid["evidence"]["planned"] == 600 and hybrid["evidence"]["pseudo_queries"] in (250, 500, 600)
    assert hybrid["weight"] in (0.5, 0.7, 0.9)
    assert set(hybrid["evidence"]["groups"]) == {"meaning", "known-item"}
    assert f"dense weight {hybrid['weight']}" in shown and "hybrid evidence" in shown
    assert json.loads(cli("list", "--json", "--index-dir", home).stdout)["indexes"][0]["hybrid_weight"] == hybrid["weight"]
    assert record["hybrid"]["recorded"] == hybrid  # the same seed and calibrator: the same evidence, the same weight
    assert record["hybrid"]["now"]["weight"] == hybrid["weight"]
    assert "hybrid search's weight" in table.stdout and f"dense weight {hybrid['weight']}" in table.stdout


def test_refit_with_auto_checks_the_stored_documents(prose_corpus, tiny_bert, cli, tmp_path):
    home = tmp_path / "indexes"
    assert cli("build", prose_corpus, "--model", tiny_bert, "-c", "none", "--index-dir", home).returncode == 0
    done = cli("refit", "--name", "docs", "-c", "auto", "--index-dir", home)
    assert done.returncode == 0, done.stderr
    decision = json.loads(cli("info", "--name", "docs", "--json", "--index-dir", home).stdout)[
        "manifest"]["calibrator"]["decision"]
    assert decision["check"]["planned"] == 600 and decision["check"]["pseudo_queries"] in (250, 500, 600)
    hybrid = json.loads(cli("info", "--name", "docs", "--json", "--index-dir", home).stdout)["hybrid"]
    assert hybrid["evidence"]["planned"] == 600  # the named calibrator's build had none; refit checked


def test_fit_queries_fits_the_calibrator_on_documents_and_queries(tiny_bert, cli, tmp_path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("".join(f"document number {i}\n" for i in range(600)), encoding="utf-8")
    vectors = tmp_path / "vectors.npy"
    np.save(vectors, space(600, 32, distorted=True)[0])
    queries = tmp_path / "queries.txt"
    queries.write_text("what is document one\nwhere is the second document\nfind number three\n", encoding="utf-8")
    home = tmp_path / "indexes"
    plain = cli("build", corpus, "--vectors", vectors, "--model", tiny_bert, "-c", "whitening",
                "--name", "plain", "--index-dir", home)
    assert plain.returncode == 0, plain.stderr
    with_queries = cli("build", corpus, "--vectors", vectors, "--model", tiny_bert, "-c", "whitening",
                       "--fit-queries", queries, "--name", "asked", "--index-dir", home)
    assert with_queries.returncode == 0, with_queries.stderr
    fit = json.loads(cli("info", "--name", "asked", "--json", "--index-dir", home).stdout)["manifest"]["fit"]
    assert fit["queries"] == 3 and fit["queries_from"] == str(queries.resolve())
    assert "plus 3 example queries" in cli("info", "--name", "asked", "--index-dir", home).stdout
    means = [load_calibrator(home / name / "calibrator").mean for name in ("plain", "asked")]
    # the three query vectors (tiny_bert's, unlike the synthetic documents) moved the fitted mean
    expected = (600 * means[0] + 3 * np.mean(_tiny_vectors(tiny_bert, queries), axis=0)) / 603
    assert np.allclose(means[1], expected, atol=1e-5)
    # refit takes them too: the documents-only index refitted with the queries matches the one built with them
    refit = cli("refit", "--name", "plain", "--fit-queries", queries, "--index-dir", home)
    assert refit.returncode == 0, refit.stderr
    assert json.loads(cli("info", "--name", "plain", "--json", "--index-dir", home).stdout)["manifest"]["fit"][
        "queries"] == 3
    refitted = load_calibrator(home / "plain" / "calibrator").mean  # from the stored float16 raw vectors
    assert np.abs(refitted - means[1]).max() < 0.1 * np.abs(means[1] - means[0]).max()


def _tiny_vectors(model, queries):
    from retriever.encode.encoder import Encoder

    return Encoder(str(model), device="cpu").encode(queries.read_text().splitlines()).astype(np.float64)


def test_fit_queries_that_do_not_exist_is_a_one_line_error(tiny_bert, cli, tmp_path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one document\n", encoding="utf-8")
    done = cli("build", corpus, "--model", tiny_bert, "--fit-queries", tmp_path / "nope.txt",
               "--index-dir", tmp_path / "indexes")
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"error: --fit-queries {tmp_path / 'nope.txt'}: no such file"]


def _sts_check(encoder, shared_data, sentences: int = 800):
    from retriever.evaluation import get_task
    from retriever.calibration.pseudo_queries import make_check_set

    texts = get_task("stsb").all_sentences(shared_data)[:sentences]
    vectors = encoder.encode(texts)
    check = make_check_set(len(texts), lambda positions: [(None, texts[i]) for i in positions],
                           lambda positions: vectors[positions], encoder, pseudo_queries=500)
    return vectors, check


@pytest.mark.slow
def test_the_default_model_on_real_sentences_is_left_uncalibrated(minilm_encoder, shared_data):
    # all-MiniLM-L6-v2 is trained for cosine: no candidate finds the pseudo-queries' targets better with confidence.
    vectors, check = _sts_check(minilm_encoder, shared_data)
    auto = make_calibrator("auto").fit(vectors, check=check)
    assert auto.decision["chosen"] == {"name": "none"}, auto.decision["reason"]


@pytest.mark.slow
def test_the_default_models_embedding_layer_gets_calibrated(prose_corpus):
    # Its layer 0 (token embeddings, mean-pooled) is a narrow cone, where every kind of pseudo-query made from real
    # documents with titles finds its target better after calibration.
    from retriever.corpus import read_corpus, document_text
    from retriever.encode.encoder import Encoder
    from retriever.calibration.pseudo_queries import make_check_set

    documents = read_corpus(prose_corpus)
    encoder = Encoder(layers=[0], device="cpu")
    vectors = encoder.encode([document_text(d) for d in documents])
    check = make_check_set(len(documents), lambda rows: [(documents[i].title, documents[i].text) for i in rows],
                           lambda rows: vectors[rows], encoder)
    auto = make_calibrator("auto").fit(vectors, check=check)
    assert auto.decision["evidence"]["mean_cosine"] > 0.3
    assert isinstance(auto.chosen, FlowCalibrator) or auto.chosen.name.startswith("whitening-"), auto.decision
    chosen = next(c for c in auto.decision["check"]["candidates"] if c["name"] == auto.chosen.name)
    assert chosen["interval"][0] > 0 and len(chosen["kinds_improved"]) > 2


def test_a_flow_k_wider_than_the_vectors_is_refused_before_encoding(tiny_bert, cli, tmp_path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one document\nanother one\n", encoding="utf-8")
    done = cli("build", corpus, "--model", tiny_bert, "-c", "flow-64", "--index-dir", tmp_path / "indexes")
    assert done.returncode == 1 and "needs K <= the vector dimension 32" in done.stderr
    assert "Encoding" not in done.stderr


def test_fit_queries_with_calibrator_none_says_they_are_ignored(tiny_bert, cli, tmp_path):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one document\nanother one\n", encoding="utf-8")
    queries = tmp_path / "queries.txt"
    queries.write_text("a query\n", encoding="utf-8")
    done = cli("build", corpus, "--model", tiny_bert, "-c", "none", "--fit-queries", queries,
               "--index-dir", tmp_path / "indexes")
    assert done.returncode == 0 and "--fit-queries ignored: calibrator none fits nothing" in done.stderr


def test_check_on_an_index_too_small_or_too_short_to_check(tiny_bert, cli, tmp_path):
    home = tmp_path / "indexes"
    short = tmp_path / "short.txt"
    short.write_text("one\ntwo words\n", encoding="utf-8")
    assert cli("build", short, "--model", tiny_bert, "--index-dir", home).returncode == 0
    done = cli("check", "short", "--index-dir", home)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        "error: index 'short' has no document long enough to cut a pseudo-query from (a title and 3 words of "
        "text, or 6 words): there is nothing to check with")
    few = tmp_path / "few.txt"  # 20 pseudo-queries: scored, but too few for auto to try a candidate
    few.write_text("".join(f"document number {i} has a few more words in it\n" for i in range(20)), encoding="utf-8")
    assert cli("build", few, "--model", tiny_bert, "-c", "whitening", "--index-dir", home).returncode == 0
    record = json.loads(cli("check", "few", "--index-dir", home, "--json").stdout)
    assert record["pseudo_queries"] == 20 and record["candidates"] == [] and record["auto"]["chosen"] == "none"
    assert record["current"]["name"] == "whitening" and "interval" in record["current"]
    table = cli("check", "few", "--index-dir", home)
    assert table.returncode == 0 and "│ index" in table.stdout and "1 of 2" in table.stdout, table.stderr
    assert "…" not in table.stdout  # nothing cut, even at 80 columns


class Rounds:
    """A check read in rounds (the interface of `pseudo_queries.CheckRounds`) over a ready CHECK: the round of N
    is its first N pseudo-queries; counts the rounds read."""

    def __init__(self, check: CheckSet, first: int):
        self.check, self.first, self.read = check, first, []
        self.planned = len(check)

    def __len__(self) -> int:
        return self.planned

    def sizes(self) -> list[int]:
        return [self.first, 2 * self.first, self.planned]

    def counts(self) -> dict[str, int]:
        return self.check.counts()

    def at(self, size: int) -> CheckSet:
        self.read.append(size)
        check = self.check
        return CheckSet(check.queries[:size], check.targets[:size], check.kinds[:size],
                        np.r_[check.distractors, check.targets[size:]])


def test_a_clear_answer_either_way_is_settled_on_the_first_round():
    X, check = space(3000, 16, distorted=True)
    rounds = Rounds(check, 100)
    auto = make_calibrator("auto").fit(X, check=rounds)
    record = auto.decision["check"]
    assert rounds.read == [100] and auto.chosen.name != "none"
    assert record["pseudo_queries"] == 100 and record["planned"] == 400 and record["confidence"] == 0.99
    assert "100 of 400 pseudo-queries" in auto.decision["reason"]
    assert next(c for c in record["candidates"] if c["name"] == auto.chosen.name)["interval"][0] > 0
    # isotropic: the flow clearly worse than the raw vectors, which stay without the other rounds
    X, check = space(3000, 16, distorted=False)
    rounds = Rounds(check, 100)
    auto = make_calibrator("auto").fit(X, check=rounds)
    assert rounds.read == [100] and auto.chosen.name == "none"
    assert all(c["interval"][1] < 1.0 for c in auto.decision["check"]["candidates"])
    # the same check read whole (a CheckSet) decides the same
    assert make_calibrator("auto").fit(X, check=check).chosen.name == "none"


def test_candidates_are_fitted_on_a_bounded_sample_of_a_large_corpus(monkeypatch):
    import retriever.calibration.auto as auto_module

    fitted_rows = []
    for kind in (FlowCalibrator, Whitening):
        original = kind.fit
        monkeypatch.setattr(kind, "fit", lambda self, X, *a, _fit=original, **k: (fitted_rows.append(len(X)),
                                                                                   _fit(self, X, *a, **k))[1])
    monkeypatch.setattr(auto_module, "CANDIDATE_ROWS", 1000)
    X, check = space(3000, 16, distorted=True)
    auto = make_calibrator("auto").fit(X, check=check)
    record = auto.decision["check"]
    assert fitted_rows and set(fitted_rows) == {1000}  # every candidate, the one kept among them
    assert record["fitted_on"] == 1000 and record["of"] == 3000 and auto.chosen.name != "none"
    assert "fitted on 1,000 of the 3,000 vectors" in auto.decision["reason"]
    assert auto.transform(X).shape == (3000, auto.chosen.dim if auto.chosen.name.startswith("whitening") else 16)
    # the same seed draws the same sample: the same calibrator
    assert np.array_equal(make_calibrator("auto").fit(X, check=check).transform(X[:50]), auto.transform(X[:50]))
    # a corpus within the bound is fitted whole, and says nothing of a sample
    fitted_rows.clear()
    auto = make_calibrator("auto").fit(X[:900], check=check)
    assert set(fitted_rows) == {900} and "fitted_on" not in auto.decision["check"]
