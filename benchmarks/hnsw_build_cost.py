"""Issue 56 (2): what the HNSW graph's build settings cost and buy at 100,000 passages. The graph is the largest
stage of a default build from vectors (about 40% of its CPU time, `vectors_build_speed_578dcff.md`); a cheaper graph
(fewer links per vector, `M`, or a narrower beam while building, `efConstruction`) would shorten it, at some cost in
recall. For each setting, in one run: the build's wall and CPU seconds on this machine's threads (FAISS's OpenMP),
and at each `efSearch` the single-query p50 (one thread) and recall@10 against exact search, for real questions
(QNLI's, encoded by the default model) over real passages (their vectors, `retriever encode`):

    python benchmarks/hnsw_build_cost.py run --vectors /work/w100k/vectors.npy \\
        --out benchmarks/results/hnsw_build_cost/minilm_100k.json
    python benchmarks/hnsw_build_cost.py report benchmarks/results/hnsw_build_cost/minilm_100k.json \\
        --out benchmarks/results/hnsw_build_cost.md

The vectors are searched raw (what auto kept for these passages), L2-normalized as an index stores them. The
library's settings are M 32, efConstruction 40 and efSearch 256 (`retriever.store.spec`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.study_cli import generated_from, study_main  # noqa: E402

SETTINGS = ((32, 40), (32, 20), (24, 40), (16, 40), (16, 80))  # (M, efConstruction); the first is the library's
EF_SEARCH = (128, 256)
QUERIES = 1000


def run(vectors_path: Path) -> dict:
    import faiss

    from retriever.encode.encoder import Encoder
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import qnli_retrieval
    from retriever.numeric import l2_normalize

    vectors = l2_normalize(np.load(vectors_path))
    texts = list(qnli_retrieval(resolve_data_dir()).queries.values())[:QUERIES]
    queries = l2_normalize(np.asarray(Encoder(None, "last-avg", None, 256, device="cpu").encode(texts), np.float32))
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    _, truth = exact.search(queries, 10)
    threads = len(os.sched_getaffinity(0))
    found = {"machine": f"{platform.machine()}, {threads} CPUs", "vectors": int(len(vectors)),
             "queries": int(len(queries)), "settings": []}
    for links, beam in SETTINGS:
        faiss.omp_set_num_threads(threads)
        graph = faiss.IndexHNSWFlat(vectors.shape[1], links, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = beam
        clock, cpu = time.perf_counter(), time.process_time()
        graph.add(vectors)
        record = {"M": links, "efConstruction": beam, "build_wall_s": round(time.perf_counter() - clock, 2),
                  "build_cpu_s": round(time.process_time() - cpu, 2), "search": []}
        faiss.omp_set_num_threads(1)  # a query as the searcher runs one
        for width in EF_SEARCH:
            graph.hnsw.efSearch = width
            seconds, hits = [], []
            for query in queries:
                clock = time.perf_counter()
                _, ids = graph.search(query[None], 10)
                seconds.append(time.perf_counter() - clock)
                hits.append(ids[0])
            recall = float(np.mean([len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(hits, truth)]))
            record["search"].append({"efSearch": width, "recall@10": round(recall, 4),
                                     "p50_ms": round(1000 * float(np.median(seconds)), 3)})
        print(json.dumps(record), file=sys.stderr, flush=True)
        found["settings"].append(record)
    return found


def report(files: list[Path]) -> str:
    lines = ["# What the HNSW graph's build settings cost and buy (issue 56, 2)", "",
             f"{generated_from(__file__, files)}: the build of each graph (FAISS, every thread) and, at each efSearch, "
             "recall@10 against exact search and the single-query p50 (one thread). The library's settings are the "
             "first row.", ""]
    for path in files:
        found = json.loads(path.read_text())
        first = found["settings"][0]
        lines += [f"## {path.name}: {found['vectors']:,} vectors, {found['queries']:,} questions ({found['machine']})",
                  "", f"Command: `{found.get('command', 'not recorded')}`.", "",
                  "| M | efConstruction | build wall s | build CPU s | CPU against the library's | "
                  + " | ".join(f"efSearch {width}: recall@10 / p50 ms" for width in EF_SEARCH) + " |",
                  "|---:|---:|---:|---:|---:|" + "---|" * len(EF_SEARCH)]
        for record in found["settings"]:
            lines.append(f"| {record['M']} | {record['efConstruction']} | {record['build_wall_s']:.2f} | "
                         f"{record['build_cpu_s']:.2f} | {record['build_cpu_s'] / first['build_cpu_s']:.2f}x | "
                         + " | ".join(f"{search['recall@10']:.4f} / {search['p50_ms']:.3f}"
                                      for search in record["search"]) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--vectors", type=Path, required=True, help="the passages' vectors (.npy)")

    study_main(__file__, __doc__, report, run=(arguments, lambda args: run(args.vectors)))


if __name__ == "__main__":
    main()
