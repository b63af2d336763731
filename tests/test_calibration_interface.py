"""The calibrator interface every calibrator shares: factory, save/load, dimension checks, bad input."""

import json

import numpy as np
import pytest

from retriever.calibration import CALIBRATOR_NAMES, Calibrator, load_calibrator, make_calibrator
from retriever.calibration.auto import AutoCalibrator
from retriever.calibration.flow import FlowCalibrator
from retriever.errors import RetrieverError

ALL_NAMES = ["none", "flow", "whitening", "whitening-4", "sn", "natsv-2", "sn+natsv-2"]
SMALL_FLOW = {"epochs": 1, "width": 8, "device": "cpu"}


def sample(n: int = 400, dim: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, dim)) @ rng.normal(size=(dim, dim)) + 2.0).astype(np.float32)


def build(name: str) -> Calibrator:
    return make_calibrator(name, **SMALL_FLOW) if name == "flow" else make_calibrator(name)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_fit_returns_self_and_transform_gives_float32(name):
    X = sample()
    calibrator = build(name)
    assert calibrator.name == name and calibrator.dim is None
    assert calibrator.fit(X) is calibrator and calibrator.dim == 8
    Z = calibrator.transform(X[:50])
    assert Z.dtype == np.float32 and Z.shape == (50, 4 if name == "whitening-4" else 8)
    assert np.isfinite(Z).all()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_save_then_load_gives_identical_output(name, tmp_path):
    X = sample()
    calibrator = build(name).fit(X)
    calibrator.save(tmp_path / "index")
    record = json.loads((tmp_path / "index" / "calibrator.json").read_text())
    assert record["name"] == name and record["dim"] == 8
    json.dumps(calibrator.config())  # JSON-able, for manifests
    loaded = load_calibrator(tmp_path / "index", expected_dim=8)
    assert type(loaded) is type(calibrator) and loaded.config() == calibrator.config()
    assert np.array_equal(loaded.transform(X), calibrator.transform(X))


def test_none_passes_vectors_through():
    X = sample()
    assert np.array_equal(make_calibrator("none").fit(X).transform(X), X)


def test_default_name_is_auto_and_names_are_case_insensitive():
    assert isinstance(make_calibrator(), AutoCalibrator)
    assert isinstance(make_calibrator(None), AutoCalibrator)
    assert make_calibrator(" Whitening-16 ").name == "whitening-16"
    assert make_calibrator("Flow-16+LU").name == "flow-16+lu"
    for name in ("auto", "flow", "flow-K", "flow+lu", "whitening", "sn", "natsv", "sn+natsv", "none"):
        assert name in CALIBRATOR_NAMES


@pytest.mark.parametrize("name", ["bert-flow", "natsv", "whitening-", "whitening-x", "sn+natsv", "pca-5", "", " "])
def test_unknown_name_lists_the_valid_ones(name):
    with pytest.raises(RetrieverError, match=r"unknown calibrator .*valid names: auto, flow, flow-K, .*whitening, whitening-K, sn"):
        make_calibrator(name)


def test_k_must_be_positive():
    with pytest.raises(RetrieverError, match="K must be at least 1"):
        make_calibrator("whitening-0")


def test_options_are_checked():
    make_calibrator("whitening", seed=1, device="cpu")  # accepted by every calibrator, so callers can pass them
    with pytest.raises(RetrieverError, match="takes no option epochs"):
        make_calibrator("whitening", epochs=2)
    with pytest.raises(RetrieverError, match="unknown flow option depht; valid: .*depth"):
        make_calibrator("flow", depht=3)


def test_flow_config_records_the_hyperparameters():
    config = make_calibrator("flow", levels=3, width=16, seed=7, permutation="random").config()
    assert config["name"] == "flow" and config["levels"] == 3 and config["width"] == 16
    assert config["seed"] == 7 and config["permutation"] == "random"
    assert {"depth", "lr", "epochs", "batch_size", "shift_penalty"} <= config.keys()


def test_load_refuses_a_calibrator_of_another_dimension(tmp_path):
    make_calibrator("whitening").fit(sample(dim=8)).save(tmp_path)
    with pytest.raises(RetrieverError) as error:
        load_calibrator(tmp_path, expected_dim=384)
    assert str(error.value) == f"calibrator in {tmp_path} was fitted on 8-dim vectors, this encoder gives 384"


def test_load_reports_missing_or_broken_files(tmp_path):
    with pytest.raises(RetrieverError, match="no calibrator.json in"):
        load_calibrator(tmp_path)
    (tmp_path / "calibrator.json").write_text("{not json")
    with pytest.raises(RetrieverError, match="is not valid JSON"):
        load_calibrator(tmp_path)
    (tmp_path / "calibrator.json").write_text(json.dumps({"name": "magic", "dim": 8}))
    with pytest.raises(RetrieverError, match="unknown name 'magic'"):
        load_calibrator(tmp_path)
    make_calibrator("flow", **SMALL_FLOW).fit(sample()).save(tmp_path)
    (tmp_path / "flow.npz").unlink()
    with pytest.raises(RetrieverError, match="has no weights file flow.npz"):
        load_calibrator(tmp_path)


@pytest.mark.parametrize("saved", ["map and weights", "weights alone"])
@pytest.mark.parametrize("change", [{"width": 16}, {"depth": 2}, {"levels": 3}, {"permutation": "random"}])
def test_load_refuses_weights_that_do_not_match_the_json(tmp_path, saved, change):
    make_calibrator("flow", **SMALL_FLOW).fit(sample()).save(tmp_path)
    if saved == "weights alone":  # a flow saved before its NumPy map was: torch reads the weights
        (tmp_path / "flow-forward.npz").unlink()
    record = json.loads((tmp_path / "calibrator.json").read_text())
    (tmp_path / "calibrator.json").write_text(json.dumps({**record, **change}))
    with pytest.raises(RetrieverError, match="does not match the flow described next to it"):
        load_calibrator(tmp_path)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_nan_or_inf_rows_are_refused_with_a_count(name):
    X = sample()
    X[3, 1], X[10, 0], X[11, 5] = np.nan, np.inf, -np.inf
    with pytest.raises(RetrieverError, match=r"^X has 3 rows with NaN or inf values$"):
        build(name).fit(X)
    fitted = build(name).fit(sample())
    with pytest.raises(RetrieverError, match=r"^X has 1 row with NaN or inf values$"):
        fitted.transform(X[:5])


@pytest.mark.parametrize("name", ALL_NAMES)
def test_transform_checks_fit_and_dimension(name):
    with pytest.raises(RetrieverError, match="not fitted yet"):
        build(name).transform(sample())
    fitted = build(name).fit(sample(dim=8))
    with pytest.raises(RetrieverError, match="X has 6-dim vectors but calibrator .* was fitted on 8-dim vectors"):
        fitted.transform(sample(dim=6))


@pytest.mark.parametrize(
    "bad, message",
    [(np.zeros(8, dtype=np.float32), "must be a 2-D array"), (np.zeros((4, 0)), "dimension 0"),
     (np.array([["a", "b"]]), "must hold real numbers"), ([[1.0, 2.0]], "must be a numpy array")],
)
def test_malformed_input_is_refused(bad, message):
    with pytest.raises(RetrieverError, match=message):
        make_calibrator("whitening").fit(bad)


def test_too_few_vectors_to_fit():
    with pytest.raises(RetrieverError, match="needs at least 2 vectors"):
        make_calibrator("sn").fit(sample(n=1))
    with pytest.raises(RetrieverError, match=r"'auto' needs at least 1 vector to fit \(got 0\)"):  # not "1 vectors"
        make_calibrator("auto").fit(sample(n=1)[:0])


def test_calibrator_load_dispatches_on_the_saved_name(tmp_path):
    make_calibrator("sn+natsv-2").fit(sample()).save(tmp_path)
    assert Calibrator.load(tmp_path).name == "sn+natsv-2"
    with pytest.raises(RetrieverError, match="not a Whitening name"):
        type(make_calibrator("whitening")).load(tmp_path)
