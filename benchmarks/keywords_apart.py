"""Issue 56 (2): where a build from vectors should write its keyword index, on a thread beside the checks and fits
or in a process of its own (`retriever.engines.local.KEYWORDS_APART_FROM`). A build from vectors encodes no
documents: its main thread runs auto's check and fits and the hybrid check, much of it Python, and a keyword index
written on a thread takes turns with it for the interpreter lock; a process costs its start (spawning an
interpreter and importing the library) on the other core instead.

For each size, the first N passages of a corpus and their vectors are built with every default but where the
keyword index is written (`LocalEngine(keywords_in_process=...)`), thread and process taking turns, each run a fresh
process; wall seconds, and CPU seconds of the build and of its keyword process:

    python benchmarks/keywords_apart.py run --corpus /work/w100k/corpus.jsonl.gz --vectors /work/w100k/vectors.npy \\
        --sizes 2000,20000,100000 --rounds 2 --out benchmarks/results/keywords_apart/cpu.json
    python benchmarks/keywords_apart.py report benchmarks/results/keywords_apart/cpu.json \\
        --out benchmarks/results/keywords_apart.md

(the corpus: the first 100,000 passages of ../shared/data/passages and their vectors, `retriever encode`, as in
vectors_build_speed.py).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

WHERE = {"thread": False, "process": True}


def one_build(corpus: Path, vectors: Path, where: str) -> dict:
    """One build in this process (a fresh one: `run` starts it), the keyword index written WHERE."""
    import functools
    import multiprocessing
    import resource
    import time

    import retriever.index as index_module
    from retriever.engines.local import LocalEngine
    from retriever.index import Index

    index_module.LocalEngine = functools.partial(LocalEngine, keywords_in_process=WHERE[where])
    with tempfile.TemporaryDirectory(prefix="retriever-keywords-apart-") as folder:
        clock = time.perf_counter()
        summary = Index.build(corpus, "apart", folder, vectors=vectors)
        wall = time.perf_counter() - clock
    while multiprocessing.active_children():  # the keyword process reaped, so that its CPU time is counted
        time.sleep(0.01)
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"where": where, "documents": summary.documents, "wall_s": round(wall, 2),
            "cpu_s": round(own.ru_utime + own.ru_stime, 2),
            "keyword_process_cpu_s": round(children.ru_utime + children.ru_stime, 2),
            "timings_s": {name: round(value, 2) for name, value in summary.timings.items()}}


def run(corpus: Path, vectors: Path, sizes: list[int], rounds: int) -> dict:
    found = {"machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs", "runs": []}
    with tempfile.TemporaryDirectory(prefix="retriever-keywords-apart-data-") as data:
        stored = np.load(vectors, mmap_mode="r")
        for size in sizes:
            part, part_vectors = Path(data) / f"corpus-{size}.jsonl", Path(data) / f"vectors-{size}.npy"
            opened = gzip.open(corpus, "rt", encoding="utf-8") if corpus.suffix == ".gz" else corpus.open()
            with opened as lines, part.open("w", encoding="utf-8") as out:
                out.writelines(itertools.islice(lines, size))
            np.save(part_vectors, np.asarray(stored[:size]))
            for _ in range(rounds):
                for where in WHERE:
                    result = subprocess.run(
                        [sys.executable, __file__, "one", "--corpus", str(part), "--vectors", str(part_vectors),
                         "--where", where], capture_output=True, text=True, check=True)
                    record = json.loads(result.stdout.strip().splitlines()[-1])
                    print(json.dumps(record), file=sys.stderr, flush=True)
                    found["runs"].append(record)
    return found


def report(files: list[Path]) -> str:
    lines = ["# A build from vectors: its keyword index on a thread or in a process (issue 56, 2)", "",
             f"{generated_from(__file__, files)}: each run a fresh process building the first N passages from their "
             "vectors with every default, thread and process taking turns; the commands are in the script's "
             "docstring. CPU: the build's process, then its keyword process's.", ""]
    for path in files:
        found = json.loads(path.read_text())
        lines += [f"## `{path.name}` ({found['machine']})", "",
                  "| documents | keyword index | runs | wall s (median) | CPU s (median) | process / thread |",
                  "|---:|---|---:|---:|---:|---:|"]
        for documents in sorted({run["documents"] for run in found["runs"]}):
            medians = {}
            for where in WHERE:
                mine = [run for run in found["runs"] if run["documents"] == documents and run["where"] == where]
                medians[where] = float(np.median([run["wall_s"] for run in mine]))
                cpu = float(np.median([run["cpu_s"] for run in mine]))
                child = float(np.median([run["keyword_process_cpu_s"] for run in mine]))
                ratio = f"{medians['process'] / medians['thread']:.2f}x" if where == "process" else ""
                lines.append(f"| {documents:,} | {where} | {len(mine)} | {medians[where]:.2f} | "
                             f"{cpu:.1f}{f' + {child:.1f}' if child else ''} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "one":
        parser = argparse.ArgumentParser()
        parser.add_argument("one")
        parser.add_argument("--corpus", type=Path, required=True)
        parser.add_argument("--vectors", type=Path, required=True)
        parser.add_argument("--where", choices=list(WHERE), required=True)
        arguments = parser.parse_args()
        print(json.dumps(one_build(arguments.corpus, arguments.vectors, arguments.where)))
        return

    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--corpus", type=Path, required=True)
        running.add_argument("--vectors", type=Path, required=True)
        running.add_argument("--sizes", default="2000,20000,100000")
        running.add_argument("--rounds", type=int, default=2)

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(
        args.corpus, args.vectors, [int(size) for size in args.sizes.split(",")], args.rounds)))


if __name__ == "__main__":
    main()
