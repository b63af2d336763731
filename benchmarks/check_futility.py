"""Issue 56 (1): could auto's check stop early where a win looks unlikely (a futility stop), and so cost a small
corpus less? Auto's check reads its pseudo-queries in rounds (250, 500, 1,000, all: `docs/auto.md`, 5) and stops
early only where the answer is clear. Most corpora read every round and keep the raw vectors, so a rule that also
stops where the leading candidate is unlikely to be shown better by the last round would save most of their
check. Each task is built as `retriever build` builds it (passages, calibrator `auto`, encodings from the
evaluation cache), and every round's results are recorded: each candidate's difference from the raw vectors and its
interval. For each round before the last, two textbook futility measures of the best candidate's chance of being
shown better by all the pseudo-queries planned, were the rest like what was read:

- conditional power under the current estimate (stochastic curtailment; Lan, Simon & Halperin 1982);
- predictive power (the estimate's own uncertainty averaged over; Spiegelhalter, Freedman & Blackburn 1986).

A rule "stop where the best candidate's power is under 10%" is safe only if no task where auto chose a calibrator
had a round under 10% before it was shown.

    python benchmarks/check_futility.py run --tasks labeled --out benchmarks/results/check_futility/labeled_minilm.json
    python benchmarks/check_futility.py run --tasks ir-classic --max-lengths 256,128,64 \\
        --out benchmarks/results/check_futility/ir_classic_minilm.json
    python benchmarks/check_futility.py report benchmarks/results/check_futility/*.json \\
        --out benchmarks/results/check_futility.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path
from statistics import NormalDist

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import passages_real  # noqa: E402  (the tasks and the build settings, shared)
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

STOP_BELOW = 0.10
NORMAL = NormalDist()


def run(tasks: list[str], max_lengths: list[int]) -> dict:
    import retriever.calibration.auto as auto
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval import search_runs

    rounds: list[dict] = []
    compare = auto.compare

    def recorded(check, baseline, scores, confidence=auto.CONFIDENCE, seed=0):
        results = compare(check, baseline, scores, confidence=confidence, seed=seed)
        if confidence == auto.CONFIDENCE:  # the family's intervals (a round's interim ones are recorded apart)
            rounds.append({"read": len(check), "candidates": len(results),
                           "results": [{"name": r.name, "difference": r.difference, "interval": [r.low, r.high]}
                                       for r in results]})
        return results

    auto.compare = recorded
    data, found = resolve_data_dir(), {"model": "minilm", "tasks": []}
    for max_length in max_lengths:
        encoder = CachedEncoder(Encoder(None, "last-avg", None, max_length, device="cpu"), resolve_cache_dir())
        for name in tasks:
            rset, seen = passages_real.load_task(name, data), []
            rounds.clear()
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                search_runs(rset, encoder.encode, encoder, "auto", {"default": {}}, 0,
                            passages=passages_real.builds(None, max_length)["passages"],
                            on_snapshot=lambda snapshot: seen.append(snapshot.manifest))
            check = seen[0].calibrator.get("decision", {}).get("check", {})
            record = {"task": name, "split": passages_real.split_of(name), "max_length": max_length,
                      "chosen": seen[0].calibrator["decision"]["chosen"]["name"],
                      "planned": check.get("planned"), "read": check.get("pseudo_queries"), "rounds": list(rounds),
                      "seconds": round(time.perf_counter() - started, 1)}
            print(json.dumps({key: record[key] for key in ("task", "max_length", "chosen", "read", "planned")}),
                  file=sys.stderr, flush=True)
            found["tasks"].append(record)
    return found


def powers(result: dict, candidates: int, read: int, planned: int) -> tuple[float, float]:
    """(conditional power, predictive power) of one candidate's round: the chance that all PLANNED pseudo-queries
    show its difference above 0 (the lower end of its interval at the family's confidence, Bonferroni over
    CANDIDATES), were the rest like the READ so far."""
    z = NORMAL.inv_cdf(1 - 0.05 / candidates / 2)
    low, high = result["interval"]
    error = (high - low) / 2 / z  # the standard error of the mean difference after READ
    if error <= 0:
        return (1.0, 1.0) if result["difference"] > 0 else (0.0, 0.0)
    shown_at = z * error * math.sqrt(read / planned)  # what the last round's mean must exceed
    conditional = NORMAL.cdf((result["difference"] - shown_at) / (error * math.sqrt(read * (planned - read)) / planned))
    predictive = NORMAL.cdf((result["difference"] - shown_at) / (error * math.sqrt((planned - read) / planned)))
    return conditional, predictive


def report(files: list[Path]) -> str:
    lines = ["# A futility stop for auto's check, measured (issue 56, 1)", "",
             f"{generated_from(__file__, files)}: "
             "each round before the last, the best of the candidates' chance of being shown better than the raw "
             "vectors by every pseudo-query planned, were the rest like what was read (conditional power, then "
             f"predictive power, %). A stop below {STOP_BELOW:.0%} would end the check there with the raw vectors.",
             "", "| task | max length | chosen | read (of planned) | power at 250 | at 500 | at 1,000 | "
             f"a stop below {STOP_BELOW:.0%} |", "|---|---:|---|---:|---|---|---|---|"]
    for path in files:
        for task in json.loads(path.read_text())["tasks"]:
            cells, stop = [], None
            for size in (250, 500, 1000):
                held = [r for r in task["rounds"] if r["read"] == size and size < task["planned"]]
                if not held:
                    cells.append("")
                    continue
                best = [max(values) for values in zip(*(powers(result, held[0]["candidates"], size, task["planned"])
                                                        for result in held[0]["results"]))]
                cells.append(f"{100 * best[0]:.0f} / {100 * best[1]:.0f}")
                if stop is None and best[0] < STOP_BELOW:
                    stop = size
            if stop is None:
                verdict = "no stop"
            elif task["chosen"] == "none":
                verdict = f"stops at {stop:,}: the same choice, {task['planned'] - stop:,} fewer read"
            else:
                verdict = f"**stops at {stop:,}: loses {task['chosen']}**"
            lines.append(f"| {task['task']} | {task['max_length']} | {task['chosen']} | {task['read']:,} "
                         f"({task['planned']:,}) | {' | '.join(cells)} | {verdict} |")
    lines += ["", "(the stop column uses conditional power, the more aggressive of the two)", ""]
    return "\n".join(lines)


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--tasks", default="labeled", help="a group of passages_real.GROUPS, or task names")
        running.add_argument("--max-lengths", default="256")

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(
        list(passages_real.GROUPS.get(args.tasks, args.tasks.split(","))),
        [int(value) for value in args.max_lengths.split(",")])))


if __name__ == "__main__":
    main()
