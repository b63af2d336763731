"""Whether two runs of a benchmark gave the same figures: `retriever bench ... --json` outputs, or
`benchmarks/hybrid.py run` outputs, compared figure by figure (a change that must not change behaviour, such as a
reshaping of the code, is checked this way against the figures measured before it).

    python benchmarks/same_figures.py BEFORE.json AFTER.json [--out REPORT.md]

Exits 1 when any figure differs by more than --tolerance (default 0: exactly the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def figures(run: dict) -> dict[str, float]:
    """Every figure of RUN by a readable key: a bench's results (dataset, calibrator, mode, metric) or a hybrid
    run's tasks (task, setting)."""
    if "results" in run:
        return {" / ".join(str(row[key]) for key in ("dataset", "calibrator", "mode", "metric", "aggregation")
                           if row.get(key) is not None): float(row["score"]) for row in run["results"]}
    return {f"{task['task']} / {setting}": float(value) for task in run["tasks"]
            for setting, value in task["ndcg@10"].items()}


def compare(before: dict, after: dict, tolerance: float) -> tuple[list[str], int]:
    """Markdown lines describing the comparison, and how many figures differ."""
    old, new = figures(before), figures(after)
    missing = sorted(set(old) ^ set(new))
    differing = [(key, old[key], new[key]) for key in old if key in new and abs(old[key] - new[key]) > tolerance]
    largest = max((abs(a - b) for _, a, b in differing), default=0.0)
    lines = [f"- {len(old)} figures before, {len(new)} after; {len(old) - len(missing) - len(differing)} the same "
             f"(tolerance {tolerance:g}), {len(differing)} different (largest difference {largest:.6g}), "
             f"{len(missing)} in one run only"]
    lines += [f"  - {key}: {a:.6g} -> {b:.6g}" for key, a, b in differing[:20]]
    lines += [f"  - only in one run: {key}" for key in missing[:20]]
    return lines, len(differing) + len(missing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--out", type=Path, help="append the comparison, as markdown, to this file")
    args = parser.parse_args()
    lines, problems = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()), args.tolerance)
    report = "\n".join([f"`{args.before}` against `{args.after}`:", *lines]) + "\n"
    print(report, end="")
    if args.out:
        with open(args.out, "a", encoding="utf-8") as out:
            out.write(report + "\n")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
