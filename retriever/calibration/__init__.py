"""Calibrators: maps from raw sentence vectors to a space where cosine similarity ranks better.

    make_calibrator("auto").fit(X).save(folder)          # or "flow", "flow-256", "whitening", ...
    load_calibrator(folder, expected_dim=encoder.dim).transform(X)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retriever.calibration.auto import AutoCalibrator, describe_decision
from retriever.calibration.base import Calibrator, read_config
from retriever.calibration.check import CheckSet
from retriever.calibration.pseudo_queries import CheckRounds
from retriever.calibration.base import FLOW_NAME
from retriever.calibration.names import COMMON_OPTIONS, VALID_NAMES, fixed_class, make_fixed
from retriever.defaults import DEFAULT_FIT_SAMPLE
from retriever.errors import RetrieverError, param

DEFAULT_CALIBRATOR = "auto"

CALIBRATOR_NAMES = (
    "auto (default): decides from the corpus, no labels: a candidate (flow, flow-K, whitening-K) only where it beats "
    "the raw vectors with confidence on a retrieval check with pseudo-queries made from the corpus, else none; "
    "flow: BERT-flow, a normalizing flow that Gaussianizes the vectors; "
    "flow-K: whitening-K, then a flow in those K dimensions; "
    "flow+lu, flow-K+lu: with Glow's learnable LU 1x1 mixing in every step (slower: a dim x dim product a step); "
    "whitening or whitening-K: BERT-whitening, optionally keeping the top K dimensions; "
    "sn: per-dimension mean 0, std 1; "
    "natsv-K: center, then null the top K singular directions; "
    "sn+natsv-K: sn, then natsv-K; "
    "none: raw vectors"
)


def make_calibrator(name: str | None = DEFAULT_CALIBRATOR, **options) -> Calibrator:
    """An unfitted calibrator by name; keyword options configure the flow (levels, depth, width, lr, ...)."""
    # None is the default; an empty name is no calibrator's (`refit -c ""` quietly refitted with auto)
    name = (DEFAULT_CALIBRATOR if name is None else name).strip().lower()
    if name == AutoCalibrator.name:
        unknown = sorted(set(options) - set(COMMON_OPTIONS))
        if unknown:
            raise RetrieverError(f"calibrator 'auto' takes no option {', '.join(unknown)}")
        return AutoCalibrator(**options)
    return make_fixed(name, **options)


def fit_sample_rows(rows: int, fit_sample: int | None, seed: int = 0) -> np.ndarray | None:
    """Which rows a calibrator fits on: None for all of them (ROWS <= FIT_SAMPLE, or no bound), else FIT_SAMPLE
    distinct rows drawn uniformly with SEED, ascending (so reading them from disk goes forward)."""
    if fit_sample is not None and fit_sample < 2:
        raise RetrieverError(f"{param('fit_sample')} must be at least 2 (got {fit_sample})")
    if fit_sample is None or rows <= fit_sample:
        return None
    return np.sort(np.random.default_rng(seed).choice(rows, size=fit_sample, replace=False))


def fit_on_sample(calibrator: Calibrator, X: np.ndarray, fit_sample: int | None = DEFAULT_FIT_SAMPLE,
                  seed: int = 0, check: CheckSet | CheckRounds | None = None) -> Calibrator:
    """Fit CALIBRATOR on at most FIT_SAMPLE rows of X (all of X, as given, when it has no more), with CHECK for a
    calibrator that takes one (`auto`)."""
    rows = fit_sample_rows(len(X), fit_sample, seed)
    return fit_calibrator(calibrator, X if rows is None else np.asarray(X[rows]), check)


def fit_calibrator(calibrator: Calibrator, X: np.ndarray,
                   check: CheckSet | CheckRounds | None = None) -> Calibrator:
    """CALIBRATOR.fit(X), given the retrieval check set where it takes one (`Calibrator.uses_check`)."""
    return calibrator.fit(X, check=check) if calibrator.uses_check else calibrator.fit(X)


def too_few_to_fit(calibrator: Calibrator, rows: int, dim: int) -> str | None:
    """None when ROWS vectors of dimension DIM are enough to fit CALIBRATOR (`Calibrator.min_fit_rows`), else
    why not, e.g. "too few to fit the flow (it needs at least 385 for 384 dimensions)"."""
    needed = calibrator.min_fit_rows(dim)
    if rows >= needed:
        return None
    label = "the flow" if calibrator.name == "flow" else f"calibrator '{calibrator.name}'"
    reason = calibrator.min_fit_reason(dim)
    why = f"too few to fit {label} (it needs at least {needed:,}{' ' + reason if reason else ''})"
    # A flow fitted in fewer dimensions (flow-K: whitening to K first) needs only K + 1.
    smaller = [k for k in (256, 128, 64, 32, 16, 8, 4) if k < dim and k + 1 <= rows]
    if calibrator.name in ("flow", "flow+lu") and smaller:
        suffix = calibrator.name[len("flow"):]
        why += f"; flow-K fits in K dimensions with K + 1: try {param('calibrator', f'flow-{smaller[0]}{suffix}')}"
    return why


def saved_config(folder: str | Path, expected_dim: int | None = None) -> dict:
    """The saved calibrator's config, checked (a name and a dimension, the encoder's): what `load_calibrator`
    checks before it loads any weights."""
    record = read_config(folder)
    if expected_dim is not None and int(record["dim"]) != expected_dim:
        raise RetrieverError(
            f"calibrator in {folder} was fitted on {record['dim']}-dim vectors, this encoder gives {expected_dim}"
        )
    return record


def loads_torch(config: dict) -> bool:
    """Whether loading the saved calibrator CONFIG describes may need torch: a flow, or auto's choice of one (a flow
    saved before its NumPy map was is read through torch; one saved with it is not)."""
    chosen = (config.get("decision") or {}).get("chosen") if config.get("name") == AutoCalibrator.name else config
    return isinstance(chosen, dict) and FLOW_NAME.match(str(chosen.get("name", ""))) is not None


def load_calibrator(folder: str | Path, expected_dim: int | None = None) -> Calibrator:
    """The fitted calibrator saved in folder; refuses one fitted on vectors of another dimension."""
    record = saved_config(folder, expected_dim)
    name = str(record["name"])
    if name == AutoCalibrator.name:
        return AutoCalibrator.load(folder)
    kind = fixed_class(name)
    if kind is None:
        raise RetrieverError(f"calibrator in {folder} has unknown name '{name}'; valid names: {VALID_NAMES}")
    return kind.load(folder)


__all__ = ["AutoCalibrator", "Calibrator", "CALIBRATOR_NAMES", "DEFAULT_CALIBRATOR", "DEFAULT_FIT_SAMPLE",
           "make_calibrator", "load_calibrator", "describe_decision", "fit_calibrator", "fit_on_sample",
           "fit_sample_rows", "too_few_to_fit"]
