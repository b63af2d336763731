"""`auto`: decide, from the corpus alone (no labels), how much to calibrate, and record why.

A tuned sentence encoder (all-MiniLM-L6-v2, all-mpnet-base-v2 at their last layer) already spreads its vectors
over the sphere: random pairs have a mean cosine near 0, and every calibrator measured on it was neutral to
harmful (benchmarks/results/README.md, "auto"). An anisotropic representation (raw BERT, an embedding layer)
packs them into a narrow cone, and there a whitened, dimension-reduced flow helps most. So:

1. anisotropy = mean cosine of random pairs of corpus vectors. Below ISOTROPIC_MEAN_COSINE: `none`.
2. Otherwise `flow-K`: whitening to the K principal directions that hold KEEP_VARIANCE of the variance, then
   the flow. The rest is the noise floor that full whitening would raise to unit variance (issue 12's held-out
   BEIR set of 5k documents, MiniLM layer 0: whitening 8.06 nDCG@10, whitening-256, about the 95% cut, 43.05).

The evidence (anisotropy, spectrum, the flow's held-out log-likelihood against the Gaussian it starts from, and
how many nearest neighbours calibration keeps) is saved with the decision, in calibrator.json, the index manifest
and `retriever info`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from retriever.calibration.base import Calibrator, centered_gram, column_mean, read_config
from retriever.calibration.flow import FlowCalibrator, _standard_normal_log_density
from retriever.calibration.linear import Identity
from retriever.errors import RetrieverError

# Mean cosine of random pairs below which a space counts as isotropic. Measured on the 11 benchmark corpora
# (benchmarks/results/auto_*.json, "decisions"): MiniLM and mpnet at their own pooling 0.021-0.066; at layer 0
# MiniLM 0.28-0.49, mpnet 0.114-0.285 (raw BERT layers: 0.6 and more per Ethayarajh 2019, not measured here).
# The cut sits between the tuned encoders and every anisotropic space measured; mpnet's layer 0 comes closest.
ISOTROPIC_MEAN_COSINE = 0.10
# Keep the principal directions that hold this share of the variance (MiniLM layer 0: 205-262 of 384).
KEEP_VARIANCE = 0.95
# Fewer vectors than this per kept direction estimate its variance too poorly to whiten by (the flow's hard
# minimum is one more than the directions): below it, auto leaves the vectors as they are. STS-16's 1,867
# sentences at MiniLM layer 0 (about 7 per direction) still gain 8 Spearman points from flow-K, so the bar is low.
ROWS_PER_DIRECTION = 4
# Rows the evidence is computed on (a seeded sample): enough for stable statistics, cheap next to the fit.
EVIDENCE_ROWS = 20_000
# Fraction of the fit rows held out to score the flow's likelihood against its Gaussian start.
HELD_OUT = 0.1
NEIGHBOURS = 10
# A 2-level flow splits its input twice: it needs at least 4 dimensions.
MIN_FLOW_DIM = 4


class AutoCalibrator(Calibrator):
    """Fits the calibrator the corpus calls for (`decision`), then transforms exactly as it does.

    A chosen flow-K is fitted on 90% of the rows given (all of them when 10% would be under 100 rows or leave too
    few to fit): the other 10% score its held-out likelihood for the evidence."""

    name = "auto"

    def __init__(self, seed: int = 0, device: str = "auto", decision: dict | None = None):
        # `decision` is accepted so that from_config(config()) works on a saved record; a new fit remakes it.
        self.seed, self.device = int(seed), device
        self.dim = None
        self.chosen: Calibrator | None = None
        self.decision: dict | None = None

    def config(self) -> dict:
        record = {"name": self.name, "seed": self.seed}
        if self.decision is not None:
            record["decision"] = self.decision
        return record

    def min_fit_rows(self, dim: int) -> int:
        return 0  # below what a flow needs, `fit` chooses `none` itself and says why

    @property
    def weights_file(self) -> str | None:  # the chosen calibrator's file, saved next to calibrator.json
        return self.chosen.weights_file if self.chosen is not None else None

    def _save_weights(self, path: Path) -> None:
        self.chosen._save_weights(path)

    def fit(self, X: np.ndarray) -> AutoCalibrator:
        dim = self._check_fit_input(X, min_rows=1)
        rng = np.random.default_rng(self.seed)
        if len(X) < 2:
            evidence, choice, reason = {"rows": len(X)}, None, "one vector: nothing to measure a spread on"
        else:
            sample = _sample(X, EVIDENCE_ROWS, rng)
            evidence = spectrum_evidence(sample, rng)
            choice, reason = _decide(evidence, len(X), dim)
        if choice is None:
            chosen: Calibrator = Identity().fit(X)
        else:
            chosen = FlowCalibrator(k=choice, seed=self.seed, device=self.device)
            fit_rows, held_out = _split(len(X), chosen.min_fit_rows(dim), rng)
            chosen.fit(X if held_out is None else np.asarray(X[fit_rows]))
            if held_out is not None:
                evidence.update(likelihood_evidence(chosen, np.asarray(X[held_out])))
            evidence.update(neighbour_evidence(sample, chosen.transform(sample), rng))
        self.chosen, self.dim = chosen, dim
        self.decision = {"chosen": chosen.config(), "reason": reason, "evidence": evidence}
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        self._require_fitted()
        return self.chosen.transform(X)

    def describe(self) -> str:
        """One line for people: what was chosen and why."""
        return describe_decision(self.decision) if self.decision else "auto (not fitted)"

    # --- persistence: calibrator.json holds the decision; the chosen calibrator's weights lie next to it ----------

    @classmethod
    def load(cls, folder: str | Path) -> AutoCalibrator:
        from retriever.calibration import make_calibrator

        record = read_config(folder)
        decision = record.get("decision")
        if not isinstance(decision, dict) or not isinstance(decision.get("chosen"), dict):
            raise RetrieverError(f"calibrator in {folder} is 'auto' but records no decision")
        calibrator = cls(seed=record.get("seed", 0), decision=decision)
        chosen = type(make_calibrator(decision["chosen"]["name"])).from_config(decision["chosen"])
        chosen.dim = int(record["dim"])
        chosen._load_weights_from(folder)
        calibrator.chosen, calibrator.dim, calibrator.decision = chosen, int(record["dim"]), decision
        return calibrator


def describe_decision(decision: dict) -> str:
    """"auto chose flow-254: mean cosine of random pairs 0.432 >= 0.1 (anisotropic); ..." for `info` and logs."""
    chosen = (decision.get("chosen") or {}).get("name", "?")
    return f"auto chose {chosen}: {decision.get('reason', 'no reason recorded')}"


def spectrum_evidence(sample: np.ndarray, rng: np.random.Generator, pairs: int = 20_000) -> dict:
    """Anisotropy and spectrum of a sample: mean cosine of random pairs, the top direction's variance share, the
    participation ratio (effective number of directions) and how many directions hold KEEP_VARIANCE."""
    unit = sample / np.maximum(np.linalg.norm(sample, axis=1, keepdims=True), 1e-12)
    first, second = rng.integers(0, len(unit), (2, pairs))
    distinct = first != second
    mean_cosine = float((unit[first[distinct]] * unit[second[distinct]]).sum(1).mean()) if distinct.any() else 0.0
    variances = np.clip(np.linalg.eigvalsh(centered_gram(sample, column_mean(sample)))[::-1], 0, None)
    total = float(variances.sum())
    if total <= 0:
        return {"rows": int(len(sample)), "mean_cosine": round(mean_cosine, 4), "top_direction_share": 0.0}
    cumulative = np.cumsum(variances) / total
    return {
        "rows": int(len(sample)),
        "mean_cosine": round(mean_cosine, 4),
        "top_direction_share": round(float(variances[0]) / total, 4),
        "participation_ratio": round(total**2 / float(np.square(variances).sum() or 1.0), 1),
        "directions_for_variance": int(np.searchsorted(cumulative, KEEP_VARIANCE) + 1),
    }


def likelihood_evidence(flow: FlowCalibrator, held_out: np.ndarray) -> dict:
    """Held-out log-likelihood per dimension of the fitted flow, and of the Gaussian it starts from (its
    whitening alone): how much the nonlinear part learned that generalises beyond the fit rows."""
    with torch.inference_mode():
        x = torch.from_numpy(np.asarray(held_out, dtype=np.float32)).to(next(flow.flow.parameters()).device)
        y, logdet = flow.flow.reduction(x)
        gaussian = (_standard_normal_log_density(y) + logdet).mean().item()
    flow_ll = float(flow.log_prob(held_out).mean())
    dims = flow.flow.dim
    return {"held_out_rows": int(len(held_out)), "held_out_loglik_per_dim_flow": round(flow_ll / dims, 4),
            "held_out_loglik_per_dim_gaussian": round(gaussian / dims, 4)}


def neighbour_evidence(raw: np.ndarray, calibrated: np.ndarray, rng: np.random.Generator, queries: int = 500) -> dict:
    """Of each sampled vector's NEIGHBOURS nearest (cosine) neighbours in the raw space, the share calibration
    keeps: near 1 means it changes little, low values that it re-orders the corpus substantially."""
    if len(raw) <= NEIGHBOURS + 1:
        return {}
    picks = rng.choice(len(raw), size=min(queries, len(raw)), replace=False)

    def neighbours(vectors: np.ndarray) -> np.ndarray:
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        scores = unit[picks] @ unit.T
        scores[np.arange(len(picks)), picks] = -np.inf  # a vector is not its own neighbour
        return np.argpartition(-scores, NEIGHBOURS, axis=1)[:, :NEIGHBOURS]

    before, after = neighbours(raw), neighbours(calibrated)
    kept = np.mean([len(np.intersect1d(b, a)) / NEIGHBOURS for b, a in zip(before, after)])
    return {f"neighbours_kept_at_{NEIGHBOURS}": round(float(kept), 4)}


def _decide(evidence: dict, rows: int, dim: int) -> tuple[int | None, str]:
    """(K for flow-K, or None for none) and the reason, in words."""
    cosine = evidence["mean_cosine"]
    if evidence["top_direction_share"] == 0:
        return None, "all vectors are identical: there is no spread to calibrate"
    if dim < MIN_FLOW_DIM:
        return None, f"{dim}-dimensional vectors are too few dimensions for a flow (it needs {MIN_FLOW_DIM})"
    if cosine < ISOTROPIC_MEAN_COSINE:
        return None, (f"mean cosine of random pairs {cosine:.3f} < {ISOTROPIC_MEAN_COSINE} (already isotropic: "
                      "calibration would only move a tuned geometry)")
    k = max(MIN_FLOW_DIM, min(evidence["directions_for_variance"], dim))
    needed = max(FlowCalibrator(k=k).min_fit_rows(dim), ROWS_PER_DIRECTION * k)
    if rows < needed:
        return None, (f"mean cosine {cosine:.3f} is anisotropic, but {rows:,} vectors are too few to fit "
                      f"flow-{k} reliably (it needs {ROWS_PER_DIRECTION} per direction, {needed:,})")
    return k, (f"mean cosine of random pairs {cosine:.3f} >= {ISOTROPIC_MEAN_COSINE} (anisotropic); "
               f"{k} of {dim} directions hold {KEEP_VARIANCE:.0%} of the variance")


def _sample(X: np.ndarray, rows: int, rng: np.random.Generator) -> np.ndarray:
    if len(X) <= rows:
        return np.asarray(X, dtype=np.float64)
    return np.asarray(X[np.sort(rng.choice(len(X), size=rows, replace=False))], dtype=np.float64)


def _split(rows: int, min_fit: int, rng: np.random.Generator) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(fit rows, held-out rows), or (None, None) when holding out would leave fewer than the fit needs."""
    held = int(rows * HELD_OUT)
    if held < 100 or rows - held < min_fit:
        return None, None
    order = rng.permutation(rows)
    return np.sort(order[held:]), np.sort(order[:held])
