"""build, search, add, delete, refit, info: option parsing and rendering around `retriever.index.Index`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from cli import options
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
    stderr_console.print(
        f"{verb} index '{summary.name}': {summary.documents} documents ({summary.changed} {extra or 'changed'})"
        f" in {summary.seconds:.1f}s"
    )


def build(
    corpus: Annotated[Path, typer.Argument(help=".txt (one document per line), BEIR .jsonl, or .csv/.tsv with id,text")],
    name: Annotated[Optional[str], typer.Option("--name", "-n", help="index name [default: the corpus file's stem]")] = None,
    model: options.Model = None,
    pooling: options.Pooling = "last-avg",
    layers: options.Layers = None,
    max_length: options.MaxLength = None,
    calibrator: Calibrator = "flow",
    seed: Seed = None,
    index_type: Annotated[str, typer.Option("--index-type", help="flat (exact) | hnsw (approximate, large corpora)")] = "flat",
    device: options.Device = "auto",
    dtype: options.Dtype = "fp32",
    batch_size: options.BatchSize = 64,
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Encode CORPUS, fit the calibrator on it (unsupervised), and store a calibrated FAISS + SQLite index."""
    from retriever.index import Index

    name = name or corpus.stem
    summary = Index.build(
        corpus, name, index_dir, model=model, pooling=pooling, layers=layers, max_length=max_length,
        calibrator=calibrator, calibrator_options={"seed": seed} if seed is not None else None,
        index_type=index_type, device=device, dtype=dtype, batch_size=batch_size, encoding=encoding, progress=True,
    )
    share = summary.timings["encode"] / summary.seconds if summary.seconds else 0.0
    _report("built", summary, "encoded")
    stderr_console.print(
        f"{summary.truncated} documents truncated at the max length; encoding took {share:.0%} of the time\n"
        f"search it with: retriever search \"...\" {index_options(index_dir, name)}"
    )


def search(
    query: Annotated[Optional[str], typer.Argument(help="the query text")] = None,
    name: options.IndexName = None,
    k: Annotated[int, typer.Option("-k", help="results per query")] = 10,
    queries: Annotated[Optional[Path], typer.Option("--queries", help=".txt (one per line) or BEIR queries.jsonl")] = None,
    as_json: Json = False,
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
        hits = index.search(query, k)[0]
        if as_json:
            print(json.dumps([asdict(hit) for hit in hits], ensure_ascii=False))
        else:
            _hits_table(query, hits)
        return
    batch = read_queries(queries, encoding=encoding)
    results = index.search([text for _, text in batch], k, progress=True)
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
    device: options.Device = "auto",
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Encode new documents with the saved calibrator (no refit) and append them."""
    from retriever.index import Index

    index = Index.open(_pick(index_dir, name, writing=True), index_dir, device=device)
    summary = index.add(corpus, encoding, progress=True)
    _report("updated", summary, "added")
    stderr_console.print(f"{summary.truncated} documents truncated at the max length")


def delete(
    doc_ids: Annotated[list[str], typer.Argument(help="document ids to remove")],
    name: options.IndexName = None,
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Remove documents from the vector index and the metadata together."""
    from retriever.index import Index

    index = Index.open(_pick(index_dir, name, writing=True), index_dir, device="cpu")
    _report("updated", index.delete(doc_ids), "removed")


def refit(
    name: options.IndexName = None,
    calibrator: Annotated[Optional[str], typer.Option("--calibrator", "-c", help="[default: the index's own]")] = None,
    seed: Seed = None,
    index_dir: options.IndexDir = "indexes",
) -> None:
    """Refit the calibrator on the stored raw vectors (no re-encoding) and rewrite the vector index."""
    from retriever.index import Index

    index = Index.open(_pick(index_dir, name, writing=True), index_dir, device="cpu")
    summary = index.refit(calibrator, {"seed": seed} if seed is not None else None)
    _report("refitted", summary, "re-calibrated")


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
    rows = [
        ("folder", details["folder"]),
        ("documents", f"{details['documents']:,} ({details['vectors']:,} vectors)"),
        ("model", f"{encoder['model']} ({pooling}, max_length {encoder['max_length']}, {encoder['dtype']})"),
        ("calibrator", json.dumps(manifest["calibrator"])),
        ("index", f"{manifest['index_type']}, {manifest['dim']} dims, search on {details['search_backend']}"),
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
