"""Issue 44's second study: could each query choose its own hybrid weight from the shapes of its two score lists?

For every labeled retrieval task, the index is built as `retriever build` builds it (calibrator `auto`) and each
query's hybrid candidates (the union of both sides' top lists, each scored on both sides, as
`retriever.search.hybrid` fuses them) are captured once. Offline, the zscore fusion is then recomputed per query:
at fixed weights, by per-query rules that move the weight by each side's confidence (its top hit's z-score in its
own list, `conf`), and by the per-query oracle (the best of 0.5/0.6/0.7/0.8 for each query, known from the labels:
the headroom no rule can pass). Besides, the Spearman correlation over queries of each signal with the query's
preference (nDCG@10 at 0.5 minus at 0.8) says whether the signal carries any information at all.

    python benchmarks/fusion_per_query.py run --model minilm --out benchmarks/results/fusion_per_query_minilm.json
    python benchmarks/fusion_per_query.py run --model mpnet --out benchmarks/results/fusion_per_query_mpnet.json
    python benchmarks/fusion_per_query.py report benchmarks/results/fusion_per_query_*.json \\
        --out benchmarks/results/fusion_per_query.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import DEV, HELD_OUT, MAX_LENGTH, model_path  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402


def capture(model: str, name: str) -> dict:
    """TASK's queries' hybrid candidates: (rowids, dense, keyword, dense_rank, keyword_rank) per query."""
    import retriever.search.hybrid as hybrid
    from retriever.corpus import Document
    from retriever.encode.encoder import Encoder
    from retriever.encode.passages import PassageSettings
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval import EmbeddingEncoder
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS
    from retriever.index import Index
    from retriever.search.fusion import ListZScore
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher
    from retriever.versions.snapshot import Snapshot

    captured = []

    class Capturing(ListZScore):  # today's fusion, its input kept
        name = "capturing-zscore"

        def scores(self, candidates, weight):
            captured.append(tuple(np.copy(part) for part in (candidates.rowids, candidates.dense, candidates.keyword,
                                                             candidates.dense_rank, candidates.keyword_rank)))
            return super().scores(candidates, weight)

    encoder = CachedEncoder(Encoder(model_path(model), "last-avg", None, MAX_LENGTH, device="cpu"), resolve_cache_dir())
    rset = RETRIEVAL_TASKS[name].load(resolve_data_dir())
    documents = [Document(doc, text, title, "corpus", n) for n, (doc, (title, text)) in enumerate(rset.corpus.items(), 1)]
    query_ids = list(rset.queries)
    texts = [rset.queries[q] for q in query_ids]
    raw = np.asarray(encoder.encode(texts), dtype=np.float32)
    original = hybrid.make_fusion
    hybrid.make_fusion = lambda _: Capturing()
    try:
        with tempfile.TemporaryDirectory(prefix="retriever-bench-") as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Index.build(documents, "bench", Path(folder) / "indexes", encoder=EmbeddingEncoder(encoder.encode, encoder),
                        calibrator="auto", calibrator_options={"seed": 0}, index_type="flat", device="cpu",
                        passages=PassageSettings())
            with Snapshot.open("bench", Path(folder) / "indexes", device="cpu") as snapshot:
                searcher, vectors = Searcher(snapshot), snapshot.calibrate(raw)
                options = SearchOptions(k=min(101, len(documents)), mode="hybrid", weight=0.7)
                for start in range(0, len(texts), 256):
                    searcher.search(texts[start:start + 256], vectors[start:start + 256], options)
                rowids = np.unique(np.concatenate([c[0] for c in captured]))
                rows = snapshot.rows(rowids.astype(np.int64))
                ids = {int(r): rows[int(r)]["doc_id"] for r in rowids}
    finally:
        hybrid.make_fusion = original
    return {"query_ids": query_ids, "qrels": rset.qrels, "ids": ids, "candidates": captured}


def standard(scores: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """`ListZScore`'s standardisation of one side."""
    listed = scores[ranks > 0]
    if not len(listed):
        return np.zeros(len(scores))
    spread = float(listed.std()) if listed.std() > 1e-6 else float(scores.std())
    return (scores - listed.mean()) / max(spread, 1e-6)


def top_z(scores: np.ndarray, ranks: np.ndarray) -> float:
    z = standard(scores, ranks)[ranks > 0]
    return float(z.max()) if len(z) else 0.0


def fixed(weight: float):
    return lambda d, k, dr, kr: weight * standard(d, dr) + (1 - weight) * standard(k, kr)


def confident(prior: float):
    """The prior weight moved by each side's confidence: its top hit's z-score in its own list."""
    def rule(d, k, dr, kr):
        dense, keyword = max(top_z(d, dr), 1e-3), max(top_z(k, kr), 1e-3)
        weight = prior * dense / (prior * dense + (1 - prior) * keyword)
        return weight * standard(d, dr) + (1 - weight) * standard(k, kr)
    return rule


RULES = {"fixed 0.6": fixed(0.6), "fixed 0.8": fixed(0.8), "conf 0.7": confident(0.7), "conf 0.6": confident(0.6)}


def per_query_ndcg(task: dict, rule) -> np.ndarray:
    from retriever.evaluation.retrieval import per_query

    run = {}
    for query, (rowids, d, k, dr, kr) in zip(task["query_ids"], task["candidates"]):
        fused = rule(d, k, dr, kr)
        order = np.lexsort((rowids, -fused))[:101]
        run[query] = {task["ids"][int(rowids[i])]: float(fused[i]) for i in order}
    return per_query(run, task["qrels"])["ndcg@10"]


def signals(task: dict) -> dict[str, np.ndarray]:
    by_query = dict(zip(task["query_ids"], task["candidates"]))
    judged = [q for q, relevant in task["qrels"].items() if any(g > 0 for g in relevant.values())]
    found: dict[str, list[float]] = {"dense top z": [], "keyword top z": [], "keyword - dense top z": [],
                                     "keyword list length": [], "top-10 overlap": []}
    for query in judged:
        _, d, k, dr, kr = by_query[query]
        found["dense top z"].append(top_z(d, dr))
        found["keyword top z"].append(top_z(k, kr))
        found["keyword - dense top z"].append(found["keyword top z"][-1] - found["dense top z"][-1])
        found["keyword list length"].append(float((kr > 0).sum()))
        found["top-10 overlap"].append(float(((dr > 0) & (dr <= 10) & (kr > 0) & (kr <= 10)).sum()))
    return {name: np.asarray(values) for name, values in found.items()}


def run(model: str, tasks: list[str]) -> dict:
    from scipy.stats import spearmanr

    results = {"model": model, "tasks": []}
    for name in tasks:
        task = capture(model, name)
        base = per_query_ndcg(task, fixed(0.7))
        at = {w: per_query_ndcg(task, fixed(w)) for w in (0.5, 0.6, 0.8)}
        oracle = np.max(np.stack([base, *at.values()]), axis=0)
        preference = at[0.5] - at[0.8]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a constant signal (every keyword list full) has no correlation
            correlations = {signal: round(float(np.nan_to_num(spearmanr(values, preference)[0])), 3)
                            for signal, values in signals(task).items()}
        record = {"task": name, "split": "dev" if name in DEV else "held-out", "fixed 0.7": round(float(base.mean()), 2),
                  "vs fixed 0.7": {**{label: round(float(per_query_ndcg(task, rule).mean() - base.mean()), 2)
                                      for label, rule in RULES.items()},
                                   "per-query oracle": round(float(oracle.mean() - base.mean()), 2)},
                  "queries moved by the weight": round(float((preference != 0).mean()), 3),
                  "spearman with preference": correlations}
        print(json.dumps(record), file=sys.stderr, flush=True)
        results["tasks"].append(record)
    return results


def report(files: list[Path]) -> str:
    lines = ["# Could each query choose its own hybrid weight? (issue 44's per-query study)", "",
             f"{generated_from(__file__, files)}. "
             "nDCG@10 x100 against zscore fusion at the fixed weight 0.7 (today's default), each query's candidates "
             "captured from a real index (calibrator auto). `conf p`: the weight p moved per query by each side's "
             "confidence (its top hit's z-score in its own list); per-query oracle: the best of 0.5-0.8 for each "
             "query, known from the labels. Right: Spearman correlation over queries of each signal with the "
             "query's preference (nDCG@10 at 0.5 minus at 0.8; positive: the query wants keywords).", ""]
    for path in files:
        run_ = json.loads(path.read_text())
        rules = list(run_["tasks"][0]["vs fixed 0.7"])
        signal_names = list(run_["tasks"][0]["spearman with preference"])
        lines += [f"## {run_['model']}", "", "| task | split | fixed 0.7 | " + " | ".join(rules) + " | queries moved | "
                  + " | ".join(f"rho: {name}" for name in signal_names) + " |",
                  "|---|---|" + "---:|" * (1 + len(rules) + 1 + len(signal_names))]
        for task in run_["tasks"]:
            lines.append(f"| {task['task']} | {task['split']} | {task['fixed 0.7']:.2f} | "
                         + " | ".join(f"{task['vs fixed 0.7'][rule]:+.2f}" for rule in rules)
                         + f" | {task['queries moved by the weight']:.0%} | "
                         + " | ".join(f"{task['spearman with preference'][name]:+.2f}" for name in signal_names) + " |")
        lines += ["", "| rule | dev: worst | dev: mean | held-out: worst | held-out: mean |", "|---|---:|---:|---:|---:|"]
        for rule in rules:
            dev = [t["vs fixed 0.7"][rule] for t in run_["tasks"] if t["split"] == "dev"]
            held = [t["vs fixed 0.7"][rule] for t in run_["tasks"] if t["split"] != "dev"]
            lines.append(f"| {rule} | {min(dev):+.2f} | {np.mean(dev):+.2f} | {min(held):+.2f} | {np.mean(held):+.2f} |")
        largest = max(abs(v) for t in run_["tasks"] for v in t["spearman with preference"].values())
        lines += ["", f"The largest correlation of any signal with a query's preference, over all tasks: {largest:.2f}.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--model", default="minilm")
        running.add_argument("--tasks", default=",".join(DEV + HELD_OUT))

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(args.model, args.tasks.split(","))))


if __name__ == "__main__":
    main()
