"""The ``--plot`` figure: BERT-flow's Figure 2 (similarity vs word edit distance on STS-B dev, for the gold scores,
the raw and each calibrated similarity) above the singular-value spectrum of the embeddings before and after
calibration. matplotlib is imported here only, so the rest of ``bench`` never pays for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from retriever.numeric import unit_rows
from retriever.errors import RetrieverError, UnavailableError, param
from retriever.evaluation.evaluators import spearman_x100

CLOSE, FAR = "#2ca02c", "#1f77b4"  # the paper's green (edit distance <= 4) and blue
SPECTRUM_FLOOR = 1e-4


def plot_lexical_and_spectrum(
    path: str | Path,
    gold: np.ndarray,
    similarities: Mapping[str, np.ndarray],
    distances: np.ndarray,
    vectors: Mapping[str, np.ndarray],
    max_distance: int = 4,
    title: str = "",
) -> Path:
    """Write the figure to ``path`` (format from its extension, e.g. .png) and return the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UnavailableError(f"{param('plot')} needs matplotlib (pip install matplotlib)") from None

    panels = {"gold": np.asarray(gold, dtype=float), **similarities}
    close = distances <= max_distance
    figure = plt.figure(figsize=(3.1 * len(panels), 7.4), layout="constrained")
    grid = figure.add_gridspec(2, len(panels), height_ratios=[1, 0.9])
    for column, (name, values) in enumerate(panels.items()):
        axes = figure.add_subplot(grid[0, column])
        axes.scatter(values[~close], distances[~close], s=5, alpha=0.35, color=FAR, linewidths=0,
                     label=f"edit distance > {max_distance}")
        axes.scatter(values[close], distances[close], s=5, alpha=0.6, color=CLOSE, linewidths=0,
                     label=f"edit distance ≤ {max_distance}")
        rho = spearman_x100(values, distances)
        axes.set_title(f"{'gold score' if name == 'gold' else name}\nρ(edit distance) = {rho:.1f}", fontsize=10)
        axes.set_xlabel("gold similarity (0–5)" if name == "gold" else "cosine similarity", fontsize=9)
        if column == 0:
            axes.set_ylabel("word edit distance", fontsize=9)
            axes.legend(fontsize=7, loc="upper left", markerscale=2.5)
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.tick_params(labelsize=8)
        axes.grid(alpha=0.25)

    axes = figure.add_subplot(grid[1, :])
    for name, matrix in vectors.items():
        if not np.isfinite(matrix).all():  # a diverged calibrator: nothing meaningful to draw
            continue
        spectrum = singular_spectrum(matrix)
        axes.plot(np.arange(1, len(spectrum) + 1), spectrum, label=f"{name} ({matrix.shape[1]} dims)", linewidth=1.6)
    # Log-log: the top few values (the cone's dominant directions) get room. Exactly degenerate directions (some
    # models have constant dimensions; natsv-K nulls K) would stretch the axis to 1e-17: floor it.
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_ylim(bottom=SPECTRUM_FLOOR, top=1.5)
    axes.set_xlabel(f"singular value index (values below {SPECTRUM_FLOOR:g} not shown)", fontsize=9)
    axes.set_ylabel("σᵢ / σ₁", fontsize=9)
    axes.set_title(
        "Singular values of the unit-normalized sentence vectors (STS-B dev; the cosine space): "
        "a flat spectrum is isotropic, one dominant value is a narrow cone",
        fontsize=10,
    )
    axes.legend(fontsize=8)
    axes.grid(alpha=0.25, which="both")
    axes.tick_params(labelsize=8)
    figure.suptitle(f"STS-B dev: similarity vs lexical overlap (BERT-flow Fig. 2) — {title}", fontsize=11)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(path, dpi=130)
    except (ValueError, OSError) as error:  # unknown extension, unwritable folder
        raise RetrieverError(f"{param('plot', str(path))}: {error}") from None
    finally:
        plt.close(figure)
    return path


def singular_spectrum(vectors: np.ndarray) -> np.ndarray:
    """Singular values of the L2-normalized rows, divided by the largest: what cosine similarity sees."""
    unit = unit_rows(np.asarray(vectors, dtype=np.float64))
    values = np.linalg.svd(unit, compute_uv=False)
    return values / values[0]
