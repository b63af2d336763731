"""Issue 54: passages decided on real questions. Each task's corpus is built twice as `retriever build` builds it
(calibrator `auto`, keyword index, the hybrid check): with passages (the default) and with `--no-passages`, each
text encoded by the real model at the max length asked (`--max-lengths`: the encoder reads 256, 128 or 64 tokens of
each text, so the classic collections' abstracts outrun it), and every query searched through `Searcher.search`
(`evaluation.retrieval.search_runs`): the default search (hybrid at the weight the index decided), each side alone,
and hybrid at fixed weights, for the best weight in hindsight. nDCG@10 x100; recall@10 of the source page on the
long-document sets (issue 42's known-item yardstick, the guard).

    python benchmarks/passages_real.py run --tasks ir-classic --max-lengths 256,128,64 \\
        --out benchmarks/results/passages_real/ir_classic_minilm.json
    python benchmarks/passages_real.py run --tasks labeled --out benchmarks/results/passages_real/labeled_minilm.json
    python benchmarks/passages_real.py run --tasks long --out benchmarks/results/passages_real/long_minilm.json
    python benchmarks/passages_real.py cost --out benchmarks/results/passages_real/cost_cpu.json
    python benchmarks/passages_real.py cost --corpora cranfield:128:fits,cisi:128:fits,cacm:128:fits,\\
        cranfield:64:fits,cisi:64:fits,cacm:64:fits --out benchmarks/results/passages_real/cost_fits_cpu.json
    python benchmarks/passages_real.py report benchmarks/results/passages_real/*.json \\
        --out benchmarks/results/passages_real.md

`cost` builds with the real encoder and no cache, in one run, each corpus with passages and with
`--no-passages`: seconds, vectors per document; `task:max_length:fits` only the task's documents at most twice
the encoder's read, where the issue sets its cost target (at most 1.5x).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import DEV, HELD_OUT, model_path  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

from retriever.evaluation.long_documents import LONG_DOCUMENT_TASKS  # noqa: E402
from retriever.evaluation.retrieval_tasks import IR_CLASSIC  # noqa: E402

WEIGHTS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SEARCHES = {"default": {}, "dense": {"mode": "dense"}, "keyword": {"mode": "keyword"},
            **{f"hybrid@{weight}": {"mode": "hybrid", "weight": weight} for weight in WEIGHTS},
            # A query's English stop words left out (kept by default: a choice made on the labeled tasks)
            "keyword, stop words out": {"mode": "keyword", "stop_words": True},
            "default, stop words out": {"stop_words": True}}
LONG = tuple(name + form for name in LONG_DOCUMENT_TASKS for form in ("", "-rare"))
GROUPS = {"ir-classic": tuple(IR_CLASSIC), "labeled": DEV + HELD_OUT, "long": LONG}
DEPTH = 10  # recall@10 on the long-document sets


def split_of(task: str) -> str:
    if task in IR_CLASSIC:
        return "real questions"
    if task in LONG:
        return "long, " + LONG_DOCUMENT_TASKS[task.removesuffix("-rare")].split
    return "labeled, dev" if task in DEV else "labeled, held-out"


def load_task(name: str, data):
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS

    if name in LONG:
        return LONG_DOCUMENT_TASKS[name.removesuffix("-rare")].load(data, rare=name.endswith("-rare"))
    return RETRIEVAL_TASKS[name].load(data)


def builds(window: str | None = None, max_length: int = 256):
    """The two builds compared: with passages (WINDOW: their window in tokens, or "read", as many as the encoder
    reads; None: the default) and without."""
    from retriever.encode.passages import PassageSettings

    tokens = max_length if window == "read" else int(window) if window else None
    return {"passages": PassageSettings(window=tokens), "no-passages": PassageSettings(enabled=False)}


def recall_at(run: dict, rset, depth: int = DEPTH) -> float:
    from retriever.evaluation.retrieval import ranked

    found = [len(set(ranked(run.get(query, {}), query, rset.ignore_identical)[:depth]) & set(relevant))
             / min(len(relevant), depth) for query, relevant in rset.qrels.items()]
    return 100.0 * float(np.mean(found))


def _one(rset, query: str):
    """RSET with QUERY's judgments only."""
    from dataclasses import replace

    return replace(rset, qrels={query: rset.qrels[query]})


def interval(differences: np.ndarray, confidence: float = 0.95, resamples: int = 10_000) -> tuple[float, float]:
    """A paired bootstrap percentile interval for the mean of per-query DIFFERENCES."""
    rng = np.random.default_rng(0)
    means = differences[rng.integers(0, len(differences), size=(resamples, len(differences)))].mean(axis=1)
    return tuple(float(value) for value in np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2]))


def run(model: str, tasks: list[str], max_lengths: list[int], seed: int, window: str | None = None) -> dict:
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval import evaluate_run, per_query, search_runs

    data = resolve_data_dir()
    results = {"model": model, "seed": seed, "window": window or "default", "tasks": []}
    for max_length in max_lengths:
        encoder = CachedEncoder(Encoder(model_path(model), "last-avg", None, max_length, device="cpu"),
                                resolve_cache_dir())
        results.setdefault("encoders", []).append(encoder.config())
        for name in tasks:
            rset = load_task(name, data)
            record = {"task": name, "split": split_of(name), "max_length": max_length,
                      "metric": "recall@10" if name in LONG else "ndcg@10", **rset.describe()}
            for build, settings in builds(window, max_length).items():
                seen: list[dict] = []

                def look(snapshot, seen=seen):
                    seen.append({"hybrid": snapshot.manifest.hybrid, "documents": len(snapshot),
                                 "vectors": sum(len(segment.keys) for segment in snapshot.segments),
                                 "calibrator": snapshot.calibrator.describe()})
                started = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    runs = search_runs(rset, encoder.encode, encoder, "auto", SEARCHES, seed, passages=settings,
                                       on_snapshot=look)
                if name in LONG:
                    scores = {label: round(recall_at(found, rset) / 100, 4) for label, found in runs.items()}
                else:
                    scores = {label: round(evaluate_run(found, rset.qrels, rset.ignore_identical)["ndcg@10"], 2)
                              for label, found in runs.items()}
                hybrid = seen[0]["hybrid"]
                # The default search's figure per query, for a paired interval of the two builds' difference.
                each = (per_query(runs["default"], rset.qrels, rset.ignore_identical)["ndcg@10"] if name not in LONG
                        else [recall_at({query: runs["default"].get(query, {})}, _one(rset, query)) / 100
                              for query in rset.qrels])
                groups = hybrid.get("evidence", {}).get("groups", {})
                record[build] = {"scores": scores, "weight": hybrid["weight"], "reason": hybrid["reason"],
                                 "meaning_gap": groups.get("meaning", {}).get("dense_minus_keyword"),
                                 "default_per_query": [round(float(value), 4) for value in each],
                                 "documents": seen[0]["documents"], "vectors": seen[0]["vectors"],
                                 "calibrator": seen[0]["calibrator"],
                                 "seconds": round(time.perf_counter() - started, 1)}
            print(json.dumps({"task": name, "max_length": max_length,
                              **{build: {key: record[build][key] for key in ("weight", "vectors")}
                                 | {label: record[build]["scores"][label] for label in ("default", "dense", "keyword")}
                                 for build in ("passages", "no-passages")}}), file=sys.stderr, flush=True)
            results["tasks"].append(record)
    return results


def cost(model: str, corpora: list[tuple[str, int, bool]]) -> dict:
    """Each (task, max length, fits) built from its texts twice in this run, with passages and without, encoding
    every text (no cache): seconds and vectors. FITS: only the documents at most twice the encoder's read (title,
    text and special tokens), where the issue sets its cost target."""
    from retriever.corpus import Document
    from retriever.evaluation.data import resolve_data_dir
    from retriever.index import Index

    data = resolve_data_dir()
    found = {"model": model, "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
             "corpora": []}
    for name, max_length, fits in corpora:
        rset = load_task(name, data)
        documents = [Document(doc, text, title, "corpus", number)
                     for number, (doc, (title, text)) in enumerate(rset.corpus.items(), start=1)]
        if fits:
            documents = _within_two_reads(documents, model, max_length)
        record = {"task": name, "max_length": max_length, "fits": fits, "documents": len(documents)}
        for build, settings in reversed(list(builds(None, max_length).items())):  # the one without passages first: a cold start
            with tempfile.TemporaryDirectory(prefix="retriever-cost-") as folder, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                started = time.perf_counter()
                summary = Index.build(documents, "cost", Path(folder), model=model_path(model),
                                      max_length=max_length, device="cpu", passages=settings)
                seconds = time.perf_counter() - started
                with summary.open() as index:
                    vectors = sum(len(segment.keys) for segment in index.snapshot.segments)
            record[build] = {"seconds": round(seconds, 1), "vectors": vectors,
                             "timings": {key: round(value, 1) for key, value in summary.timings.items()}}
        record["ratio"] = round(record["passages"]["seconds"] / record["no-passages"]["seconds"], 2)
        print(json.dumps(record), file=sys.stderr, flush=True)
        found["corpora"].append(record)
    return found


def _within_two_reads(documents: list, model: str, max_length: int) -> list:
    """DOCUMENTS whose title and text, special tokens counted, are at most twice MAX_LENGTH tokens."""
    from retriever.encode.models import load_model

    tokenizer = load_model(model_path(model)).tokenizer
    lengths = [len(ids) for ids in tokenizer([document.title or "" for document in documents],
                                             [document.text for document in documents])["input_ids"]]
    return [document for document, length in zip(documents, lengths) if length <= 2 * max_length]


# --- report ----------------------------------------------------------------------------------------------------


def _fmt(value: float, metric: str) -> str:
    return f"{value:.3f}" if metric == "recall@10" else f"{value:.2f}"


def _best_weight(scores: dict) -> tuple[float, float]:
    weights = {float(label.split("@")[1]): value for label, value in scores.items() if label.startswith("hybrid@")}
    best = max(weights, key=lambda weight: (weights[weight], -abs(weight - 0.5)))
    return best, weights[best]


def report(files: list[Path]) -> str:
    runs = [json.loads(path.read_text()) for path in files]
    lines = ["# Passages decided on real questions (issue 54)", "",
             f"{generated_from(__file__, files)}. "
             "Every index is built as `retriever build` builds it (calibrator `auto`, keyword index, hybrid check) "
             "and searched through `Searcher.search`. *default*: the default search of the default build (hybrid "
             "at the weight the index decided); *no-passages*: the same of a `--no-passages` build of the same "
             "texts. nDCG@10 x100 (recall@10 of the source page on the long-document sets).", ""]
    for found in runs:
        if "corpora" in found:
            lines += _cost_lines(found)
            continue
        tasks = found["tasks"]
        window = found.get("window", "default")
        lines += [f"## {found['model']}: {', '.join(sorted({t['split'] for t in tasks}))}"
                  + ("" if window == "default" else f", passages of {window} tokens" if window != "read" else
                     ", passages as long as the encoder reads"), "",
                  f"Command: `{found.get('command', 'not recorded')}`.", "",
                  "### The default search, with passages and without", "",
                  "| task | max length | vectors / document | default | no-passages | difference [95% interval] | "
                  "dense: passages / without | keyword: passages / without |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        differences: dict[tuple[str, int], list[float]] = {}
        for task in tasks:
            metric, mine, theirs = task["metric"], task["passages"], task["no-passages"]
            difference = mine["scores"]["default"] - theirs["scores"]["default"]
            differences.setdefault((task["split"], task["max_length"]), []).append(difference)
            low, high = interval(np.asarray(mine["default_per_query"]) - np.asarray(theirs["default_per_query"]))
            lines.append(f"| {task['task']} | {task['max_length']} | {mine['vectors'] / mine['documents']:.2f} | "
                         f"{_fmt(mine['scores']['default'], metric)} | {_fmt(theirs['scores']['default'], metric)} | "
                         f"{difference:+.2f} [{low:+.2f}, {high:+.2f}] | {_fmt(mine['scores']['dense'], metric)} / "
                         f"{_fmt(theirs['scores']['dense'], metric)} | {_fmt(mine['scores']['keyword'], metric)} / "
                         f"{_fmt(theirs['scores']['keyword'], metric)} |")
        lines += ["", "| set | max length | tasks | worst difference | mean difference |",
                  "|---|---:|---:|---:|---:|"]
        for (split, max_length), values in sorted(differences.items()):
            lines.append(f"| {split} | {max_length} | {len(values)} | {min(values):+.2f} | {np.mean(values):+.2f} |")
        long = [task for task in tasks if task["task"] in LONG]
        if long:
            lines += ["", "The long-document yardstick (the guard), mean recall@10 over its sets, each mode of each build:",
                      "", "| query | sets | default | dense | keyword | no-passages: default / dense / keyword |",
                      "|---|---:|---:|---:|---:|---|"]
            for form, rare in (("a sentence", False), ("its rare words", True)):
                chosen = [task for task in long if task["task"].endswith("-rare") == rare]
                mean = {build: {mode: np.mean([task[build]["scores"][mode] for task in chosen])
                                for mode in ("default", "dense", "keyword")} for build in ("passages", "no-passages")}
                lines.append(f"| {form} | {len(chosen)} | {mean['passages']['default']:.3f} | "
                             f"{mean['passages']['dense']:.3f} | {mean['passages']['keyword']:.3f} | "
                             + " / ".join(f"{mean['no-passages'][mode]:.3f}" for mode in ("default", "dense", "keyword"))
                             + " |")
        lines += ["", "### The hybrid weight each index decided, against hindsight and each side alone", "",
                  "| task | max length | build | pseudo-queries of meaning: dense - keyword | dense - keyword | weight "
                  "decided | default | best weight in hindsight | dense | keyword | default - better side |",
                  "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        for task in tasks:
            for build in ("passages", "no-passages"):
                record, metric = task[build], task["metric"]
                scores = record["scores"]
                weight, best = _best_weight(scores)
                better = max(scores["dense"], scores["keyword"])
                gap = record.get("meaning_gap")
                pseudo = (f"{gap['difference']:+.1f} [{gap['interval'][0]:+.1f}, {gap['interval'][1]:+.1f}]"
                          if gap else "n/a")
                lines.append(f"| {task['task']} | {task['max_length']} | {build} | {pseudo} | "
                             f"{scores['dense'] - scores['keyword']:+.2f} | {record['weight']} | "
                             f"{_fmt(scores['default'], metric)} | {weight} ({_fmt(best, metric)}) | "
                             f"{_fmt(scores['dense'], metric)} | {_fmt(scores['keyword'], metric)} | "
                             f"{scores['default'] - better:+.2f} |")
        if any("keyword, stop words out" in task["passages"]["scores"] for task in tasks):
            lines += ["", "### A query's stop words left out (`stop_words=True`; the default keeps them)", "",
                      "| task | max length | keyword: kept / out | default: kept / out |", "|---|---:|---:|---:|"]
            for task in tasks:
                scores, metric = task["passages"]["scores"], task["metric"]
                lines.append(f"| {task['task']} | {task['max_length']} | {_fmt(scores['keyword'], metric)} / "
                             f"{_fmt(scores['keyword, stop words out'], metric)} | {_fmt(scores['default'], metric)} / "
                             f"{_fmt(scores['default, stop words out'], metric)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _cost_lines(found: dict) -> list[str]:
    lines = [f"## What passages cost: builds encoding every text ({found['machine']}, {found['model']})", "",
             f"Command: `{found.get('command', 'not recorded')}`. Both builds of a corpus in the same run, the one "
             "without passages first.", "",
             "| corpus | max length | documents | vectors / document | seconds: passages | seconds: without | "
             "ratio | encoding s: passages / without |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for record in found["corpora"]:
        mine, theirs = record["passages"], record["no-passages"]
        corpus = record["task"] + (", documents at most twice the read" if record.get("fits") else "")
        lines.append(f"| {corpus} | {record['max_length']} | {record['documents']:,} | "
                     f"{mine['vectors'] / record['documents']:.2f} | {mine['seconds']:.1f} | {theirs['seconds']:.1f} | "
                     f"{record['ratio']:.2f}x | {mine['timings'].get('encode', 0):.1f} / "
                     f"{theirs['timings'].get('encode', 0):.1f} |")
    return lines + [""]


def main() -> None:
    def run_arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--model", default="minilm")
        running.add_argument("--tasks", default="ir-classic",
                             help="task names, comma-separated, or a group: " + ", ".join(GROUPS))
        running.add_argument("--max-lengths", default="256")
        running.add_argument("--seed", type=int, default=0)
        running.add_argument("--window", default=None,
                             help="the passages' window in tokens, or \"read\": as many as the encoder reads (default: "
                                  "the default build's)")

    def measured(args: argparse.Namespace) -> dict:
        tasks = [task for part in args.tasks.split(",") for task in GROUPS.get(part, (part,))]
        return run(args.model, tasks, [int(length) for length in args.max_lengths.split(",")], args.seed, args.window)

    def cost_arguments(costing: argparse.ArgumentParser) -> None:
        costing.add_argument("--model", default="minilm")
        costing.add_argument("--corpora", default="cranfield:256,cisi:256,cacm:256,cranfield:128,cisi:128,cacm:128,"
                                                  "cranfield:64,cisi:64,cacm:64,long-python-doc:256",
                             help="task:max_length pairs, comma-separated; task:max_length:fits keeps only the "
                                  "documents at most twice the read")

    def costed(args: argparse.Namespace) -> dict:
        specs = [pair.split(":") for pair in args.corpora.split(",")]
        if any(len(spec) not in (2, 3) or spec[2:] not in ([], ["fits"]) for spec in specs):
            raise SystemExit("--corpora: task:max_length or task:max_length:fits, comma-separated")
        return cost(args.model, [(spec[0], int(spec[1]), spec[2:] == ["fits"]) for spec in specs])

    study_main(__file__, __doc__, report, run=(run_arguments, measured), cost=(cost_arguments, costed))


if __name__ == "__main__":
    main()
