"""Whitening, standard normalization and natsv: the statistics each promises, on correlated samples."""

import warnings

import numpy as np
import pytest

from retriever.calibration import make_calibrator
from retriever.calibration.linear import NullTopSingular, StandardNormalization, Whitening
from retriever.errors import RetrieverError


def correlated_sample(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Gaussian with a random full covariance (eigenvalues 0.01-100) and means far from zero."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return (rng.normal(size=(n, dim)) * np.geomspace(10, 0.1, dim)) @ rotation.T + rng.normal(5, 3, dim)


def test_whitening_gives_identity_covariance():
    X = correlated_sample(5000, 20)
    assert np.abs(np.cov(X.T) - np.eye(20)).max() > 10
    Z = make_calibrator("whitening").fit(X).transform(X)
    assert Z.dtype == np.float32 and Z.shape == (5000, 20)
    Z = Z.astype(np.float64)
    assert np.abs(Z.mean(0)).max() < 1e-6
    assert np.abs(np.cov(Z.T) - np.eye(20)).max() < 1e-6


def test_whitening_k_keeps_the_top_k_directions():
    X = correlated_sample(5000, 20)
    full = make_calibrator("whitening").fit(X).transform(X)
    Z = make_calibrator("whitening-5").fit(X).transform(X)
    assert Z.shape == (5000, 5)
    assert np.abs(np.cov(Z.T.astype(np.float64)) - np.eye(5)).max() < 1e-6
    assert np.array_equal(Z, full[:, :5])  # the leading columns are the largest-variance directions


def test_whitening_float32_and_float64_inputs_agree():
    X = correlated_sample(3000, 16)
    from32 = make_calibrator("whitening").fit(X.astype(np.float32)).transform(X.astype(np.float32))
    from64 = make_calibrator("whitening").fit(X).transform(X)
    assert np.abs(from32 - from64).max() < 1e-3


def test_whitening_with_fewer_vectors_than_dimensions_warns_and_shrinks():
    sample = correlated_sample(530, 50)
    X, unseen = sample[:30], sample[30:]
    with pytest.warns(UserWarning, match="30 vectors of dimension 50"):
        calibrator = make_calibrator("whitening").fit(X)
    # The sample covariance has rank 29: plain whitening would scale the 21 null directions of X by ~1e6 and
    # turn any unseen vector into noise along them (measured: |z| up to 1e5). Shrinkage keeps them bounded.
    Z = calibrator.transform(unseen)
    assert np.isfinite(Z).all() and np.abs(Z).max() < 50


def test_whitening_with_enough_vectors_does_not_warn():
    X = correlated_sample(200, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_calibrator("whitening").fit(X)


def test_whitening_of_a_singular_covariance_stays_finite():
    X = correlated_sample(1000, 8)
    X = np.hstack([X, X[:, :1]])  # a duplicated column: one exactly zero eigenvalue
    Z = make_calibrator("whitening").fit(X).transform(X)
    assert np.isfinite(Z).all()


@pytest.mark.parametrize("rows, dim", [(40, 64), (300, 384), (5, 3), (10, 1)])
def test_ledoit_wolf_is_scikit_learn_s(rows, dim):
    """Fewer vectors than dimensions: whitening shrinks the covariance (Ledoit-Wolf) with NumPy, as scikit-learn
    computes it, without importing scikit-learn (about a second, more than a small corpus's whole fit)."""
    from sklearn.covariance import ledoit_wolf as scikit_learn_s

    from retriever.numeric import ledoit_wolf

    X = np.random.default_rng(rows).standard_normal((rows, dim)) @ np.random.default_rng(dim).standard_normal((dim, dim))
    X -= X.mean(axis=0)
    np.testing.assert_allclose(ledoit_wolf(X), scikit_learn_s(X, assume_centered=True)[0], rtol=1e-10, atol=1e-12)


def test_sn_gives_mean_zero_and_std_one():
    X = correlated_sample(4000, 12)
    Z = make_calibrator("sn").fit(X).transform(X).astype(np.float64)
    assert np.abs(Z.mean(0)).max() < 1e-6
    assert np.abs(Z.std(0) - 1).max() < 1e-6
    # Per-dimension only: correlations are untouched.
    assert np.allclose(np.corrcoef(Z.T), np.corrcoef(X.T), atol=1e-6)


def test_sn_leaves_constant_dimensions_at_zero():
    X = correlated_sample(500, 6)
    X[:, 2] = 7.0
    X[:, 4] = 1e-32 * np.random.default_rng(0).normal(size=500)
    Z = make_calibrator("sn").fit(X).transform(X)
    assert np.isfinite(Z).all()
    assert np.abs(Z[:, [2, 4]]).max() < 1e-12
    assert np.abs(Z[:, [0, 1, 3, 5]].std(0) - 1).max() < 1e-5


def top_right_singular_vectors(X: np.ndarray, k: int) -> np.ndarray:
    _, _, vt = np.linalg.svd(X - X.mean(0), full_matrices=False)
    return vt[:k].T


def test_natsv_removes_the_top_singular_directions():
    X = correlated_sample(3000, 10)
    Z = make_calibrator("natsv-3").fit(X).transform(X).astype(np.float64)
    top = top_right_singular_vectors(X, 3)
    assert np.abs(Z @ top).max() < 1e-4  # nothing left along the top 3 directions
    assert np.abs(Z.mean(0)).max() < 1e-5  # centered
    # Everything orthogonal to them is kept as is.
    centered = X - X.mean(0)
    expected = centered - centered @ top @ top.T
    assert np.abs(Z - expected).max() < 1e-4
    assert Z.shape == X.shape


def test_sn_plus_natsv_is_natsv_on_standardized_vectors():
    X = correlated_sample(3000, 10)
    combined = make_calibrator("sn+natsv-2").fit(X).transform(X)
    standardized = make_calibrator("sn").fit(X).transform(X).astype(np.float64)
    separate = make_calibrator("natsv-2").fit(standardized).transform(standardized)
    assert np.abs(combined - separate).max() < 1e-5


def test_k_larger_than_the_dimension_is_refused():
    X = correlated_sample(100, 8)
    for name in ("whitening-9", "natsv-9", "sn+natsv-12"):
        with pytest.raises(RetrieverError, match="K <= the vector dimension 8"):
            make_calibrator(name).fit(X)


def test_memmap_input_gives_the_same_fit(tmp_path):
    X = correlated_sample(2000, 12).astype(np.float32)
    np.save(tmp_path / "vectors.npy", X)
    memmap = np.load(tmp_path / "vectors.npy", mmap_mode="r")
    for name in ("whitening", "sn", "natsv-4"):
        assert np.array_equal(make_calibrator(name).fit(memmap).transform(X), make_calibrator(name).fit(X).transform(X))


def test_names_build_the_right_classes():
    assert isinstance(make_calibrator("whitening"), Whitening) and make_calibrator("whitening").k is None
    assert make_calibrator("whitening-256").k == 256
    assert isinstance(make_calibrator("sn"), StandardNormalization)
    natsv = make_calibrator("sn+natsv-5")
    assert isinstance(natsv, NullTopSingular) and natsv.standardize and natsv.k == 5
    assert not make_calibrator("natsv-10").standardize


def test_identical_vectors_cannot_be_whitened_but_pass_sn():
    X = np.tile(np.arange(6, dtype=np.float32), (50, 1))
    with pytest.raises(RetrieverError, match="all 50 vectors are identical"):
        make_calibrator("whitening").fit(X)
    assert np.array_equal(make_calibrator("sn").fit(X).transform(X), np.zeros_like(X))


@pytest.mark.parametrize("name", ["whitening", "whitening-16", "natsv-2", "sn"])
def test_a_query_alone_is_calibrated_as_in_a_batch(name):
    # A query's vector (a few rows) is multiplied on the calling thread, a batch through BLAS: the same vector.
    X = correlated_sample(2000, 96)
    calibrator = make_calibrator(name).fit(X)
    batch = calibrator.transform(X[:12])
    for row in range(12):
        np.testing.assert_allclose(calibrator.transform(X[row : row + 1])[0], batch[row], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["whitening-16", "sn+natsv-2"])
def test_a_build_transformed_in_blocks_gives_the_bits_of_one_block(name, monkeypatch):
    # A build's vectors, and auto's check of them, are transformed TRANSFORM_ROWS at a time: the stored bits must
    # not depend on how many rows went through together.
    from retriever.calibration import linear

    X = correlated_sample(3000, 96).astype(np.float32)
    calibrator = make_calibrator(name).fit(X)
    monkeypatch.setattr(linear, "TRANSFORM_ROWS", 1000)
    blocks = calibrator.transform(X)
    monkeypatch.setattr(linear, "TRANSFORM_ROWS", 65536)
    assert np.array_equal(blocks, calibrator.transform(X))
