"""How many vectors a calibrator needs: fit on a uniform sample of a real corpus against a fit on all of it.

    python benchmarks/fit_sample.py --vectors last-avg=PASSAGES.npy,0=PASSAGES_LAYER0.npy \\
        --out benchmarks/results/fit_sample

The corpus is the 1,089,521 real passages of ../shared/data/passages, encoded by `retriever encode` with
all-MiniLM-L6-v2 (title and text, max_length 256) at the model's own pooling (last-avg) and at layer 0 (the
embedding output, anisotropic like raw BERT). For each, the flow (the default calibrator) and whitening are fitted
on all passages and on uniform samples drawn as the index draws them (`fit_sample_rows`, seeded): 10% and 20%
of the corpus, and fixed sizes around the default `--fit-sample`. Each fitted calibrator is scored on STS-B test
(Spearman x 100 of cosine similarity, pairs encoded with the same settings), and its fit time is recorded.
Flow results are the mean over --seeds (the seed drives both the sample and the flow). Writes OUT.json, OUT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from retriever.calibration import DEFAULT_FIT_SAMPLE, fit_on_sample, make_calibrator  # noqa: E402
from retriever.encode.encoder import Encoder  # noqa: E402
from retriever.evaluation import get_task, resolve_data_dir  # noqa: E402
from retriever.evaluation.evaluators import cosine_rows, spearman_x100  # noqa: E402


def stsb_test(layer: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """STS-B test pairs encoded as the passages were (max_length 256), and the gold scores."""
    (test,) = get_task("stsb").load_split(resolve_data_dir(), "test")
    sentences = list(dict.fromkeys(test.sent1 + test.sent2))
    row = {sentence: number for number, sentence in enumerate(sentences)}
    layers = None if layer == "last-avg" else [int(layer)]
    vectors = Encoder(layers=layers, device="cpu").encode(sentences)
    first = vectors[[row[s] for s in test.sent1]]
    second = vectors[[row[s] for s in test.sent2]]
    return first, second, test.labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", required=True, help="LAYER=PATH pairs, comma-separated (LAYER: last-avg or 0)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--sizes", default="25000,50000,100000,200000,400000")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fit_sample")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    # Layers are measured one run at a time if need be: a run adds its layers to the results already written.
    results = args.out.with_suffix(".json")
    report: dict = json.loads(results.read_text()) if results.exists() else {"layers": {}}
    report.update({"benchmark": "fit_sample", "model": "all-MiniLM-L6-v2", "seeds": seeds, "cpus": os.cpu_count(),
                   "machine": platform.machine(), "default_fit_sample": DEFAULT_FIT_SAMPLE})
    for pair in args.vectors.split(","):
        layer, path = pair.split("=", 1)
        X = np.load(path)
        n = len(X)
        first, second, gold = stsb_test(layer)
        sizes = {"all": None, "10%": n // 10, "20%": n // 5}
        sizes.update({f"{int(size):,}": int(size) for size in args.sizes.split(",") if int(size) < n})
        rows = {}
        for label, size in sizes.items():
            for name in ("flow", "whitening"):
                runs = []
                for seed in seeds if name == "flow" else [0]:
                    calibrator = make_calibrator(name, seed=seed)
                    start = time.perf_counter()
                    fit_on_sample(calibrator, X, size, seed)
                    seconds = time.perf_counter() - start
                    score = spearman_x100(cosine_rows(calibrator.transform(first), calibrator.transform(second)), gold)
                    runs.append({"seed": seed, "spearman": round(score, 2), "fit_seconds": round(seconds, 2)})
                rows.setdefault(label, {"vectors": size or n})[name] = {
                    "mean": round(float(np.mean([r["spearman"] for r in runs])), 2),
                    "fit_seconds": round(float(np.mean([r["fit_seconds"] for r in runs])), 2), "runs": runs}
                print(layer, label, name, rows[label][name]["mean"], rows[label][name]["fit_seconds"], file=sys.stderr,
                      flush=True)
        raw = spearman_x100(cosine_rows(first, second), gold)
        report["layers"][layer] = {"corpus_vectors": n, "raw": round(raw, 2), "threads": args.threads, "fits": rows}
        results.write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))


def markdown(report: dict) -> str:
    lines = ["# Fitting calibrators on a sample (benchmarks/fit_sample.py)", "",
             f"STS-B test Spearman x 100 after calibrators fitted on the {report['model']} vectors of the real "
             f"passages corpus; flow: mean of seeds {', '.join(map(str, report['seeds']))}.", ""]
    for layer, result in report["layers"].items():
        full = result["fits"]["all"]
        lines += [f"## {layer} ({result['corpus_vectors']:,} passages; uncalibrated: {result['raw']}; "
                  f"fits on {result.get('threads', '?')} thread(s))", "",
                  "| fitted on | vectors | flow | flow - all | flow fit s | whitening | whitening - all |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for label, row in result["fits"].items():
            flow, white = row["flow"], row["whitening"]
            lines.append(f"| {label} | {row['vectors']:,} | {flow['mean']:.2f} | {flow['mean'] - full['flow']['mean']:+.2f} | "
                         f"{flow['fit_seconds']:.1f} | {white['mean']:.2f} | "
                         f"{white['mean'] - full['whitening']['mean']:+.2f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
