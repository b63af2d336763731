"""Can an index tell, without labels, that a query has no good match? Candidate signals on real tasks.

For each retrieval task's corpus (an index of it, calibrator none or whitening), 300 of its own queries (they have
an answer in it) against 420 queries of the other tasks (off-topic: no answer there). Each query's best hit is read
through three signals, none fitted to these labels:
- `best`: the best hit's cosine, AUC only (a threshold on it would have to be tuned per corpus and space);
- `gaussian`: expected documents at least that good by chance, N x P(Z >= z), with z the hit's distance above the
  query's mean score over the index in standard deviations (the moments `fusion="null"` already estimates); "good"
  when under 1;
- `random-null`: the best-hit score of 512 random queries drawn from a Gaussian with the index's own mean and
  covariance (in the space searched); "good" when above their 95th percentile.
A useful signal passes most own queries and few off-topic ones, on every task and in both spaces.

    python benchmarks/no_match.py --out benchmarks/results/no_match_cpu
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from retriever.calibration import make_calibrator  # noqa: E402
from retriever.corpus import Document, document_text  # noqa: E402
from retriever.evaluation import resolve_data_dir  # noqa: E402
from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir  # noqa: E402
from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS  # noqa: E402
from retriever.numeric import l2_normalize  # noqa: E402

TASKS = ("qnli-retrieval", "stsb-dup", "debian-package", "python-doc-page", "linux-doc-page", "foldoc-term",
         "wordnet-define", "bible-parallel")
OWN, OFF_TOPIC_PER_TASK, RANDOM_QUERIES = 300, 60, 512


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    greater = (positive[:, None] > negative[None, :]).mean()
    return float(greater + 0.5 * (positive[:, None] == negative[None, :]).mean())


def best_hits(queries: np.ndarray, documents: np.ndarray) -> np.ndarray:
    scores = queries @ documents.T
    scores[scores > 0.9999] = -1.0  # a duplicate task's query is itself in the corpus: not its answer
    return scores.max(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from retriever.encode.encoder import Encoder

    encoder = CachedEncoder(Encoder(max_length=256, device="cpu"), resolve_cache_dir())
    data = resolve_data_dir(None)
    rng = np.random.default_rng(0)
    sets = {name: RETRIEVAL_TASKS[name].load(data) for name in TASKS}
    picked = {}
    for name, rset in sets.items():
        ids = list(rset.queries)
        picked[name] = [rset.queries[ids[i]] for i in rng.choice(len(ids), min(OWN, len(ids)), replace=False)]
    rows = []
    for name, rset in sets.items():
        documents = encoder.encode([document_text(Document(doc, text, title, "corpus", number)) for number,
                                    (doc, (title, text)) in enumerate(rset.corpus.items(), start=1)])
        own = encoder.encode(picked[name])
        off = encoder.encode([text for other in TASKS if other != name for text in picked[other][:OFF_TOPIC_PER_TASK]])
        for calibrator_name in ("none", "whitening"):
            calibrator = make_calibrator(calibrator_name)
            calibrator.fit(documents)
            space = l2_normalize(calibrator.transform(documents))
            own_q, off_q = (l2_normalize(calibrator.transform(q)) for q in (own, off))
            sample = space[rng.choice(len(space), min(4096, len(space)), replace=False)]
            mean, covariance = sample.mean(0), np.cov(sample, rowvar=False)

            def gaussian_good(queries: np.ndarray, best: np.ndarray) -> np.ndarray:
                spread = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", queries, covariance, queries), 1e-12))
                z = (best - queries @ mean) / spread
                chance = np.array([len(space) * 0.5 * math.erfc(value / math.sqrt(2)) for value in z])
                return chance < 1

            factor = np.linalg.cholesky(covariance + 1e-6 * np.eye(len(mean)))
            random_queries = l2_normalize((mean + rng.standard_normal((RANDOM_QUERIES, len(mean))) @ factor.T)
                                          .astype(np.float32))
            threshold = float(np.quantile(best_hits(random_queries, space), 0.95))
            own_best, off_best = best_hits(own_q, space), best_hits(off_q, space)
            rows.append({
                "task": name, "calibrator": calibrator_name, "documents": len(space),
                "own_queries": len(own_q), "off_topic_queries": len(off_q),
                "auc_best": round(auc(own_best, off_best), 3),
                "gaussian_good_own": round(float(gaussian_good(own_q, own_best).mean()), 3),
                "gaussian_good_off_topic": round(float(gaussian_good(off_q, off_best).mean()), 3),
                "random_null_threshold": round(threshold, 3),
                "random_null_good_own": round(float((own_best > threshold).mean()), 3),
                "random_null_good_off_topic": round(float((off_best > threshold).mean()), 3)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    result = {"benchmark": "no_match", "model": "all-MiniLM-L6-v2 (max_length 256)", "rows": rows,
              "command": " ".join(["python", "benchmarks/no_match.py", *sys.argv[1:]])}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        lines = ["# Telling a query with no good match, without labels (share judged 'good': own / off-topic)", "",
                 f"`{result['command']}`", "",
                 "| task | calibrator | AUC of best cosine | gaussian E<1 | random-null 95% (threshold) |",
                 "|---|---|---:|---|---|"]
        for row in rows:
            lines.append(f"| {row['task']} | {row['calibrator']} | {row['auc_best']} | "
                         f"{row['gaussian_good_own']} / {row['gaussian_good_off_topic']} | "
                         f"{row['random_null_good_own']} / {row['random_null_good_off_topic']} "
                         f"({row['random_null_threshold']}) |")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
