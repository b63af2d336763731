"""The default build's decisions by two checkouts' code, compared: auto's whole record (the calibrator chosen, the
pseudo-queries read, every candidate's check figures) and the hybrid check's (the fusion, the weight, its
evidence), with the default search's nDCG@10, on the 14 labeled tasks and the real questions (Cranfield, CISI, CACM;
those at every max length given, the labeled tasks at 256). For a change to how the checks compute, not what they
decide (issue 56, 1: the check ranking each target by counting, e9e6cd4):

    git worktree add ../base81 e9e6cd4~1
    python benchmarks/check_decisions.py run --code ../base81 --max-lengths 256,64 \\
        --out benchmarks/results/check_decisions/base.json
    python benchmarks/check_decisions.py run --code . --max-lengths 256,64 \\
        --out benchmarks/results/check_decisions/counted.json
    python benchmarks/check_decisions.py report benchmarks/results/check_decisions/base.json \\
        benchmarks/results/check_decisions/counted.json --out benchmarks/results/check_decisions.md

`--code` is the checkout whose `retriever` (and `benchmarks/passages_real.py`, for the tasks and the build's
settings) this process imports. Encodings come from the evaluation cache (`RETRIEVER_CACHE`), as in
passages_real.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.study_cli import generated_from, study_main  # noqa: E402


def run(code: Path, max_lengths: list[int]) -> dict:
    code = code.resolve()
    sys.path[:0] = [str(code), str(code / "benchmarks")]
    for name in [name for name in sys.modules if name == "retriever" or name.startswith("retriever.")]:
        del sys.modules[name]  # this checkout's, not the one the study's command line came from
    import passages_real
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir

    assert Path(sys.modules["retriever"].__file__).is_relative_to(code), "imported another checkout's code"
    data = resolve_data_dir()
    found: dict = {"model": "minilm", "code": str(code), "builds": []}
    for max_length in max_lengths:
        encoder = CachedEncoder(Encoder(None, "last-avg", None, max_length, device="cpu"), resolve_cache_dir())
        tasks = list(passages_real.GROUPS["ir-classic"]) + (list(passages_real.GROUPS["labeled"])
                                                           if max_length == 256 else [])
        for name in tasks:
            rset = passages_real.load_task(name, data)
            started = time.perf_counter()
            ndcg, manifest = default_build_searched(passages_real, rset, encoder, max_length)
            record = {"task": name, "max_length": max_length, "default": ndcg,
                      "calibrator": manifest.calibrator.get("decision"), "hybrid": manifest.hybrid,
                      "seconds": round(time.perf_counter() - started, 1)}
            print(json.dumps({key: record[key] for key in ("task", "max_length", "default", "seconds")}),
                  file=sys.stderr, flush=True)
            found["builds"].append(record)
    return found


def default_build_searched(passages_real, rset, encoder, max_length: int = 256) -> tuple[float, object]:
    """RSET's corpus built as `retriever build` builds it (passages, calibrator auto, the hybrid check) from
    ENCODER's vectors, and searched by default: nDCG@10 (x100, rounded to 2 places) and the build's manifest.
    PASSAGES_REAL: that module, of the checkout whose code runs (its tasks and the build's settings)."""
    from retriever.evaluation.retrieval import evaluate_run, search_runs

    seen: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = search_runs(rset, encoder.encode, encoder, "auto", {"default": {}}, 0,
                           passages=passages_real.builds(None, max_length)["passages"],
                           on_snapshot=lambda snapshot: seen.append(snapshot.manifest))
    return round(evaluate_run(runs["default"], rset.qrels, rset.ignore_identical)["ndcg@10"], 2), seen[0]


def _check_figures(record: dict) -> dict[str, float]:
    """Every number of auto's check record, by its path."""
    figures: dict[str, float] = {}

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{path}.{key}")
        elif isinstance(value, list) and not (value and isinstance(value[0], str)):
            for number, inner in enumerate(value):
                walk(inner, f"{path}.{number}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            figures[path] = float(value)

    walk(record.get("check", {}), "check")
    return figures


def report(files: list[Path]) -> str:
    before, after = (json.loads(path.read_text()) for path in files)
    lines = [f"# The default build's decisions, {Path(before['code']).name} against {Path(after['code']).name}", "",
             generated_from(__file__, files) + f". Commands: `{before.get('command')}`; `{after.get('command')}`.",
             "", "| task | max length | calibrator | pseudo-queries read: auto, hybrid check | hybrid: fusion, weight "
             "(evidence) | default nDCG@10 | auto's check figures: differ, largest difference |",
             "|---|---:|---|---|---|---|---|"]
    same = 0
    for old, new in zip(before["builds"], after["builds"]):
        assert (old["task"], old["max_length"]) == (new["task"], new["max_length"])

        def read(record: dict) -> str:
            return f"{record['calibrator'].get('check', {}).get('pseudo_queries')}, " \
                   f"{record['hybrid'].get('evidence', {}).get('pseudo_queries')}"

        chosen = (old["calibrator"]["chosen"]["name"], new["calibrator"]["chosen"]["name"])
        old_figures, new_figures = _check_figures(old["calibrator"]), _check_figures(new["calibrator"])
        moved = [abs(old_figures[key] - new_figures.get(key, float("nan"))) for key in old_figures
                 if old_figures[key] != new_figures.get(key)]
        agree = (chosen[0] == chosen[1] and read(old) == read(new) and old["hybrid"] == new["hybrid"]
                 and old["default"] == new["default"])
        same += agree
        lines.append(
            f"| {new['task']} | {new['max_length']} | {' / '.join(dict.fromkeys(chosen))} | "
            f"{' / '.join(dict.fromkeys((read(old), read(new))))} | "
            f"{new['hybrid']['fusion']}, {new['hybrid']['weight']} "
            f"({'the same' if old['hybrid'] == new['hybrid'] else 'differs'}) | "
            f"{' / '.join(dict.fromkeys((format(old['default'], '.2f'), format(new['default'], '.2f'))))} | "
            f"{len(moved)} of {len(old_figures)}{f', {max(moved):.2f}' if moved else ''} |")
    lines += ["", f"Builds deciding alike (calibrator, pseudo-queries read, the hybrid record whole, the default "
                  f"search's nDCG@10): {same} of {len(before['builds'])}.", ""]
    return "\n".join(lines)


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--code", type=Path, default=REPO, help="the checkout whose code to run")
        running.add_argument("--max-lengths", default="256")

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(
        args.code, [int(value) for value in args.max_lengths.split(",")])))


if __name__ == "__main__":
    main()
