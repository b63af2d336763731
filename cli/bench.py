"""`retriever bench`: STS / QNLI scores of raw and calibrated embeddings, shaped like BERT-flow's Table 2.

A thin layer: parse options -> plan (validates input, loads no model) -> encoder -> runner -> render.
The table (or, with --json, one JSON object) goes to stdout; progress and logs go to stderr.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import options
from cli.options import default
from cli.output import print_json
from retriever.text import terminal_safe

Datasets = Annotated[
    str,
    typer.Argument(
        help="stsb | sickr | sts12 | sts13 | sts14 | sts15 | sts16 | qnli (pair tasks); retrieval through an index: "
        "qnli-retrieval, stsb-dup ... sts16-dup, sickr-dup, bible-parallel, wordnet-define, debian-package, "
        "foldoc-term, python-doc-page (and linux-, postgresql-, perl-, qt-, rust-, racket-, sqlite-doc-page), "
        "cranfield | cisi | cacm (real questions judged by people); beir PATH or beir:PATH (any BEIR folder); the "
        "groups sts, retrieval, ir-classic and all (the pair tasks); or a comma list",
        show_default=False,
    ),
]
BeirPath = Annotated[
    Optional[str], typer.Argument(help="with `beir`: the BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv)",
                                  show_default=False),
]
Calibrators = Annotated[
    str,
    typer.Option(
        "--calibrator", "-c",
        help="comma-separated: none, auto, flow, flow-K, whitening, whitening-K, sn, natsv-K, sn+natsv-K (one table row each)",
    ),
]
FitOn = Annotated[
    str,
    typer.Option(
        "--fit-on",
        help="what each dataset's calibrators are fitted on: target (all its sentences, no labels; the paper's "
        "'flow (target)'), train (its train split's sentences), or FILE (unlabeled sentences, one per line)",
    ),
]
BenchMaxLength = Annotated[int, typer.Option("--max-length", help="tokens per sentence (the paper's setting)")]


def bench(
    datasets: Datasets,
    beir_path: BeirPath = None,
    model: options.Model = None,
    pooling: options.Pooling = "last-avg",
    layers: options.Layers = None,
    calibrator: Calibrators = "none,auto",
    fit_on: FitOn = "target",
    fit_queries: Annotated[bool, typer.Option(
        "--fit-queries", help="retrieval tasks: fit each index's calibrator on its documents plus the task's "
        "queries (no labels), as `retriever build --fit-queries` does")] = False,
    mode: Annotated[str, typer.Option(
        "--mode", help="retrieval tasks: comma-separated search modes, each scored on the same index: dense, keyword "
        "(BM25), hybrid")] = "dense",
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**64 - 1,
                                      help="seed of the flow's initialisation and batch order")] = 0,
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object instead of the table")] = False,
    plot: Annotated[
        Optional[Path],
        typer.Option("--plot", help="write a figure (e.g. FILE.png): similarity vs edit distance on STS-B dev "
                     "and the singular-value spectrum, raw and calibrated " + default("no figure")),
    ] = None,
    lexical: Annotated[
        bool, typer.Option("--lexical", help="add the paper's Table 6: Spearman of each similarity with word edit "
                           "distance and with gold on STS-B dev")
    ] = False,
    data_dir: Annotated[
        Optional[Path], typer.Option("--data-dir", help="folder holding stsb/, sick/, sts12/ ... qnli/ "
                                     + default("$RETRIEVER_DATA, else ../shared/data"))
    ] = None,
    layout: Annotated[
        Optional[str], typer.Option("--layout", help="original | senteval, for STS-B and SICK-R (STS12-16 "
                                    "exist only in the SentEval layout, QNLI in GLUE's: glue) " + default("original"))
    ] = None,
    max_length: BenchMaxLength = 64,
    device: options.Device = "auto",
    dtype: options.Dtype = "fp32",
    batch_size: options.BatchSize = None,
    runtime: options.Runtime = "auto",
    cache_dir: Annotated[
        Optional[Path], typer.Option("--cache-dir", help="where encoded sentences are kept "
                                     + default("$RETRIEVER_CACHE, else ~/.cache/retriever/embeddings"))
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="encode everything again; write no cache")] = False,
    limit: Annotated[
        Optional[int], typer.Option("--limit", help="only the first N pairs of each file: a smoke test, "
                                    "scores not comparable " + default("every pair"))
    ] = None,
) -> None:
    """Score raw and calibrated embeddings on STS (Spearman x100), QNLI (ROC-AUC x100) and retrieval (nDCG@10)."""
    from retriever.evaluation.runner import plan_benchmark, run_benchmark

    from retriever.errors import RetrieverError

    if beir_path is not None:
        if datasets.strip().lower() != "beir":
            raise RetrieverError(f"unexpected argument {beir_path!r}: a folder follows only `beir` (beir PATH)")
        datasets = f"beir:{beir_path}"
    elif datasets.strip().lower() == "beir":
        raise RetrieverError("beir needs a folder: retriever bench beir PATH")
    started = time.perf_counter()
    plan = plan_benchmark(datasets, calibrator, data_dir, layout, fit_on, seed, limit, lexical, plot, fit_queries,
                          mode)
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.progress import stderr_console

    encoder = Encoder(model, pooling, layers, max_length, device, dtype, batch_size, runtime=runtime)
    cached = CachedEncoder(encoder, None if no_cache else resolve_cache_dir(cache_dir))
    log = lambda line: stderr_console.print(terminal_safe(line), markup=False, highlight=False)  # noqa: E731
    report = run_benchmark(plan, cached, progress=True, log=log)
    where = "no disk cache" if cached.folder is None else f"cache {cached.folder}"
    stderr_console.print(
        f"encoded {cached.encoded:,} new sentences ({where}); "
        f"{time.perf_counter() - started:.1f} s in all",
        markup=False,
        highlight=False,
    )
    if json_output:
        print_json(report.to_json())  # one line, as every other --json
    else:
        _print_tables(report)


def _print_tables(report) -> None:
    from rich.console import Console

    from retriever.evaluation.runner import lexical_table, retrieval_table, score_table

    # Off a terminal (a pipe, a file) rich would wrap at 80 columns; the Table-2 layout needs about 150.
    console = Console(width=None if sys.stdout.isatty() else 200)
    settings = report.settings
    pooling = f"layers {','.join(map(str, settings['layers']))}" if settings.get("layers") else settings["pooling"]
    title = (
        f"{settings['model']} · {pooling} · max_length {settings['max_length']} · {settings['dtype']} · "
        f"fit on {settings['fit_on']} · seed {settings['seed']}"
    )
    # STS and QNLI here, under their caption; retrieval's nDCG only in its own table below, shown once.
    scored = [record for record in report.results if record["metric"] in ("spearman", "auc")]
    if scored:
        headers, rows = score_table(scored)
        note = ("Spearman x100 of cosine vs gold on test splits (STS-12..16: wmean and all); QNLI: ROC-AUC x100 on "
                "dev")
        _print_table(console, title, headers, rows, note)
    headers, rows = retrieval_table(report.results)
    if rows:
        heading = "Retrieval through the index (BEIR metrics)"
        _print_table(console, heading if scored else f"{title} · {heading}", headers, rows,
                     "x100; calibrators fitted on each corpus by the index build; (keyword), (hybrid): that search "
                     "mode on the same index; nDCG@10 ignores a hit that is the query itself (its id and text)")
    if report.lexical is not None:
        headers, rows = lexical_table(report.lexical)
        _print_table(console, "Similarity vs lexical overlap (BERT-flow Table 6)", headers, rows,
                     f"Spearman x100 over {report.lexical['pairs']} STS-B dev pairs")


def _print_table(console, title: str, headers: list[str], rows: list[list], note: str) -> None:
    from rich.table import Table
    from rich.text import Text

    from retriever.evaluation.runner import format_score

    # Title and note as lines of their own: as table title/caption rich would wrap them to the table's width. Names
    # (model, data set folders) are the user's: no markup read from them, control characters escaped.
    console.print(terminal_safe(title), style="bold", markup=False, highlight=False)
    table = Table()
    for index, header in enumerate(headers):
        table.add_column(Text(terminal_safe(str(header))), justify="left" if index == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(Text(terminal_safe(format_score(value))) for value in row))
    console.print(table)
    console.print(note + "\n", style="dim", markup=False, highlight=False)
