"""Where `auto` should switch from exact `flat` search to the `hnsw` graph: per corpus size, single-query p50 of
both and hnsw recall@10 against flat, on real vectors, in the same run.

The switch is worth it from the size where hnsw answers faster than flat with recall@10 >= 0.95. Both costs grow
with the dimension (a flat scan scores N vectors of d numbers, a graph walk ef x M vectors of d numbers), so the
crossover is a number of documents; it is measured at 384 and 768 dimensions to check that.

Vector sets (each shuffled with a fixed seed; QUERIES rows held out as queries, the rest indexed in order):
- `passages-minilm`: the real passages encoded by the default model (`retriever encode`, --passages): the set the
  threshold is read from;
- `mix-minilm`, `mix-mpnet`: held out for validation: whatever the embedding cache holds for the default model and
  for all-mpnet-base-v2 (768-d): sentences and passages of the STS, QNLI and retrieval tasks (--cache-minilm,
  --cache-mpnet: an encoder folder of `retriever.evaluation.cache`).
Each set is searched raw (`none`) and whitened (`whitening`, fitted on 20,000 of its rows: the isotropic space
calibrated indexes hold, where graphs find neighbours less easily). One flat and one hnsw store (the library's
`VectorStore`, default settings) grow to the largest size; each size is measured as they reach it.

    python benchmarks/hnsw_crossover.py --passages /work/scale/vectors-1m.npy \
        --cache-minilm ~/.cache/retriever/embeddings/<key> --cache-mpnet ~/.cache/retriever/embeddings/<key> \
        --out benchmarks/results/hnsw_crossover_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from retriever.calibration import make_calibrator  # noqa: E402
from retriever.numeric import l2_normalize  # noqa: E402
from retriever.store.vectors import VectorStore, set_threads
from retriever.store.spec import FLAT_MAX_DOCUMENTS, IndexSpec  # noqa: E402

SIZES = (5_000, 10_000, 20_000, 35_000, 50_000, 75_000, 100_000)
QUERIES = 300
RECALL_TARGET = 0.95
SEED = 0


def cache_vectors(folder: Path) -> np.ndarray:
    return np.concatenate([np.load(shard)["vectors"] for shard in sorted(folder.glob("shard-*.npz"))])


def shuffled(vectors: np.ndarray, rows: int) -> np.ndarray:
    order = np.random.default_rng(SEED).permutation(len(vectors))[:rows]
    return np.ascontiguousarray(vectors[order], dtype=np.float32)


def p50_ms(store: VectorStore, queries: np.ndarray) -> float:
    times = []
    for query in queries:
        started = time.perf_counter()
        store.search(query[None], 10)
        times.append(time.perf_counter() - started)
    return round(1000 * statistics.median(times), 3)


def measure(vectors: np.ndarray, sizes: list[int]) -> list[dict]:
    queries, indexed = vectors[:QUERIES], vectors[QUERIES:]
    dim = vectors.shape[1]
    flat, hnsw = VectorStore.create(dim, "flat", device="cpu"), VectorStore.create(dim, IndexSpec(type="hnsw"),
                                                                                  device="cpu")
    rows, done = [], 0
    for size in sizes:
        block = indexed[done:size]
        ids = np.arange(done, size, dtype=np.int64)
        flat.add(ids, block)
        started = time.perf_counter()
        hnsw.add(ids, block)
        build_seconds = time.perf_counter() - started
        done = size
        _, exact = flat.search(queries, 10)
        _, found = hnsw.search(queries, 10)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact.tolist(), found.tolist())])
        flat_ms, hnsw_ms = p50_ms(flat, queries), p50_ms(hnsw, queries)
        rows.append({"documents": size, "flat_p50_ms": flat_ms, "hnsw_p50_ms": hnsw_ms,
                     "hnsw_speedup": round(flat_ms / hnsw_ms, 2), "hnsw_recall_at_10": round(float(recall), 4),
                     "hnsw_add_seconds": round(build_seconds, 2)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def crossover(rows: list[dict]) -> int | None:
    """The smallest size from which on hnsw is faster than flat at recall@10 >= RECALL_TARGET (at every larger
    size measured too)."""
    good = [row["hnsw_p50_ms"] < row["flat_p50_ms"] and row["hnsw_recall_at_10"] >= RECALL_TARGET for row in rows]
    for position in range(len(rows)):
        if all(good[position:]):
            return rows[position]["documents"]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, required=True)
    parser.add_argument("--cache-minilm", type=Path)
    parser.add_argument("--cache-mpnet", type=Path)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    set_threads()
    sizes = [int(size) for size in args.sizes.split(",")]
    rows_needed = max(sizes) + QUERIES
    sets = {"passages-minilm": (lambda: np.load(args.passages, mmap_mode="r")[:rows_needed * 2], "tuned on")}
    if args.cache_minilm:
        sets["mix-minilm"] = (lambda: cache_vectors(args.cache_minilm), "held out")
    if args.cache_mpnet:
        sets["mix-mpnet"] = (lambda: cache_vectors(args.cache_mpnet), "held out")
    results = []
    for name, (load, role) in sets.items():
        vectors = shuffled(np.asarray(load()), rows_needed)
        for calibrator_name in ("none", "whitening"):
            calibrated = vectors
            if calibrator_name != "none":
                calibrator = make_calibrator(calibrator_name)
                calibrator.fit(vectors[QUERIES:QUERIES + 20_000])
                calibrated = calibrator.transform(vectors).astype(np.float32)
            usable = [size for size in sizes if size <= len(calibrated) - QUERIES]
            print(f"{name} {calibrator_name}: {len(calibrated):,} x {calibrated.shape[1]}", file=sys.stderr)
            rows = measure(l2_normalize(calibrated), usable)
            results.append({"set": name, "role": role, "calibrator": calibrator_name, "dim": int(vectors.shape[1]),
                            "rows": rows, "crossover": crossover(rows)})
    result = {"benchmark": "hnsw_crossover", "queries": QUERIES, "recall_target": RECALL_TARGET,
              "hnsw": {"m": IndexSpec(type="hnsw").hnsw_m, "ef_construction": IndexSpec(type="hnsw").ef_construction,
                       "ef_search": IndexSpec(type="hnsw").search_ef},
              "flat_max_documents_when_run": FLAT_MAX_DOCUMENTS, "results": results,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "command": " ".join(["python", "benchmarks/hnsw_crossover.py", *sys.argv[1:]])}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        lines = ["# Flat against hnsw by corpus size (single query p50, recall@10 of hnsw against flat)", "",
                 f"`{result['command']}`", "",
                 "| set | role | calibrator | documents | flat p50 ms | hnsw p50 ms | speedup | recall@10 |",
                 "|---|---|---|---:|---:|---:|---:|---:|"]
        for entry in results:
            for row in entry["rows"]:
                lines.append(f"| {entry['set']} ({entry['dim']}-d) | {entry['role']} | {entry['calibrator']} | "
                             f"{row['documents']:,} | {row['flat_p50_ms']} | {row['hnsw_p50_ms']} | "
                             f"{row['hnsw_speedup']} | {row['hnsw_recall_at_10']} |")
        lines += ["", "Crossover (smallest size from which hnsw is faster at recall@10 >= 0.95):", ""]
        lines += [f"- {entry['set']}, {entry['calibrator']}: {entry['crossover']}" for entry in results]
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
