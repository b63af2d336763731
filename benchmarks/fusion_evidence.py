"""Issue 44's study: can a corpus decide its own hybrid weight from pseudo-queries, without labels?

For each labeled retrieval task, pseudo-queries are cut from a sample of its documents exactly as `auto`'s check
cuts them (`retriever.calibration.pseudo_queries`: title, sentence, span, known-item), each with one target (the
source document without the query; for known-item, the document as stored) among distractors (other documents
of the corpus). Both sides search that pool as the index would: dense by cosine of the encoder's vectors (raw,
L2-normalized), keyword by BM25 (the keyword index's tokenizer, k1 and b, every query word kept as hybrid's
default keeps them); hybrid fuses the union of both top-100 lists with `zscore` (the default fusion) at each
dense weight of a grid. nDCG@10 of the target, by kind.

`report` sets this evidence beside the labeled nDCG@10 of the same tasks at the same weights
(`benchmarks/results/hybrid_{model}.json`, issue 27's run: `zscore-all@w`) and scores rules that pick a weight
from the evidence alone, against today's fixed 0.7: on the dev tasks (where a rule may be designed) and the
held-out tasks apart (`benchmarks/hybrid.py`'s split).

    python benchmarks/fusion_evidence.py run --model minilm --out benchmarks/results/fusion_evidence_minilm.json
    python benchmarks/fusion_evidence.py report benchmarks/results/fusion_evidence_*.json \\
        --out benchmarks/results/fusion_evidence.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import DEV, HELD_OUT, MAX_LENGTH, model_path  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
LABELED_WEIGHTS = (0.5, 0.6, 0.7, 0.8)  # what issue 27 measured with every query word kept (zscore-all@w)
QUERIES = 600
DISTRACTORS = 3000
CANDIDATES = 100  # each side's list, as hybrid search reads (`search.options.HYBRID_CANDIDATES`)
MEANING = ("title", "sentence", "span")  # the kinds whose target never holds the query's words as given


class PoolBM25:
    """BM25 as the keyword index scores (its tokenizer, k1, b and idf) over a pool of one target and many shared
    distractors: the distractors are tokenized once, and each query's target joins their statistics."""

    def __init__(self, texts: list[str]):
        from retriever.store.keywords import B, K1, Tokenizer

        self.tokenize, self.k1, self.b = Tokenizer.get(), K1, B
        postings: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        self.lengths = np.zeros(len(texts), np.float32)
        for position, text in enumerate(texts):
            terms = self.tokenize(text)
            self.lengths[position] = sum(terms.values())
            for term, count in terms.items():
                postings[term][0].append(position)
                postings[term][1].append(count)
        self.postings = {term: (np.asarray(at), np.asarray(counts, np.float32)) for term, (at, counts) in
                         postings.items()}

    def scores(self, query: str, target: str) -> np.ndarray:
        """QUERY's BM25 over TARGET (position 0) and the distractors (1...)."""
        target_terms = self.tokenize(target)
        lengths = np.concatenate([[sum(target_terms.values())], self.lengths]).astype(np.float32)
        norms = self.k1 * (1 - self.b + self.b * lengths / max(float(lengths.mean()), 1e-9))
        documents = len(lengths)
        scores = np.zeros(documents, np.float32)
        for term, count in self.tokenize(query).items():
            at, counts = self.postings.get(term, (np.empty(0, int), np.empty(0, np.float32)))
            in_target = target_terms.get(term, 0)
            frequency = len(at) + (in_target > 0)
            if not frequency:
                continue
            idf = np.log1p((documents - frequency + 0.5) / (frequency + 0.5))
            scores[at + 1] += count * idf * counts * (self.k1 + 1) / (counts + norms[at + 1])
            if in_target:
                scores[0] += count * idf * in_target * (self.k1 + 1) / (in_target + norms[0])
        return scores


def fused_ranks(dense: np.ndarray, keyword: np.ndarray, weights: tuple[float, ...]) -> dict[float, int]:
    """The rank of pool position 0 (the target) in the zscore fusion at each weight (`target_rank`)."""
    from retriever.search.fusion import Candidates, ListZScore, top_list

    keys = np.arange(len(dense))
    dense_top = top_list(dense, keys, CANDIDATES)
    keyword_top = top_list(keyword, keys, CANDIDATES) if keyword.any() else np.empty(0, np.int64)
    union = np.union1d(dense_top, keyword_top)
    dense_rank = np.zeros(len(dense), int)
    dense_rank[dense_top] = np.arange(1, len(dense_top) + 1)
    keyword_rank = np.zeros(len(dense), int)
    keyword_rank[keyword_top] = np.arange(1, len(keyword_top) + 1)
    candidates = Candidates(union, dense[union], keyword[union], dense_rank[union], keyword_rank[union])
    return {weight: target_rank(ListZScore().scores(candidates, weight), union) for weight in weights}


def ndcg(rank: int) -> float:
    return 1.0 / np.log2(rank + 1) if 0 < rank <= 10 else 0.0


def target_rank(scores: np.ndarray, keys: np.ndarray | None = None) -> int:
    """The 1-based rank of key 0, the target, by SCORES of KEYS (default: the pool's positions; ties broken by the
    lower key, as search breaks them), or 0 outside the top 10."""
    from retriever.search.fusion import top_list

    keys = np.arange(len(scores)) if keys is None else keys
    order = keys[top_list(scores, keys, 10)]
    return int(np.flatnonzero(order == 0)[0]) + 1 if 0 in order else 0


def run(model: str, tasks: list[str], seed: int) -> dict:
    from retriever.calibration.pseudo_queries import make_pseudo_queries
    from retriever.corpus import Document, document_text
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS
    from retriever.numeric import l2_normalize

    encoder = CachedEncoder(Encoder(model_path(model), "last-avg", None, MAX_LENGTH, device="cpu"),
                            resolve_cache_dir())
    data = resolve_data_dir()
    results = {"model": model, "seed": seed, "queries": QUERIES, "distractors": DISTRACTORS, "weights": WEIGHTS,
               "tasks": []}
    for name in tasks:
        started = time.perf_counter()
        rset = RETRIEVAL_TASKS[name].load(data)
        documents = list(rset.corpus.values())
        order = np.random.default_rng(seed).permutation(len(documents))
        sampled = [documents[i] for i in order[:2 * QUERIES]]
        pseudo = make_pseudo_queries(sampled, seed=seed, limit=QUERIES)
        used = {query.source for query in pseudo}  # positions in SAMPLED, that is in ORDER
        distractors = [documents[i] for position, i in enumerate(order) if position not in used][:DISTRACTORS]
        stored = [document_text(Document("", text, title, "", 0)) for title, text in distractors]
        targets = [query.target if query.target is not None else
                   document_text(Document("", sampled[query.source][1], sampled[query.source][0], "", 0))
                   for query in pseudo]
        queries = [query.query for query in pseudo]
        vectors = l2_normalize(encoder.encode([*queries, *targets, *stored], progress=True,
                                              description=f"{name}: encoding"))
        query_vectors, target_vectors = vectors[:len(queries)], vectors[len(queries):2 * len(queries)]
        stored_vectors = vectors[2 * len(queries):]
        stored_keywords = PoolBM25(stored)
        rows = []
        for number, query in enumerate(pseudo):
            # The pool: this query's target first (position 0), then the distractors; the other pseudo-queries'
            # targets are left out, as a search over the corpus holds one copy of each document.
            keyword = stored_keywords.scores(query.query, targets[number])
            dense = np.concatenate([[query_vectors[number] @ target_vectors[number]],
                                    stored_vectors @ query_vectors[number]]).astype(np.float32)
            ranks = fused_ranks(dense, keyword, WEIGHTS)
            rows.append({"kind": query.kind, "dense": ndcg(target_rank(dense)), "keyword": ndcg(target_rank(keyword)),
                         **{f"zscore@{weight}": ndcg(rank) for weight, rank in ranks.items()}})
        summary = {}
        for label, kinds in (("all", None), ("meaning", MEANING), *((kind, (kind,)) for kind in
                                                                    ("title", "sentence", "span", "known-item"))):
            chosen = [row for row in rows if kinds is None or row["kind"] in kinds]
            if chosen:
                summary[label] = {"queries": len(chosen), **{key: round(100 * float(np.mean([row[key] for row in chosen])), 2)
                                                           for key in rows[0] if key != "kind"}}
        record = {"task": name, "split": "dev" if name in DEV else "held-out", "pseudo": summary,
                  "seconds": round(time.perf_counter() - started, 1)}
        print(json.dumps({"task": name, "all": summary["all"]}), file=sys.stderr, flush=True)
        results["tasks"].append(record)
    return results


# --- the report: the evidence beside the labels ----------------------------------------------------------------


def rules(pseudo: dict) -> dict[str, float]:
    """Each candidate rule's weight for one task, from its pseudo-query evidence alone (LABELED_WEIGHTS only, so
    every choice has a labeled figure)."""
    def best(label: str) -> float:
        return max(LABELED_WEIGHTS, key=lambda weight: pseudo[label][f"zscore@{weight}"])

    chosen = {"fixed 0.7 (today)": 0.7, "best on all pseudo-queries": best("all")}
    if "meaning" in pseudo:
        chosen["best on meaning kinds"] = best("meaning")
        both = (best("all"), best("meaning"))  # move only where both sorts of evidence point the same way
        chosen["both agree, else 0.7"] = (max(both) if max(both) < 0.7 else min(both) if min(both) > 0.7 else 0.7)
    gain = pseudo["all"][f"zscore@{best('all')}"] - pseudo["all"]["zscore@0.7"]
    chosen["best on all if 1 point better, else 0.7"] = best("all") if gain > 1.0 else 0.7
    return chosen


def report(files: list[Path]) -> str:
    lines = ["# Can a corpus choose its hybrid weight from pseudo-queries? (issue 44's study)", "",
             f"{generated_from(__file__, files)}, "
             "beside the labeled runs of issue 27 (`hybrid_{model}.json`, `zscore-all@w`). Pseudo-queries: "
             f"{QUERIES} per task, {DISTRACTORS:,} distractors, zscore fusion over each side's top {CANDIDATES}. "
             "Gap: dense minus keyword nDCG@10 x100. Meaning kinds: title, sentence and span (the target never holds "
             "the query); known-item: a document's rare words.", ""]
    for path in files:
        run_ = json.loads(path.read_text())
        labeled = {t["task"]: t["ndcg@10"] for t in
                   json.loads((path.parent / f"hybrid_{run_['model']}.json").read_text())["tasks"]}
        lines += [f"## {run_['model']}", "", "| task | split | pseudo gap: all | meaning | known-item | "
                  "labeled gap (dense - keyword-all) | pseudo best w (all) | labeled best w | labeled @0.7 | "
                  "best w's gain over 0.7 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        gaps, outcomes = [], {}
        for task in run_["tasks"]:
            pseudo, scores = task["pseudo"], labeled[task["task"]]
            at = {weight: scores[f"zscore-all@{weight}"] for weight in LABELED_WEIGHTS}
            best_labeled = max(at, key=at.get)
            gap = {label: round(pseudo[label]["dense"] - pseudo[label]["keyword"], 2) if label in pseudo else None
                   for label in ("all", "meaning", "known-item")}
            gaps.append((scores["dense"] - scores["keyword-all"], gap["all"], gap["meaning"]))
            best_pseudo = max(LABELED_WEIGHTS, key=lambda weight: pseudo["all"][f"zscore@{weight}"])
            lines.append(f"| {task['task']} | {task['split']} | {gap['all']} | {gap['meaning']} | {gap['known-item']} | "
                         f"{scores['dense'] - scores['keyword-all']:.2f} | {best_pseudo} | {best_labeled} | "
                         f"{at[0.7]} | {at[best_labeled] - at[0.7]:+.2f} |")
            for rule, weight in rules(pseudo).items():
                outcomes.setdefault(rule, []).append((task["split"], round(at[weight] - at[0.7], 2)))
        found = np.array([row for row in gaps if row[2] is not None], dtype=float)
        lines += ["", f"Correlation over tasks of the labeled gap with the pseudo gap: all kinds "
                  f"{np.corrcoef(found[:, 0], found[:, 1])[0, 1]:.2f}, meaning kinds "
                  f"{np.corrcoef(found[:, 0], found[:, 2])[0, 1]:.2f}.", "",
                  "| rule (weight from the evidence alone) | dev: worst | dev: mean | held-out: worst | held-out: mean "
                  "| tasks >= -0.3 |", "|---|---:|---:|---:|---:|---:|"]
        for rule, rows in outcomes.items():
            dev = [delta for split, delta in rows if split == "dev"]
            held = [delta for split, delta in rows if split != "dev"]
            lines.append(f"| {rule} | {min(dev):+.2f} | {np.mean(dev):+.2f} | {min(held):+.2f} | {np.mean(held):+.2f} | "
                         f"{sum(delta >= -0.3 for _, delta in rows)}/{len(rows)} |")
        oracle = [max(labeled[t["task"]][f"zscore-all@{w}"] for w in LABELED_WEIGHTS) - labeled[t["task"]]["zscore-all@0.7"]
                  for t in run_["tasks"]]
        lines += ["", f"The best of the four weights per task, known from the labels (an oracle no rule can beat), "
                  f"gains {np.mean(oracle):+.2f} on the mean over 0.7.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--model", default="minilm")
        running.add_argument("--tasks", default=",".join(DEV + HELD_OUT))
        running.add_argument("--seed", type=int, default=0)

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(args.model, args.tasks.split(","),
                                                                            args.seed)))


if __name__ == "__main__":
    main()
