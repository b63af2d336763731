"""Small numeric helpers every layer shares: unit-length rows, and how anisotropic a set of vectors is."""

from __future__ import annotations

import numpy as np


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """VECTORS scaled to unit length, row by row, in their own precision (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Unit-length rows as float32: what the vector indexes store and search with (inner product = cosine)."""
    return unit_rows(vectors).astype(np.float32, copy=False)


def anisotropy(vectors: np.ndarray, seed: int = 0, pairs: int = 20_000) -> dict:
    """What cosine similarity sees of VECTORS: the mean cosine of PAIRS random pairs (0 for an isotropic space, near
    1 for a narrow cone), drawn with SEED, and the share of the variance of the unit vectors along their top
    direction. Empty for fewer than 2 vectors."""
    if len(vectors) < 2:
        return {}
    unit = unit_rows(vectors)
    first, second = np.random.default_rng(seed).integers(0, len(unit), (2, pairs))
    distinct = first != second
    mean_cosine = float((unit[first[distinct]] * unit[second[distinct]]).sum(1).mean()) if distinct.any() else 0.0
    centered = np.asarray(unit - unit.mean(0), dtype=np.float64)
    # The (dim x dim) covariance and the (rows x rows) Gram matrix share their nonzero eigenvalues: the smaller is
    # solved (a small index's 40 x 40 rather than MiniLM's 384 x 384).
    gram = centered @ centered.T if len(centered) < centered.shape[1] else centered.T @ centered
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency, and ours

    # On one BLAS thread: an eigenproblem this size gains nothing from more, and where the cores are busy OpenBLAS's
    # threads wait on each other (seconds instead of milliseconds: `retriever info` felt it).
    with threadpool_limits(1, user_api="blas"):
        variances = np.clip(np.linalg.eigvalsh(gram), 0, None)
    total = float(variances.sum())
    return {"mean_cosine": round(mean_cosine, 4),
            "top_direction_share": round(float(variances[-1]) / total, 4) if total > 0 else 0.0}


def find_in(values: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of VALUES is in FOUND (any order, no repeats): (its index there, whether it is there at all; the
    index is meaningless where it is not)."""
    if not len(found):
        return np.zeros(len(values), np.int64), np.zeros(len(values), bool)
    order = np.argsort(found, kind="stable")
    at = order[np.minimum(np.searchsorted(found, values, sorter=order), len(found) - 1)]
    return at, found[at] == values
