"""Linear calibrators: identity, whitening (BERT-whitening), standard normalization, and nulling the top singular
directions (natsv). All compute in float64 and return float32.

Each is fully described by its name ("whitening-256", "sn+natsv-5"), so `config()` is just the name.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from retriever.calibration.base import Calibrator, centered_gram, column_mean, row_chunks
from retriever.errors import RetrieverError
from retriever.numeric import ledoit_wolf, product
from retriever.store.arrays import HEADER_LOCK

# Eigenvalues are raised to at least this fraction of the largest, so exactly singular covariances (constant or
# duplicated dimensions, as in MiniLM's last layer) give finite weights instead of inf.
EIGENVALUE_FLOOR = 1e-12
# A dimension whose std is below this fraction of the largest std is treated as constant by `sn`: it is centered
# but not scaled up, since scaling would turn float round-off into unit-variance noise.
CONSTANT_STD = 1e-6
# Rows transformed at a time: a block's float64 intermediates (4,096 x 768 is 25 MB) are reused from block to block
# instead of a whole memmap chunk's being allocated, and first touched, on every call: auto's check transforms its
# 50,000 stored vectors once per candidate, and 60,000 rows through whitening took 0.16 to 0.62 s in one block, 0.12 s
# in these. The same bits either way (a test): no row's products depend on the rows beside it.
TRANSFORM_ROWS = 4096


class LinearCalibrator(Calibrator):
    """y = (x - mean) / scale, then minus its projection on `removed`, then @ W; each part optional, set by `fit`."""

    weights_file = "calibrator.npz"

    def __init__(self):
        self.dim = None
        self.mean: np.ndarray | None = None
        self.scale: np.ndarray | None = None  # (dim,), None: no per-dimension scaling
        self.removed: np.ndarray | None = None  # (dim, K) orthonormal directions to null, None: none
        self.W: np.ndarray | None = None  # (dim, d_out), None: no projection

    def config(self) -> dict:
        return {"name": self.name}

    @classmethod
    def takes_name(cls, name: str) -> bool:
        return type(make_linear(name)) is cls

    @classmethod
    def from_config(cls, config: dict) -> Calibrator:
        calibrator = make_linear(config["name"])
        if not isinstance(calibrator, cls):
            raise RetrieverError(f"'{config['name']}' is not a {cls.__name__} name")
        return calibrator

    def transform(self, X: np.ndarray) -> np.ndarray:
        self._check_transform_input(X)
        out_dim = self.W.shape[1] if self.W is not None else self.dim
        out = np.empty((X.shape[0], out_dim), dtype=np.float32)
        start = 0
        for chunk in row_chunks(X, TRANSFORM_ROWS):
            y = chunk.astype(np.float64) - self.mean
            if self.scale is not None:
                y /= self.scale
            if self.removed is not None:
                y -= product(product(y, self.removed), self.removed.T)  # O(dim K) per vector, not O(dim^2)
            if self.W is not None:
                y = product(y, self.W)
            out[start : start + len(chunk)] = y
            start += len(chunk)
        return out

    def _save_weights(self, path: Path) -> None:
        arrays = {"mean": self.mean}
        for key in ("scale", "removed", "W"):
            if getattr(self, key) is not None:
                arrays[key] = getattr(self, key)
        with open(path, "wb") as file:  # a file object stops numpy from appending a second .npz
            np.savez(file, **arrays)

    def _load_weights(self, path: Path) -> None:
        with HEADER_LOCK, np.load(path) as arrays:  # each array's header is parsed as it is read
            self.mean = arrays["mean"]
            for key in ("scale", "removed", "W"):
                setattr(self, key, arrays[key] if key in arrays else None)
        if self.mean.shape != (self.dim,) or any(
            array is not None and array.shape[0] != self.dim for array in (self.scale, self.removed, self.W)
        ):
            raise RetrieverError(f"{path} does not match the {self.dim}-dim calibrator described next to it")


class Identity(LinearCalibrator):
    """`none`: vectors pass through unchanged (the index still L2-normalizes them)."""

    name = "none"
    weights_file = None

    def fit(self, X: np.ndarray) -> Identity:
        self.dim = self._check_fit_input(X, min_rows=0)
        return self

    def min_fit_rows(self, dim: int) -> int:
        return 0  # learns nothing

    def transform(self, X: np.ndarray) -> np.ndarray:
        self._check_transform_input(X)
        return np.array(X, dtype=np.float32)  # a copy: callers normalize the result in place


class Whitening(LinearCalibrator):
    """BERT-whitening (Su et al. 2021): y = (x - mu) U diag(1/sqrt(s)), keeping the top `k` dimensions if given."""

    def __init__(self, k: int | None = None):
        super().__init__()
        self.k = k
        self.name = "whitening" if k is None else f"whitening-{k}"

    def check_dim(self, dim: int) -> None:
        _check_k(self.name, self.k, dim)

    # The minimum stays the default two: below dim + 1 vectors the covariance is singular, and `fit` shrinks it
    # towards the identity (Ledoit-Wolf) with a warning, which still gives every direction a finite scale.

    def fit(self, X: np.ndarray) -> Whitening:
        dim = self._check_fit_input(X)
        _check_k(self.name, self.k, dim)
        self.mean = column_mean(X)
        n = X.shape[0]
        if n <= dim:
            # The sample covariance has rank < dim: shrink it towards a scaled identity (Ledoit-Wolf) so every
            # direction gets a finite, data-informed scale instead of 1/sqrt(0).
            warnings.warn(
                f"whitening fitted on {n} vectors of dimension {dim}: the covariance is singular, "
                "so it is shrunk towards the identity (Ledoit-Wolf); fit on more vectors than dimensions",
                stacklevel=2,
            )
            cov = ledoit_wolf(np.asarray(X, dtype=np.float64) - self.mean)
        else:
            cov = centered_gram(X, self.mean) / (n - 1)
        U, s, _ = np.linalg.svd(cov, hermitian=True)
        if s[0] <= 0:
            raise RetrieverError(f"cannot whiten: all {n} vectors are identical")
        s = np.maximum(s, s[0] * EIGENVALUE_FLOOR)
        W = U / np.sqrt(s)
        self.W = W if self.k is None else W[:, : self.k]
        self.dim = dim
        return self


class StandardNormalization(LinearCalibrator):
    """`sn`: per-dimension mean 0, std 1."""

    name = "sn"

    def fit(self, X: np.ndarray) -> StandardNormalization:
        self.dim = self._check_fit_input(X)
        self.mean, self.scale = _mean_and_scale(X)
        return self


class NullTopSingular(LinearCalibrator):
    """`natsv-K`: center, then remove each vector's projection on the top K right singular vectors of the centered
    data (the few dominant directions that make raw embeddings anisotropic). `sn+natsv-K` standardizes first."""

    def __init__(self, k: int, standardize: bool = False):
        super().__init__()
        self.k = k
        self.standardize = standardize
        self.name = f"sn+natsv-{k}" if standardize else f"natsv-{k}"

    def check_dim(self, dim: int) -> None:
        _check_k(self.name, self.k, dim)

    def min_fit_rows(self, dim: int) -> int:
        # n centered vectors span at most n - 1 directions: with fewer than K + 1, some of the K "top singular
        # directions" would be arbitrary ones of the null space, and nulling them would delete real signal.
        return max(2, self.k + 1)

    def min_fit_reason(self, dim: int) -> str:
        return f"to find {self.k} directions"

    def fit(self, X: np.ndarray) -> NullTopSingular:
        dim = self._check_fit_input(X)
        _check_k(self.name, self.k, dim)
        mean, scale = _mean_and_scale(X) if self.standardize else (column_mean(X), None)
        # Right singular vectors of the centered data = eigenvectors of its Gram matrix (streams over memmaps).
        U, _, _ = np.linalg.svd(centered_gram(X, mean, scale), hermitian=True)
        self.mean, self.scale, self.removed = mean, scale, U[:, : self.k]
        self.dim = dim
        return self


def _mean_and_scale(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = column_mean(X)
    squares = np.zeros(X.shape[1], dtype=np.float64)
    for chunk in row_chunks(X):
        squares += ((chunk.astype(np.float64) - mean) ** 2).sum(axis=0)
    std = np.sqrt(squares / X.shape[0])
    scale = np.where(std > CONSTANT_STD * std.max(), std, 1.0)
    return mean, scale


def _check_k(name: str, k: int | None, dim: int) -> None:
    if k is not None and k > dim:
        raise RetrieverError(f"calibrator '{name}' needs K <= the vector dimension {dim}")


_LINEAR_NAME = re.compile(r"^(none|sn|whitening)$|^(whitening|natsv|sn\+natsv)-(\d+)$")


def make_linear(name: str) -> LinearCalibrator | None:
    """The linear calibrator a name describes, or None if the name is not a linear one."""
    match = _LINEAR_NAME.match(name)
    if match is None:
        return None
    if match.group(1) is not None:
        return {"none": Identity, "sn": StandardNormalization, "whitening": Whitening}[match.group(1)]()
    kind, k = match.group(2), int(match.group(3))
    if k < 1:
        raise RetrieverError(f"calibrator '{name}': K must be at least 1")
    if kind == "whitening":
        return Whitening(k)
    return NullTopSingular(k, standardize=kind == "sn+natsv")


