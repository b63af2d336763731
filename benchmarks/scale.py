"""Scale on one machine: builds from vectors at 1M and 10M, writes, open and search on a 1M index.

    python benchmarks/scale.py prepare --vectors VECTORS.npy --work DIR     # once: corpora and vectors
    python benchmarks/scale.py run --work DIR [--steps a,b] [--out benchmarks/results/scale]

The data are the 1,089,521 real passages of ../shared/data/passages (see its README) and their all-MiniLM-L6-v2
vectors, made once with `retriever encode passages.jsonl.gz --out VECTORS.npy` (title and text, last-avg,
max_length 256). `prepare` writes into DIR:

- `corpus-1m`: the passages file itself with those vectors;
- `corpus-10m`: every passage ten times (ids `ID~0` .. `ID~9`), with the real vectors plus Gaussian noise of 0.1
  times each dimension's standard deviation (a different draw per copy), as ten float16 shards: 10,895,210
  documents, **real vectors repeated with small noise**, not 10M distinct passages;
- `corpus-10k` (every 109th passage), `add-1k` (1,000 other passages under new ids) with their vectors, and
  `delete-1k.txt` (1,000 ids of the 1M corpus).

`run` measures each step in a fresh process (so peak RSS is that step's own, `ru_maxrss`) and writes
`OUT.json` and `OUT.md`:

- `build-*`: `Index.build(..., vectors=...)` with the stage times (read, check_vectors, fit, train_index, index,
  write) and peak RSS; `fit` is the calibrator's fit on its sample (the default `--fit-sample`). At 1M: the type
  `auto` picks (`p1m`), and ivf, ivfpq, ivfpq with OPQ;
- `search`: recall@10 against exact search and QPS (one query at a time, and batches of 64) of each 1M index at
  its defaults, against exact search (`faiss.IndexFlatIP` over the same calibrated vectors) in the same run, and
  recall by nprobe / ef_search; queries are 1,000 real questions (QNLI dev) through the index's encode path;
- `writes`: add 1,000 documents (their vectors given, so no encoding) to the 1M index and to the 10k index, delete
  1,000 from the 1M index, and `Index.open` of each 1M index (libraries already imported);
- `search-10m`: recall@10 (exact top-10 found by streaming all calibrated vectors past 200 queries) and q/s of
  the 10M index at its defaults;
- `encode-build-100k`: a build that encodes 100,000 passages itself, and the share of its time spent encoding.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PASSAGES = REPO.parent / "shared" / "data" / "passages" / "passages.jsonl.gz"
STEPS = ("build-10k", "build-1m-auto", "build-1m-ivf", "build-1m-ivfpq", "build-1m-ivfpq-opq", "search", "writes",
         "build-10m-ivfpq", "search-10m", "encode-build-100k")
# The 1M indexes the search step compares; "p1m" is what `--index-type auto` chose.
SEARCHED = ("p1m", "p1m-ivf", "p1m-ivfpq", "p1m-ivfpq-opq")
COPIES = 10


def prepare(work: Path, vectors_path: Path, passages: Path, copies: int = COPIES) -> None:
    """Write the corpora and vector files the steps use (see the module docstring)."""
    work.mkdir(parents=True, exist_ok=True)
    vectors = np.load(vectors_path, mmap_mode="r")
    records = [json.loads(line) for line in gzip.open(passages, "rt", encoding="utf-8")]
    if len(records) != len(vectors):
        raise SystemExit(f"{vectors_path} has {len(vectors)} rows for {len(records)} passages")
    (work / "corpus-1m.jsonl.gz").unlink(missing_ok=True)
    (work / "corpus-1m.jsonl.gz").symlink_to(passages.resolve())
    (work / "vectors-1m.npy").unlink(missing_ok=True)
    (work / "vectors-1m.npy").symlink_to(vectors_path.resolve())

    small = np.arange(0, len(records), 109)[:10_000]
    added = np.arange(54, len(records), 1089)[:1_000]
    write_jsonl(work / "corpus-10k.jsonl", (records[i] for i in small))
    np.save(work / "vectors-10k.npy", np.asarray(vectors[small], dtype=np.float32))
    write_jsonl(work / "add-1k.jsonl", ({**records[i], "_id": records[i]["_id"] + "+added"} for i in added))
    np.save(work / "add-1k.npy", np.asarray(vectors[added], dtype=np.float32))
    deleted = np.arange(7, len(records), 1089)[:1_000]
    (work / "delete-1k.txt").write_text("".join(records[i]["_id"] + "\n" for i in deleted))

    shards = work / "vectors-10m"
    shards.mkdir(exist_ok=True)
    std = np.concatenate([np.asarray(vectors[i : i + 65536], np.float32) for i in range(0, len(vectors), 65536 * 4)]).std(0)
    rng = np.random.default_rng(0)
    with gzip.open(work / "corpus-10m.jsonl.gz", "wt", encoding="utf-8", compresslevel=1) as corpus:
        for copy in range(copies):
            for record in records:
                corpus.write(json.dumps({**record, "_id": f"{record['_id']}~{copy}"}, ensure_ascii=False) + "\n")
            shard = np.lib.format.open_memmap(shards / f"part-{copy:02d}.npy", mode="w+", dtype=np.float16,
                                              shape=vectors.shape)
            for start in range(0, len(vectors), 65536):
                block = np.asarray(vectors[start : start + 65536], dtype=np.float32)
                shard[start : start + len(block)] = block + 0.1 * std * rng.standard_normal(block.shape, np.float32)
            shard.flush()
            del shard
            print(f"10m: copy {copy + 1}/{copies} written", file=sys.stderr)


def write_jsonl(path: Path, records) -> None:
    with open(path, "w", encoding="utf-8") as file:
        for record in records:
            file.write(json.dumps(record, ensure_ascii=False) + "\n")


# --- steps, each run in its own process ------------------------------------------------------------------------


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def step_build(work: Path, name: str, corpus: str, vectors: str, index_type: str, options: dict | None = None) -> dict:
    from retriever.index import Index

    started = time.perf_counter()
    summary = Index.build(work / corpus, name, work / "indexes", vectors=work / vectors, index_type=index_type,
                          index_options=options, device="cpu", replace=True)
    index = Index.open(name, work / "indexes", device="cpu").snapshot
    index_bytes = sum(entry.bytes for path, entry in index.manifest.files.items() if path.endswith("vectors.faiss"))
    return {"documents": summary.documents, "seconds": round(time.perf_counter() - started, 1),
            "timings": {key: round(value, 2) for key, value in summary.timings.items()},
            "index": index.manifest.index, "fit": index.manifest.fit,
            "index_bytes": index_bytes, "index_bytes_per_vector": round(index_bytes / summary.documents, 1),
            "peak_rss_mb": peak_rss_mb()}


def step_writes(work: Path) -> dict:
    from retriever.index import Index

    indexes = work / "indexes"
    report: dict = {}
    for name in ("p1m", "p10k"):
        timings = []
        for attempt in range(3):
            index = Index.open(name, indexes, device="cpu")
            corpus = work / f"add-1k-{attempt}.jsonl"
            records = [json.loads(line) for line in open(work / "add-1k.jsonl", encoding="utf-8")]
            run = int(time.time())  # ids new to the index even when the step runs again on the same indexes
            write_jsonl(corpus, ({**r, "_id": f"{r['_id']}{attempt}-{run}"} for r in records))
            start = time.perf_counter()
            summary = index.add(corpus, vectors=work / "add-1k.npy")
            timings.append(time.perf_counter() - start)
        report[f"add_1k_to_{name}"] = {"seconds": [round(t, 3) for t in timings], "median": round(sorted(timings)[1], 3),
                                       "documents_after": summary.documents}
    report["add_ratio_1m_vs_10k"] = round(report["add_1k_to_p1m"]["median"] / report["add_1k_to_p10k"]["median"], 2)
    deleted = (work / "delete-1k.txt").read_text().split()
    index = Index.open("p1m", indexes, device="cpu")
    start = time.perf_counter()
    summary = index.delete(deleted)
    report["delete_1k_from_p1m"] = {"seconds": round(time.perf_counter() - start, 3),
                                    "documents_after": summary.documents}
    for name in SEARCHED:
        opens = []
        for _ in range(5):
            start = time.perf_counter()
            Index.open(name, indexes, device="cpu")
            opens.append(time.perf_counter() - start)
        report[f"open_{name}"] = {"seconds": [round(t, 4) for t in opens], "median": round(sorted(opens)[2], 4)}
    report["peak_rss_mb"] = peak_rss_mb()
    return report


def qnli_questions(count: int) -> list[str]:
    from retriever.evaluation import get_task, resolve_data_dir

    questions: dict[str, None] = {}
    for subset in get_task("qnli").load_split(resolve_data_dir()):
        for question in subset.sent1:
            questions.setdefault(question)
    return list(questions)[:count]


def timed_qps(search, queries: np.ndarray, batch: int, limit: int) -> float:
    queries = queries[:limit]
    start = time.perf_counter()
    for offset in range(0, len(queries), batch):
        search(queries[offset : offset + batch])
    return len(queries) / (time.perf_counter() - start)


def embed(snapshot, texts: list[str]) -> np.ndarray:
    """TEXTS in SNAPSHOT's space: its recorded encoder, its calibrator, L2 normalization (as `Index.search`)."""
    from retriever.index import load_encoder

    return snapshot.calibrate(load_encoder(snapshot).encode(texts))


def step_search(work: Path) -> dict:
    import faiss

    from retriever.numeric import l2_normalize
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher
    from retriever.store.vectors import set_threads
    from retriever.versions.snapshot import Snapshot

    set_threads()
    indexes = work / "indexes"
    reference = Snapshot.open("p1m-ivfpq", indexes, device="cpu")
    queries = embed(reference, qnli_questions(1000))
    # Exact search over the same calibrated vectors: the calibrator applied to every raw vector, in blocks.
    dim = reference.manifest.dim
    exact_index = faiss.IndexFlatIP(dim)
    rowids = []
    for segment in reference.segments:
        for ids, raw in segment.raw_blocks():
            keep = ~np.isin(ids, reference.tombstones)
            exact_index.add(l2_normalize(reference.calibrator.transform(raw[keep])))
            rowids.append(ids[keep])
    rowids = np.concatenate(rowids)
    k = 10
    exact = rowids[exact_index.search(queries, k)[1]]
    exact_qps = {"single": timed_qps(lambda q: exact_index.search(q, k), queries, 1, 100),
                 "batch_64": timed_qps(lambda q: exact_index.search(q, k), queries, 64, 1000)}
    report: dict = {"vectors": exact_index.ntotal, "queries": len(queries), "k": k,
                    "exact_qps": {key: round(value, 1) for key, value in exact_qps.items()}}
    for name in SEARCHED:
        index = Snapshot.open(name, indexes, device="cpu")
        searcher = Searcher(index)  # the search layer under `Index.search`: the dense side, given query vectors
        probe = reference.raw_sample(100)
        if not np.allclose(index.calibrator.transform(probe), reference.calibrator.transform(probe), atol=1e-5):
            raise SystemExit(f"{name} and p1m-ivfpq were calibrated differently; rebuild them from the same vectors")
        spec = index.spec
        if spec.type == "hnsw":
            knob, default, values = "ef_search", spec.search_ef, (32, 64, 128, 256, 512)
        else:
            knob, default, values = "nprobe", spec.search_nprobe, (16, 32, 64, 128, 256, 512)
        searcher.dense_top(queries, SearchOptions(k=k))  # page the mapped index in before anything is timed
        sweep = {}
        for value in sorted({*values, default}):
            start = time.perf_counter()
            found = searcher.dense_top(queries, SearchOptions(k=k, **{knob: value}))[1]
            qps = len(queries) / (time.perf_counter() - start)  # all queries in one batch
            recall = float(np.mean([len(set(f) & set(e)) / k for f, e in zip(found, exact)]))
            sweep[value] = {"recall": round(recall, 4), "qps_one_batch": round(qps, 1)}
        if spec.type == "ivfpq":  # how many candidates the exact re-ranking needs, at the default nprobe
            by_rerank = {}
            for rerank in (1, 5, 10, 20, 40):
                found = searcher.dense_top(queries, SearchOptions(k=k, rerank=rerank))[1]
                by_rerank[rerank] = round(float(np.mean([len(set(f) & set(e)) / k for f, e in zip(found, exact)])), 4)
        defaults = SearchOptions(k=k)
        search = lambda q: searcher.dense_top(q, defaults)  # noqa: E731 - the defaults, as users get them
        qps = {"single": timed_qps(search, queries, 1, 1000), "batch_64": timed_qps(search, queries, 64, 1000)}
        report[name] = {"index": {**index.manifest.index, **spec.search_settings()},
                        f"recall_at_{k}": sweep[default]["recall"],
                        **({"recall_by_rerank": by_rerank} if spec.type == "ivfpq" else {}),
                        f"by_{knob}": sweep, "qps": {key: round(value, 1) for key, value in qps.items()},
                        "speedup_over_exact": {key: round(qps[key] / exact_qps[key], 1) for key in qps},
                        "bytes_per_vector_in_memory": index.spec.bytes_per_vector(dim)}
    report["peak_rss_mb"] = peak_rss_mb()
    return report


def step_search_10m(work: Path, exact_queries: int = 200) -> dict:
    """Recall@10 and q/s of the 10M ivfpq index at its defaults. Exact top-10 for EXACT_QUERIES queries is found
    by streaming every calibrated vector past them (a flat index of 10M float32 vectors would not fit beside
    everything else); q/s is the index's own, with no exact peer at this size."""
    from retriever.numeric import l2_normalize
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher
    from retriever.store.vectors import set_threads
    from retriever.versions.snapshot import Snapshot

    set_threads()
    index = Snapshot.open("p10m-ivfpq", work / "indexes", device="cpu")
    searcher, defaults = Searcher(index), SearchOptions(k=10)
    queries = embed(index, qnli_questions(1000))
    probe, k = queries[:exact_queries], 10
    best_scores = np.full((len(probe), k), -np.inf, np.float32)
    best_ids = np.full((len(probe), k), -1, np.int64)
    start = time.perf_counter()
    for segment in index.segments:
        for ids, raw in segment.raw_blocks(262144):
            keep = ~np.isin(ids, index.tombstones)
            scores = probe @ l2_normalize(index.calibrator.transform(raw[keep])).T
            scores = np.concatenate([best_scores, scores], axis=1)
            candidates = np.concatenate([best_ids, np.broadcast_to(ids[keep], (len(probe), int(keep.sum())))], axis=1)
            top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            best_scores = np.take_along_axis(scores, top, 1)
            best_ids = np.take_along_axis(candidates, top, 1)
    exact_seconds = time.perf_counter() - start
    found = searcher.dense_top(probe, defaults)[1]
    recall = float(np.mean([len(set(f) & set(e)) / k for f, e in zip(found, best_ids)]))
    search = lambda q: searcher.dense_top(q, defaults)  # noqa: E731
    qps = {"single": timed_qps(search, queries, 1, 200), "batch_64": timed_qps(search, queries, 64, 1000)}
    return {"vectors": len(index), "index": {**index.manifest.index, **index.spec.search_settings()},
            "recall_queries": len(probe), f"recall_at_{k}": round(recall, 4),
            "qps": {key: round(value, 1) for key, value in qps.items()},
            "exact_by_streaming_seconds": round(exact_seconds, 1),
            "bytes_per_vector_in_memory": index.spec.bytes_per_vector(index.manifest.dim),
            "peak_rss_mb": peak_rss_mb()}


def step_encode_build(work: Path) -> dict:
    from retriever.index import Index

    corpus = work / "corpus-100k.jsonl"
    if not corpus.exists():
        records = [json.loads(line) for line in gzip.open(PASSAGES, "rt", encoding="utf-8")]
        write_jsonl(corpus, (records[i] for i in np.linspace(0, len(records) - 1, 100_000).astype(int)))
    summary = Index.build(corpus, "p100k-encoded", work / "indexes", device="cpu", replace=True)
    encode = summary.timings["encode"]
    return {"documents": summary.documents, "seconds": round(summary.seconds, 1),
            "timings": {key: round(value, 2) for key, value in summary.timings.items()},
            "encoding_share": round(encode / summary.seconds, 4),
            "non_encoding_share": round(1 - encode / summary.seconds, 4), "peak_rss_mb": peak_rss_mb()}


def run_step(work: Path, name: str) -> dict:
    if name == "build-10k":
        return step_build(work, "p10k", "corpus-10k.jsonl", "vectors-10k.npy", "auto")
    if name == "build-1m-auto":
        return step_build(work, "p1m", "corpus-1m.jsonl.gz", "vectors-1m.npy", "auto")
    if name == "build-1m-ivf":
        return step_build(work, "p1m-ivf", "corpus-1m.jsonl.gz", "vectors-1m.npy", "ivf")
    if name == "build-1m-ivfpq":
        return step_build(work, "p1m-ivfpq", "corpus-1m.jsonl.gz", "vectors-1m.npy", "ivfpq")
    if name == "build-1m-ivfpq-opq":
        return step_build(work, "p1m-ivfpq-opq", "corpus-1m.jsonl.gz", "vectors-1m.npy", "ivfpq", {"opq": True})
    if name == "build-10m-ivfpq":
        return step_build(work, "p10m-ivfpq", "corpus-10m.jsonl.gz", "vectors-10m", "ivfpq")
    if name == "writes":
        return step_writes(work)
    if name == "search":
        return step_search(work)
    if name == "search-10m":
        return step_search_10m(work)
    if name == "encode-build-100k":
        return step_encode_build(work)
    raise SystemExit(f"unknown step {name}; steps: {', '.join(STEPS)}")


def run(work: Path, steps: list[str], out: Path) -> None:
    results_path = out.with_suffix(".json")
    report = json.loads(results_path.read_text()) if results_path.exists() else {}
    report.update({"benchmark": "scale", "machine": platform.machine(), "cpus": os.cpu_count(),
                   "python": platform.python_version()})
    report.setdefault("steps", {})
    for name in steps:
        print(f"--- {name}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "step", name, "--work", str(work)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise SystemExit(f"step {name} failed:\n{done.stderr[-3000:]}")
        report["steps"][name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(report["steps"][name], indent=2), file=sys.stderr, flush=True)
        results_path.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))


def markdown(report: dict) -> str:
    steps = report["steps"]
    lines = ["# Scale on one machine (benchmarks/scale.py)", "",
             f"{report['cpus']} CPUs, {report['machine']}, Python {report['python']}. Each step ran in its own process.",
             ""]
    builds = [name for name in steps if name.startswith("build-")]
    if builds:
        lines += ["| build from vectors | documents | index | bytes/vector | read | check | pseudo-queries | fit | "
                  "train index | index | keywords | write | total s | peak RSS MB |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name in builds:
            b = steps[name]
            t = b["timings"]
            lines.append(f"| {name} | {b['documents']:,} | {b['index']['type']} | {b['index_bytes_per_vector']} | "
                         f"{t.get('read', 0):.1f} | {t.get('check_vectors', 0):.1f} | "
                         f"{t.get('pseudo_queries', 0):.1f} | {t.get('fit', 0):.1f} | "
                         f"{t.get('train_index', 0):.1f} | {t.get('index', 0):.1f} | {t.get('keywords', 0):.1f} | "
                         f"{t.get('write', 0):.1f} | {b['seconds']:.1f} | {b['peak_rss_mb']:,.0f} |")
        lines += ["", "`keywords`: the keyword index (issue 27), absent before it (0.0); `pseudo-queries`: the queries "
                      "`auto` checks calibrations with (issue 24), absent before it; `index`: the vectors alone."]
        lines.append("")
    if "writes" in steps:
        w = steps["writes"]
        lines += ["| write | seconds |", "|---|---:|",
                  f"| add 1,000 to the 1M index (median of 3) | {w['add_1k_to_p1m']['median']} |",
                  f"| add 1,000 to the 10k index (median of 3) | {w['add_1k_to_p10k']['median']} |",
                  f"| ratio 1M / 10k | {w['add_ratio_1m_vs_10k']} |",
                  f"| delete 1,000 from the 1M index | {w['delete_1k_from_p1m']['seconds']} |"]
        lines += [f"| Index.open, {name} (median of 5) | {w[f'open_{name}']['median']} |" for name in SEARCHED]
        lines.append("")
    if "search" in steps:
        s = steps["search"]
        lines += [f"Search over {s['vectors']:,} calibrated vectors, {s['queries']} real questions, k={s['k']}; "
                  f"exact: {s['exact_qps']['single']} q/s single, {s['exact_qps']['batch_64']} q/s in batches of 64.", "",
                  "| index | settings | bytes/vector in RAM | recall@10 | q/s single | x exact | q/s batch 64 | x exact |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for name in SEARCHED:
            r = s[name]
            settings = ", ".join(f"{k} {v}" for k, v in r["index"].items() if k != "type")
            lines.append(f"| {name}: {r['index']['type']} | {settings} | {r['bytes_per_vector_in_memory']} | "
                         f"{r['recall_at_10']} | {r['qps']['single']} | {r['speedup_over_exact']['single']} | "
                         f"{r['qps']['batch_64']} | {r['speedup_over_exact']['batch_64']} |")
        lines += ["", "Recall@10 and q/s (all 1,000 queries in one batch) by the search-time setting:", ""]
        for name in SEARCHED:
            r = s[name]
            knob = "ef_search" if "by_ef_search" in r else "nprobe"
            cells = ", ".join(f"{value}: {point['recall']} ({point['qps_one_batch']} q/s)"
                              for value, point in r[f"by_{knob}"].items())
            lines.append(f"- {name} ({knob}): {cells}")
        lines.append("")
    if "search-10m" in steps:
        t = steps["search-10m"]
        settings = ", ".join(f"{k} {v}" for k, v in t["index"].items() if k != "type")
        lines += [f"Search over the {t['vectors']:,}-vector ivfpq index ({settings}; {t['bytes_per_vector_in_memory']} "
                  f"bytes/vector in RAM): recall@10 {t['recall_at_10']} against exact top-10 (found by streaming "
                  f"every calibrated vector, {t['recall_queries']} queries); {t['qps']['single']} q/s single, "
                  f"{t['qps']['batch_64']} q/s in batches of 64.", ""]
    if "encode-build-100k" in steps:
        e = steps["encode-build-100k"]
        lines += [f"Build that encodes 100,000 passages: {e['seconds']} s, encoding {e['encoding_share']:.1%}, "
                  f"everything else {e['non_encoding_share']:.1%}.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("prepare", "run", "step"))
    parser.add_argument("name", nargs="?", help="the step (for `step`)")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--vectors", type=Path, help="prepare: the passages' vectors (retriever encode)")
    parser.add_argument("--passages", type=Path, default=PASSAGES)
    parser.add_argument("--copies", type=int, default=COPIES, help="prepare: copies of the corpus for the 10M set")
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.work, args.vectors, args.passages, args.copies)
    elif args.command == "run":
        run(args.work, [step for step in args.steps.split(",") if step], args.out)
    else:
        print(json.dumps(run_step(args.work, args.name)))


if __name__ == "__main__":
    main()
