"""Why `auto` is unsteady on a corpus of single sentences at an untuned layer, and whether reading its pseudo-queries
deeper than the top 10 would steady it. STS-B's 15,457 distinct sentences, all-MiniLM-L6-v2 mean-pooled at layers 0,
4 and 6 (`calibration_table.py`'s vectors, its cache), auto's check as `retriever bench` makes it (pseudo-queries cut
from the same sentences, encoded at the same layer; every one of them read). For each candidate and kind of
pseudo-query: nDCG@10 against the raw vectors' (what auto's "most kinds improve" reads), how many targets either ranks
in the top 10 (the rest score 0 on both sides), and at full depth how many targets each moves up and down and the
mean log rank gained (positive: nearer the top).

    python benchmarks/check_kinds_depth.py run --out benchmarks/results/check_kinds_depth/stsb_minilm.json
    python benchmarks/check_kinds_depth.py report benchmarks/results/check_kinds_depth/stsb_minilm.json \\
        --out benchmarks/results/check_kinds_depth.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import calibration_table  # noqa: E402  (the STS-B sentences, their vectors by layer, the layer's encoder)
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

KINDS = ("known-item", "span")


def run(layers: list[int], seeds: list[int]) -> dict:
    from retriever.calibration import make_calibrator
    from retriever.calibration.auto import spectrum_evidence
    from retriever.calibration.check import DEPTH, scores_at, target_ranks
    from retriever.engines.stages import check_set

    sentences, _ = calibration_table.stsb_test_scorer()
    cache = REPO / ".cache" / "calibration_table"
    found = {"model": "all-MiniLM-L6-v2", "sentences": len(sentences), "runs": []}
    for layer in layers:
        X = calibration_table.embeddings(sentences, layer, "cpu", cache)
        encoder = calibration_table.layer_encoder(layer, "cpu")
        for seed in seeds:
            auto = make_calibrator("auto", seed=seed, device="cpu")
            rounds = check_set(auto, len(sentences), lambda rows: [(None, sentences[i]) for i in rows],
                               lambda rows: X[rows], encoder, seed)
            check = rounds.at(rounds.planned)
            candidates, _ = auto.candidates(spectrum_evidence(X), len(X), X.shape[1], check)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for candidate in candidates:
                    candidate.fit(X)
            # Ranked to full depth here (a check's own ranks are exact to DEPTH only)
            whole = dataclasses.replace(check, kept_ranks=None)
            raw = target_ranks(whole, lambda vectors: np.asarray(vectors, np.float32))
            record = {"layer": layer, "seed": seed, "pseudo_queries": len(check), "candidates": []}
            for candidate in candidates:
                ranks = target_ranks(whole, candidate.transform)
                kinds = {}
                for kind in KINDS:
                    mine = check.kinds == kind
                    before, after = raw[mine], ranks[mine]
                    kinds[kind] = {
                        "queries": int(mine.sum()),
                        "ndcg@10": [round(100 * float(scores_at(ranks_of).ndcg.mean()), 2)
                                    for ranks_of in (before, after)],
                        "found_by_either": int(((before <= DEPTH) | (after <= DEPTH)).sum()),
                        "up": int((after < before).sum()), "down": int((after > before).sum()),
                        "mean_log_rank_gained": round(float(np.mean(np.log(before) - np.log(after))), 3)}
                record["candidates"].append({"name": candidate.name, "kinds": kinds})
            print(json.dumps({"layer": layer, "seed": seed}), file=sys.stderr, flush=True)
            found["runs"].append(record)
    return found


def report(files: list[Path]) -> str:
    lines = ["# The check's kinds of pseudo-query on single sentences, read to the top 10 and to full depth", "",
             f"{generated_from(__file__, files)}; what each column is, in the script's docstring. nDCG@10 x100: the "
             "raw vectors' -> the candidate's.", ""]
    for path in files:
        found = json.loads(path.read_text())
        lines += [f"## {path.name} ({found['model']}, {found['sentences']:,} STS-B sentences)", "",
                  f"Command: `{found.get('command', 'not recorded')}`.", "",
                  "| layer | seed | candidate | " + " | ".join(
                      f"{kind}: nDCG@10 / found by either / up, down / mean log rank gained" for kind in KINDS) + " |",
                  "|---:|---:|---|" + "---|" * len(KINDS)]
        for run in found["runs"]:
            for candidate in run["candidates"]:
                cells = []
                for kind in KINDS:
                    value = candidate["kinds"][kind]
                    cells.append(f"{value['ndcg@10'][0]:.2f} -> {value['ndcg@10'][1]:.2f} / "
                                 f"{value['found_by_either']} of {value['queries']} / {value['up']}, "
                                 f"{value['down']} / {value['mean_log_rank_gained']:+.3f}")
                lines.append(f"| {run['layer']} | {run['seed']} | {candidate['name']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--layers", default="0,4,6")
        running.add_argument("--seeds", default="0,1")

    def measured(args: argparse.Namespace) -> dict:
        return run([int(layer) for layer in args.layers.split(",")], [int(seed) for seed in args.seeds.split(",")])

    study_main(__file__, __doc__, report, run=(arguments, measured))


if __name__ == "__main__":
    main()
