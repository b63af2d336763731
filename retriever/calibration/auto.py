"""`auto`: calibrate only where a retrieval check on the corpus itself says it helps, and record why.

No statistic of the vectors alone says whether calibration helps retrieval: a tuned encoder whose random pairs
have a mean cosine of 0.13 can still lose 4 nDCG@10 points to a flow. So `auto` asks retrieval itself, without
labels. A `CheckSet` (pseudo-queries cut from the corpus's own documents, `retriever.calibration.pseudo_queries`) is searched
through each candidate calibrator, fitted on the same vectors as the final one, and through the raw vectors:

- candidates: the flow, and flow-K and whitening-K for the K principal directions that hold 95% and 99% of the
  variance (whitening every direction raises the noise floor to unit variance; cutting it is what K is for);
- whether to calibrate at all: the raw vectors stay unless some candidate beats them with confidence (the lower
  end of its paired bootstrap interval, 95% for all candidates together, `check.compare`, is above 0) *and*
  improves more than half of the kinds of pseudo-query (those with at least MIN_VOTE of them), so that no single
  kind, in particular the lexical known-item one, decides;
- which: then the best-scoring candidate among those that beat the raw vectors with confidence;
- how many pseudo-queries: as many as the answer needs (`pseudo_queries.CheckRounds`): read in rounds, a round
  before the last settles it only where the answer is clear either way (`check.verdict`).

The decision, the spectrum, the pseudo-query counts and every candidate's score with its interval are saved with
the calibrator (calibrator.json), so the manifest, `retriever info` and `retriever list` show them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from retriever.calibration.base import Calibrator, centered_gram, column_mean, read_config
from retriever.calibration.check import (CONFIDENCE, INTERIM_CONFIDENCE, CheckSet, baseline_result, compare,
                                         score_queries, verdict)
from retriever.calibration.linear import Identity, Whitening
from retriever.calibration.names import make_fixed
from retriever.calibration.pseudo_queries import CheckRounds, check_rounds
from retriever.errors import RetrieverError
from retriever.numeric import anisotropy
from retriever.text import counted_queries

# Candidates keep the principal directions that hold these shares of the variance.
VARIANCE_SHARES = (0.95, 0.99)
# Fewer pseudo-queries than this cannot tell calibrators apart: auto keeps the raw vectors.
MIN_PSEUDO_QUERIES = 50
# A kind votes on whether calibration helps only with this many pseudo-queries: the mean of fewer is too noisy
# (a few multi-sentence documents in a corpus of single sentences give a handful of `sentence` ones).
MIN_VOTE = 100
# Rows the spectrum is computed on (a seeded sample): enough for stable statistics, cheap next to the fit.
EVIDENCE_ROWS = 20_000
# Candidates are fitted on at most this many of the rows auto is given (a seeded sample), the one it keeps too: a
# flow fitted on 25,000 passage vectors of a million-passage corpus scores STS-B as well as one fitted on all of them
# (benchmarks/results/fit_sample.md), and fitting five candidates on every row was most of a large build's time.
CANDIDATE_ROWS = 25_000
# A 2-level flow splits its input twice: it needs at least 4 dimensions.
MIN_FLOW_DIM = 4


class AutoCalibrator(Calibrator):
    """Fits every candidate, keeps the one the retrieval check chooses (`decision`), transforms as it does."""

    name = "auto"
    uses_check = True

    def __init__(self, seed: int = 0, device: str = "auto", decision: dict | None = None):
        # `decision` is accepted so that from_config(config()) works on a saved record; a new fit remakes it.
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            # the check's NumPy generators take no other (a negative one failed after the corpus was encoded)
            raise RetrieverError(f"auto option seed must be an integer from 0 to 2**64 - 1 (got {seed!r})")
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
        return 0  # `fit` leaves out a candidate it has too few vectors for, and keeps the raw vectors if none is left

    @property
    def weights_file(self) -> str | None:  # the chosen calibrator's file, saved next to calibrator.json
        return self.chosen.weights_file if self.chosen is not None else None

    def _save_weights(self, path: Path) -> None:
        self.chosen._save_weights(path)

    def fit(self, X: np.ndarray, check: CheckSet | CheckRounds | None = None) -> AutoCalibrator:
        """Fit the candidates on X and keep the one CHECK chooses (read in rounds until the choice is settled, where
        it is `CheckRounds`); without a check set (no texts to make pseudo-queries from), keep the raw vectors and
        say so."""
        dim = self._check_fit_input(X, min_rows=1)
        evidence = spectrum_evidence(_sample(X, EVIDENCE_ROWS, np.random.default_rng(self.seed))) if len(X) > 1 else {}
        fitted_on = candidate_rows(X, self.seed)
        candidates, reason = self.candidates(evidence, len(fitted_on), dim, check)
        chosen: Calibrator = Identity().fit(X)
        record = None
        if candidates:
            for candidate in candidates:
                # Quietly: what a fit warns of (whitening's singular covariance, fewer vectors than dimensions) is
                # nobody's to act on here: auto rejects most candidates, and its check measured the one it keeps.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    candidate.fit(fitted_on)
            voters = voting_kinds(check)  # of every pseudo-query made: the same voters in every round
            check, planned, results, none = self._settled(check, candidates, chosen.transform, voters)
            best, agreed, winners = decide(results, none, voters)
            if agreed:
                chosen = next(c for c in candidates if c.name == best.name)
            reason = _reason(best, agreed, winners, voters, check, planned)
            if agreed and len(fitted_on) < len(X):
                reason += f" (fitted on {len(fitted_on):,} of the {len(X):,} vectors, a seeded sample)"
            confidence = CONFIDENCE if len(check) == planned else INTERIM_CONFIDENCE
            record = {"pseudo_queries": len(check), "planned": planned, "kinds": check.counts(),
                      **({"fitted_on": len(fitted_on), "of": len(X)} if len(fitted_on) < len(X) else {}),
                      "pool": check.pool_size, "confidence": confidence, "voting_kinds": voters, "none": none.record(),
                      "candidates": [{**result.record(), "kinds_improved": supported_kinds(result, none, voters)}
                                     for result in results]}
        self.chosen, self.dim = chosen, dim
        self.decision = {"chosen": chosen.config(), "reason": reason, "evidence": evidence,
                         **({"check": record} if record else {})}
        return self

    def _settled(self, check: CheckSet | CheckRounds, candidates: list[Calibrator], raw, voters: list[str]) -> tuple:
        """The round of CHECK that settles the choice, with the pseudo-queries planned, each fitted candidate's
        result there and the raw vectors' (RAW: their transform): the first round where the best-scoring candidate
        beats the raw vectors with confidence (`INTERIM_CONFIDENCE`, the results then at that confidence) and
        improves most of VOTERS, or where no candidate could on all the pseudo-queries (`check.verdict`); else the
        last."""
        for current, planned in check_rounds(check):
            baseline = score_queries(current, raw)
            scores = [(candidate.name, score_queries(current, candidate.transform)) for candidate in candidates]
            results = compare(current, baseline, scores, seed=self.seed)
            none = baseline_result("none", current, baseline)
            if len(current) == planned:
                return current, planned, results, none
            shown = compare(current, baseline, scores, confidence=INTERIM_CONFIDENCE, seed=self.seed)
            verdicts = [verdict(strict.low, result.low, result.high, len(current), planned)
                        for result, strict in zip(results, shown)]
            leader = max(range(len(results)), key=lambda number: results[number].ndcg)
            if all(answer is False for answer in verdicts) or (verdicts[leader] and supported(shown[leader], none,
                                                                                              voters)):
                return current, planned, shown, none
        raise AssertionError("a check's rounds end with all its pseudo-queries")

    def candidates(self, evidence: dict, rows: int, dim: int,
                   check: CheckSet | CheckRounds | None) -> tuple[list[Calibrator], str | None]:
        """The unfitted candidates for ROWS vectors of DIM dimensions, or none and why none is tried."""
        if check is None:
            return [], "no pseudo-queries to check calibration with (auto decides from the corpus's texts, which an " \
                       "index build, refit or bench gives it): raw vectors kept"
        if len(check) < MIN_PSEUDO_QUERIES:
            return [], (f"only {len(check)} pseudo-queries could be made from the corpus (its documents are too "
                        "short or too few, or written without spaces between words, as Chinese or Japanese; at "
                        f"least {MIN_PSEUDO_QUERIES} are needed to tell calibrators apart): raw vectors kept")
        if not evidence.get("directions"):
            return [], "all vectors are identical: there is no spread to calibrate"
        if dim < MIN_FLOW_DIM:
            return [], f"{dim}-dimensional vectors are too few dimensions for a flow (it needs {MIN_FLOW_DIM})"
        from retriever.calibration.flow import FlowCalibrator

        found: list[Calibrator] = [FlowCalibrator(seed=self.seed, device=self.device)]
        for k in dict.fromkeys(evidence["directions"].values()):
            if MIN_FLOW_DIM <= k < dim:
                found += [FlowCalibrator(k=k, seed=self.seed, device=self.device), Whitening(k)]
        found = [c for c in found if rows >= c.min_fit_rows(dim)]
        if not found:
            return [], (f"{rows:,} vectors are too few to fit any candidate (a flow on {dim} dimensions needs "
                        f"{dim + 1:,}): raw vectors kept")
        return found, None

    def transform(self, X: np.ndarray) -> np.ndarray:
        self._require_fitted()
        return self.chosen.transform(X)

    def describe(self) -> str:
        """One line for people: what was chosen and why."""
        return describe_decision(self.decision) if self.decision else "auto (not fitted)"

    # --- persistence: calibrator.json holds the decision; the chosen calibrator's weights lie next to it ----------

    @classmethod
    def load(cls, folder: str | Path) -> AutoCalibrator:
        record = read_config(folder)
        decision = record.get("decision")
        if not isinstance(decision, dict) or not isinstance(decision.get("chosen"), dict):
            raise RetrieverError(f"calibrator in {folder} is 'auto' but records no decision")
        calibrator = cls(seed=record.get("seed", 0), decision=decision)
        chosen = type(make_fixed(decision["chosen"]["name"])).from_config(decision["chosen"])
        chosen.dim = int(record["dim"])
        chosen._load_weights_from(folder)
        calibrator.chosen, calibrator.dim, calibrator.decision = chosen, int(record["dim"]), decision
        return calibrator


def describe_decision(decision: dict) -> str:
    """"auto chose flow-254: it beat none on the retrieval check ..." for `info`, logs and the bench."""
    chosen = (decision.get("chosen") or {}).get("name", "?")
    return f"auto chose {chosen}: {decision.get('reason', 'no reason recorded')}"


def spectrum_evidence(sample: np.ndarray, pairs: int = 20_000, seed: int = 0) -> dict:
    """How anisotropic a sample is (`numeric.anisotropy`: the mean cosine of random pairs, the top direction's
    share of the unit vectors' variance) and its spectrum: the participation ratio (effective number of
    directions) and how many directions hold each of VARIANCE_SHARES of the variance (the K of flow-K and
    whitening-K). No spectrum (no "directions") where the sample has no spread."""
    evidence = {"rows": int(len(sample)), **anisotropy(sample, seed=seed, pairs=pairs)}
    variances = np.clip(np.linalg.eigvalsh(centered_gram(sample, column_mean(sample)))[::-1], 0, None)
    total = float(variances.sum())
    if total <= 0:
        return evidence
    cumulative = np.cumsum(variances) / total
    return {**evidence,
            "participation_ratio": round(total**2 / float(np.square(variances).sum() or 1.0), 1),
            "directions": {f"{share:.0%}": int(min(np.searchsorted(cumulative, share) + 1, len(variances)))
                           for share in VARIANCE_SHARES}}


def decide(results: list, none, voters: list[str]) -> tuple:
    """The rule on the check's results: (best, agreed, winners). Winners beat NONE with confidence; agreed are the
    winners that improve more than half of VOTERS. Raw vectors stay unless some winner is agreed; then the choice
    is BEST, the best-scoring winner. Without an agreed winner, BEST is only the best-scoring candidate, reported."""
    winners = [result for result in results if result.low > 0]
    agreed = [result for result in winners if supported(result, none, voters)]
    best = max((winners if agreed else []) or results, key=lambda result: result.ndcg)
    return best, agreed, winners


def voting_kinds(check: CheckSet | CheckRounds) -> list[str]:
    """The kinds with enough pseudo-queries (MIN_VOTE) for their mean to count as a kind's verdict (of a check
    read in rounds, those of every pseudo-query made)."""
    counts = check.counts()
    return [kind for kind, count in counts.items() if count >= MIN_VOTE] or list(counts)


def supported_kinds(result, none, voters: list[str]) -> list[str]:
    """The voting kinds whose pseudo-queries RESULT's calibrator finds better than the raw vectors do."""
    return [kind for kind in voters if kind in result.by_kind and result.by_kind[kind] > none.by_kind[kind]]


def supported(result, none, voters: list[str]) -> bool:
    """More than half of the voting kinds improve: no single kind, the lexical one included, decides."""
    return len(supported_kinds(result, none, voters)) > len(voters) / 2


def _reason(best, agreed: list, winners: list, voters: list[str], check: CheckSet, planned: int) -> str:
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in check.counts().items())
    measured = (f"{best.name} {100 * best.difference:+.2f} nDCG@10 [{100 * best.low:+.2f}, {100 * best.high:+.2f}] "
                f"against none on {counted_queries({'pseudo_queries': len(check), 'planned': planned})} ({kinds})")
    if agreed:
        backers = ", ".join(result.name for result in agreed)
        return (f"it beat the raw vectors on the retrieval check: {measured}; calibration helps most kinds of "
                f"pseudo-query ({backers} {'improves' if len(agreed) == 1 else 'improve'} more than half of "
                f"{', '.join(voters)})")
    if winners:
        return (f"raw vectors kept: {', '.join(result.name for result in winners)} beat them on the retrieval "
                f"check, but none improves more than half of the kinds of pseudo-query ({', '.join(voters)}), so no "
                f"single kind decides; best: {measured}")
    return f"no candidate beat the raw vectors with confidence on the retrieval check; best: {measured}"


def candidate_rows(X: np.ndarray, seed: int) -> np.ndarray:
    """The rows of X the candidates are fitted on: all of them, or CANDIDATE_ROWS drawn with SEED (in order)."""
    if len(X) <= CANDIDATE_ROWS:
        return X
    return X[np.sort(np.random.default_rng([seed, CANDIDATE_ROWS]).choice(len(X), CANDIDATE_ROWS, replace=False))]


def _sample(X: np.ndarray, rows: int, rng: np.random.Generator) -> np.ndarray:
    if len(X) <= rows:
        return np.asarray(X, dtype=np.float64)
    return np.asarray(X[np.sort(rng.choice(len(X), size=rows, replace=False))], dtype=np.float64)
