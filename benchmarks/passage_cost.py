"""Issue 42's cost: what passages cost beside one vector per document, in the same run.

    python benchmarks/passage_cost.py build --out benchmarks/results/passage_cost_build_cpu.json
    python benchmarks/passage_cost.py search --work DIR --out benchmarks/results/passage_cost_search_cpu.json
    python benchmarks/passage_cost.py report benchmarks/results/passage_cost_*_cpu.json \\
        --out benchmarks/results/passage_cost_cpu.md

`build`: one set of issue 42's yardstick (`long-python-doc`: 200 documentation pages of 600+ words among 4,000
paragraphs) built twice with the default model, encoding every text (no cache): with passages (the default) and
with `--no-passages` (today's one vector per document). Seconds, vectors and bytes on disk, per document and per
vector.

`search`: query latency by vector (the query already encoded: what the search costs) at a million passages'
worth of documents, one at a time, k=10, in every mode, 1,000 QNLI questions (the first 20 warm up), the two
indexes answering each query in turn (so a load that comes and goes on the machine weighs on both). The same
1,089,521 real paragraphs of `passages/passages.jsonl.gz` are indexed twice, both `ivf` (nlist 1024, nprobe 256):
- today: each paragraph a document, one vector each;
- passages: each page (the paragraphs of one source sharing a title, in order) one document, 365,140 of them,
  its paragraphs its passages (`Index.build(vectors=..., vector_spans=...)`): the same vectors and the same
  keyword units, so the difference is what scoring a document by its best passage costs.
No machine here encodes a million paragraphs in a benchmark's time: the vectors are real all-MiniLM-L6-v2 vectors
(the embedding cache's, from the benchmarks' texts) tiled to 1,089,521 rows with Gaussian noise of 0.1 x each
dimension's spread, the same for both indexes; a paragraph's vector is not its text's (the cost is measured,
not relevance).
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.study_cli import study_main  # noqa: E402

PASSAGES = REPO.parent / "shared" / "data" / "passages" / "passages.jsonl.gz"
MODES = ("dense", "keyword", "hybrid")
WARM_UP = 20


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def folder_bytes(index) -> dict[str, int]:
    parts: dict[str, int] = {}
    for path, entry in index.snapshot.manifest.files.items():
        name = path.rsplit("/", 1)[-1]
        key = "keyword index" if name.startswith("keyword") else name
        parts[key] = parts.get(key, 0) + entry.bytes
    return parts


def build_cost() -> dict:
    from retriever.corpus import Document
    from retriever.encode.encoder import Encoder
    from retriever.encode.passages import PassageSettings
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.long_documents import LONG_DOCUMENT_TASKS
    from retriever.index import Index

    rset = LONG_DOCUMENT_TASKS["long-python-doc"].load(resolve_data_dir())
    documents = [Document(doc, text, title, "corpus", number)
                 for number, (doc, (title, text)) in enumerate(rset.corpus.items(), start=1)]
    encoder = Encoder(None, device="cpu")
    encoder.encode(["warm up"] * 64)
    results = {"set": rset.name, "documents": len(documents), "builds": {}}
    with tempfile.TemporaryDirectory(prefix="retriever-cost-") as folder:
        for label, settings in (("one vector per document", PassageSettings(enabled=False)),
                                ("passages", PassageSettings())):
            started = time.perf_counter()
            summary = Index.build(documents, "cost", folder, encoder=encoder, device="cpu", passages=settings,
                                  replace=True)
            seconds = time.perf_counter() - started
            with summary.open() as index:
                parts = folder_bytes(index)
                vectors = index.snapshot.manifest.live_vectors
            total = sum(parts.values())
            results["builds"][label] = {
                "seconds": round(seconds, 1), "timings": {key: round(value, 2) for key, value in summary.timings.items()},
                "vectors": vectors, "bytes": total, "parts": parts,
                "ms_per_document": round(1000 * seconds / len(documents), 2),
                "ms_per_vector": round(1000 * seconds / vectors, 2),
                "bytes_per_document": round(total / len(documents)), "bytes_per_vector": round(total / vectors)}
            print(label, results["builds"][label], file=sys.stderr, flush=True)
    return results


def vector_pool(rows: int, seed: int = 0) -> np.ndarray:
    """ROWS real all-MiniLM-L6-v2 vectors: the embedding cache's (max_length 256), tiled with noise."""
    from retriever.evaluation.cache import resolve_cache_dir

    pools = []
    for folder in Path(resolve_cache_dir()).iterdir():
        described = folder / "encoder.json"
        if not described.is_file():
            continue
        record = json.loads(described.read_text())
        if record.get("max_length") == 256 and record.get("dim") == 384 and record.get("pooling") == "last-avg":
            for shard in sorted(folder.glob("shard-*.npz")):
                with np.load(shard) as stored:
                    pools.append(np.asarray(stored["vectors"], np.float32))
    pool = np.concatenate(pools)
    rng = np.random.default_rng(seed)
    spread = pool.std(axis=0)
    picks = rng.integers(0, len(pool), size=rows)
    out = np.empty((rows, pool.shape[1]), np.float32)
    for start in range(0, rows, 100_000):
        chosen = picks[start : start + 100_000]
        out[start : start + len(chosen)] = pool[chosen] + 0.1 * spread * rng.standard_normal(
            (len(chosen), pool.shape[1]), dtype=np.float32)
    return out


def write_corpora(work: Path) -> tuple[Path, Path, Path]:
    """paragraphs.jsonl (one document each), pages.jsonl (a page each) and page-spans.npy (which paragraph of which
    page each vector is)."""
    paragraphs, pages, spans_path = work / "paragraphs.jsonl", work / "pages.jsonl", work / "page-spans.npy"
    if spans_path.is_file():
        return paragraphs, pages, spans_path
    spans = []
    with gzip.open(PASSAGES, "rt", encoding="utf-8") as source, open(paragraphs, "w", encoding="utf-8") as one, \
            open(pages, "w", encoding="utf-8") as grouped:
        current, texts, number = None, [], -1

        def flush():
            if current is not None:
                grouped.write(json.dumps({"_id": f"page-{number}", "title": current[1], "text": "\n\n".join(texts)},
                                         ensure_ascii=False) + "\n")

        for line in source:
            record = json.loads(line)
            one.write(line)
            key = (record["_id"].rsplit("-", 1)[0], record["title"])
            if key != current:
                flush()
                current, texts, number, offset = key, [], number + 1, 0
            start = offset if not texts else offset + 2
            texts.append(record["text"])
            spans.append((number, start, start + len(record["text"])))
            offset = start + len(record["text"])
        flush()
    np.save(spans_path, np.asarray(spans, np.int64))
    return paragraphs, pages, spans_path


def search_cost(work: Path, queries: int) -> dict:
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import qnli_retrieval
    from retriever.index import Index, load_encoder
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    work.mkdir(parents=True, exist_ok=True)
    paragraphs, pages, spans_path = write_corpora(work)
    spans = np.load(spans_path)
    vectors_path = work / "vectors.npy"
    if not vectors_path.is_file():
        np.save(vectors_path, vector_pool(len(spans)))
    texts = list(qnli_retrieval(resolve_data_dir()).queries.values())[: queries + WARM_UP]
    results = {"queries": queries, "k": 10, "indexes": {}}
    opened = {}
    for label, corpus, given in (("today", paragraphs, None), ("passages", pages, spans_path)):
        index_dir = work / "indexes"
        started = time.perf_counter()
        summary = Index.build(corpus, label, index_dir, vectors=vectors_path, vector_spans=given, device="cpu",
                              index_type="ivf", replace=True)
        seconds = time.perf_counter() - started
        index = Index.open(label, index_dir, device="cpu")
        opened[label] = (index, Searcher(index.snapshot), index.snapshot.calibrate(
            load_encoder(index.snapshot).encode(texts)))
        results["indexes"][label] = {
            "documents": summary.documents, "vectors": index.snapshot.manifest.live_vectors,
            "index": index.snapshot.manifest.index, "build_seconds": round(seconds, 1),
            "timings": {key: round(value, 2) for key, value in summary.timings.items()},
            "bytes": sum(folder_bytes(index).values())}
    # The two indexes answer each query in turn, mode by mode: a load that comes and goes on the machine weighs
    # on both alike.
    options = {mode: SearchOptions(k=10, mode=mode) for mode in MODES}
    timings = {label: {mode: [] for mode in MODES} for label in opened}
    for number, text in enumerate(texts):
        for mode in MODES:
            for label, (index, searcher, vectors) in opened.items():
                clock = time.perf_counter()
                searcher.search([text], None if mode == "keyword" else vectors[number : number + 1], options[mode])
                if number >= WARM_UP:
                    timings[label][mode].append(time.perf_counter() - clock)
    for label, (index, _, _) in opened.items():
        results["indexes"][label].update(
            p50_ms={mode: round(1000 * float(np.percentile(timings[label][mode], 50)), 2) for mode in MODES},
            p99_ms={mode: round(1000 * float(np.percentile(timings[label][mode], 99)), 2) for mode in MODES})
        print(label, results["indexes"][label], file=sys.stderr, flush=True)
        index.close()
    today, passages = results["indexes"]["today"], results["indexes"]["passages"]
    results["p50_ratio"] = {mode: round(passages["p50_ms"][mode] / today["p50_ms"][mode], 3) for mode in MODES}
    results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return results


def report(files: list[Path]) -> str:
    lines = ["# What passages cost (issue 42)", "",
             "Generated by `benchmarks/passage_cost.py report`; see its docstring for the method.", ""]
    for path in files:
        found = json.loads(path.read_text())
        lines += [f"From `{path.name}`: {found['machine']}; `{found['command']}`.", ""]
        if "builds" in found:
            lines += [f"## Build, encoding every text: {found['set']} ({found['documents']:,} documents)", "",
                      "| build | seconds | vectors | MB on disk | ms / document | ms / vector | bytes / vector |",
                      "|---|---:|---:|---:|---:|---:|---:|"]
            for label, built in found["builds"].items():
                lines.append(f"| {label} | {built['seconds']:.1f} | {built['vectors']:,} | {built['bytes'] / 2**20:.1f} | "
                             f"{built['ms_per_document']:.2f} | {built['ms_per_vector']:.2f} | "
                             f"{built['bytes_per_vector']:,} |")
            lines.append("")
        else:
            lines += [f"## Search by vector at a million passages ({found['queries']:,} questions, k={found['k']})",
                      "", "| index | documents | vectors | build s | MB | " + " | ".join(
                          f"{mode} p50 ms" for mode in MODES) + " |", "|---|---:|---:|---:|---:|" + "---:|" * 3]
            for label, built in found["indexes"].items():
                lines.append(f"| {label} | {built['documents']:,} | {built['vectors']:,} | {built['build_seconds']:.0f} | "
                             f"{built['bytes'] / 2**20:,.0f} | " + " | ".join(f"{built['p50_ms'][mode]:.2f}"
                                                                             for mode in MODES) + " |")
            lines += ["", "p50 with passages / today: " + ", ".join(f"{mode} **{ratio:.2f}x**" for mode, ratio in
                                                                   found["p50_ratio"].items()) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    def search_arguments(searched: argparse.ArgumentParser) -> None:
        searched.add_argument("--work", type=Path, required=True)
        searched.add_argument("--queries", type=int, default=1000)

    def with_machine(results: dict) -> dict:
        return {**results, "machine": machine()}

    study_main(__file__, __doc__.splitlines()[0], report,
               build=(None, lambda args: with_machine(build_cost())),
               search=(search_arguments, lambda args: with_machine(search_cost(args.work, args.queries))))


if __name__ == "__main__":
    main()
