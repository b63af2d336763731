"""Local engine vs Ray engine: the same builds of real passages, fixed overhead and steady-state throughput.

    python benchmarks/engine_speed.py --out benchmarks/results/engine_speed_cpu          # 20k and 100k passages
    python benchmarks/engine_speed.py --device cuda --passages sample.jsonl.gz --sample 0 --out .../engine_speed_h100

Each build runs in a fresh process (imports and model loads counted, as a user's `retriever build` pays them),
calibrator `none` so both engines do identical work after encoding. For each engine the wall times T(n) at the
two sizes give a line T(n) = fixed + n / rate: `rate` is the steady-state throughput once started (documents/s),
`fixed` the cost that does not grow with the corpus (process start, model load, for Ray the cluster and actors).
The Ray engine also reports its own steady rate, measured between the first and last encoded batch. Target:
ray rate / local rate >= 0.9 on this machine. Timings on a shared machine drift by tens of percent over a long
run, so each engine builds each size --repeats times, the engines alternating which goes first (local-ray, then
ray-local: a drift weighs on both alike), and the line goes through the mean wall times.

The passages are a seeded, shuffled sample (seed 0) of ../shared/data/passages (1.09 M real passages); --sample 0
shuffles --passages whole. A size takes the sample's first n passages.
"""

from __future__ import annotations

import argparse
import gzip
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
PASSAGES = REPO.parent / "shared" / "data" / "passages" / "passages.jsonl.gz"

BUILD = """
import json, sys, time
started = time.perf_counter()
from retriever.index import Index
from retriever.engines.ray_build import RayOptions
corpus, home, engine, device, workers, batch_rows, batch_size, model, dtype = sys.argv[1:10]
options = RayOptions(workers=int(workers) if workers != "0" else None, batch_rows=int(batch_rows))
summary = Index.build(corpus, "bench", home, engine=engine, ray_options=options if engine == "ray" else None,
                      calibrator="none", device=device, batch_size=int(batch_size), model=model or None, dtype=dtype,
                      replace=True)
print(json.dumps({"seconds": time.perf_counter() - started, "timings": summary.timings,
                  "documents": summary.documents}))
"""


def sample_passages(source: Path, count: int, out: Path) -> Path:
    lines = gzip.open(source, "rt", encoding="utf-8").read().splitlines()
    # Shuffled (seed 0): the file is ordered by source, so a prefix of it would make the sizes' documents differ
    # in length, and the line through the two sizes meaningless.
    rng = np.random.default_rng(0)
    lines = [lines[i] for i in (rng.choice(len(lines), count, replace=False) if count else rng.permutation(len(lines)))]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def first_lines(source: Path, count: int, out: Path) -> Path:
    with open(source, encoding="utf-8") as file:
        out.write_text("".join(line for _, line in zip(range(count), file)), encoding="utf-8")
    return out


def run_build(corpus: Path, engine: str, device: str, workers: int, batch_rows: int, batch_size: int, model: str,
              dtype: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="engine-speed-") as home:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", BUILD, str(corpus), home, engine, device, str(workers),
                               str(batch_rows), str(batch_size), model, dtype], capture_output=True, text=True,
                              cwd=REPO)
        wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{engine} build failed:\n{done.stderr[-3000:]}")
    record = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 2), "build_s": round(record["seconds"], 2),
            "timings": {key: round(value, 3) for key, value in record["timings"].items()}}


def line_fit(sizes: list[int], walls: list[float]) -> dict:
    """T(n) = fixed + n / rate through the two (or least squares through more) measured points."""
    slope, fixed = np.polyfit(np.asarray(sizes, float), np.asarray(walls, float), 1)
    return {"fixed_s": round(float(fixed), 2), "rate_docs_per_s": round(float(1 / slope), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, default=PASSAGES)
    parser.add_argument("--sample", type=int, default=100_000, help="seeded sample size; 0 takes --passages whole")
    parser.add_argument("--sizes", default="20000,100000")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=0, help="ray encode actors [default: the engine's]")
    parser.add_argument("--batch-rows", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=64, help="encoder batch size (both engines)")
    parser.add_argument("--model", default="", help="model folder [default: all-MiniLM-L6-v2]")
    parser.add_argument("--random-model", type=Path,
                        help="config and tokenizer folder: a randomly initialised model of that shape (speed only)")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--repeats", type=int, default=2,
                        help="builds per engine and size; engines alternate which goes first [default: 2]")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = parser.parse_args()

    sizes = [int(size) for size in args.sizes.split(",")]
    model = args.model
    if args.random_model:
        sys.path.insert(0, str(REPO))
        from benchmarks.encode_speed import random_model_folder

        model = random_model_folder(args.random_model)
    work = Path(tempfile.mkdtemp(prefix="engine-speed-data-"))
    sample = sample_passages(args.passages, args.sample, work / "sample.jsonl")
    corpora = {size: first_lines(sample, size, work / f"passages-{size}.jsonl") for size in sizes}
    results: dict[str, dict[int, list[dict]]] = {"local": {size: [] for size in sizes},
                                                 "ray": {size: [] for size in sizes}}
    for repeat in range(args.repeats):
        # Engines alternate which goes first (local-ray, then ray-local...): a machine that slows down or speeds up
        # during the run then weighs on both alike.
        order = ("local", "ray") if repeat % 2 == 0 else ("ray", "local")
        for size in sizes:
            for engine in order:
                record = run_build(corpora[size], engine, args.device, args.workers, args.batch_rows,
                                   args.batch_size, model, args.dtype)
                results[engine][size].append(record)
                print(f"{engine:5} {size:>7,} docs: {record['wall_s']:7.1f} s  {record['timings']}", file=sys.stderr)
        # Written after every repeat: a run cut short still leaves its finished repeats on disk.
        write_report(args, sizes, results, quiet=repeat + 1 < args.repeats)


def write_report(args, sizes: list[int], results: dict, quiet: bool = False) -> None:
    """OUT.json and OUT.md from the repeats finished so far."""
    repeats = len(results["local"][sizes[0]])
    mean_wall = {engine: {size: float(np.mean([record["wall_s"] for record in results[engine][size]]))
                          for size in sizes} for engine in results}
    fits = {engine: line_fit(sizes, [mean_wall[engine][size] for size in sizes]) for engine in results}
    ratio = fits["ray"]["rate_docs_per_s"] / fits["local"]["rate_docs_per_s"]
    repeat_ratios = [line_fit(sizes, [results["ray"][size][r]["wall_s"] for size in sizes])["rate_docs_per_s"]
                     / line_fit(sizes, [results["local"][size][r]["wall_s"] for size in sizes])["rate_docs_per_s"]
                     for r in range(repeats)]
    report = {
        "benchmark": "engine_speed",
        "device": args.device,
        "model": f"random {args.random_model}" if args.random_model else (args.model or "all-MiniLM-L6-v2"),
        "dtype": args.dtype,
        "sizes": sizes,
        "workers": args.workers or "engine default",
        "batch_rows": args.batch_rows,
        "encoder_batch_size": args.batch_size,
        "repeats": repeats,
        "builds": results,
        "mean_wall_s": mean_wall,
        "fit": fits,
        "steady_rate_ratio_ray_vs_local": round(ratio, 3),
        "steady_rate_ratio_per_repeat": [round(value, 3) for value in repeat_ratios],
        "extra_fixed_s_ray": round(fits["ray"]["fixed_s"] - fits["local"]["fixed_s"], 2),
        "ray_in_run_steady_docs_per_s": {size: [record["timings"].get("encode_steady_rows_per_s")
                                                for record in results["ray"][size]] for size in sizes},
        "target": "steady_rate_ratio_ray_vs_local >= 0.9",
        "passes": ratio >= 0.9,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
    }
    try:
        import torch

        report["machine"]["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        pass
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [f"# engine_speed: {report['model']}, {args.dtype} ({args.device}, {os.cpu_count()} CPUs"
             f"{', ' + report['machine']['gpu'] if report['machine'].get('gpu') else ''})", "",
             f"Wall seconds per build (each in a fresh process), {repeats} repeat(s), engines alternating "
             "which goes first; the line is fitted through the means.", "",
             "| engine | " + " | ".join(f"{size:,} docs (s)" for size in sizes) + " | fixed (s) | rate (docs/s) |",
             "|---|" + "---:|" * (len(sizes) + 2)]
    for engine in ("local", "ray"):
        lines.append(f"| {engine} | " + " | ".join(
            f"{mean_wall[engine][size]:.1f}" + (" (" + ", ".join(f"{record['wall_s']:.1f}" for record in
                                                        results[engine][size]) + ")" if repeats > 1 else "")
            for size in sizes) + f" | {fits[engine]['fixed_s']:.1f} | {fits[engine]['rate_docs_per_s']:,.0f} |")
    lines += ["", f"steady-state rate ratio ray / local: **{ratio:.3f}** (target >= 0.9: "
              f"{'PASS' if ratio >= 0.9 else 'FAIL'}); per repeat: "
              + ", ".join(f"{value:.3f}" for value in repeat_ratios)
              + f"; Ray's extra fixed cost: {report['extra_fixed_s_ray']:.1f} s", ""]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    if not quiet:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
