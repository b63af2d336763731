"""Issue 27 at a million passages: what the keyword index costs to build and store, and keyword and hybrid search
latency beside dense search on the same index (hnsw, what `--index-type auto` picks at this size).

    python benchmarks/hybrid_speed.py --work DIR --out benchmarks/results/hybrid_speed_cpu

DIR is `benchmarks/scale.py prepare`'s folder (corpus-1m.jsonl.gz and vectors-1m.npy: the 1,089,521 real
passages and their all-MiniLM-L6-v2 vectors). Steps, in this one process:

- build: `Index.build(corpus, vectors=...)` as `retriever build --vectors` runs it; the stage times, of which
  `keywords` is the keyword index (FTS5 tokenizing every passage, postings written), and each part's bytes on disk;
- search: 1,000 real questions (QNLI dev), one at a time, k=10, each through `Index.search` in every mode in
  turn (dense, keyword, hybrid: the same query back to back, so caches favour no mode; the index's files read
  once beforehand, so none of it waits on the disk): p50, p99 and queries per
  second by text (encoding included, PyTorch as `Index.search` runs it), and by vector (the query already
  encoded: what the search itself costs). The first 20 queries warm up and are not counted. `--runtime onnx`
  encodes on ONNX Runtime, as the server does on a CPU (`Index.search` and the CLI use PyTorch).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODES = ("dense", "keyword", "hybrid")
WARM_UP = 20


def questions(count: int) -> list[str]:
    from retriever.evaluation.retrieval_tasks import qnli_retrieval
    from retriever.evaluation.data import resolve_data_dir

    return list(qnli_retrieval(resolve_data_dir()).queries.values())[:count]


def build(work: Path, name: str) -> dict:
    from retriever.index import Index

    started = time.perf_counter()
    summary = Index.build(work / "corpus-1m.jsonl.gz", name, work / "indexes", vectors=work / "vectors-1m.npy",
                          device="cpu", replace=True)
    seconds = time.perf_counter() - started
    index = Index.open(name, work / "indexes", device="cpu")
    parts: dict[str, int] = {}
    for path, entry in index.snapshot.manifest.files.items():
        part = path.rsplit("/", 1)[-1]
        key = "keyword index" if part.startswith("keyword") else part
        parts[key] = parts.get(key, 0) + entry.bytes
    keywords = summary.timings.get("keywords", 0.0)
    return {"documents": summary.documents, "index": index.snapshot.manifest.index, "seconds": round(seconds, 1),
            "timings": {key: round(value, 2) for key, value in summary.timings.items()},
            "keywords_share_of_the_rest": round(keywords / (seconds - keywords), 3),
            "bytes": parts, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def latency(work: Path, name: str, count: int, runtime: str) -> dict:
    from benchmarks.filtered_search import page_in
    from retriever.index import Index, load_encoder
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    page_in(work / "indexes" / name)  # as a serving process has it after a while, whatever ran before
    index = Index.open(name, work / "indexes", device="cpu", runtime=runtime)
    texts = questions(count + WARM_UP)
    searcher = Searcher(index.snapshot)  # the search layer `Index.search` runs, given the query vectors
    vectors = index.snapshot.calibrate(load_encoder(index.snapshot, runtime).encode(texts))
    options = {mode: SearchOptions(k=10, mode=mode) for mode in MODES}
    by_text = {mode: [] for mode in MODES}
    by_vector = {mode: [] for mode in MODES}
    for number, text in enumerate(texts):
        for mode in MODES:
            clock = time.perf_counter()
            index.search(text, options[mode])
            text_seconds = time.perf_counter() - clock
            clock = time.perf_counter()
            searcher.search([text], None if mode == "keyword" else vectors[number : number + 1], options[mode])
            vector_seconds = time.perf_counter() - clock
            if number >= WARM_UP:
                by_text[mode].append(text_seconds)
                by_vector[mode].append(vector_seconds)

    def summary(seconds: list[float]) -> dict:
        values = np.array(seconds) * 1000
        return {"p50_ms": round(float(np.percentile(values, 50)), 2), "p99_ms": round(float(np.percentile(values, 99)), 2),
                "queries_per_second": round(1000 / float(values.mean()), 1)}

    result = {"queries": count, "k": 10, "index": index.snapshot.manifest.index, "encoder_runtime": runtime,
              "by_text": {mode: summary(by_text[mode]) for mode in MODES},
              "by_vector": {mode: summary(by_vector[mode]) for mode in MODES}}
    for way in ("by_text", "by_vector"):
        dense = result[way]["dense"]["p50_ms"]
        result[way]["p50_ratio_to_dense"] = {mode: round(result[way][mode]["p50_ms"] / dense, 2) for mode in MODES}
    return result


def markdown(report: dict) -> str:
    built, searched = report["build"], report["search"]
    lines = ["# Keyword and hybrid search at a million passages (`benchmarks/hybrid_speed.py`)", "",
             f"{report['machine']}. Command: `{report['command']}`.", "",
             f"## Build from vectors: {built['documents']:,} passages, index {built['index']['type']}", "",
             "| stage | seconds |", "|---|---:|"]
    lines += [f"| {stage} | {seconds:.1f} |" for stage, seconds in built["timings"].items()]
    lines += [f"| **total** | **{built['seconds']:.1f}** |", "",
              f"The keyword index adds {built['timings'].get('keywords', 0):.1f} s to the "
              f"{built['seconds'] - built['timings'].get('keywords', 0):.1f} s of everything else: "
              f"**{100 * built['keywords_share_of_the_rest']:.1f}%** (peak RSS {built['peak_rss_mb']:,.0f} MB).", "",
              "| part | MB on disk |", "|---|---:|"]
    lines += [f"| {part} | {size / 2**20:,.1f} |" for part, size in sorted(built["bytes"].items(), key=lambda x: -x[1])]
    lines += ["", f"## Search: {searched['queries']:,} QNLI questions one at a time, k={searched['k']}", ""]
    runtime = {"torch": "PyTorch, as `retriever search` runs it", "onnx": "ONNX Runtime, as the server runs it"}[
        searched["encoder_runtime"]]
    for way, caption in (("by_text", f"by text (encoding included: {runtime})"),
                         ("by_vector", "by vector (the query already encoded)")):
        lines += [f"{caption}:", "", "| mode | p50 ms | p99 ms | q/s | p50 / dense |", "|---|---:|---:|---:|---:|"]
        for mode in MODES:
            row = searched[way][mode]
            lines.append(f"| {mode} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['queries_per_second']:.1f} | "
                         f"{searched[way]['p50_ratio_to_dense'][mode]:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--name", default="p1m-hybrid")
    parser.add_argument("--skip-build", action="store_true", help="search the index NAME already built in WORK")
    parser.add_argument("--runtime", choices=("torch", "onnx"), default="torch",
                        help="the encoder's forward pass for the searches by text (the server's default is onnx)")
    parser.add_argument("--out", type=Path, required=True, help="OUT.json and OUT.md are written")
    args = parser.parse_args()
    report = {"benchmark": "hybrid_speed", "command": " ".join(["python", "benchmarks/hybrid_speed.py", *sys.argv[1:]]),
              "machine": f"{platform.machine()}, Python {platform.python_version()}, "
                         f"{__import__('os').cpu_count()} CPUs"}
    report["build"] = json.loads(args.out.with_suffix(".json").read_text())["build"] if args.skip_build else \
        build(args.work, args.name)
    report["search"] = latency(args.work, args.name, args.queries, args.runtime)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report) + "\n")


if __name__ == "__main__":
    main()
