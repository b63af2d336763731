"""Wall time of the CLI's commands that encode nothing, each a fresh process, beside `python -c pass`.

A user waits for the whole process: interpreter start, imports, the command's own work. Commands that read or
rewrite an index's files (list, show, versions, verify, delete, compact, remove) should answer in about a second;
those that transform vectors through a flow (info, search) import torch. Each command runs --runs times on a
small index (a flow-32 calibrator, 600 documents, made here with the embedded model); the median is reported.

    python benchmarks/cli_speed.py --out benchmarks/results/cli_speed_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 1.5  # issue 28: non-encoding commands on the 2-core machine
DOCUMENTS = 600


# One cold search in a fresh process, stage by stage (the CLI's search is these calls).
SEARCH_STAGES = """
import json, sys, time
t = [time.perf_counter()]
from retriever.index import Index
t.append(time.perf_counter())
from retriever.index import load_encoder
from retriever.search.options import SearchOptions
from retriever.search.searcher import Searcher
index = Index.open("notes", sys.argv[1], device="cpu")
t.append(time.perf_counter())
encoder = load_encoder(index.snapshot)
t.append(time.perf_counter())
index.snapshot.calibrator
t.append(time.perf_counter())
vectors = index.snapshot.calibrate(encoder.encode(["a document about topic 3"]))
t.append(time.perf_counter())
Searcher(index.snapshot).search(["a document about topic 3"], vectors, SearchOptions(k=10, mode="hybrid"))
t.append(time.perf_counter())
print(json.dumps([b - a for a, b in zip(t, t[1:])]))
"""


def timed(command: list[str], runs: int, reset=None) -> list[float]:
    times = []
    for _ in range(runs):
        if reset is not None:
            reset()
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cli-speed-"))
    home = work / "home"
    corpus = work / "notes.txt"
    corpus.write_text("".join(f"Note {i}: a short document about topic {i % 37} and detail {i}.\n"
                              for i in range(DOCUMENTS)))
    retriever = [sys.executable, "-m", "cli.main"]
    os.chdir(REPO)
    subprocess.run([*retriever, "build", str(corpus), "--name", "notes", "--calibrator", "flow-32",
                    "--index-dir", str(home)], check=True, capture_output=True, timeout=600)
    backup = work / "backup"
    shutil.copytree(home, backup, symlinks=True)

    def restore() -> None:  # writes (delete, compact, remove) each start from the same index
        shutil.rmtree(home)
        shutil.copytree(backup, home, symlinks=True)

    where = ["--index-dir", str(home)]
    commands = {
        "list": (["list", *where], None),
        "show": (["show", "notes.txt:7", "--name", "notes", *where], None),
        "versions": (["versions", "--name", "notes", *where], None),
        "verify": (["verify", "--name", "notes", *where], None),
        "delete": (["delete", "notes.txt:7", "--name", "notes", *where], restore),
        "compact": (["compact", "--name", "notes", *where], restore),
        "remove": (["remove", "--name", "notes", "--yes", *where], restore),
        "info (flow: imports torch)": (["info", "--name", "notes", *where], None),
        "search (encodes the query)": (["search", "a document about topic 3", "--name", "notes", *where], None),
    }
    results = {"python -c pass": statistics.median(timed([sys.executable, "-c", "pass"], args.runs))}
    for label, (command, reset) in commands.items():
        results[label] = statistics.median(timed([*retriever, *command], args.runs, reset))
        if reset is not None:
            reset()  # the next command finds the index as built
        print(f"{label:30s} {results[label]:.2f} s", flush=True)
    restore()
    breakdown = [statistics.median(stage) for stage in zip(*(
        json.loads(subprocess.run([sys.executable, "-c", SEARCH_STAGES, str(home)], capture_output=True, text=True,
                                  check=True, timeout=300).stdout) for _ in range(3)))]
    stages = dict(zip(("import retriever.index", "open the index", "import torch and transformers, load the model",
                       "load the flow's weights", "encode the query", "search"), (round(v, 3) for v in breakdown)))
    print("search, cold, by stage (median of 3):", json.dumps(stages), flush=True)
    report = {"benchmark": "cli_speed", "runs": args.runs, "documents": DOCUMENTS, "cpus": os.cpu_count(),
              "python": platform.python_version(), "target_seconds": TARGET_SECONDS,
              "median_seconds": {label: round(value, 3) for label, value in results.items()},
              "search_cold_stages_seconds": stages,
              "non_encoding_within_target": all(value <= TARGET_SECONDS for label, value in results.items()
                                                if "(" not in label)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
