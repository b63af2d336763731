"""The hybrid check: how each side of hybrid search does on the corpus's own pseudo-queries, and the dense weight
the corpus is given from it (issue 44).

The pseudo-queries are `auto`'s (`retriever.calibration.check.CheckSet`, with their texts): each is searched over
the check's pool (every pseudo-query's target and the distractors) by both sides as the index searches, dense by
cosine of the calibrated vectors and keyword by BM25 (the keyword index's tokenizer, k1 and b, every query word
kept), and the two top lists fused by the default fusion at each weight of `WEIGHTS`. nDCG@10 of each query's
target, apart for the kinds that judge meaning (title, sentence, span: the target never holds the query as given)
and for known-item queries (a document's own rare words: keyword search's best case).

What the evidence may decide was studied on 14 labeled tasks (benchmarks/fusion_evidence.py, benchmarks/
fusion_adaptive.py): the weight that does best on pseudo-queries is biased toward keywords by construction (it
follows the mix of kinds, not the corpus), and neither it nor per-query score shapes predict the labeled best
weight. The default weight's lean to the dense side was measured on corpora where dense search reads meaning
better than keywords do. So the evidence moves the weight only when this corpus is outside that range:

- dense search is not shown better than keywords on the meaning kinds (the interval of the difference reaches 0
  or below): nothing here supports leaning on the dense side, and both sides get the same share (`EVEN_WEIGHT`);
- keyword search loses to dense even on known-item queries (its best case, interval wholly above 0): the keyword
  side reads this corpus poorly, and the dense side gets `DENSE_LEANING_WEIGHT`;
- otherwise the measured default (`DEFAULT_WEIGHT`).

The first rule was stated after one held-out task (bible-parallel) suggested it, and adopted only once it had been
checked on tasks made afterwards (benchmarks/results/fusion_adaptive.md: fresh documentation pages, long pages).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from retriever.calibration.check import CONFIDENCE, INTERIM_CONFIDENCE, CheckSet, paired_bootstrap, verdict
from retriever.calibration.pseudo_queries import CheckRounds, check_rounds
from retriever.defaults import DEFAULT_FUSION, DEFAULT_WEIGHT
from retriever.numeric import l2_normalize_in_place
from retriever.search.fusion import make_fusion, scored_candidates
from retriever.store.keywords import B, K1, Tokenizer, text_postings

WEIGHTS = (0.5, 0.6, 0.7, 0.8, 0.9)  # the fused figures the record shows beside the sides'
MEANING = ("title", "sentence", "span")
KNOWN_ITEM = "known-item"
# Fewer pseudo-queries of a group than this give an interval too wide to move anything: the default stays.
MIN_QUERIES = 30
EVEN_WEIGHT = 0.5
DENSE_LEANING_WEIGHT = 0.9
CANDIDATES = 100  # each side's list, as hybrid search reads it (`options.HYBRID_CANDIDATES`)
BATCH = 64  # queries scored against the pool at once


class PoolBM25:
    """BM25 as the keyword index scores (its tokenizer, k1, b and idf) over a pool of texts, tokenized once."""

    def __init__(self, texts: list[str]):
        self.tokenize = Tokenizer.get()
        postings, lengths = text_postings(texts)
        self.size = len(texts)
        mean = float(lengths.mean()) if len(lengths) else 0.0
        self.norms = (K1 * (1 - B + B * lengths / max(mean, 1e-9))).astype(np.float32)
        self.postings = {term: (at, many.astype(np.float32)) for term, (at, many) in postings.items()}

    def scores(self, query: str) -> np.ndarray:
        """QUERY's BM25 over the pool (0 where no query term occurs)."""
        scores = np.zeros(self.size, np.float32)
        for term, count in self.tokenize(query).items():
            if term not in self.postings:
                continue
            at, counts = self.postings[term]
            idf = np.log1p((self.size - len(at) + 0.5) / (len(at) + 0.5))
            scores[at] += count * idf * counts * (K1 + 1) / (counts + self.norms[at])
        return scores


def target_ndcg(scores: np.ndarray, target: int) -> float:
    """nDCG@10 of the document at position TARGET (the one relevant) in the top 10 of SCORES, ties broken as search
    breaks them, by the lower position (`fusion.top_list` with positions for keys): its rank is how many score
    higher, or the same at a lower position, counted rather than sorted."""
    score = scores[target]
    ahead = int(np.count_nonzero(scores > score)) + int(np.count_nonzero(scores[:target] == score))
    return float(1.0 / np.log2(ahead + 2)) if ahead < 10 else 0.0


def query_results(check: CheckSet, transform: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
    """Per pseudo-query nDCG@10 of its target: "dense", "keyword" and "FUSION@w" for each of WEIGHTS (FUSION: the
    default fusion's name)."""
    pool = l2_normalize_in_place(transform(np.concatenate([check.targets, check.distractors])))
    queries = l2_normalize_in_place(transform(check.queries))
    keywords = PoolBM25(list(check.pool_texts))
    fusion = make_fusion(DEFAULT_FUSION)
    found = {label: np.zeros(len(queries)) for label in ("dense", "keyword", *(f"{fusion.name}@{w}" for w in WEIGHTS))}
    for start in range(0, len(queries), BATCH):
        similarities = queries[start : start + BATCH] @ pool.T
        for offset, dense in enumerate(similarities):
            number = start + offset
            keyword = keywords.scores(check.query_texts[number])
            found["dense"][number] = target_ndcg(dense, number)
            if keyword.any():
                found["keyword"][number] = target_ndcg(keyword, number)
            candidates = scored_candidates(dense, keyword, CANDIDATES)
            # the candidates' row ids are pool positions in ascending order: the target's place among them, if any
            at = int(np.searchsorted(candidates.rowids, number))
            if at < len(candidates.rowids) and candidates.rowids[at] == number:
                for weight, fused in zip(WEIGHTS, fusion.scores_by_weight(candidates, WEIGHTS)):
                    found[f"{fusion.name}@{weight}"][number] = target_ndcg(fused, at)
    return found


def hybrid_check(check: CheckSet | CheckRounds | None, transform: Callable[[np.ndarray], np.ndarray],
                 seed: int = 0) -> dict:
    """The hybrid decision for an index whose vectors TRANSFORM calibrates (a calibrator's), from CHECK's
    pseudo-queries (None, or without texts: no evidence, the default stays): {"fusion", "weight", "reason",
    "evidence"}, as the manifest records it. `CheckRounds` are read until the decision is settled: a round before
    the last decides where each difference the rule asks about is shown or could not be (`check.verdict`)."""
    if check is None or not len(check):
        return decision(None)
    for current, planned in check_rounds(check):
        if current.query_texts is None:
            return decision(None)
        evidence, verdicts = _evidence(current, planned, transform, seed)
        if len(current) == planned or _settled(verdicts):
            return decision(evidence)
    raise AssertionError("a check's rounds end with all its pseudo-queries")


def _evidence(check: CheckSet, planned: int, transform, seed: int) -> tuple[dict, dict]:
    """The evidence record of CHECK, a round of PLANNED pseudo-queries, and each group's verdict on dense minus
    keyword (None where it has too few pseudo-queries, or only more can tell)."""
    results = query_results(check, transform)
    groups = {"meaning": np.isin(check.kinds, MEANING), KNOWN_ITEM: check.kinds == KNOWN_ITEM}
    evidence: dict = {"pseudo_queries": len(check), "planned": planned, "pool": check.pool_size,
                      "confidence": CONFIDENCE, "groups": {}}
    verdicts: dict[str, bool | None] = dict.fromkeys(groups)
    for group, chosen in groups.items():
        record: dict = {"queries": int(chosen.sum())}
        if chosen.sum():
            record["ndcg@10"] = {label: _points(values[chosen].mean()) for label, values in results.items()}
        if chosen.sum() >= MIN_QUERIES:
            differences = results["dense"][chosen] - results["keyword"][chosen]
            low, high = paired_bootstrap(differences, check.kinds[chosen], CONFIDENCE, seed=seed)
            record["dense_minus_keyword"] = {"difference": _points(differences.mean()),
                                             "interval": [_points(low), _points(high)]}
            if len(check) < planned:
                shown, _ = paired_bootstrap(differences, check.kinds[chosen], INTERIM_CONFIDENCE, seed=seed)
                verdicts[group] = verdict(shown, low, high, len(check), planned)
        evidence["groups"][group] = record
    return evidence, verdicts


def _settled(verdicts: dict[str, bool | None]) -> bool:
    """Whether the rule (`decision`) reads the same on more pseudo-queries: dense is shown not to lead on meaning
    (even weights), or it is shown to, and known-item queries settle the rest."""
    meaning, known = verdicts["meaning"], verdicts[KNOWN_ITEM]
    return meaning is False or (meaning is True and known is not None)


def decision(evidence: dict | None) -> dict:
    """The fusion and dense weight EVIDENCE (`hybrid_check`'s; None: none was gathered) supports, and why."""
    record = {"fusion": DEFAULT_FUSION, "weight": DEFAULT_WEIGHT}
    if evidence is None:
        return {**record, "reason": "not checked (no pseudo-queries: the calibrator was named, or the build had no "
                                    "text to cut them from, or too few words between spaces): the measured default"}
    meaning = evidence["groups"]["meaning"].get("dense_minus_keyword")
    known = evidence["groups"][KNOWN_ITEM].get("dense_minus_keyword")
    if meaning is not None and meaning["interval"][1] < 0:
        return {**record, "weight": EVEN_WEIGHT, "evidence": evidence,
                "reason": (f"dense search loses to keywords even on pseudo-queries of meaning ({meaning['difference']:+.1f}"
                           f" nDCG@10, interval {_interval(meaning)}): the encoder reads this corpus poorly, so both "
                           "sides weigh the same")}
    if meaning is not None and meaning["interval"][0] <= 0:
        return {**record, "weight": EVEN_WEIGHT, "evidence": evidence,
                "reason": (f"dense search is not shown better than keywords on pseudo-queries of meaning "
                           f"({meaning['difference']:+.1f} nDCG@10, interval {_interval(meaning)}): nothing here "
                           "supports leaning on the dense side, so both sides weigh the same")}
    if known is not None and known["interval"][0] > 0:
        return {**record, "weight": DENSE_LEANING_WEIGHT, "evidence": evidence,
                "reason": (f"keyword search loses to dense even on known-item pseudo-queries, its best case "
                           f"({known['difference']:+.1f} nDCG@10 for dense, interval {_interval(known)}): the keyword "
                           "side reads this corpus poorly, so the dense side leads")}
    if meaning is None or known is None:
        return {**record, "evidence": evidence,
                "reason": f"too few pseudo-queries of meaning or known-item kind (fewer than {MIN_QUERIES}) to move "
                          "the weight: the measured default"}
    return {**record, "evidence": evidence,
            "reason": (f"each side reads this corpus as well as where the default was measured (dense "
                       f"{meaning['difference']:+.1f} on meaning, keyword {-known['difference']:+.1f} on known-item "
                       "pseudo-queries): the measured default")}


def recorded_hybrid(record: dict | None) -> dict:
    """An index's hybrid decision as its manifest records it (`Manifest.hybrid`), or for an index written before
    the check, the defaults it is searched with."""
    if record is not None:
        return record
    return {"fusion": DEFAULT_FUSION, "weight": DEFAULT_WEIGHT,
            "reason": "written before the hybrid check: the measured default"}


def describe(record: dict) -> str:
    """One line for `info` and `check`: the fusion, the weight and why."""
    return f"{record['fusion']}, dense weight {record['weight']}: {record['reason']}"


def _interval(difference: dict) -> str:
    low, high = difference["interval"]
    return f"{low:+.1f} to {high:+.1f}"


def _points(value: float) -> float:
    return round(100 * float(value), 2)
