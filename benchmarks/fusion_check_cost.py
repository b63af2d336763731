"""Issue 44: what the hybrid check costs a build (target: at most 10% of a CPU build of 100,000 passages).

One default build (calibrator `auto`, index type `auto`) of CORPUS, timed stage by stage inside the build
(`ChangeSummary.timings`); the hybrid check's share is its time over the whole build's, in the same run. Built
from the corpus's precomputed raw vectors (VECTORS, row i = passage i, from the default model), so the build
encodes only auto's pseudo-queries: a build that encodes its documents too takes longer, and the share is smaller
still.

    python benchmarks/fusion_check_cost.py --corpus /work/filtered/w100k/corpus.jsonl.gz \\
        --vectors /work/filtered/w100k/vectors.npy --out benchmarks/results/fusion_check_cost_cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--vectors", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="path without suffix: .json and .md are written")
    args = parser.parse_args()
    from retriever.index import Index

    with tempfile.TemporaryDirectory(prefix="retriever-bench-") as folder:
        started = time.perf_counter()
        summary = Index.build(args.corpus, "cost", folder, vectors=args.vectors)
        wall = time.perf_counter() - started
        hybrid = Index.open("cost", folder).snapshot.manifest.hybrid
    timings = {stage: round(seconds, 2) for stage, seconds in summary.timings.items()}
    share = timings["hybrid_check"] / wall
    result = {"command": " ".join(["python", "benchmarks/fusion_check_cost.py", *sys.argv[1:]]),
              "documents": summary.documents, "wall_s": round(wall, 1), "timings_s": timings,
              "hybrid_check_share": round(share, 4), "weight": hybrid["weight"],
              "pseudo_queries": hybrid["evidence"]["pseudo_queries"], "pool": hybrid["evidence"]["pool"]}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stages = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in timings.items())
    args.out.with_suffix(".md").write_text(
        f"# What the hybrid check costs a build (issue 44)\n\n`{result['command']}`\n\n"
        f"A default build of {summary.documents:,} passages from their precomputed vectors (2 CPUs): "
        f"{wall:.1f} s in all ({stages}). The hybrid check ({result['pseudo_queries']:,} pseudo-queries among "
        f"{result['pool']:,} documents, both sides) took {timings['hybrid_check']:.1f} s: **{share:.1%}** of the "
        f"build (target <= 10%: **{'PASS' if share <= 0.10 else 'FAIL'}**). A build that encodes its documents "
        "on the CPU takes minutes more (benchmarks/results/check_cost_cpu.md: 629 s for 100,000 passages), and the "
        f"check's share is smaller still. The weight decided: {hybrid['weight']}.\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
