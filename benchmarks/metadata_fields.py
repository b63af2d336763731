"""What metadata costs a segment's document table: writing it (the JSON as given, and the `fields` table filters
read, one row per value), its bytes, and a filter's first evaluation, beside the same documents without metadata
in the same run.

    python benchmarks/metadata_fields.py [--documents 100000] [--out benchmarks/results/metadata_fields_cpu]

The documents are the first N real passages of ../shared/data/passages; each gets the metadata of a typical
export: two scalars, a list of two tags, a nested object (7 rows in the fields table with its containers).
Written in chunks of 4,096 as a build writes them, then `finish` (the doc_id and fields indexes); each of the
two tables is written 3 times, alternating, and the median kept.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PASSAGES = REPO.parent / "shared" / "data" / "passages" / "passages.jsonl.gz"
CHUNK = 4096
ROUNDS = 3
FILTERS = {"scalar 0.1%": {"bucket": 7}, "scalar 50%": {"bucket": {"$lt": 500}}, "list 1%": {"tags": "t7"},
           "list 50%": {"tags": {"$in": ["even"]}}, "list none of": {"tags": {"$nin": ["t7"]}},
           "nested 10%": {"origin.site": "s3"}, "own field": {"doc_id": {"$gte": "z"}}}


def metadata(row: int) -> dict:
    return {"bucket": row % 1000, "year": 2000 + row % 25, "tags": [f"t{row % 100}", "odd" if row % 2 else "even"],
            "origin": {"site": f"s{row % 10}"}}


def passages(count: int):
    from retriever.corpus import Document

    with gzip.open(PASSAGES, "rt", encoding="utf-8") as lines:
        for row, line in enumerate(lines):
            if row == count:
                return
            record = json.loads(line)
            yield Document(str(record["_id"]), record["text"], record.get("title") or None, "passages.jsonl",
                           row + 1, metadata(row))


def write(path: Path, documents: list, with_metadata: bool) -> float:
    from dataclasses import replace

    from retriever.store.documents import DocumentTable

    rows = documents if with_metadata else [replace(d, metadata=None) for d in documents]
    started = time.perf_counter()
    table = DocumentTable.create(path)
    for start in range(0, len(rows), CHUNK):
        chunk = rows[start:start + CHUNK]
        table.insert(np.arange(start + 1, start + len(chunk) + 1), chunk)
    table.finish()
    table.close()
    return time.perf_counter() - started


def run(count: int) -> dict:
    from retriever.filters import parse_where
    from retriever.store.documents import DocumentTable

    documents = list(passages(count))
    folder = Path(tempfile.mkdtemp(prefix="metadata-fields-"))
    seconds = {"without": [], "with": []}
    for _ in range(ROUNDS):
        for kind in ("without", "with"):
            seconds[kind].append(write(folder / f"{kind}.db", documents, kind == "with"))
    sizes = {kind: (folder / f"{kind}.db").stat().st_size for kind in seconds}
    evaluations = []
    with DocumentTable.open(folder / "with.db") as table:
        for label, clause in FILTERS.items():
            where = parse_where(clause)
            clock = time.perf_counter()
            matches = table.matching(where)
            evaluations.append({"filter": label, "where": clause, "matches": int(len(matches)),
                                "seconds": round(time.perf_counter() - clock, 4)})
    medians = {kind: statistics.median(values) for kind, values in seconds.items()}
    return {"benchmark": "metadata_fields", "documents": len(documents),
            "write_seconds": {kind: round(value, 3) for kind, value in medians.items()},
            "write_ratio_with_vs_without": round(medians["with"] / medians["without"], 2),
            "extra_ms_per_1000_documents": round(1000 * (medians["with"] - medians["without"]) / len(documents) * 1000, 2),
            "bytes": sizes, "bytes_ratio": round(sizes["with"] / sizes["without"], 2),
            "first_evaluation": evaluations,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    result = run(args.documents)
    result["command"] = " ".join(["python", "benchmarks/metadata_fields.py", *sys.argv[1:]])
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        seconds, sizes = result["write_seconds"], result["bytes"]
        lines = [f"# Metadata in a segment's document table ({result['documents']:,} passages)", "",
                 f"`{result['command']}`", "",
                 "| documents written | seconds (median of 3) | bytes |", "|---|---:|---:|",
                 f"| without metadata | {seconds['without']} | {sizes['without']:,} |",
                 f"| with metadata (JSON + fields table) | {seconds['with']} | {sizes['with']:,} |",
                 f"| ratio | {result['write_ratio_with_vs_without']} | {result['bytes_ratio']} |", "",
                 f"Extra write time: {result['extra_ms_per_1000_documents']} ms per 1,000 documents.", "",
                 "| filter | where | matches | first evaluation s |", "|---|---|---:|---:|"]
        lines += [f"| {row['filter']} | `{json.dumps(row['where'])}` | {row['matches']:,} | {row['seconds']} |"
                  for row in result["first_evaluation"]]
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
