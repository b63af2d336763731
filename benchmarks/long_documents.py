"""Issue 42's yardstick: does a sentence from the last quarter of a long page find that page among short paragraphs,
in dense, keyword and hybrid search? (`retriever.evaluation.long_documents`: documentation pages of at least 600
words from the real passages, a query sentence or its five rarest words, recall@10 of the source page.)

Each set is built into a real index as `retriever build` builds it (calibrator `auto`, keyword index; the encoder
reads at most MAX_LENGTH tokens of a text) and searched in every mode through the search layer `Index.search`
runs (`evaluation.retrieval.search_runs`). The report gives recall@10 per set, query form and mode, and how long
the long pages are in the model's tokens.

    python benchmarks/long_documents.py run --model minilm --out benchmarks/results/long_documents/minilm_w128_o16.json
    python benchmarks/long_documents.py run --model minilm --tasks long-python-doc,long-postgresql-doc \\
        --window 64 --overlap 8 --out benchmarks/results/long_documents/minilm_w64_o8_dev.json   # a setting, on dev
    python benchmarks/long_documents.py report benchmarks/results/long_documents/*.json \\
        --out benchmarks/results/long_documents.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import model_path  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402
from retriever.evaluation.long_documents import LONG_DOCUMENT_TASKS  # noqa: E402
from retriever.evaluation.retrieval import ranked, search_runs  # noqa: E402

MAX_LENGTH = 256
MODES = ("dense", "keyword", "hybrid")
DEPTH = 10


def recall_at(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], depth: int = DEPTH) -> float:
    """The share of queries whose relevant document is among the first DEPTH of its ranking."""
    return float(np.mean([bool(set(ranked(run.get(query, {}), query)[:depth]) & set(relevant))
                          for query, relevant in qrels.items()]))


def run(model: str, tasks: list[str], calibrator: str, seed: int, passages) -> dict:
    from retriever.corpus import Document, document_text
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir

    encoder = CachedEncoder(Encoder(model_path(model), "last-avg", None, MAX_LENGTH, device="cpu"),
                            resolve_cache_dir())
    data = resolve_data_dir()
    results = {"model": model, "encoder": encoder.config(), "calibrator": calibrator, "seed": seed,
               "passages": passages.checked(encoder.max_length).to_record(), "tasks": []}
    if passages.enabled:
        results["first_passage"] = "what the encoder reads of the document (its vector of before)"
    for name in tasks:
        task = LONG_DOCUMENT_TASKS[name]
        for rare in (False, True):
            started = time.perf_counter()
            rset = task.load(data, rare)
            pages = [document_text(Document(doc, text, title, "", 0)) for doc, (title, text) in rset.corpus.items()
                     if ":page" in doc]
            tokens = [len(ids) for ids in encoder.tokenizer(pages, add_special_tokens=True)["input_ids"]]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runs = search_runs(rset, encoder.encode, encoder, calibrator,
                                   {mode: {"mode": mode} for mode in MODES}, seed, depth=DEPTH, passages=passages)
            record = {"task": rset.name, "source": task.source, "split": task.split, "query": "rare words" if rare
                      else "sentence", **rset.describe(),
                      "long_page_tokens": {"median": int(np.median(tokens)), "min": int(min(tokens)),
                                           f"over_{MAX_LENGTH}": round(float(np.mean(np.array(tokens) > MAX_LENGTH)),
                                                                       3)},
                      "recall@10": {mode: round(recall_at(found, rset.qrels), 4) for mode, found in runs.items()},
                      "seconds": round(time.perf_counter() - started, 1)}
            print(f"{rset.name}: " + ", ".join(f"{mode} {value:.3f}" for mode, value in record["recall@10"].items()),
                  file=sys.stderr, flush=True)
            results["tasks"].append(record)
    return results


def _mean(found: dict, query: str, split: str | None, mode: str) -> float:
    return float(np.mean([task["recall@10"][mode] for task in found["tasks"] if task["query"] == query
                          and (split is None or task["split"] == split)]))


def _setting(found: dict) -> str:
    cut = found.get("passages")
    if cut is None:
        return "one vector per document (before passages)"
    first = found.get("first_passage", "what the encoder reads of the document (its vector of before)")
    return f"passages: window {cut['window']}, overlap {cut['overlap']}; first passage: {first}"


def report(files: list[Path]) -> str:
    """FILES: runs of this benchmark. A table of every run's means by split (the settings compared), then each
    run's sets."""
    runs = [(path, json.loads(path.read_text())) for path in files]
    lines = ["# Long documents among short ones (issue 42's yardstick)", "",
             generated_from(__file__, files) + ". Recall@10 of the source page: a query is a sentence from the "
             "last quarter of a documentation page of at least 600 words (or the sentence's five rarest words), "
             "among single paragraphs of the same source's other pages. Each set is built as `retriever build` "
             "builds it (calibrator `auto`, keyword index) and searched through `Searcher.search`. Sets are dev "
             "(python-doc, postgresql-doc: what settings were chosen on) or held-out (perl-doc, git-doc, "
             "debian-handbook, erlang-doc).", "",
             "## Every run: mean recall@10 by split", "",
             "| run | model | setting | split | sentence: dense | keyword | hybrid | rare words: dense | keyword | "
             "hybrid |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for path, found in runs:
        for split in ("dev", "held-out"):
            if not any(task["split"] == split for task in found["tasks"]):
                continue
            lines.append(f"| `{path.name}` | {found['model']} | {_setting(found)} | {split} | " + " | ".join(
                f"{_mean(found, query, split, mode):.3f}" for query in ("sentence", "rare words") for mode in MODES)
                + " |")
    for path, found in runs:
        if {task["split"] for task in found["tasks"]} != {"dev", "held-out"}:
            continue  # a dev-only run is in the table above
        lines += ["", f"## `{path.name}`: {found['model']} (max_length {found['encoder']['max_length']}, calibrator "
                  f"{found['calibrator']}), {_setting(found)}", "", f"Command: `{found.get('command', '')}`.", "",
                  "| set | split | query | pages | documents | page tokens (median) | pages over "
                  f"{MAX_LENGTH} tokens | dense | keyword | hybrid |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for task in found["tasks"]:
            tokens, recall = task["long_page_tokens"], task["recall@10"]
            lines.append(f"| {task['task']} | {task['split']} | {task['query']} | {task['queries']:,} | "
                         f"{task['documents']:,} | {tokens['median']:,} | {tokens[f'over_{MAX_LENGTH}']:.0%} | "
                         + " | ".join(f"{recall[mode]:.3f}" for mode in MODES) + " |")
        for query in ("sentence", "rare words"):
            lines += ["", f"Mean over the sets, {query} queries: " + ", ".join(
                f"{mode} {_mean(found, query, None, mode):.3f}" for mode in MODES) + "."]
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    from retriever.encode.passages import PassageSettings

    def arguments(measure: argparse.ArgumentParser) -> None:
        measure.add_argument("--model", default="minilm", help="minilm, mpnet or a model folder")
        measure.add_argument("--tasks", default=",".join(LONG_DOCUMENT_TASKS))
        measure.add_argument("--calibrator", default="auto")
        measure.add_argument("--seed", type=int, default=0)
        measure.add_argument("--window", type=int, default=None, help="passage window in tokens (default: max_length)")
        measure.add_argument("--overlap", type=int, default=None, help="passage overlap in tokens")
        measure.add_argument("--no-passages", action="store_true",
                             help="one vector per document, cut (before passages)")

    study_main(__file__, __doc__.splitlines()[0], report, run=(arguments, lambda args: run(
        args.model, [task for task in args.tasks.split(",") if task], args.calibrator, args.seed,
        PassageSettings(args.window, args.overlap, enabled=not args.no_passages))))


if __name__ == "__main__":
    main()
