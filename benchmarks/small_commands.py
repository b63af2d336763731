"""Issue 56: the commands a user waits on for a small corpus, one checkout's code against another's. Each command is
a whole `retriever` process as a user runs it, importing the code of the checkout named (`PYTHONPATH`), the two
checkouts taking turns command by command, round by round, on the same machine:

    git worktree add ../before ada26c7
    python benchmarks/small_commands.py run --before ../before --rounds 3 \\
        --out benchmarks/results/small_commands/cpu.json
    python benchmarks/small_commands.py report benchmarks/results/small_commands/cpu.json \\
        --out benchmarks/results/small_commands.md

The corpus: the first 300 distinct sentences of STS-B dev, one per line (`build_vs_encode.write_corpora`). The
commands, in this order each round: `retriever encode` of the corpus, `retriever build` of it (every default),
`retriever add` of one new line to that index, `retriever search` of one question. Each checkout builds its own index; the
machine's ONNX cache is shared, as a user's machine has one (its graph and kit are kept by the first run of either).
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
from benchmarks.build_vs_encode import write_corpora  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

STEPS = ("encode", "build", "add", "search")


def _commit(code: Path) -> str:
    return subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def run(before: Path, rounds: int) -> dict:
    retriever = str(Path(sys.executable).parent / "retriever")
    codes = {"before": before.resolve(), "after": REPO}
    seconds = {label: {step: [] for step in STEPS} for label in codes}
    with tempfile.TemporaryDirectory(prefix="retriever-small-commands-") as folder:
        folder = Path(folder)
        corpus = write_corpora(folder)["300 short records"]
        for number in range(rounds):
            for label, code in codes.items():
                note = folder / f"note-{label}-{number}.txt"
                note.write_text(f"A new note, number {number}, about the harbour and its ships.\n")
                indexes = folder / f"indexes-{label}"
                commands = {
                    "encode": ["encode", corpus, "--out", folder / f"{label}.npy"],
                    "build": ["build", corpus, "--name", "notes", "--index-dir", indexes, "--replace"],
                    "add": ["add", note, "--name", "notes", "--index-dir", indexes],
                    "search": ["search", "a man playing a guitar", "--name", "notes", "--index-dir", indexes],
                }
                for step in STEPS:
                    started = time.perf_counter()
                    done = subprocess.run([retriever, *map(str, commands[step])], capture_output=True, text=True,
                                          env={**os.environ, "PYTHONPATH": str(code)})
                    seconds[label][step].append(round(time.perf_counter() - started, 3))
                    if done.returncode != 0:
                        raise SystemExit(f"{label}: retriever {step} failed: {done.stderr.strip()[-2000:]}")
    return {"machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs", "rounds": rounds,
            "codes": {label: _commit(code) for label, code in codes.items()}, "seconds": seconds}


def report(paths: list[Path]) -> str:
    lines = ["# The commands a user waits on for a small corpus, before and after (issue 56)", "",
             generated_from(__file__, paths) + ". Each: a whole `retriever` process on 300 short records (one new "
             "line for `add`, one question for `search`), the two checkouts taking turns; medians of the rounds.", ""]
    for path in paths:
        found = json.loads(path.read_text())
        before, after = found["codes"]["before"], found["codes"]["after"]
        lines += [f"## {after} against {before} ({found['machine']}, {found['rounds']} rounds)", "",
                  f"| command | {before}, s | {after}, s | ratio |", "|---|---:|---:|---:|"]
        for step in STEPS:
            old = float(np.median(found["seconds"]["before"][step]))
            new = float(np.median(found["seconds"]["after"][step]))
            lines.append(f"| retriever {step} | {old:.2f} | {new:.2f} | {new / old:.2f}x |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    def run_arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--before", type=Path, required=True, help="a checkout of the code to compare with")
        running.add_argument("--rounds", type=int, default=3)

    study_main(__file__, __doc__, report, run=(run_arguments, lambda args: run(args.before, args.rounds)))


if __name__ == "__main__":
    main()
