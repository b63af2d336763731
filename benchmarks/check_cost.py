"""What `auto`'s retrieval check costs a build: the same 100,000 real passages built with `auto` and with the
calibrator `auto` chose, fixed (what the build costs without the check), in the same run, each in a fresh process.

    python benchmarks/check_cost.py --out benchmarks/results/check_cost_cpu            # 100k passages, MiniLM
    python benchmarks/check_cost.py --documents 20000 --repeats 1 --out /tmp/check_cost  # a quick look

The check's cost is everything `auto` adds: making and encoding the pseudo-queries and their targets, fitting
every candidate (the flow, flow-K and whitening-K at two K) and searching the pseudo-queries through each. Also
reported: the same build with calibrator `none` (no fit at all), the stricter baseline. Builds alternate their
order over repeats, so a machine's drift weighs on both alike. Target (issue 24): auto's build at most 1.2 x the
baseline's wall time.

The passages are a seeded, shuffled sample (seed 0) of ../shared/data/passages (1.09 M real passages).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.engine_speed import PASSAGES, sample_passages  # noqa: E402

TARGET = 1.2
BUILD = """
import json, sys, time
started = time.perf_counter()
from retriever.index import Index
corpus, home, calibrator = sys.argv[1:4]
summary = Index.build(corpus, "bench", home, calibrator=calibrator, device="cpu")
from retriever.index import Index as Opened
decision = Opened.open("bench", home, device="cpu").snapshot.manifest.calibrator.get("decision")
print(json.dumps({"seconds": time.perf_counter() - started, "timings": summary.timings,
                  "chosen": decision["chosen"]["name"] if decision else calibrator,
                  "decision": decision}))
"""


def build(corpus: Path, calibrator: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="check-cost-") as home:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", BUILD, str(corpus), home, calibrator], capture_output=True,
                              text=True, cwd=REPO)
        wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{calibrator} build failed:\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {"calibrator": calibrator, "chosen": record["chosen"], "wall_s": round(wall, 2),
            "timings": {key: round(value, 2) for key, value in record["timings"].items()},
            **({"decision": record["decision"]} if record["decision"] else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    parser.add_argument("--report", action="store_true", help="only write OUT.md again from OUT.json")
    args = parser.parse_args()
    if args.report:
        args.out.with_suffix(".md").write_text(markdown(json.loads(args.out.with_suffix(".json").read_text())) + "\n")
        return
    with tempfile.TemporaryDirectory(prefix="check-cost-corpus-") as folder:
        corpus = sample_passages(PASSAGES, args.documents, Path(folder) / "passages.jsonl")
        runs: list[dict] = []
        first = build(corpus, "auto")  # learns what auto chooses: the baseline to compare with
        runs.append(first)
        chosen = first["chosen"]
        baselines = list(dict.fromkeys([chosen, "none"]))
        for repeat in range(args.repeats):
            order = [*baselines, "auto"] if repeat % 2 == 0 else ["auto", *reversed(baselines)]
            for calibrator in order:
                if repeat == 0 and calibrator == "auto":
                    continue  # the first auto build above is this repeat's
                runs.append(build(corpus, calibrator))
                print(f"repeat {repeat + 1}: {calibrator}: {runs[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
    mean = {name: float(np.mean([r["wall_s"] for r in runs if r["calibrator"] == name]))
            for name in ["auto", *baselines]}
    result = {
        "benchmark": "check_cost", "documents": args.documents, "repeats": args.repeats, "cpu_count": os.cpu_count(),
        "python": platform.python_version(), "auto_chose": chosen, "runs": runs,
        "mean_wall_s": {name: round(value, 1) for name, value in mean.items()},
        "ratios": {f"auto / {name}": round(mean["auto"] / mean[name], 3) for name in baselines},
        "target": f"auto / {chosen} <= {TARGET}",
        "pass": mean["auto"] / mean[chosen] <= TARGET,
        "command": " ".join(["python", "benchmarks/check_cost.py", *sys.argv[1:]]),
    }
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result) + "\n")
    print(markdown(result))


def markdown(result: dict) -> str:
    auto_runs = [r for r in result["runs"] if r["calibrator"] == "auto"]
    parts = {key: np.mean([r["timings"].get(key, 0.0) for r in auto_runs]) for key in ("encode", "pseudo_queries", "fit")}
    lines = [f"# What auto's retrieval check costs a build ({result['documents']:,} passages, "
             f"{result['cpu_count']} CPUs)", "", f"`{result['command']}`", "",
             f"auto chose `{result['auto_chose']}`. Mean wall time per build over {result['repeats']} "
             "repeat(s), each in a fresh process (imports, model load, encoding, fit, indexing):", "",
             "| build | wall s (mean) | runs |", "|---|---:|---|"]
    for name, value in result["mean_wall_s"].items():
        runs = ", ".join(f"{r['wall_s']:.1f}" for r in result["runs"] if r["calibrator"] == name)
        lines.append(f"| {name} | {value:.1f} | {runs} |")
    chosen_runs = [r for r in result["runs"] if r["calibrator"] == result["auto_chose"]]
    chosen_fit = np.mean([r["timings"].get("fit", 0.0) for r in chosen_runs])
    own = parts["pseudo_queries"] + parts["fit"] - chosen_fit
    lines += ["", *(f"- {name}: **{value:.3f}**" for name, value in result["ratios"].items()),
              f"- target {result['target']}: **{'PASS' if result['pass'] else 'FAIL'}**",
              f"- inside auto's builds (mean): encoding the corpus {parts['encode']:.1f} s, making and encoding the "
              f"pseudo-queries {parts['pseudo_queries']:.1f} s, fitting and checking every candidate "
              f"{parts['fit']:.1f} s (the {result['auto_chose']} build's own fit: {chosen_fit:.1f} s)",
              f"- the check's own time, measured inside the build: {own:.1f} s, **{own / result['mean_wall_s'][result['auto_chose']]:.1%}** "
              f"of the {result['auto_chose']} build's wall time. Whole-build times drift more than that between "
              "runs on this machine (the corpus encoding alone took "
              + ", ".join(f"{r['timings']['encode']:.1f} s" for r in result["runs"]) + " in the builds above)"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
