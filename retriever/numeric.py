"""Small numeric helpers every layer shares: unit-length rows, and how anisotropic a set of vectors is."""

from __future__ import annotations

import numpy as np


def row_norms(vectors: np.ndarray) -> np.ndarray:
    """Each row's L2 norm, in the rows' precision, summed in one pass over the rows: `np.linalg.norm` first writes
    every squared element to a temporary as large as VECTORS, and a build normalizes all its vectors several times."""
    return np.sqrt(np.einsum("ij,ij->i", vectors, vectors))


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """VECTORS scaled to unit length, row by row, in their own precision (a zero row stays zero)."""
    return vectors / np.maximum(row_norms(vectors), 1e-12)[:, None]


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Unit-length rows as float32: what the vector indexes store and search with (inner product = cosine)."""
    return unit_rows(vectors).astype(np.float32, copy=False)


def l2_normalize_in_place(vectors: np.ndarray) -> np.ndarray:
    """`l2_normalize` of an array the caller owns (a calibrator's transform gives a new one), its rows scaled in
    place where it is float32: a new array as large costs the first touch of each of its pages, several times the
    division itself (a tenth of a second for 50,000 vectors of 384 dimensions, many times in a build)."""
    if vectors.dtype != np.float32 or not vectors.flags.writeable:
        return l2_normalize(vectors)
    vectors /= np.maximum(row_norms(vectors), 1e-12)[:, None]
    return vectors


# What a query's products run on. OpenBLAS threads a matrix-vector product past about 9,000 numbers and a matrix
# product past about 260,000 multiplications (one 768-d vector through a 768 x 768 matrix), and its worker threads
# then go on spinning for a while: on a machine of few cores they take a core from what comes next (the next
# query's encoder, an IVF scan), which waits several times longer (benchmarks/results/README.md, "The query path at
# a million passages"). A query's products are small, so they run on the calling thread (`np.einsum`, no BLAS);
# a batch of more than FEW_ROWS rows is worth BLAS's threads.
FEW_ROWS = 4


def row_dots(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Each row of MATRIX dotted with VECTOR, on the calling thread: a search scores a few hundred or thousand
    stored vectors against its query this way."""
    return np.einsum("ij,j->i", matrix, vector)


def product(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """LEFT @ RIGHT (2-d), on the calling thread where LEFT has at most FEW_ROWS rows (a query's vector through a
    calibrator), else through BLAS."""
    return np.einsum("ij,jk->ik", left, right) if len(left) <= FEW_ROWS else left @ right


# Random pairs whose cosines `anisotropy` computes at a time.
PAIR_BLOCK = 512


def anisotropy(vectors: np.ndarray, seed: int = 0, pairs: int = 20_000) -> dict:
    """What cosine similarity sees of VECTORS: the mean cosine of PAIRS random pairs (0 for an isotropic space, near
    1 for a narrow cone), drawn with SEED, and the share of the variance of the unit vectors along their top
    direction. Empty for fewer than 2 vectors."""
    if len(vectors) < 2:
        return {}
    unit = unit_rows(vectors)
    first, second = np.random.default_rng(seed).integers(0, len(unit), (2, pairs))
    distinct = first != second
    first, second = first[distinct], second[distinct]
    # A block of pairs at a time: the pairs' rows gathered at once are tens of megabytes of fresh memory, whose
    # first touch costs more than the products (most of this function's time in a build of a few hundred records).
    total = sum(float(np.einsum("ij,ij->i", unit[first[start : start + PAIR_BLOCK]],
                                unit[second[start : start + PAIR_BLOCK]]).sum(dtype=np.float64))
                for start in range(0, len(first), PAIR_BLOCK))
    mean_cosine = total / len(first) if len(first) else 0.0
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


def ledoit_wolf(centered: np.ndarray) -> np.ndarray:
    """The Ledoit-Wolf shrunk covariance of CENTERED rows (Ledoit and Wolf, J. Multivar. Anal. 2004): the sample
    covariance pulled towards a scaled identity by the shrinkage their formula estimates, float64. What
    scikit-learn's `ledoit_wolf(X, assume_centered=True)` computes, to float rounding (a test holds them equal);
    written out because importing scikit-learn costs about a second, more than a small corpus's whole fit."""
    X = np.asarray(centered, dtype=np.float64)
    n, p = X.shape
    covariance = X.T @ X / n
    if p == 1:
        return covariance
    squares = X**2
    trace = squares.sum(axis=0) / n
    mu = trace.sum() / p
    delta_sum = float(np.square(covariance).sum())  # the squared coefficients of <X.T, X>, over n^2
    beta = (float((squares.T @ squares).sum()) / n - delta_sum) / (p * n)
    delta = (delta_sum - 2.0 * mu * trace.sum() + p * mu**2) / p
    beta = min(beta, delta)  # never shrink past the identity
    shrinkage = 0.0 if beta == 0 else beta / delta
    shrunk = (1.0 - shrinkage) * covariance
    shrunk.flat[:: p + 1] += shrinkage * mu
    return shrunk
