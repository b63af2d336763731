"""build, search, add, delete, compact, refit, info, verify: option parsing and rendering around
`retriever.index.Index`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from cli import options
from retriever.defaults import DEFAULT_FIT_SAMPLE
from retriever.index_folder import index_options
from retriever.progress import stderr_console

stdout = Console(soft_wrap=True)

Calibrator = Annotated[
    str,
    typer.Option("--calibrator", "-c", help="flow | whitening | whitening-K | sn | natsv-K | sn+natsv-K | none"),
]
Seed = Annotated[Optional[int], typer.Option("--seed", help="seed for the flow's fit (deterministic per seed)")]
Json = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def _pick(index_dir: str, name: str | None, writing: bool = False) -> str:
    from retriever.index_folder import pick_index

    chosen = pick_index(index_dir, name, writing)
    if name is None:
        stderr_console.print(f"using index '{chosen}'")
    return chosen


def _snippet(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _report(verb: str, summary, extra: str = "") -> None:
    for note in summary.notes:
        stderr_console.print(note)
    stderr_console.print(
        f"{verb} index '{summary.name}': {_count(summary.documents, 'document')} ({summary.changed:,} "
        f"{extra or 'changed'}) in {summary.seconds:.1f}s"
    )


def build(
    corpus: Annotated[Path, typer.Argument(help=".txt (one document per line), BEIR .jsonl, .csv/.tsv with id,text, or .gz of them")],
    name: Annotated[Optional[str], typer.Option("--name", "-n", help="index name [default: the corpus file's stem]")] = None,
    vectors: Annotated[Optional[Path], typer.Option(
        "--vectors", help="precomputed raw vectors: a .npy or a folder of .npy shards, row i = document i, made by "
        "the encoder --model/--pooling/--layers/--max-length name (e.g. by `retriever encode`); nothing is encoded")] = None,
    model: options.Model = None,
    pooling: options.Pooling = "last-avg",
    layers: options.Layers = None,
    max_length: options.MaxLength = None,
    calibrator: Calibrator = "flow",
    seed: Seed = None,
    fit_sample: Annotated[int, typer.Option(
        "--fit-sample", help="fit the calibrator on at most this many vectors (uniform, seeded by --seed)")] = DEFAULT_FIT_SAMPLE,
    index_type: Annotated[str, typer.Option(
        "--index-type", help="auto (by corpus size and memory) | flat (exact) | hnsw | ivf | ivfpq (compressed)")] = "auto",
    opq: Annotated[bool, typer.Option("--opq", help="ivfpq: rotate with OPQ before quantizing")] = False,
    fresh: Annotated[bool, typer.Option(
        "--fresh", help="start over even if a killed build of this corpus can be resumed")] = False,
    device: options.Device = "auto",
    dtype: options.Dtype = "fp32",
    batch_size: options.BatchSize = 64,
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Build a calibrated index of CORPUS: encode, fit the calibrator, store FAISS + SQLite.

    The calibrator is fitted unsupervised on a sample of the corpus (--fit-sample). With --vectors nothing is
    encoded. Streamed in chunks: a killed build re-run with the same corpus and encoder settings resumes from its
    last finished chunk (--fresh starts over)."""
    from retriever.index import Index

    name = name or _stem(corpus)
    summary = Index.build(
        corpus, name, index_dir, vectors=vectors, model=model, pooling=pooling, layers=layers, max_length=max_length,
        calibrator=calibrator, calibrator_options={"seed": seed} if seed is not None else None, fit_sample=fit_sample,
        index_type=index_type, index_options={"opq": True} if opq else None, device=device, dtype=dtype,
        batch_size=batch_size, encoding=encoding, resume=not fresh, progress=True,
    )
    _report("built", summary, "encoded" if vectors is None else "indexed")
    if vectors is None:
        share = summary.timings["encode"] / summary.seconds if summary.seconds else 0.0
        stderr_console.print(f"{_count(summary.truncated, 'document')} truncated at the max length; "
                             f"encoding took {share:.0%} of the time")
    stderr_console.print(f"search it with: retriever search \"...\" {index_options(index_dir, name)}")


def _stem(corpus: Path) -> str:
    """corpus.jsonl.gz -> corpus."""
    name = corpus.name
    for suffix in reversed(corpus.suffixes):
        name = name.removesuffix(suffix) if suffix.lower() in (".gz", ".txt", ".jsonl", ".csv", ".tsv") else name
    return name or corpus.stem


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def search(
    query: Annotated[Optional[str], typer.Argument(help="the query text")] = None,
    name: options.IndexName = None,
    k: Annotated[int, typer.Option("-k", help="results per query")] = 10,
    queries: Annotated[Optional[Path], typer.Option("--queries", help=".txt (one per line) or BEIR queries.jsonl")] = None,
    as_json: Json = False,
    nprobe: Annotated[Optional[int], typer.Option(
        "--nprobe", help="ivf/ivfpq: buckets scanned per query [default: the index's, set for recall@10 >= 0.95]")] = None,
    ef_search: Annotated[Optional[int], typer.Option(
        "--ef-search", help="hnsw: candidates kept per query [default: the index's]")] = None,
    rerank: Annotated[Optional[int], typer.Option(
        "--rerank", help="ivfpq: re-score k x this many candidates exactly [default: the index's]")] = None,
    device: options.Device = "auto",
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Search an index with one QUERY or a --queries file, through the index's own encode path."""
    from retriever.corpus import read_queries
    from retriever.errors import RetrieverError
    from retriever.index import Index

    if (query is None) == (queries is None):
        raise RetrieverError('give either a query ("...") or --queries FILE')
    index = Index.open(_pick(index_dir, name), index_dir, device=device)
    if queries is None:
        hits = index.search(query, k, nprobe=nprobe, ef_search=ef_search, rerank=rerank)[0]
        if as_json:
            print(json.dumps([asdict(hit) for hit in hits], ensure_ascii=False))
        else:
            _hits_table(query, hits)
        return
    batch = read_queries(queries, encoding=encoding)
    results = index.search([text for _, text in batch], k, progress=True, nprobe=nprobe, ef_search=ef_search,
                           rerank=rerank)
    for (query_id, text), hits in zip(batch, results):
        if as_json:
            record = {"query_id": query_id, "results": [{"doc_id": h.doc_id, "score": h.score} for h in hits]}
            print(json.dumps(record, ensure_ascii=False))
        else:
            _hits_table(f"{query_id}: {text}", hits)


def _hits_table(title: str, hits) -> None:
    table = Table(title=_snippet(title, 80), title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("score", justify="right")
    table.add_column("doc id")
    table.add_column("text")
    for hit in hits:
        text = f"[bold]{hit.title}[/bold] {hit.text}" if hit.title else hit.text
        table.add_row(str(hit.rank), f"{hit.score:.3f}", hit.doc_id, _snippet(text))
    stdout.print(table)


def add(
    corpus: Annotated[Path, typer.Argument(help="new documents, in any corpus format build accepts")],
    name: options.IndexName = None,
    vectors: Annotated[Optional[Path], typer.Option(
        "--vectors", help="their precomputed raw vectors (.npy or folder of shards), made with the index's encoder")] = None,
    device: options.Device = "auto",
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Add documents, calibrated with the saved calibrator (no refit).

    They are encoded (or taken from --vectors) and written as one new segment; the rest of the index is reused as
    it is, not copied."""
    from retriever.index import Index

    index = Index.open(_pick(index_dir, name, writing=True), index_dir, device=device)
    summary = index.add(corpus, encoding, progress=True, vectors=vectors)
    _report("updated", summary, "added")
    if vectors is None:
        stderr_console.print(f"{_count(summary.truncated, 'document')} truncated at the max length")


def delete(
    doc_ids: Annotated[list[str], typer.Argument(help="document ids to remove")],
    name: options.IndexName = None,
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Delete documents by id, all or nothing (searches skip them at once; compaction drops them)."""
    from retriever.index import Index

    index = Index.open(_pick(index_dir, name, writing=True), index_dir, device="cpu")
    _report("updated", index.delete(doc_ids), "removed")


def compact(
    name: options.IndexName = None,
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Merge the index's segments into one and drop deleted documents for good.

    Writes also compact by themselves once many small segments or deletions pile up."""
    from retriever.index import Index

    index = Index.open(_pick(index_dir, name, writing=True), index_dir, device="cpu")
    before = len(index.segments)
    summary = index.compact()
    _report("compacted", summary, f"deleted dropped, {before} segments merged")


def refit(
    name: options.IndexName = None,
    calibrator: Annotated[Optional[str], typer.Option("--calibrator", "-c", help="[default: the index's own]")] = None,
    seed: Seed = None,
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Refit the calibrator on the stored raw vectors (no re-encoding) and rewrite the vector indexes."""
    from retriever.index import Index

    index = Index.open(_pick(index_dir, name, writing=True), index_dir, device="cpu")
    summary = index.refit(calibrator, {"seed": seed} if seed is not None else None)
    _report("refitted", summary, "re-calibrated")


def verify(
    index: Annotated[Optional[str], typer.Argument(help="the index to check (or --name)", show_default=False)] = None,
    name: options.IndexName = None,
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Re-hash every file of the index against its manifest.

    Opening an index checks only the manifest's own checksum and every file's size."""
    import time

    from retriever.errors import RetrieverError
    from retriever.index import verify_index

    started = time.perf_counter()
    if index and name and index != name:
        raise RetrieverError(f"two different indexes named: '{index}' and --name '{name}'")
    name = _pick(index_dir, index or name)
    manifest, checked = verify_index(name, index_dir)
    stderr_console.print(f"index '{name}' is intact: {len(manifest['files'])} files, {checked / 2**20:,.1f} MiB "
                         f"re-hashed in {time.perf_counter() - started:.1f}s")


def info(
    name: options.IndexName = None,
    as_json: Json = False,
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Show the manifest, counts, and isotropy before and after calibration."""
    from retriever.index import Index

    details = Index.open(_pick(index_dir, name), index_dir, device="cpu").info()
    if as_json:
        print(json.dumps(details, indent=2))
        return
    manifest = details["manifest"]
    table = Table(title=f"index '{manifest['name']}'", show_header=False, title_justify="left")
    encoder = manifest["encoder"]
    pooling = f"layers {encoder['layers']}" if encoder["layers"] else encoder["pooling"]
    spec = {**manifest["index"], **details["search_settings"]}
    settings = ", ".join(f"{key} {value}" for key, value in spec.items() if key != "type")
    fitted = manifest.get("fit", {})
    rows = [
        ("folder", details["folder"]),
        ("documents", f"{details['documents']:,} ({details['vectors']:,} vectors in "
                      f"{_count(len(details['segments']), 'segment')}, {details['deleted']:,} of them deleted, "
                      "until compaction drops them)"),
        ("model", f"{encoder['model']} ({pooling}, max_length {encoder['max_length']}, {encoder['dtype']})"),
        ("calibrator", json.dumps(manifest["calibrator"])),
        ("fitted on", "a calibrator fitted before the build" if fitted.get("prefitted") else
                      f"{fitted.get('sample', 0):,} of {fitted.get('of', 0):,} vectors (seed {fitted.get('seed', 0)})"),
        ("index", f"{spec['type']} ({settings or 'exact'}), {manifest['dim']} dims, "
                  f"search on {details['search_backend']}"),
        ("created", manifest["created"] + (f", refitted {manifest['refitted']}" if "refitted" in manifest else "")),
        ("versions", ", ".join(f"{k} {v}" for k, v in manifest["versions"].items())),
    ]
    for stage in ("raw", "calibrated"):
        values = details["isotropy"][stage]
        if values:
            rows.append((f"isotropy ({stage})", f"mean cosine of random pairs {values['mean_cosine_random_pairs']:+.3f}, "
                         f"top direction holds {values['top_direction_variance_share']:.1%} of the variance"))
    for key, value in rows:
        table.add_row(key, value)
    stdout.print(table)
