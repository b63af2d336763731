"""Issue 54's long-document guard: dense recall of cut pages by their best passage, by which calibration the
passages and queries share and what it was fitted on.

Each set of the long-document yardstick (or each real-question collection, `--tasks ir-classic`, with the encoder
reading 256, 128 and 64 tokens) is cut as `retriever build` cuts it (`PassageCutter`, default settings); every
passage and query is encoded once (all-MiniLM-L6-v2, the evaluation cache); a document is scored in NumPy by its
best passage's cosine (`max`, MaxP); by the index's rule (`cover`: its first passage weighed by the share of the
text it spans, its best by the rest); by `cover` for a document at most twice (`near 2`) or four times (`near 4`)
what the encoder reads (its first passage spans at least a half or a quarter of it) and `max` beyond; and by the
share squared as the first passage's weight (`share squared`: nearer `max` the longer the document); and by `max`
for a document over four times the corpus's median (`far 4 (median)`) or mean (`far 4 (mean)`) length in
characters, `cover` for the rest (a document far longer than the corpus's own, as BM25's length normalisation reads
length), or over four times both the median and the encoder's read (`far 4 (median and read)`). Calibrations:
none (the raw vectors),
and whitening and the flow, each fitted on the documents' reads (what each document's first passage is: what a
build fits on today) or on every passage (at most 25,000 rows, as a build samples). Recall@10 of the source page
on the long sets, nDCG@10 x100 on the real questions.

    python benchmarks/passage_calibration.py run --out benchmarks/results/passage_calibration/long_minilm.json
    python benchmarks/passage_calibration.py run --tasks ir-classic --max-lengths 256,128,64 \
        --out benchmarks/results/passage_calibration/ir_classic_minilm.json
    python benchmarks/passage_calibration.py report benchmarks/results/passage_calibration/*.json \\
        --out benchmarks/results/passage_calibration.md
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import model_path  # noqa: E402
from benchmarks.passage_scoring import metric  # noqa: E402
from benchmarks.passages_real import load_task, split_of  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402
from retriever.evaluation.long_documents import LONG_DOCUMENT_TASKS  # noqa: E402

FIT_SAMPLE = 25_000
SPACES = ("none", "whitening on reads", "whitening on passages", "flow on reads", "flow on passages")


def run(model: str, seed: int, tasks: str = "long", max_lengths: tuple[int, ...] = (256,)) -> dict:
    from retriever.calibration import fit_on_sample, make_calibrator
    from retriever.corpus import Document
    from retriever.encode.encoder import Encoder
    from retriever.encode.passages import PassageCutter, PassageSettings
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import IR_CLASSIC
    from retriever.numeric import l2_normalize
    from retriever.store.passages import coverages, document_scores, passage_keys

    names = list(LONG_DOCUMENT_TASKS) if tasks == "long" else list(IR_CLASSIC)
    long = tasks == "long"
    found = {"model": model, "seed": seed, "fit_sample": FIT_SAMPLE, "tasks": []}
    for max_length in max_lengths:
        plain = Encoder(model_path(model), "last-avg", None, max_length, device="cpu")
        encoder = CachedEncoder(plain, resolve_cache_dir())
        cutter = PassageCutter(plain.tokenizer, PassageSettings().checked(max_length), max_length)
        for name in names:
            rset = load_task(name, resolve_data_dir())
            documents = [Document(doc, text, title, "corpus", number)
                         for number, (doc, (title, text)) in enumerate(rset.corpus.items(), start=1)]
            query_ids = list(rset.queries)
            queries = np.asarray(encoder.encode([rset.queries[query] for query in query_ids]), np.float32)
            passages = cutter.cut(documents)
            vectors = np.asarray(encoder.encode(passages.texts), np.float32)
            starts = passages.offsets[:-1]
            # The share of each document's text its first passage spans, as the index weighs it.
            share = coverages(passage_keys(np.arange(len(documents)), passages.counts()), passages.spans)[starts]
            doc_ids = [document.doc_id for document in documents]
            # Each document's length against the corpus's typical one (characters of text).
            lengths = np.array([len(document.text) for document in documents], np.float64)
            to_median, to_mean = lengths / max(np.median(lengths), 1.0), lengths / max(lengths.mean(), 1.0)

            def scores(calibrate) -> dict[str, float]:
                similarity = l2_normalize(calibrate(queries)) @ l2_normalize(calibrate(vectors)).T
                best = np.maximum.reduceat(similarity, starts, axis=1)
                cover = document_scores(similarity[:, starts], best, share)  # the index's own rule
                rules = {"max": best, "cover": cover,
                         "near 2": np.where(share >= 0.5, cover, best), "near 4": np.where(share >= 0.25, cover, best),
                         "share squared": share**2 * similarity[:, starts] + (1 - share**2) * best,
                         "far 4 (median)": np.where(to_median > 4, best, cover),
                         "far 4 (mean)": np.where(to_mean > 4, best, cover),
                         "far 4 (median and read)": np.where((to_median > 4) & (share < 0.25), best, cover)}
                return {rule: metric(value, doc_ids, query_ids, rset, long) for rule, value in rules.items()}

            record = {"task": name, "split": split_of(name), "max_length": max_length, "documents": len(documents),
                      "passages": len(vectors), "scores": {"none": scores(lambda x: x)}}
            for calibrator in ("whitening", "flow"):
                for fitted_on, rows in (("reads", vectors[starts]), ("passages", vectors)):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        fitted = fit_on_sample(make_calibrator(calibrator, seed=seed), rows, FIT_SAMPLE, seed)
                    record["scores"][f"{calibrator} on {fitted_on}"] = scores(fitted.transform)
            print(json.dumps(record), file=sys.stderr, flush=True)
            found["tasks"].append(record)
    return found


def report(files: list[Path]) -> str:
    lines = ["# Which calibration finds a cut document by its passages (issue 54)", "",
             f"{generated_from(__file__, files)}. "
             "Dense search alone; each calibration fitted on the documents' reads (what a build fits on) or on every "
             "passage (sampled to 25,000 rows); the rules and the commands are in the script's docstring. Recall@10 "
             "of the source page on the long sets (sentence queries), nDCG@10 x100 on the real questions.", ""]
    for path in files:
        found = json.loads(path.read_text())
        rules = list(found["tasks"][0]["scores"]["none"])
        lines += [f"## `{path.name}` ({found['model']})", "",
                  "| set | max length | documents | passages | rule | " + " | ".join(SPACES) + " |",
                  "|---|---:|---:|---:|---|" + "---:|" * len(SPACES)]
        digits = 3 if found["tasks"][0]["split"].startswith("long") else 2
        for task in found["tasks"]:
            for rule in rules:
                lines.append(f"| {task['task']} | {task.get('max_length', 256)} | {task['documents']:,} | "
                             f"{task['passages']:,} | {rule} | "
                             + " | ".join(f"{task['scores'][space][rule]:.{digits}f}" for space in SPACES) + " |")
        for max_length in sorted({task.get("max_length", 256) for task in found["tasks"]}, reverse=True):
            chosen = [task for task in found["tasks"] if task.get("max_length", 256) == max_length]
            for rule in rules:
                means = [float(np.mean([task["scores"][space][rule] for task in chosen])) for space in SPACES]
                lines.append(f"| mean of {len(chosen)} | {max_length} | | | {rule} | "
                             + " | ".join(f"{mean:.{digits}f}" for mean in means) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--model", default="minilm")
        running.add_argument("--seed", type=int, default=0)
        running.add_argument("--tasks", choices=("long", "ir-classic"), default="long")
        running.add_argument("--max-lengths", default="256")

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(
        args.model, args.seed, args.tasks, tuple(int(value) for value in args.max_lengths.split(",")))))


if __name__ == "__main__":
    main()
