"""Issue 42, point 3: does BM25 bury long documents, and what keeps it from doing so?

Three keyword rankings of every task, through real keyword indexes (`Index.build`, `Searcher.search`, BM25 with
k1 1.2 and b 0.75):

- document: today's BM25, a document one unit (its length normalisation weighs a long document down);
- passage: the documents cut into passages exactly as a build cuts them for the encoder (the model's tokenizer,
  the default window and overlap, the title with each), each passage indexed as a unit, a document scored by its
  best passage (MaxP);
- combined: each query's document and passage scores, each divided by the query's best, summed (CombSUM).

Measured on issue 42's long-document yardstick (recall@10 of the source page, a sentence or its five rarest
words) and on the 14 labeled retrieval tasks of `benchmarks/hybrid.py` (nDCG@10 x100), whose short-text tasks
are one passage a document and so must come out the same in all three.

    python benchmarks/keyword_passages.py run --out benchmarks/results/keyword_passages.json
    python benchmarks/keyword_passages.py report benchmarks/results/keyword_passages.json \\
        --out benchmarks/results/keyword_passages.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import DEV, HELD_OUT  # noqa: E402
from benchmarks.long_documents import recall_at  # noqa: E402
from retriever.evaluation.long_documents import LONG_DOCUMENT_TASKS  # noqa: E402
from retriever.evaluation.retrieval import evaluate_run  # noqa: E402
from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS  # noqa: E402

RANKINGS = ("document", "passage", "combined")
DEPTH = 100  # documents per query's ranking
PASSAGE_DEPTH = 1000  # passages read per query to rank DEPTH documents
SEPARATOR = "\t#"


def keyword_run(units: dict[str, tuple[str | None, str]], queries: dict[str, str], depth: int) -> dict:
    """Query id -> {unit id: BM25} over UNITS (id -> (title, text)) indexed as documents, each query's top DEPTH."""
    from retriever.corpus import Document
    from retriever.index import Index
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    documents = [Document(unit, text, title, "corpus", number)
                 for number, (unit, (title, text)) in enumerate(units.items(), start=1)]
    # Keyword search reads no vector: random unit vectors stand in, so no model runs.
    vectors = np.random.default_rng(0).normal(size=(len(documents), 8)).astype(np.float32)
    ids, texts = list(queries), list(queries.values())
    with tempfile.TemporaryDirectory(prefix="retriever-bench-") as folder:
        with Index.build(documents, "bench", folder, vectors=vectors, model=str(_tiny_model(Path(folder))),
                         calibrator="none", index_type="flat", device="cpu").open() as index:
            searcher = Searcher(index.snapshot)
            options = SearchOptions(k=min(depth, len(documents)), mode="keyword")
            run = {}
            for start in range(0, len(ids), 256):
                found = searcher.search(texts[start : start + 256], None, options)
                run.update({query: {hit.doc_id: hit.score for hit in hits}
                            for query, hits in zip(ids[start : start + 256], found)})
    return run


def _tiny_model(folder: Path) -> Path:
    """A model folder whose card says 8 dimensions: what the stand-in vectors are built under."""
    from transformers import AutoTokenizer, BertConfig

    from retriever.encode.models import default_model_path

    path = folder / "model"
    if not path.is_dir():
        BertConfig(vocab_size=30522, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                   intermediate_size=8).save_pretrained(path)
        AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(path)
    return path


def rankings(rset, cutter) -> dict[str, dict]:
    """The three keyword runs of RSET (see the module docstring); CUTTER cuts its documents as a build does."""
    from retriever.corpus import Document

    document = keyword_run(rset.corpus, rset.queries, DEPTH)
    documents = [Document(doc, text, title, "corpus", 0) for doc, (title, text) in rset.corpus.items()]
    units = {}
    for start in range(0, len(documents), 4096):
        chunk = documents[start : start + 4096]
        cut = cutter.cut(chunk)
        for number, doc in enumerate(chunk):
            for passage, (begin, end) in enumerate(cut.spans[cut.offsets[number] : cut.offsets[number + 1]].tolist()):
                units[f"{doc.doc_id}{SEPARATOR}{passage}"] = (doc.title, doc.text[begin:end])
    passages = keyword_run(units, rset.queries, PASSAGE_DEPTH)
    passage = {}
    for query, found in passages.items():
        best: dict[str, float] = {}
        for unit, score in found.items():
            doc = unit.rsplit(SEPARATOR, 1)[0]
            best[doc] = max(best.get(doc, 0.0), score)
        passage[query] = dict(sorted(best.items(), key=lambda item: -item[1])[:DEPTH])
    combined = {}
    for query in rset.queries:
        by_document, by_passage = document.get(query, {}), passage.get(query, {})
        top_document, top_passage = max(by_document.values(), default=1.0), max(by_passage.values(), default=1.0)
        scores = {doc: by_document.get(doc, 0.0) / top_document + by_passage.get(doc, 0.0) / top_passage
                  for doc in set(by_document) | set(by_passage)}
        combined[query] = dict(sorted(scores.items(), key=lambda item: -item[1])[:DEPTH])
    return {"document": document, "passage": passage, "combined": combined, "units": len(units)}


def run() -> dict:
    from retriever.encode.models import load_model
    from retriever.encode.passages import PassageCutter, PassageSettings
    from retriever.evaluation.data import resolve_data_dir

    loaded = load_model(None)
    settings = PassageSettings().checked(loaded.max_length)
    cutter = PassageCutter(loaded.tokenizer, settings, loaded.max_length)
    data = resolve_data_dir()
    results = {"model": loaded.name, "passages": settings.to_record(), "long": [], "labeled": []}
    for task in LONG_DOCUMENT_TASKS.values():
        for rare in (False, True):
            started = time.perf_counter()
            rset = task.load(data, rare)
            found = rankings(rset, cutter)
            record = {"task": rset.name, "split": task.split, "query": "rare words" if rare else "sentence",
                      "documents": len(rset.corpus), "passages": found["units"],
                      "recall@10": {name: round(recall_at(found[name], rset.qrels), 4) for name in RANKINGS},
                      "seconds": round(time.perf_counter() - started, 1)}
            print(record, file=sys.stderr, flush=True)
            results["long"].append(record)
    for name in DEV + HELD_OUT:
        started = time.perf_counter()
        rset = RETRIEVAL_TASKS[name].load(data)
        found = rankings(rset, cutter)
        record = {"task": name, "split": "dev" if name in DEV else "held-out", "documents": len(rset.corpus),
                  "passages": found["units"],
                  "ndcg@10": {ranking: round(evaluate_run(found[ranking], rset.qrels)["ndcg@10"], 2)
                              for ranking in RANKINGS},
                  "seconds": round(time.perf_counter() - started, 1)}
        print(record, file=sys.stderr, flush=True)
        results["labeled"].append(record)
    return results


def report(path: Path) -> str:
    found = json.loads(path.read_text())
    lines = ["# Keyword search over long documents: document, passage or combined BM25 (issue 42)", "",
             f"Generated by `benchmarks/keyword_passages.py report` from `{path.name}` (`{found['command']}`). "
             "BM25 (k1 1.2, b 0.75) through real keyword indexes; `passage` cuts the documents as a build does for "
             f"{found['model']} (window {found['passages']['window']} tokens, {found['passages']['overlap']} "
             "overlapping, the title with each) and scores a document by its best passage; `combined` sums each "
             "query's document and passage scores, each divided by the query's best.", "",
             "## Long pages among short paragraphs: recall@10 of the source page", "",
             "| set | split | query | documents | passages | document | passage | combined |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for task in found["long"]:
        lines.append(f"| {task['task']} | {task['split']} | {task['query']} | {task['documents']:,} | "
                     f"{task['passages']:,} | " + " | ".join(f"{task['recall@10'][r]:.3f}" for r in RANKINGS) + " |")
    for query in ("sentence", "rare words"):
        for split in ("dev", "held-out"):
            tasks = [t for t in found["long"] if t["query"] == query and t["split"] == split]
            lines.append(f"| mean, {split} | | {query} | | | " + " | ".join(
                f"{np.mean([t['recall@10'][r] for t in tasks]):.3f}" for r in RANKINGS) + " |")
    lines += ["", "## The 14 labeled retrieval tasks: nDCG@10 x100", "",
              "| task | split | documents | passages | document | passage | combined |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for task in found["labeled"]:
        lines.append(f"| {task['task']} | {task['split']} | {task['documents']:,} | {task['passages']:,} | "
                     + " | ".join(f"{task['ndcg@10'][r]:.2f}" for r in RANKINGS) + " |")
    for split in ("dev", "held-out"):
        tasks = [t for t in found["labeled"] if t["split"] == split]
        lines.append(f"| mean, {split} | | | | " + " | ".join(
            f"{np.mean([t['ndcg@10'][r] for t in tasks]):.2f}" for r in RANKINGS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("run")
    measure.add_argument("--out", type=Path, required=True)
    merge = commands.add_parser("report")
    merge.add_argument("file", type=Path)
    merge.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "report":
        args.out.write_text(report(args.file))
        return
    results = run()
    results["command"] = " ".join(["python", "benchmarks/keyword_passages.py", *sys.argv[1:]])
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
