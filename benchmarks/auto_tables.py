"""Issue 12's acceptance tables from `retriever bench --json` results: one table per model and pooling, and the
checks the issue sets, computed from the scores (nothing here is typed in by hand).

- tuned encoders (last-avg): `auto` >= raw - 0.2 on every STS set, QNLI and every retrieval task;
- anisotropic representations (layer 0): `auto` and the best flow >= the best linear calibrator (whitening,
  whitening-K, sn, natsv-K, sn+natsv-K) - 0.5 on the 7-set STS average, QNLI AUC and each retrieval task.

    python benchmarks/auto_tables.py --out benchmarks/results/auto.md \
        minilm_last-avg=benchmarks/results/auto_minilm_last-avg.json minilm_layer0=... mpnet_last-avg=... \
        --fit-queries minilm_layer0=benchmarks/results/auto_minilm_layer0_fit-queries.json ...
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from retriever.evaluation.runner import markdown_table, score_table  # noqa: E402

LINEAR = re.compile(r"^(whitening(-\d+)?|sn|natsv-\d+|sn\+natsv-\d+)$")
FLOW = re.compile(r"^flow(-\d+)?(\+lu)?$")
TUNED_TOLERANCE, ANISOTROPIC_TOLERANCE = 0.2, 0.5


def main_columns(headers: list[str]) -> list[str]:
    """The columns the checks read: each STS set's main score, the average, QNLI and each retrieval task."""
    return [h for h in headers[1:] if not h.endswith(" all")]


def checks(label: str, headers: list[str], rows: list[list]) -> list[dict]:
    table = {row[0]: dict(zip(headers, row)) for row in rows}
    columns = main_columns(headers)
    found = []
    if "layer0" not in label:  # a tuned encoder: auto must not fall below raw - 0.2 anywhere
        for column in (c for c in columns if c != "avg"):
            value, raw = table["auto"][column], table["none"][column]
            found.append({"model": label, "column": column, "check": f"auto >= raw - {TUNED_TOLERANCE}",
                          "value": value, "bar": raw - TUNED_TOLERANCE, "pass": value >= raw - TUNED_TOLERANCE})
        return found
    linear = [name for name in table if LINEAR.match(name)]
    flows = [name for name in table if FLOW.match(name)]
    for column in (c for c in columns if c == "avg" or "QNLI" in c or "nDCG" in c):
        best_linear = max(linear, key=lambda name: table[name][column])
        bar = table[best_linear][column] - ANISOTROPIC_TOLERANCE
        best_flow = max(flows, key=lambda name: table[name][column])
        for name in ("auto", best_flow):
            value = table[name][column]
            found.append({"model": label, "column": column,
                          "check": f"{'auto' if name == 'auto' else f'best flow ({name})'} >= best linear "
                                   f"({best_linear}) - {ANISOTROPIC_TOLERANCE}",
                          "value": value, "bar": bar, "pass": value >= bar})
    return found


def fit_queries_table(corpus_only: dict, with_queries: dict) -> tuple[list[str], list[list]]:
    """nDCG@10 per retrieval task, fitted on the corpus alone and on corpus + queries."""
    def ndcg(document: dict) -> dict:
        return {(r["calibrator"], r["dataset"]): r["score"] for r in document["results"] if r["metric"] == "ndcg@10"}

    before, after = ndcg(corpus_only), ndcg(with_queries)
    datasets = list(dict.fromkeys(dataset for _, dataset in after))
    calibrators = list(dict.fromkeys(calibrator for calibrator, _ in after))
    headers = ["calibrator", *(f"{d} {kind}" for d in datasets for kind in ("corpus", "+queries"))]
    rows = [[name, *(value for d in datasets for value in (before.get((name, d)), after.get((name, d))))]
            for name in calibrators]
    return headers, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="LABEL=FILE.json (label ends in layer0 for layer 0)")
    parser.add_argument("--fit-queries", nargs="*", default=[], help="LABEL=FILE.json of a --fit-queries run")
    parser.add_argument("--out", help="write the markdown here (and the checks as JSON beside it)")
    args = parser.parse_args()

    documents = dict(item.split("=", 1) for item in args.results)
    lines, all_checks = [], []
    for label, path in documents.items():
        document = json.loads(Path(path).read_text())
        headers, rows = score_table(document["results"])
        keep = [i for i, h in enumerate(headers) if not h.endswith(" all")]
        headers, rows = [headers[i] for i in keep], [[row[i] for i in keep] for row in rows]
        found = checks(label, headers, rows)
        all_checks += found
        passed = sum(check["pass"] for check in found)
        lines += [f"### {label} ({Path(path).name}; max_length {document['max_length']})", "",
                  markdown_table(headers, rows), "",
                  f"Checks: {passed} of {len(found)} pass.", ""]
        lines += [f"- {'PASS' if c['pass'] else 'FAIL'} {c['column']}: {c['check']}: {c['value']:.2f} vs {c['bar']:.2f}"
                  for c in found]
        lines.append("")
    for item in args.fit_queries:
        label, path = item.split("=", 1)
        if label not in documents:
            raise SystemExit(f"--fit-queries {label}: no corpus-only result with that label")
        headers, rows = fit_queries_table(json.loads(Path(documents[label]).read_text()),
                                          json.loads(Path(path).read_text()))
        lines += [f"### {label}: fitted on the corpus vs corpus + queries (`--fit-queries`), nDCG@10", "",
                  markdown_table(headers, rows), ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps({"checks": all_checks}, indent=1) + "\n")


if __name__ == "__main__":
    main()
