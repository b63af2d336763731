"""FAISS's prefetching threads for mapped IVF lists, on and off (`retriever.store.vectors._without_list_prefetch`).

FAISS reads an IVF index's lists mapped (`OnDiskInvertedLists`) and, by default, starts 32 threads for every search
to touch the lists it is about to scan. The library turns them off. For each setting in turn, each run a fresh
process: a page cache dropped first (where this process may: root on Linux; else the run says it stayed warm), the
index opened, then SEARCHES dense searches of QNLI questions one at a time: the first search's milliseconds, the
first ten's together, and the median of the rest.

    python benchmarks/ivf_prefetch.py run --index-dir /work/cost/indexes-b32dfcb --name passages --rounds 2 \\
        --out benchmarks/results/ivf_prefetch/cpu.json
    python benchmarks/ivf_prefetch.py report benchmarks/results/ivf_prefetch/cpu.json \\
        --out benchmarks/results/ivf_prefetch.md

(the index: a million passages built by `benchmarks/search_p50.py`.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

SETTINGS = {"FAISS's default (32 threads)": 32, "the library's (none)": 0}
SEARCHES = 60


def one(index_dir: Path, name: str, threads: int) -> dict:
    """SEARCHES dense searches in this (fresh) process, FAISS's prefetching THREADS for the mapped lists."""
    import time

    import faiss

    import retriever.store.vectors as vectors_module
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import qnli_retrieval
    from retriever.index import Index, load_encoder
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    def prefetching(index: faiss.Index) -> None:
        lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
        lists.prefetch_nthread = threads

    vectors_module._without_list_prefetch = prefetching
    texts = list(qnli_retrieval(resolve_data_dir()).queries.values())[:SEARCHES]
    index = Index.open(name, index_dir, device="cpu")
    queries = index.snapshot.calibrate(load_encoder(index.snapshot).encode(texts))
    searcher, options = Searcher(index.snapshot), SearchOptions(k=10, mode="dense")
    milliseconds = []
    for number, text in enumerate(texts):
        clock = time.perf_counter()
        searcher.search([text], queries[number : number + 1], options)
        milliseconds.append(1000 * (time.perf_counter() - clock))
    index.close()
    return {"first_ms": round(milliseconds[0], 1), "first_ten_ms": round(sum(milliseconds[:10]), 1),
            "rest_median_ms": round(float(np.median(milliseconds[10:])), 2)}


def dropped_page_cache() -> bool:
    """Drop the page cache (every file read again from disk), where this process may."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def run(index_dir: Path, name: str, rounds: int) -> dict:
    found = {"machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs", "runs": []}
    for _ in range(rounds):
        for setting, threads in SETTINGS.items():
            cold = dropped_page_cache()
            result = subprocess.run([sys.executable, __file__, "one", "--index-dir", str(index_dir), "--name", name,
                                     "--threads", str(threads)], capture_output=True, text=True, check=True)
            record = {"setting": setting, "cold": cold, **json.loads(result.stdout.strip().splitlines()[-1])}
            print(json.dumps(record), file=sys.stderr, flush=True)
            found["runs"].append(record)
    return found


def report(files: list[Path]) -> str:
    lines = ["# Mapped IVF lists: FAISS's prefetching threads on and off", "",
             f"{generated_from(__file__, files)}: each run a fresh process, the page cache dropped first where "
             f"marked cold, then {SEARCHES} dense searches of QNLI questions one at a time; the commands are in the "
             "script's docstring.", ""]
    for path in files:
        found = json.loads(path.read_text())
        lines += [f"## `{path.name}` ({found['machine']})", "",
                  "| setting | page cache | first search, ms | first ten, ms | the rest: median ms |",
                  "|---|---|---:|---:|---:|"]
        for run in found["runs"]:
            lines.append(f"| {run['setting']} | {'dropped' if run['cold'] else 'warm'} | {run['first_ms']:,.0f} | "
                         f"{run['first_ten_ms']:,.0f} | {run['rest_median_ms']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        parser = argparse.ArgumentParser()
        parser.add_argument("one")
        parser.add_argument("--index-dir", type=Path, required=True)
        parser.add_argument("--name", required=True)
        parser.add_argument("--threads", type=int, required=True)
        arguments = parser.parse_args()
        print(json.dumps(one(arguments.index_dir, arguments.name, arguments.threads)))
        return

    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--index-dir", type=Path, required=True)
        running.add_argument("--name", default="passages")
        running.add_argument("--rounds", type=int, default=2)

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(args.index_dir, args.name, args.rounds)))


if __name__ == "__main__":
    main()
