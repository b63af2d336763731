"""Diagnostics of a built index's calibration: does it help this corpus (`retrieval_check`), and how isotropic
are its vectors before and after (`isotropy`). `Index.check` and `Index.info` hand them the version's data;
nothing here reads an index itself."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from retriever.calibration import AutoCalibrator, Calibrator, make_calibrator
from retriever.calibration.auto import supported_kinds, voting_kinds
from retriever.calibration.check import CONFIDENCE, CheckSet, baseline_result, compare, score_queries
from retriever.calibration.pseudo_queries import CheckRounds
from retriever.errors import RetrieverError, param
from retriever.numeric import anisotropy, l2_normalize


def retrieval_check(name: str, documents: int, documents_at, vectors_at, raw_sample: Callable[[int, int], np.ndarray],
                    encoder, calibrator: Calibrator, calibrator_name: str, fit_sample: int | None, seed: int = 0,
                    progress: bool = False, check: CheckSet | CheckRounds | None = None) -> dict:
    """The retrieval check on index NAME's own DOCUMENTS, without labels: pseudo-queries made from them
    (`pseudo_queries`, reading DOCUMENTS_AT and VECTORS_AT, encoded by ENCODER), searched through the raw
    vectors, through `auto`'s candidates fitted on RAW_SAMPLE(size, seed), and through the index's own
    CALIBRATOR (recorded as CALIBRATOR_NAME), read in rounds as a build reads them (`CheckRounds`). Returns the
    check's record (`AutoCalibrator.decision["check"]`: the round that settled auto's choice) with what auto would
    choose now ("auto") and the index's own calibrator's result on the same round ("current"). CHECK: the
    pseudo-queries, already made (what the caller checks something else on too)."""
    if fit_sample is not None and fit_sample < 2:  # as a build refuses it (0 read as "all" before)
        raise RetrieverError(f"{param('fit_sample')} must be at least 2 (got {fit_sample})")
    if check is None:
        check = CheckRounds(documents, documents_at, vectors_at, encoder, seed, progress=progress)
    if not documents:
        raise RetrieverError(f"index '{name}' holds no document: there is nothing to check")
    if not len(check):
        raise RetrieverError(f"index '{name}' has no document long enough to cut a pseudo-query from (a title and "
                             "3 words of text, or 6 words): there is nothing to check with")
    auto = make_calibrator("auto", seed=seed, device="cpu")
    auto.fit(raw_sample(fit_sample or documents, seed), check=check)
    if isinstance(check, CheckRounds):
        check = check.at(auto.decision.get("check", {}).get("pseudo_queries", check.planned))
    baseline = score_queries(check, lambda raw: np.asarray(raw, np.float32))
    none, voters = baseline_result("none", check, baseline), voting_kinds(check)
    record = dict(auto.decision.get("check") or {
        "pseudo_queries": len(check), "kinds": check.counts(), "pool": check.pool_size, "confidence": CONFIDENCE,
        "voting_kinds": voters, "none": none.record(), "candidates": []})
    current = calibrator.chosen if isinstance(calibrator, AutoCalibrator) else calibrator
    if current.name != "none":
        (result,) = compare(check, baseline, [(current.name, score_queries(check, current.transform))],
                            confidence=record["confidence"], seed=seed)
        record["current"] = {**result.record(), "kinds_improved": supported_kinds(result, none, voters)}
    else:
        record["current"] = {"name": "none"}
    record["current"]["calibrator"] = calibrator_name
    record["auto"] = {"chosen": auto.decision["chosen"]["name"], "reason": auto.decision["reason"]}
    return record


def isotropy(raw: np.ndarray, calibrator: Calibrator, seed: int = 0) -> dict:
    """How anisotropic RAW vectors are, and the same vectors through CALIBRATOR and L2 normalization
    (`numeric.anisotropy`, the same pairs for both: calibrator none reads the same before and after)."""
    calibrated = l2_normalize(calibrator.transform(raw)) if len(raw) else raw
    return {"raw": anisotropy(raw, seed=seed), "calibrated": anisotropy(calibrated, seed=seed) if len(raw) else {}}
