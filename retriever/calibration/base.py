"""The Calibrator interface, and the input checks and chunked statistics every calibrator shares.

A calibrator maps raw sentence vectors to a space where cosine similarity works better (BERT-flow, whitening, ...).
It is fitted once on a sample of the corpus, saved next to the index as `calibrator.json` plus a weights file, and
applied to every document and query vector before the index L2-normalizes them.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError
from retriever.text import counted

CONFIG_FILE = "calibrator.json"
# Rows per chunk when streaming over X: bounds memory on large memmaps (65,536 x 768 float64 is 400 MB).
CHUNK_ROWS = 65536

# The names a flow is saved and asked for under: flow, flow-K (whitening-K first), with +lu for LU mixing.
FLOW_NAME = re.compile(r"^flow(?:-(\d+))?(\+lu)?$")


_KINDS: list[type] = []  # every Calibrator subclass, in definition order


class Calibrator(ABC):
    """Fitted map from raw vectors (n, dim) to calibrated float32 vectors (n, d_out)."""

    name: str
    dim: int | None = None
    # File written next to calibrator.json by `save` (None: the calibrator has no weights).
    weights_file: str | None = None
    # Whether `fit` takes a retrieval check set (`fit(X, check=...)`): pseudo-queries made from the corpus's texts,
    # which only the caller that has the texts and the encoder can make (`auto`).
    uses_check: bool = False

    @abstractmethod
    def fit(self, X: np.ndarray) -> Calibrator:
        """Learn the map from X (n, d), an array or an np.memmap; returns self."""

    @abstractmethod
    def transform(self, X: np.ndarray) -> np.ndarray:
        """Calibrated vectors, float32 (n, d_out): a new array, the caller's to change (normalized in place)."""

    @abstractmethod
    def config(self) -> dict:
        """Name and hyperparameters, JSON-able; `from_config(config())` rebuilds an unfitted copy."""

    @classmethod
    def from_config(cls, config: dict) -> Calibrator:
        options = {key: value for key, value in config.items() if key not in ("name", "dim")}
        try:
            return cls(**options)
        except TypeError:
            raise RetrieverError(f"calibrator '{config['name']}' has options this version does not know: "
                                 f"{', '.join(sorted(options))}") from None

    @property
    def fitted(self) -> bool:
        return self.dim is not None

    def min_fit_rows(self, dim: int) -> int:
        """The fewest DIM-dimensional vectors this calibrator can be fitted on meaningfully; `Index.build` falls
        back to no calibration below it, and `refit` refuses. Two by default: a mean and a spread need two."""
        return 2

    def min_fit_reason(self, dim: int) -> str:
        """Why `min_fit_rows` is what it is, for messages: "for 384 dimensions"."""
        return ""

    def check_dim(self, dim: int) -> None:
        """Refuse, before any encoding, vectors of a dimension this calibrator cannot take (K > dim)."""

    # --- persistence -------------------------------------------------------------------------------------------

    def save(self, folder: str | Path) -> None:
        self._require_fitted()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.weights_file is not None:
            self._save_weights(folder / self.weights_file)
        record = {**self.config(), "dim": self.dim}
        (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS.append(cls)  # so `Calibrator.load` finds the class of a saved name without importing them all

    @classmethod
    def takes_name(cls, name: str) -> bool:
        """Whether a calibrator saved under NAME is one of this class (flow-256 is a flow, whitening-64 a
        whitening)."""
        return name == getattr(cls, "name", None)

    @classmethod
    def load(cls, folder: str | Path) -> Calibrator:
        if cls is Calibrator:  # the abstract class: let the name in calibrator.json pick the subclass
            name = str(read_config(folder)["name"])
            kind = next((kind for kind in _KINDS if not getattr(kind, "__abstractmethods__", None)
                         and kind.takes_name(name)), None)
            if kind is None:
                raise RetrieverError(f"calibrator in {folder} has unknown name '{name}'")
            return kind.load(folder)
        record = read_config(folder)
        calibrator = cls.from_config(record)
        if calibrator.name != record["name"]:
            raise RetrieverError(f"calibrator in {folder} is '{record['name']}', not '{calibrator.name}'")
        calibrator.dim = int(record["dim"])
        calibrator._load_weights_from(folder)
        return calibrator

    def _load_weights_from(self, folder: str | Path) -> None:
        """Read this calibrator's weights file from FOLDER, if it has one."""
        if self.weights_file is not None:
            path = Path(folder) / self.weights_file
            if not path.is_file():
                raise RetrieverError(f"calibrator in {folder} has no weights file {self.weights_file}")
            self._load_weights(path)

    def _save_weights(self, path: Path) -> None:
        raise NotImplementedError  # only calibrators with a weights_file implement these two

    def _load_weights(self, path: Path) -> None:
        raise NotImplementedError

    # --- checks shared by fit and transform --------------------------------------------------------------------

    def _require_fitted(self) -> None:
        if not self.fitted:
            raise RetrieverError(f"calibrator '{self.name}' is not fitted yet; call fit first")

    def _check_fit_input(self, X: np.ndarray, min_rows: int = 2) -> int:
        """Validate X for fit; returns its dimension."""
        check_matrix(X)
        if X.shape[0] < min_rows:
            raise RetrieverError(
                f"calibrator '{self.name}' needs at least {counted(min_rows, 'vector')} to fit (got {X.shape[0]:,})"
            )
        return X.shape[1]

    def _check_transform_input(self, X: np.ndarray) -> None:
        self._require_fitted()
        check_matrix(X)
        if X.shape[1] != self.dim:
            raise RetrieverError(
                f"X has {X.shape[1]}-dim vectors but calibrator '{self.name}' was fitted on {self.dim}-dim vectors"
            )


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise RetrieverError(f"no {CONFIG_FILE} in {folder}; is this an index or calibrator folder?")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise RetrieverError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from None
    if not isinstance(record, dict) or "name" not in record or "dim" not in record:
        raise RetrieverError(f"{path} lacks the 'name' and 'dim' fields of a calibrator")
    return record


def row_chunks(X: np.ndarray, rows: int | None = None) -> Iterator[np.ndarray]:
    """X in consecutive row blocks, so a memmap is never read whole."""
    rows = rows or CHUNK_ROWS
    for start in range(0, X.shape[0], rows):
        yield X[start : start + rows]


def check_matrix(X: np.ndarray) -> None:
    """A 2-D real-valued array with at least one column and only finite values, else RetrieverError."""
    if not hasattr(X, "shape") or not hasattr(X, "dtype"):
        raise RetrieverError(f"X must be a numpy array, got {type(X).__name__}")
    if X.ndim != 2:
        raise RetrieverError(f"X must be a 2-D array (n vectors, dim), got shape {tuple(X.shape)}")
    if X.shape[1] == 0:
        raise RetrieverError("X has vectors of dimension 0")
    if not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer)):
        raise RetrieverError(f"X must hold real numbers, got dtype {X.dtype}")
    if np.issubdtype(X.dtype, np.floating):
        bad_rows = sum(int((~np.isfinite(chunk)).any(axis=1).sum()) for chunk in row_chunks(X))
        if bad_rows:
            raise RetrieverError(f"X has {bad_rows} row{'s' if bad_rows != 1 else ''} with NaN or inf values")


def column_mean(X: np.ndarray) -> np.ndarray:
    """Per-column mean in float64, streamed over row chunks."""
    total = np.zeros(X.shape[1], dtype=np.float64)
    for chunk in row_chunks(X):
        total += chunk.sum(axis=0, dtype=np.float64)
    return total / X.shape[0]


def centered_gram(X: np.ndarray, mean: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    """sum_i (x_i - mean)(x_i - mean)^T in float64 (optionally of (x_i - mean) / scale), streamed over chunks.

    Centering each chunk before the product (a second pass rather than E[xx^T] - mu mu^T) avoids cancellation
    when the mean is large next to the spread, as it is for raw transformer embeddings.
    """
    gram = np.zeros((X.shape[1], X.shape[1]), dtype=np.float64)
    for chunk in row_chunks(X):
        centered = chunk.astype(np.float64) - mean
        if scale is not None:
            centered /= scale
        gram += centered.T @ centered
    return gram
