"""`auto`: none for an isotropic space, flow-K for an anisotropic one, the decision and its evidence saved and
shown; and `--fit-queries`, which fits the calibrator on documents plus example queries."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retriever.calibration import load_calibrator, make_calibrator
from retriever.calibration.auto import ISOTROPIC_MEAN_COSINE, AutoCalibrator
from retriever.calibration.flow import FlowCalibrator
from retriever.calibration.linear import Identity


def cone(n: int, dim: int, offset: float, seed: int = 0) -> np.ndarray:
    """Gaussian vectors with a decaying spectrum, shifted by OFFSET along a common direction: offset 0 is
    isotropic around the origin (mean cosine ~0), a large offset packs them into a narrow cone."""
    rng = np.random.default_rng(seed)
    spread = rng.normal(size=(n, dim)) * np.linspace(1.0, 0.05, dim)
    return (spread @ np.linalg.qr(rng.normal(size=(dim, dim)))[0] + offset / np.sqrt(dim)).astype(np.float32)


def test_an_isotropic_space_is_left_as_it_is():
    X = cone(3000, 24, offset=0.0)
    auto = make_calibrator("auto").fit(X)
    assert isinstance(auto.chosen, Identity)
    evidence = auto.decision["evidence"]
    assert evidence["mean_cosine"] < ISOTROPIC_MEAN_COSINE and "isotropic" in auto.decision["reason"]
    assert np.array_equal(auto.transform(X), X)


def test_an_anisotropic_space_gets_a_flow_on_the_directions_that_hold_its_variance():
    X = cone(3000, 24, offset=8.0)
    auto = make_calibrator("auto").fit(X)
    evidence = auto.decision["evidence"]
    assert evidence["mean_cosine"] > 0.5
    assert isinstance(auto.chosen, FlowCalibrator) and auto.chosen.k == evidence["directions_for_variance"] < 24
    assert auto.decision["chosen"]["name"] == f"flow-{auto.chosen.k}"
    # the rest of the evidence: the flow's held-out likelihood against its Gaussian start, neighbours kept
    assert evidence["held_out_rows"] == 300
    assert np.isfinite(evidence["held_out_loglik_per_dim_flow"])
    assert np.isfinite(evidence["held_out_loglik_per_dim_gaussian"])
    assert 0 <= evidence["neighbours_kept_at_10"] <= 1
    Z = auto.transform(X)
    unit = Z / np.linalg.norm(Z, axis=1, keepdims=True)
    pairs = np.random.default_rng(1).integers(0, len(unit), (2, 5000))
    assert abs((unit[pairs[0]] * unit[pairs[1]]).sum(1).mean()) < 0.05  # the cone is opened


def test_the_decision_is_saved_and_loaded_with_the_chosen_weights(tmp_path):
    X = cone(2000, 16, offset=8.0)
    auto = make_calibrator("auto", seed=3).fit(X)
    auto.save(tmp_path)
    record = json.loads((tmp_path / "calibrator.json").read_text())
    assert record["name"] == "auto" and record["seed"] == 3 and record["decision"] == auto.decision
    loaded = load_calibrator(tmp_path, expected_dim=16)
    assert isinstance(loaded, AutoCalibrator) and loaded.decision == auto.decision
    assert np.array_equal(loaded.transform(X), auto.transform(X))
    assert loaded.describe().startswith(f"auto chose {auto.chosen.name}: mean cosine")


def test_same_seed_same_decision_and_vectors():
    X = cone(1500, 16, offset=8.0)
    first, second = make_calibrator("auto").fit(X), make_calibrator("auto").fit(X)
    assert first.decision == second.decision and np.array_equal(first.transform(X), second.transform(X))


def test_too_few_vectors_for_the_flow_fall_back_to_none_and_say_so():
    X = cone(40, 32, offset=8.0)
    auto = make_calibrator("auto").fit(X)
    assert isinstance(auto.chosen, Identity) and "too few to fit" in auto.decision["reason"]


def test_a_one_document_corpus_builds_with_auto_choosing_none_quietly(cli, tmp_path, tiny_bert):
    one = tmp_path / "one.txt"
    one.write_text("The only document.\n")
    done = cli("build", one, "--model", tiny_bert)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    manifest = json.loads(cli("info", "--name", "one", "--json").stdout)["manifest"]
    assert manifest["calibrator"]["decision"]["chosen"] == {"name": "none"}
    assert "one vector" in manifest["calibrator"]["decision"]["reason"]


def test_auto_takes_no_flow_options():
    from retriever.errors import RetrieverError

    with pytest.raises(RetrieverError, match="auto"):
        make_calibrator("auto", width=8)


@pytest.fixture()
def cone_corpus(tmp_path):
    """A 600-document corpus with precomputed anisotropic 32-dim vectors (tiny_bert's dimension)."""
    corpus = tmp_path / "docs.txt"
    corpus.write_text("".join(f"document number {i}\n" for i in range(600)), encoding="utf-8")
    vectors = tmp_path / "vectors.npy"
    np.save(vectors, cone(600, 32, offset=8.0))
    return corpus, vectors


def test_build_defaults_to_auto_and_info_and_list_show_its_decision(cone_corpus, tiny_bert, cli, tmp_path):
    corpus, vectors = cone_corpus
    home = tmp_path / "indexes"
    done = cli("build", corpus, "--vectors", vectors, "--model", tiny_bert, "--index-dir", home)
    assert done.returncode == 0, done.stderr
    details = json.loads(cli("info", "--name", "docs", "--json", "--index-dir", home).stdout)
    calibrator = details["manifest"]["calibrator"]
    assert calibrator["name"] == "auto" and calibrator["decision"]["chosen"]["name"].startswith("flow-")
    assert calibrator["decision"]["evidence"]["mean_cosine"] > 0.5
    k = calibrator["decision"]["chosen"]["k"]
    assert details["manifest"]["dim"] == k  # the index holds flow-K's K-dimensional vectors
    shown = cli("info", "--name", "docs", "--index-dir", home).stdout
    assert f"auto chose flow-{k}" in shown and "auto evidence" in shown and "mean_cosine" in shown
    listed = cli("list", "--json", "--index-dir", home).stdout
    assert [record["calibrator"] for record in json.loads(listed)["indexes"]] == [f"auto: flow-{k}"]


def test_fit_queries_fits_the_calibrator_on_documents_and_queries(cone_corpus, tiny_bert, cli, tmp_path):
    corpus, vectors = cone_corpus
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
    from retriever.encoder import Encoder

    return Encoder(str(model), device="cpu").encode(queries.read_text().splitlines()).astype(np.float64)


def test_fit_queries_that_do_not_exist_is_a_one_line_error(cone_corpus, tiny_bert, cli, tmp_path):
    corpus, vectors = cone_corpus
    done = cli("build", corpus, "--vectors", vectors, "--model", tiny_bert, "--fit-queries", tmp_path / "nope.txt",
               "--index-dir", tmp_path / "indexes")
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"error: --fit-queries {tmp_path / 'nope.txt'}: no such file"]


def test_the_default_model_on_real_sentences_is_left_uncalibrated(minilm_encoder, shared_data):
    # all-MiniLM-L6-v2 is trained to spread sentences over the sphere: auto measures that and changes nothing.
    from retriever.evaluation import get_task

    sentences = get_task("stsb").all_sentences(shared_data)[:800]
    auto = make_calibrator("auto").fit(minilm_encoder.encode(sentences))
    assert auto.decision["chosen"] == {"name": "none"}
    assert auto.decision["evidence"]["mean_cosine"] < ISOTROPIC_MEAN_COSINE


def test_the_default_models_embedding_layer_gets_a_flow(shared_data):
    # Its layer 0 (token embeddings, mean-pooled) is a narrow cone: auto calibrates it.
    from retriever.encoder import Encoder
    from retriever.evaluation import get_task

    sentences = get_task("stsb").all_sentences(shared_data)[:4000]
    vectors = Encoder(layers=[0], device="cpu").encode(sentences)
    auto = make_calibrator("auto").fit(vectors)
    assert auto.decision["evidence"]["mean_cosine"] > 0.3
    assert auto.decision["chosen"]["name"] == f"flow-{auto.decision['evidence']['directions_for_variance']}"


@pytest.mark.parametrize("X, reason", [
    (np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32) + 5, "too few dimensions for a flow"),
    (np.ones((500, 8), dtype=np.float32), "all vectors are identical"),
])
def test_spaces_no_flow_can_take_are_left_as_they_are(X, reason):
    auto = make_calibrator("auto").fit(X)
    assert auto.decision["chosen"] == {"name": "none"} and reason in auto.decision["reason"]


def test_a_flow_k_wider_than_the_vectors_is_refused_before_encoding(cone_corpus, tiny_bert, cli, tmp_path):
    corpus, _ = cone_corpus  # no --vectors: the refusal must come before any encoding
    done = cli("build", corpus, "--model", tiny_bert, "-c", "flow-64", "--index-dir", tmp_path / "indexes")
    assert done.returncode == 1 and "needs K <= the vector dimension 32" in done.stderr
    assert "Encoding" not in done.stderr


def test_fit_queries_with_calibrator_none_says_they_are_ignored(cone_corpus, tiny_bert, cli, tmp_path):
    corpus, vectors = cone_corpus
    queries = tmp_path / "queries.txt"
    queries.write_text("a query\n", encoding="utf-8")
    done = cli("build", corpus, "--vectors", vectors, "--model", tiny_bert, "-c", "none", "--fit-queries", queries,
               "--index-dir", tmp_path / "indexes")
    assert done.returncode == 0 and "--fit-queries ignored: calibrator none fits nothing" in done.stderr
