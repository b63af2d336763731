"""Filtered dense search: recall@10 against exact filtered search, latency and q/s, by selectivity, on hnsw and
ivfpq, beside unfiltered search, in the same run.

    python benchmarks/filtered_search.py prepare --vectors VECTORS.npy --work DIR [--documents 1000000]
    python benchmarks/filtered_search.py run --work DIR [--types hnsw,ivfpq] [--out benchmarks/results/filtered]

`prepare` writes the first N real passages (../shared/data/passages) with synthetic metadata of known
selectivity (independent of the text): `bucket` = row % 1000, a list `tags` = ["t{row % 100}", "even" or "odd"]
and a nested `origin` = {"site": "s{row % 10}"}; and their rows of VECTORS (a `retriever encode` output of the
passages file). `run` builds one index per type from those vectors (calibrator `auto`, as a user
gets), then, for 300 real questions (QNLI dev, through the index's encoder):
- filters `{"bucket": 0}`, `{"bucket": {"$lt": 10}}`, `{"bucket": {"$lt": 100}}`, `{"bucket": {"$lt": 500}}`
  (0.1%, 1%, 10%, 50% of the documents), on the list `{"tags": "t7"}` and `{"tags": "even"}` (1%, 50%: an
  element of the list), and on the nested path `{"origin.site": "s3"}` (10%);
- recall@10 against the exact top-10 among the matching documents (their raw vectors calibrated, every one
  scored);
- single-query latency p50/p99 and q/s of `search_vectors` with the filter, and without any (the same queries,
  with the unfiltered search's own recall@10 against exact search over every document);
- how the plan ran (exact over the matches, or the ANN with a selector and its widened beam or probes), and the
  time to evaluate each filter over every document the first time (SQLite; remembered per version after that).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PASSAGES = REPO.parent / "shared" / "data" / "passages" / "passages.jsonl.gz"
FILTERS = {"0.1%": {"bucket": 0}, "1%": {"bucket": {"$lt": 10}}, "10%": {"bucket": {"$lt": 100}},
           "50%": {"bucket": {"$lt": 500}}, "list 1%": {"tags": "t7"}, "list 50%": {"tags": "even"},
           "nested 10%": {"origin.site": "s3"}}
QUERIES = 300
WARM_UP = 20


def prepare(work: Path, vectors: Path, documents: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    source = np.load(vectors, mmap_mode="r")
    if len(source) < documents:
        raise SystemExit(f"{vectors} holds {len(source):,} rows; {documents:,} asked for")
    np.save(work / "vectors.npy", np.ascontiguousarray(source[:documents], dtype=np.float32))
    with gzip.open(PASSAGES, "rt", encoding="utf-8") as lines, \
            gzip.open(work / "corpus.jsonl.gz", "wt", encoding="utf-8", compresslevel=1) as out:
        for row, line in enumerate(lines):
            if row == documents:
                break
            metadata = {"bucket": row % 1000, "tags": [f"t{row % 100}", "odd" if row % 2 else "even"],
                        "origin": {"site": f"s{row % 10}"}}
            out.write(json.dumps({**json.loads(line), "metadata": metadata}, ensure_ascii=False) + "\n")
    print(f"prepared {documents:,} passages with metadata in {work}")


def questions() -> list[str]:
    from retriever.evaluation import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS

    queries = list(RETRIEVAL_TASKS["qnli-retrieval"].load(resolve_data_dir(None)).queries.values())
    return queries[:QUERIES]


def timed(search, queries: np.ndarray) -> tuple[list[float], list[np.ndarray]]:
    times, found = [], []
    for query in queries:
        started = time.perf_counter()
        found.append(search(query[None])[1][0])
        times.append(time.perf_counter() - started)
    return times, found


def page_in(folder: Path) -> None:
    """Read every file under FOLDER once, so the searches below find the index in memory, as a serving process does
    after its first queries (a graph walk touches pages at random: a few warm-up queries do not bring them in)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                while handle.read(1 << 24):
                    pass


def latency(times: list[float]) -> dict:
    return {"p50_ms": round(1000 * float(np.percentile(times, 50)), 3),
            "p99_ms": round(1000 * float(np.percentile(times, 99)), 3),
            "qps": round(len(times) / sum(times), 1)}


def run(work: Path, types: list[str]) -> dict:
    from retriever.filters import parse_where
    from retriever.index import Index, load_encoder
    from retriever.search.options import SearchOptions
    from retriever.search.plan import plan_filtered_search
    from retriever.search.searcher import Searcher
    from retriever.store.vectors import set_threads

    set_threads()
    texts = questions()
    results = []
    for index_type in types:
        name = f"filtered-{index_type}"
        started = time.perf_counter()
        if not (work / "indexes" / name).exists():
            Index.build(work / "corpus.jsonl.gz", name, work / "indexes", vectors=work / "vectors.npy",
                        index_type=index_type, device="cpu")
        built_seconds = time.perf_counter() - started
        index = Index.open(name, work / "indexes", device="cpu")
        snapshot, searcher = index.snapshot, Searcher(index.snapshot)  # the search layer under `Index.search`
        queries = snapshot.calibrate(load_encoder(snapshot).encode(texts))
        raw, rowids = snapshot.raw_vectors()
        order = np.argsort(rowids)
        raw, rowids = raw[order], rowids[order]
        page_in(work / "indexes" / name)  # an index opened cold would be timed reading its pages from disk
        unfiltered = SearchOptions(k=10)
        timed(lambda q: searcher.dense_top(q, unfiltered), queries[:WARM_UP])  # not counted
        unfiltered_times, unfiltered_found = timed(lambda q: searcher.dense_top(q, unfiltered), queries)
        everything = snapshot.calibrate(np.asarray(raw, dtype=np.float32))
        unfiltered_truth = rowids[np.argsort(-(queries @ everything.T), axis=1)[:, :10]]
        del everything
        unfiltered_recall = float(np.mean([len(set(ids.tolist()) & set(row)) / 10
                                           for ids, row in zip(unfiltered_found, unfiltered_truth.tolist())]))
        entry = {"index_type": index_type, "documents": len(index), "build_seconds": round(built_seconds, 1),
                 "calibrator": snapshot.manifest.calibrator.get("name"),
                 "unfiltered": {**latency(unfiltered_times), "recall_at_10": round(unfiltered_recall, 4)},
                 "filters": []}
        for label, clause in FILTERS.items():
            where = parse_where(clause)
            clock = time.perf_counter()
            allowed = searcher.matches.matches(where).rowids
            evaluate_seconds = time.perf_counter() - clock
            matching = np.isin(rowids, allowed)
            exact_ids = rowids[matching]
            scores = queries @ snapshot.calibrate(np.asarray(raw[matching], dtype=np.float32)).T
            truth = exact_ids[np.argsort(-scores, axis=1)[:, :10]]
            filtered = SearchOptions(k=10, where=where)
            times, found = timed(lambda q: searcher.dense_top(q, filtered), queries)
            violations = int(sum((~np.isin(ids[ids >= 0], allowed)).sum() for ids in found))
            short = int(sum((ids >= 0).sum() < min(10, len(allowed)) for ids in found))
            recall = float(np.mean([len(set(ids.tolist()) & set(row)) / 10 for ids, row in zip(found, truth.tolist())]))
            plan = plan_filtered_search(len(allowed), len(snapshot), 10, snapshot.spec)
            row = {"selectivity": label, "where": clause, "matches": int(len(allowed)), "plan": plan.describe(),
                   "recall_at_10": round(recall, 4), **latency(times),
                   "p50_vs_unfiltered": round(np.percentile(times, 50) / np.percentile(unfiltered_times, 50), 2),
                   "hits_outside_the_filter": violations, "queries_short_of_k": short,
                   "first_evaluation_seconds": round(evaluate_seconds, 3)}
            entry["filters"].append(row)
            print(json.dumps({"index_type": index_type, **row}), file=sys.stderr)
        results.append(entry)
        index.close()
    return {"benchmark": "filtered_search", "queries": len(texts), "results": results,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    making = commands.add_parser("prepare")
    making.add_argument("--vectors", type=Path, required=True)
    making.add_argument("--work", type=Path, required=True)
    making.add_argument("--documents", type=int, default=1_000_000)
    running = commands.add_parser("run")
    running.add_argument("--work", type=Path, required=True)
    running.add_argument("--types", default="hnsw,ivfpq")
    running.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.work, args.vectors, args.documents)
        return
    result = run(args.work, args.types.split(","))
    result["command"] = " ".join(["python", "benchmarks/filtered_search.py", *sys.argv[1:]])
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        lines = [f"# Filtered dense search ({result['results'][0]['documents']:,} passages, {result['queries']} "
                 "questions, one at a time)", "", f"`{result['command']}`", "",
                 "| index | filter | matches | plan | recall@10 | p50 ms | p99 ms | q/s | p50 vs unfiltered | "
                 "outside filter | short of k | first evaluation s |",
                 "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for entry in result["results"]:
            unfiltered = entry["unfiltered"]
            lines.append(f"| {entry['index_type']} | none | {entry['documents']:,} | ann | "
                         f"{unfiltered['recall_at_10']} | "
                         f"{unfiltered['p50_ms']} | {unfiltered['p99_ms']} | {unfiltered['qps']} | 1 | - | - | - |")
            for row in entry["filters"]:
                lines.append(f"| {entry['index_type']} | {row['selectivity']} | {row['matches']:,} | {row['plan']} | "
                             f"{row['recall_at_10']} | {row['p50_ms']} | {row['p99_ms']} | {row['qps']} | "
                             f"{row['p50_vs_unfiltered']} | {row['hits_outside_the_filter']} | "
                             f"{row['queries_short_of_k']} | {row['first_evaluation_seconds']} |")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
