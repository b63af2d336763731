"""build, list, search, show, add, delete, compact, refit, check, info, verify, remove: option parsing and rendering
around `retriever.index.Index` and `retriever.versions.folder`.

Every command finds its indexes through `resolve_index_dir` (--index-dir, else $RETRIEVER_HOME, else
~/.local/share/retriever/indexes), so it works the same from any folder, and names that folder absolutely."""

from __future__ import annotations

import json
import sys
import textwrap
import warnings
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from cli import options
from cli.interrupts import on_interrupt
from cli.options import default
from cli.output import print_json
from retriever.defaults import DEFAULT_FIT_SAMPLE
from retriever.encode.passages import MAX_PASSAGES
from retriever.errors import RetrieverError
from retriever.files.folder import FOLDER_KEY
from retriever.versions.home import NAME_RULE, check_name, index_options, resolve_index_dir
from retriever.progress import stderr_console
from retriever.text import counted, counted_queries, escape_undecodable, terminal_safe

stdout = Console(soft_wrap=True)
Calibrator = Annotated[str, typer.Option("--calibrator", "-c", help=options.CALIBRATORS)]
FitQueries = Annotated[Optional[Path], typer.Option(
    "--fit-queries", help="example queries (.txt, one per line, or BEIR queries.jsonl), no labels: the calibrator "
    "is fitted on the documents plus these, so it also fits what users search with " + default("none: documents only"))]
Seed = Annotated[Optional[int], typer.Option(
    "--seed", min=0, max=2**64 - 1, help="seed for the flow's fit (deterministic per seed) " + default("0"))]
Json = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
# What an interrupted write leaves: every write builds a new version and swaps it in only when complete.
UNCHANGED = "index '{name}' is unchanged (the previous version is intact)"



def _say(line: str) -> None:
    """One message on stderr, as plain text (no rich markup), control characters escaped, and unwrapped, so a
    hint pastes as one command."""
    stderr_console.print(terminal_safe(line), markup=False, highlight=False, soft_wrap=True)


def _home(index_dir: str | None) -> Path:
    return resolve_index_dir(index_dir)


def _one_name(positional: str | None, name: str | None) -> str | None:
    """The index a command names, as an argument or with --name (every command takes --name); both must agree."""
    if positional is not None and name is not None and positional != name:
        raise RetrieverError(f"two different indexes named: '{positional}' and --name '{name}'")
    return positional or name


def _index_then(arguments: list[str], name: str | None, command: str, what: str) -> tuple[str | None, str]:
    """The arguments of a command that takes [INDEX] WHAT (show, add, rollback): (the index they or --name name,
    or None; WHAT). Told apart by their number: WHAT alone, or the index before it."""
    if len(arguments) > 2:
        raise RetrieverError(f"{command} takes one {what} (and, before it, the index if --name is not given)")
    return _one_name(arguments[0] if len(arguments) == 2 else None, name), arguments[-1]


def _pick(home: Path, name: str | None, writing: bool = False) -> str:
    from retriever.versions.catalog import pick_index

    chosen = pick_index(home, name, writing)
    if name is None:
        _say(f"using index '{chosen}'")
    return chosen


def _plain(text: str) -> Text:
    """Stored or user text for a table cell or title: no rich markup read from it, control characters escaped."""
    return Text(terminal_safe(text))


def _snippet(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _report(verb: str, summary, extra: str = "", notes: bool = True) -> None:
    for note in summary.notes if notes else ():
        _say(note)
    _say(f"{verb} index '{summary.name}': {counted(summary.documents, 'document')} ({summary.changed:,} "
         f"{extra or 'changed'}) in {summary.seconds:.1f}s")


def _folder_options(corpus: Path | list[Path], include: list[str] | None, exclude: list[str] | None, strict: bool,
                    corpus_files: bool = False):
    """--include, --exclude, --strict and --corpus-files as the library takes them; refused where CORPUS is not a
    folder (and the first three beside --corpus-files, which reads every corpus file)."""
    from retriever.files.folder import FolderOptions

    from retriever.files.folder import is_file_list

    if strict and is_file_list(corpus):  # your files named one by one: stop at one that cannot be read
        if include or exclude or corpus_files:
            raise RetrieverError("--include, --exclude and --corpus-files choose the files of a folder; files named "
                                 "one by one are read as named")
        return FolderOptions(strict=True)
    if (include or exclude or strict or corpus_files) and not (isinstance(corpus, Path) and corpus.is_dir()):
        raise RetrieverError("--include, --exclude, --strict and --corpus-files choose the files of a folder; "
                             f"{corpus if isinstance(corpus, Path) else 'files named one by one'} is not a folder")
    if corpus_files and (include or exclude or strict):
        raise RetrieverError("--include, --exclude and --strict choose among your files; a folder of --corpus-files "
                             "is read whole")
    return FolderOptions(tuple(include or ()), tuple(exclude or ()), strict=strict, corpus_files=corpus_files)


def build(
    corpora: Annotated[list[Path], typer.Argument(
        help="a corpus file: .txt (one document per line), BEIR .jsonl, .csv/.tsv with id,text, or .gz of them; or "
        "a folder of your files, one document each (Markdown, HTML, reStructuredText, text, PDF, Word; a .txt in a "
        "folder is one document), with either engine (--corpus-files: a folder of corpus files); or one or more of "
        "your files named one by one (.md, .html, .rst, .pdf, .docx; several need --name)", show_default=False,
        metavar="CORPUS...")],
    name: Annotated[Optional[str], typer.Option(
        "--name", "-n", help=f"index name: {NAME_RULE} " + default("the corpus file's stem, or the folder's name"))] = None,
    include: Annotated[Optional[list[str]], typer.Option(
        "--include", help="a folder: read only the files this pattern names (git's syntax from the folder, e.g. "
        "'*.md' or 'docs/**'; repeat for more) " + default("every file of a format above"))] = None,
    exclude: Annotated[Optional[list[str]], typer.Option(
        "--exclude", help="a folder: leave out the files this pattern names (as --include; hidden files and what "
        ".gitignore or .retrieverignore files ignore are always left out) " + default("none"))] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="a folder: stop at the first file that cannot be read (by default it is skipped with a "
        "line saying why)")] = False,
    corpus_files: Annotated[bool, typer.Option(
        "--corpus-files", help="a folder: it holds corpus files (.txt one document per line, .jsonl, .csv/.tsv, .gz "
        "of them), read in name order, not your files one document each")] = False,
    vectors: Annotated[Optional[Path], typer.Option(
        "--vectors", help="precomputed raw vectors: a .npy or a folder of .npy shards, row i = document i, made by "
        "the encoder --model/--pooling/--layers/--max-length name (e.g. by `retriever encode`); nothing is encoded, "
        "and each document stays one vector unless --vector-spans says which passage each vector is "
        + default("none: encode the corpus"))] = None,
    vector_spans: Annotated[Optional[Path], typer.Option(
        "--vector-spans", help="with --vectors: a .npy of (document, start, end) integer rows, row i saying which "
        "passage vector i is (documents numbered from 0 in corpus order, ascending; characters start to end of "
        "its text) " + default("none: vector i is document i"))] = None,
    model: options.Model = None,
    pooling: options.Pooling = "last-avg",
    layers: options.Layers = None,
    max_length: options.MaxLength = None,
    calibrator: Calibrator = "auto",
    seed: Seed = None,
    fit_sample: Annotated[int, typer.Option(
        "--fit-sample", help="fit the calibrator on at most this many vectors (uniform, seeded by --seed)")] = DEFAULT_FIT_SAMPLE,
    fit_queries: FitQueries = None,
    index_type: Annotated[str, typer.Option(
        "--index-type", **options.choice(options.INDEX_TYPES),
        help="auto: by corpus size and memory; flat: exact; hnsw, ivf: approximate; ivfpq: compressed")] = "auto",
    opq: Annotated[bool, typer.Option("--opq", help="ivfpq: rotate with OPQ before quantizing")] = False,
    fresh: Annotated[bool, typer.Option(
        "--fresh", help="start over even if a killed build of this corpus can be resumed")] = False,
    replace: Annotated[bool, typer.Option(
        "--replace", help="build over an index of this name (its current version is kept: `retriever versions`, "
        "`retriever rollback`)")] = False,
    device: options.Device = "auto",
    dtype: options.Dtype = "fp32",
    batch_size: options.BatchSize = None,
    runtime: options.Runtime = "auto",
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = None,
    engine: Annotated[str, typer.Option(
        "--engine", **options.choice(("local", "ray")),
        help="local: this process; ray: a Ray cluster (pip install 'retriever\\[ray]')")] = "local",
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", help="ray: 'auto' or HOST:PORT of a running cluster " + default("start one on 127.0.0.1 "
                                                                                         "for this build"))] = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="ray: encode actors " + default("one per GPU; locally, one using every core but one"))] = None,
    gpus_per_worker: Annotated[Optional[float], typer.Option(
        "--gpus-per-worker", help="ray: GPUs each encode actor holds " + default("1 where the cluster has GPUs, "
                                                                                 "else 0"))] = None,
    batch_rows: Annotated[int, typer.Option(
        "--batch-rows", help="ray: documents per encode call of an actor (larger pads less)")] = 16384,
    passages: Annotated[bool, typer.Option(
        "--passages/--no-passages", help="cut a document longer than the encoder reads into overlapping passages, "
        "a vector each, the document scoring by its best (--no-passages: one vector per document, its text past "
        "--max-length unseen by dense search)")] = True,
    passage_window: Annotated[Optional[int], typer.Option(
        "--passage-window", help="tokens per passage, title included " + default("64, or the encoder's max length if less"))] = None,
    passage_overlap: Annotated[Optional[int], typer.Option(
        "--passage-overlap", help="tokens a passage repeats from the one before " + default("an eighth of the "
                                                                                             "window"))] = None,
) -> None:
    """Build a calibrated index of CORPUS: encode, fit the calibrator, store FAISS + SQLite.

    The calibrator is fitted unsupervised on a sample of the corpus (--fit-sample); a corpus too small for it is
    built uncalibrated, with a warning. With --vectors nothing is encoded. Streamed in chunks: a killed build re-run
    with the same corpus and encoder settings resumes from its last finished chunk (--fresh starts over). A build
    refuses at once while another process writes the same index (other writes wait their turn). With --engine ray
    the corpus is read and encoded on a Ray cluster and the segments written there; the index folder must be on
    storage every node sees."""
    # Everything that needs no corpus read comes first: a bad name or index folder fails in one line, at once.
    home = _home(index_dir)
    corpus: Path | list[Path] = corpora[0] if len(corpora) == 1 else corpora
    if isinstance(corpus, list) and name is None:
        raise RetrieverError("several files make one index: name it with --name")
    if isinstance(corpus, list) and (vectors is not None or engine != "local"):
        raise RetrieverError("files named one by one are read and encoded here: drop --vectors and --engine ray, or "
                             "give one corpus file or folder")
    name = check_name(name) if name is not None else _name_from(corpus)
    from retriever.encode.passages import PassageSettings
    from retriever.index import Index

    if not passages and (passage_window is not None or passage_overlap is not None):
        raise RetrieverError("--passage-window and --passage-overlap cut documents into passages: drop them or "
                             "--no-passages")
    # What a re-run takes over: a corpus file's finished chunks (not a folder's files or files named one by one,
    # read and encoded again).
    resumable = not isinstance(corpus, list) and (corpus_files or not Path(corpus).is_dir())
    resume = ("re-run the same command to build it" if not resumable else
              "re-run the same command to resume" if not fresh else "re-run it without --fresh to resume")
    existed = (home / name).exists()
    on_interrupt((UNCHANGED.format(name=name) if existed else f"index '{name}' was not built") + f"; {resume}")
    ray_options = None
    if engine == "ray":
        from retriever.engines.ray_build import RayOptions

        ray_options = RayOptions(ray_address, workers, gpus_per_worker, batch_rows)
    elif any(value is not None for value in (ray_address, workers, gpus_per_worker)):
        raise RetrieverError("--ray-address, --workers and --gpus-per-worker are for --engine ray")
    summary = Index.build(
        corpus, name, home, vectors=vectors, engine=engine, ray_options=ray_options, model=model, pooling=pooling,
        layers=layers, max_length=max_length,
        calibrator=calibrator, calibrator_options={"seed": seed} if seed is not None else None, fit_sample=fit_sample,
        index_type=index_type, index_options={"opq": True} if opq else None, device=device, dtype=dtype,
        batch_size=batch_size, runtime=runtime, encoding=encoding, resume=not fresh, progress=True,
        fit_queries=fit_queries,
        replace=replace, passages=PassageSettings(passage_window, passage_overlap, enabled=passages),
        vector_spans=vector_spans, folder=_folder_options(corpus, include, exclude, strict, corpus_files),
    )
    _report("built", summary, "encoded" if vectors is None else "indexed", notes=False)  # shown as they came
    from retriever.versions.catalog import describe_calibrator
    from retriever.versions.integrity import read_manifest

    _say(f"calibrator: {describe_calibrator(read_manifest(Path(summary.folder), name=name))}")
    _say(f"version {summary.version} written to {summary.folder}" + (" (the version it replaced is kept: retriever versions "
                                            f"{index_options(home, name)})" if existed else ""))
    if vectors is None:
        share = summary.timings["encode"] / summary.seconds if summary.seconds else 0.0
        _say("; ".join(filter(None, (_long_documents(summary), f"encoding took {share:.0%} of the time"))))
    _say(f"search it with: retriever search \"...\" {index_options(home, name)}")


def _long_documents(summary) -> str:
    """What became of the documents longer than the encoder reads: cut into passages, or truncated ("" for no
    such document: a count of none is no news)."""
    said = []
    if summary.cut:
        said.append(f"{counted(summary.cut, 'document')} longer than the encoder reads cut into passages "
                    f"({counted(summary.passages, 'vector')} in all)")
    if summary.truncated and summary.cut:  # cut into passages as far as a document's passages may go
        said.append(f"{counted(summary.truncated, 'document')} longer than {MAX_PASSAGES:,} passages: dense search "
                    f"reads the first {MAX_PASSAGES:,} of {'it' if summary.truncated == 1 else 'each'}, keyword "
                    f"search all of {'it' if summary.truncated == 1 else 'them'}")
    elif summary.truncated:
        said.append(f"{counted(summary.truncated, 'document')} truncated at the max length")
    return "; ".join(said)


def _name_from(corpus: Path) -> str:
    """The default index name, the corpus file's stem (corpus.jsonl.gz -> corpus), when it obeys the rule."""
    if corpus.is_dir():  # a folder of files: its own name (of `.`, the current folder's)
        corpus = Path(corpus.resolve().name)
    name = corpus.name
    for suffix in reversed(corpus.suffixes):
        name = name.removesuffix(suffix) if suffix.lower() in (".gz", ".txt", ".jsonl", ".csv", ".tsv", ".md",
                                                                ".markdown", ".html", ".htm", ".rst", ".pdf",
                                                                ".docx") else name
    name = name or corpus.stem
    try:
        return check_name(name)
    except RetrieverError:
        raise RetrieverError(f"the corpus file's stem {name!r} is not a valid index name (a name is {NAME_RULE}); "
                             "pass --name") from None


def list_indexes(
    as_json: Annotated[bool, typer.Option("--json", help=(
        'print {"index_dir", "indexes": [{"name", "version", "documents", "passages", "model", "calibrator", '
        '"calibrator_asked" (after a fallback), "hybrid_weight", "index_type", "written", "folder", "fields"} (a '
        'damaged one: '
        '"name", "written", "folder", "problem")], "interrupted_builds": [{"name", "documents", "encoded", "model", '
        '"since", "folder"}]} instead of a table'))] = False,
    index_dir: options.IndexDir = None,
) -> None:
    """List the indexes in the index folder: documents, model, calibrator, index type, when last written."""
    from retriever.versions.catalog import describe_indexes, interrupted_builds

    home = _home(index_dir)
    records = describe_indexes(home)
    interrupted = interrupted_builds(home)
    if as_json:
        print_json({"index_dir": str(home), "indexes": records, "interrupted_builds": interrupted})
        return
    for build in interrupted:
        done = (f"{build['encoded']:,} of {counted(build['documents'], 'document')} encoded"
                if build["documents"] is not None else "reading the corpus")
        _say(f"interrupted build of '{build['name']}' ({done}, since {build['since'][:16].replace('T', ' ')} UTC): "
             f"run the same build command again to resume it, or remove {build['folder']} to drop it")
    if not records:
        _say(f"no index in {home}; build one with: retriever build CORPUS {index_options(home)}".rstrip())
        return
    stdout.print(_plain(f"indexes in {home}"), soft_wrap=False, overflow="fold")  # a long home folds, whole
    # A name is what a user types: it is never broken. Beside the other columns where it fits; else on a line of its
    # own above its model (as `search` stacks long ids above their text); where even that column would be too
    # narrow for it, each index is a block of its own lines. The short fields never wrap; a model's folder path and
    # the calibrator fold.
    fields = [record for record in records if record.get("fields")]
    reasons: list[str] = []
    rows = []
    for record in records:
        written = datetime.fromisoformat(record["written"]).strftime("%Y-%m-%d %H:%M")
        if "problem" in record:
            rows.append((record["name"], "", "", "", written, record["problem"]))
            continue
        # The cell says what was chosen; why (auto's evidence) goes under the table, whole: folded into a
        # column of 80 it was unreadable.
        calibrator, _, why = record["calibrator"].partition(" (")
        if why:
            reasons.append(f"'{record['name']}' {calibrator}: {why[:-1] if why.endswith(')') else why}")
        if "calibrator_asked" in record:
            calibrator += f" ({record['calibrator_asked']} asked: too few documents)"
        calibrator += f"\nhybrid {record['hybrid_weight']}"
        documents = f"{record['documents']:,}" + (f"\n{record['passages']:,} passages"
                                                  if record.get("passages", record["documents"]) != record["documents"]
                                                  else "")
        rows.append((record["name"], documents, record["model"], record["index_type"], written, calibrator))
    names = max(len(row[0]) for row in rows)
    counts = max([len(line) for row in rows for line in row[1].split("\n")] + [len("documents")])
    # Borders and padding (1 + 3 per column) and the least widths of type (5), written (16) and calibrator (10).
    beside = 1 + 3 * 5 + counts + 5 + 16 + 10
    if names + 3 + 16 + beside <= stdout.width:
        layout = "columns"
    elif max(names, 16) + beside <= stdout.width:
        layout = "stacked"
    else:
        for name, documents, model, index_type, written, calibrator in rows:
            stdout.print(Text(terminal_safe(name), style="bold"), soft_wrap=True)
            details = (f"documents {documents.replace(chr(10), ', ')} · model {model} · type {index_type} · "
                       f"written {written} UTC · calibrator {calibrator.replace(chr(10), ', ')}")
            stdout.print(_plain(textwrap.fill(details, width=max(stdout.width, 20), initial_indent="  ",
                                              subsequent_indent="  ", break_long_words=False)), soft_wrap=True)
        layout = "blocks"
    table = Table()
    if layout == "stacked":
        table.add_column("name / model", overflow="fold", min_width=max(names, 16))
    else:
        table.add_column("name", no_wrap=True, min_width=max(4, names))
    table.add_column("documents", justify="right", no_wrap=True, min_width=counts)
    if layout != "stacked":
        table.add_column("model", overflow="fold", min_width=16)
    table.add_column("type", no_wrap=True, min_width=5)
    table.add_column("written (UTC)", no_wrap=True, min_width=16)
    table.add_column("calibrator", overflow="fold", min_width=10)
    for name, documents, model, index_type, written, calibrator in rows:
        if layout == "stacked":
            cells = [Text.assemble((terminal_safe(name), "bold"), "\n", terminal_safe(model)), documents]
        else:
            cells = [_plain(name), documents, _plain(model)]
        table.add_row(*cells, _plain(index_type), written, _plain(calibrator))
    if layout != "blocks":
        stdout.print(table)
    for reason in reasons:
        stdout.print(_plain(reason))
    for record in fields:  # under the table: a column would not fit 80 columns
        stdout.print(_plain(f"'{record['name']}' metadata fields (--where): {', '.join(record['fields'])}"))


def search(
    query: Annotated[Optional[str], typer.Argument(help="the query text", show_default=False)] = None,
    name: options.IndexName = None,
    k: options.K = 10,
    queries: Annotated[Optional[Path], typer.Option(
        "--queries", help=".txt (one per line) or BEIR queries.jsonl " + default("none: search QUERY"))] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='one JSON line per query: {"query_id", "query", "mode", "results": [{"rank", "doc_id", "score", '
        '"dense_score", "keyword_score", "dense_rank", "keyword_rank", "title", "text", "metadata", "passage", '
        '"span", "page", "length"}]} (query_id null for QUERY; a side not searched: null)')] = False,
    full: Annotated[bool, typer.Option(
        "--full", help="show each result's text, wrapped: a long document's match with the text around it "
        "(default: a one-line snippet)")] = False,
    nprobe: options.NProbe = None,
    ef_search: options.EfSearch = None,
    rerank: options.Rerank = None,
    mode: options.Mode = None,
    fusion: options.Fusion = None,
    weight: options.Weight = None,
    space: options.Space = "calibrated",
    where: options.Where = None,
    min_score: options.MinScore = None,
    device: options.Device = "auto",
    runtime: options.Runtime = "auto",
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = None,
) -> None:
    """Search an index with one QUERY or a --queries file: dense through the index's own encode path, keyword
    (BM25), or both fused (hybrid, the default where the index has a keyword index).

    Stored text is printed with control characters escaped (\\x1b, \\u202e): a document cannot drive the terminal.
    --json is exact JSON, with those characters as \\u escapes."""
    from retriever.corpus import read_queries
    from retriever.filters import FilterWarning, filter_notes
    from retriever.index import Index
    from retriever.search.options import SearchOptions
    from retriever.search.fusion import score_meaning
    from retriever.search.results import search_record
    from retriever.text import check_queries

    if (query is None) == (queries is None):
        raise RetrieverError('give either a query ("...") or --queries FILE' + (", not both" if query is not None
                                                                                  else ""))
    if query is not None:
        check_queries([query])  # before an index is picked or opened
    settings = SearchOptions(k=k, mode=mode, fusion=fusion, weight=weight, where=where, min_score=min_score,
                             space=space, nprobe=nprobe, ef_search=ef_search, rerank=rerank)
    home = _home(index_dir)
    index = Index.open(_pick(home, name), home, device=device, runtime=runtime)
    # More than the index holds would allocate room for nothing; the mode shown is the one the index searches in.
    settings = replace(settings, k=min(k, max(len(index), 1)))
    resolved = settings.resolved(index.name, index.snapshot.has_keywords, index.snapshot.manifest.hybrid)
    mode = resolved.mode
    for note in filter_notes(settings.where, index.snapshot.manifest.metadata_fields, index.snapshot.field_kinds):
        _say(f"note: {note}")
    with warnings.catch_warnings():  # the notes above said them
        warnings.simplefilter("ignore", FilterWarning)
        if queries is None:
            batch = [(None, query)]
            results = [index.search(query, settings)]
        else:
            batch = read_queries(queries, encoding=encoding)
            results = index.search([text for _, text in batch], settings, progress=True)
    for (query_id, text), hits in zip(batch, results):
        if as_json:
            print_json(search_record(query_id, text, hits, mode))
        else:
            _hits_table(text if query_id is None else f"{query_id}: {text}", hits, full, mode, min_score,
                        score_meaning(resolved))
            if mode in ("keyword", "hybrid") and not _has_words(text):  # "no hits" alone read as no match found
                _say("note: the query holds no word keyword search reads (only punctuation or symbols)"
                     + ("; ranked by the dense side alone" if mode == "hybrid" else ""))
            if full and any(_in_context(hit)[1] for hit in hits):
                _say(f"a long document shows its match with {CONTEXT_CHARS:,} characters either side; the whole of "
                     f"one: retriever show {index.name} DOC_ID")


def _has_words(text: str) -> bool:
    """Whether keyword search reads any word of TEXT (its tokenizer's terms: letters, digits, their marks)."""
    from retriever.store.keywords import Tokenizer

    return bool(Tokenizer.get()(text))


# `search --full`: this much of a long document's text either side of where it matched.
CONTEXT_CHARS = 600


def _in_context(hit) -> tuple[Text, bool]:
    """HIT's match in its context: the passage (bold where it is not the whole text) with up to CONTEXT_CHARS
    of the text either side, cut at word boundaries and marked "…"; and whether the text was cut."""
    text, (start, end) = hit.text, hit.span
    low, high = max(0, start - CONTEXT_CHARS), min(len(text), end + CONTEXT_CHARS)
    if low > 0:  # from the first whole word
        space = text.find(" ", low, start)
        low = space + 1 if space >= 0 else low
    if high < len(text):
        space = text.rfind(" ", end, high)
        high = space if space >= 0 else high
    shown = Text("… " if low > 0 else "")
    whole = (start, end) == (0, len(text))
    shown.append(terminal_safe(text[low:start]))
    shown.append(terminal_safe(text[start:end]), style=None if whole else "bold")
    shown.append(terminal_safe(text[end:high]))
    if high < len(text):
        shown.append(" …")
    return shown, low > 0 or high < len(text)


def _hits_table(title: str, hits, full: bool, mode: str = "dense", min_score: float | None = None,
                scores: str | None = None) -> None:
    """One query's results. A doc id is shown whole, on one line while it fits (it is what `show` and `delete`
    take); the text is a one-line snippet of where the document matched (its best passage) filling the rest of the
    width, or with FULL all of it, wrapped. Where ids leave the text too little width, each id goes on a line of
    its own above its text. Hybrid
    results say where each side ranked them ("3/-": third in the dense list, not in the keyword list). SCORES: what
    the score is (`fusion.score_meaning`), said under the table."""
    title = terminal_safe(title)
    if not hits and min_score is not None:
        stdout.print(Text(f"{title if full else _snippet(title, stdout.width)}\n  no good match: no hit has a dense "
                          f"score of at least {min_score:g}"))
        return
    if not hits:  # a filter that selects nothing, or keywords no document holds: said, not an empty table
        stdout.print(Text(f"{title if full else _snippet(title, stdout.width)}\n  no hits"))
        return
    rows = [(str(hit.rank), f"{round(hit.score, 3) + 0.0:.3f}", escape_undecodable(hit.doc_id))  # no -0.000
            for hit in hits]
    sides = [f"{hit.dense_rank or '-'}/{hit.keyword_rank or '-'}" for hit in hits] if mode == "hybrid" else None
    rank, score, ids = (max([cell_len(row[i]) for row in rows] + [len(header)])
                        for i, header in enumerate(("rank", "score", "doc id")))
    # Widths set here, not left to rich, which would squeeze the ids first. Overhead: 1 + 3 per column (a border
    # and a space each side). Beside whole ids, a text under 30 columns says too little (`fileinput.filelinen…`
    # at 80 columns): then the ids are STACKED, each above its text in one column that takes the width.
    side = max([cell_len(cell) for cell in sides] + [len("d/k")]) + 3 if sides else 0
    fixed = 13 + rank + score + side
    stacked = stdout.width - fixed - ids < 30
    room = max(stdout.width - fixed + 3 if stacked else stdout.width - fixed - ids, 10)
    table = Table(title=Text(title if full else _snippet(title, stdout.width)), title_justify="left")
    table.add_column("rank", justify="right", no_wrap=True, width=rank)
    table.add_column("score", justify="right", no_wrap=True, width=score)
    if sides:
        table.add_column("d/k", justify="right", no_wrap=True, width=side - 3)
    if not stacked:
        table.add_column("doc id", overflow="fold", width=ids)
    table.add_column("doc id / text" if stacked else "text", overflow="fold", max_width=room)
    for number, ((rank, score, doc_id), hit) in enumerate(zip(rows, hits)):
        cell = Text()
        if hit.title:
            cell.append(terminal_safe(hit.title if full else " ".join(hit.title.split())), style="bold")
            cell.append(" ")
        if hit.page is not None:  # a PDF read from a folder: the page the match starts on
            cell.append(f"p. {hit.page} ", style="dim")
        # The snippet is where the document matched: its best passage ("..." where that is not its start). A text
        # that opens with its title (a Markdown file's first heading is both) does not show it twice.
        passage = " ".join(hit.passage.split())
        shown_title = " ".join(hit.title.split()) if hit.title else ""
        if hit.span[0] == 0 and shown_title and passage.startswith(shown_title + " "):
            passage = passage[len(shown_title) + 1:]
        snippet = ("… " if hit.span[0] > 0 else "") + passage
        cell.append(_in_context(hit)[0] if full else Text(terminal_safe(snippet)))
        if not full:
            cell.truncate(room, overflow="ellipsis")
        shown = [Text.assemble(doc_id, "\n", cell)] if stacked else [Text(doc_id, overflow="fold"), cell]
        table.add_row(rank, score, *([sides[number]] if sides else []), *shown)
    stdout.print(table)
    if scores and mode == "hybrid":  # a cosine and BM25 say what they are; a fused score does not
        # Under the table, wrapped to the console's width (a narrow table would fold it into a column).
        stdout.print(Text(f"score: {scores}", style="dim"), soft_wrap=False)


def show(
    ids: Annotated[list[str], typer.Argument(
        help="DOC_ID (the index by --name, or the latest), or INDEX DOC_ID", show_default=False, metavar="[INDEX] DOC_ID")],
    name: options.IndexName = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='print {"doc_id", "title", "text", "source", "line", "metadata"} instead of a table')] = False,
    index_dir: options.IndexDir = None,
) -> None:
    """Show one stored document in full: id, title, text, and the file (and line, of a corpus file) it came from.

    Control characters are shown escaped (\\x1b, \\u202e); --json is exact JSON, with them as \\u escapes."""
    from retriever.index import Index

    index, doc_id = _index_then(ids, name, "show", "document id")
    home = _home(index_dir)
    index = _pick(home, index)
    opened = Index.open(index, home, device="cpu")
    row = opened.document(doc_id)
    if row is None:
        raise RetrieverError(f"no document {doc_id!r} in index '{index}'")
    record = {key: row[key] for key in ("doc_id", "title", "text", "source", "line", "metadata")}
    if as_json:
        print_json(record)
        return
    metadata = record.pop("metadata") or {}
    if metadata.get(FOLDER_KEY) == record["source"] and isinstance(metadata.get("path"), str):
        # A file read from a folder: where it lies, not the folder and a line number (a file is one document).
        file = str(Path(record.pop("source"), metadata["path"]))
        record.pop("line")
        record["file"] = file
    table = Table(show_header=False, title=_plain(f"index '{index}'"), title_justify="left")
    table.add_column("field", no_wrap=True, style="bold")
    table.add_column("value", overflow="fold")
    for key, value in record.items():
        shown = "" if value is None else str(value)
        table.add_row("id" if key == "doc_id" else key,
                      Text(escape_undecodable(shown)) if key in ("doc_id", "source", "file") else _plain(shown))
    for key, value in metadata.items():  # as JSON: a number and the same digits as text read differently
        table.add_row(_plain(key), _plain(json.dumps(value, ensure_ascii=False)), style="dim")
    stdout.print(table)


def add(
    arguments: Annotated[list[str], typer.Argument(
        help="CORPUS: new documents, in any corpus format build accepts, a folder of your files or one of them "
        "(the index by --name, or the only one), or INDEX CORPUS", show_default=False, metavar="[INDEX] CORPUS")],
    name: options.IndexName = None,
    include: Annotated[Optional[list[str]], typer.Option(
        "--include", help="a folder: read only the files this pattern names (as build's) "
        + default("every file build reads"))] = None,
    exclude: Annotated[Optional[list[str]], typer.Option(
        "--exclude", help="a folder: leave out the files this pattern names (as build's) " + default("none"))] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="a folder: stop at the first file that cannot be read")] = False,
    vectors: Annotated[Optional[Path], typer.Option(
        "--vectors", help="their precomputed raw vectors (.npy or folder of shards), made with the index's encoder "
        + default("none: encode them"))] = None,
    upsert: Annotated[bool, typer.Option(
        "--upsert", help="replace the documents whose ids are already in the index (else they are refused)")] = False,
    device: options.Device = "auto",
    encoding: options.Encoding = "utf-8",
    index_dir: options.IndexDir = None,
) -> None:
    """Add documents, calibrated with the saved calibrator (no refit).

    They are encoded (or taken from --vectors) and written as one new segment; the rest of the index is reused as
    it is, not copied. Waits while another process writes the same index."""
    from retriever.index import Index

    name, corpus = _index_then(arguments, name, "add", "corpus")
    home = _home(index_dir)
    index = Index.open(_pick(home, name, writing=True), home, device=device)
    on_interrupt(UNCHANGED.format(name=index.name))
    summary = index.add(Path(corpus), encoding, progress=True, vectors=vectors, upsert=upsert,
                        folder=_folder_options(Path(corpus), include, exclude, strict))
    _report("updated", summary, "added")
    if vectors is None and _long_documents(summary):
        _say(_long_documents(summary))


def delete(
    doc_ids: Annotated[Optional[list[str]], typer.Argument(help="document ids to remove", show_default=False)] = None,
    name: options.IndexName = None,
    where: Annotated[Optional[str], typer.Option(
        "--where", help="delete every document this JSON filter selects (the filters of `search --where`) "
        + default("none: the ids given"))] = None,
    index_dir: options.IndexDir = None,
) -> None:
    """Delete documents by id, all or nothing, or every document a --where filter selects (searches skip them at
    once; compaction drops them).

    Waits while another process writes the same index."""
    from retriever.filters import FilterWarning
    from retriever.index import Index

    home = _home(index_dir)
    index = Index.open(_pick(home, name, writing=True), home, device="cpu")
    on_interrupt(UNCHANGED.format(name=index.name))
    with warnings.catch_warnings(record=True) as noted:  # said once: in the error, where nothing was selected
        warnings.simplefilter("always", FilterWarning)
        summary = index.delete(doc_ids, where=where)
    for note in noted:
        _say(f"{'note' if issubclass(note.category, FilterWarning) else 'warning'}: {note.message}")
    _report("updated", summary, "removed")
    if summary.documents == 0 and summary.changed:  # a filter that selected everything: the way back, said
        kept = [kept["version"] for kept in Index.versions(index.name, home) if not kept["current"]]
        if kept:
            _say(f"index '{index.name}' holds no document now; the version before is kept until the next write: "
                 f"retriever rollback {kept[0]} {index_options(home, index.name)}".rstrip())


def compact(
    index: Annotated[Optional[str], typer.Argument(help="the index to compact (or --name)", show_default=False)] = None,
    name: options.IndexName = None,
    index_dir: options.IndexDir = None,
) -> None:
    """Merge the index's segments into one and drop deleted documents for good.

    Writes also compact by themselves once many small segments or deletions pile up. Waits while another process
    writes the same index."""
    from retriever.index import Index

    home = _home(index_dir)
    index = Index.open(_pick(home, _one_name(index, name), writing=True), home, device="cpu")
    on_interrupt(UNCHANGED.format(name=index.name))
    before, version = len(index.snapshot.segments), index.snapshot.manifest.version
    summary = index.compact()
    if summary.version == version:  # nothing to merge or drop
        for note in summary.notes:
            _say(note)
        return
    _report("compacted", summary, f"deleted dropped, {counted(before, 'segment')} merged")


def sync(
    index: Annotated[Optional[str], typer.Argument(help="the index to sync (or --name)", show_default=False)] = None,
    name: options.IndexName = None,
    allow_empty: Annotated[bool, typer.Option(
        "--allow-empty", help="delete every file's documents where the folder holds no file now (refused without "
        "it: a drive not mounted, or a folder moved, looks the same)")] = False,
    index_dir: options.IndexDir = None,
) -> None:
    """Bring an index built from a folder in step with it: new files added, changed ones replaced, removed ones
    deleted, in one version; untouched files are not read again or encoded.

    The folder is read as the build read it (its --include/--exclude patterns). A file that cannot be read now is
    skipped with a line, its indexed version kept. A folder with no file left in it is refused unless
    --allow-empty. Waits while another process writes the same index."""
    from retriever.index import Index

    home = _home(index_dir)
    index = Index.open(_pick(home, _one_name(index, name), writing=True), home, device="cpu")
    on_interrupt(UNCHANGED.format(name=index.name))
    result = index.sync(progress=True, allow_empty=allow_empty)
    for note in result.notes:
        _say(note)
    _say(result.line())


def refit(
    index: Annotated[Optional[str], typer.Argument(help="the index to refit (or --name)", show_default=False)] = None,
    name: options.IndexName = None,
    calibrator: Annotated[Optional[str], typer.Option(
        "--calibrator", "-c", help=f"{options.CALIBRATORS} " + default("the index's own"))] = None,
    seed: Seed = None,
    fit_queries: FitQueries = None,
    index_dir: options.IndexDir = None,
) -> None:
    """Refit the calibrator on the stored raw vectors (no re-encoding) and rewrite the vector indexes.

    Refuses a calibrator the index holds too few documents for. Waits while another process writes the same
    index."""
    from retriever.index import Index

    home = _home(index_dir)
    index = Index.open(_pick(home, _one_name(index, name), writing=True), home, device="cpu")
    on_interrupt(UNCHANGED.format(name=index.name))
    summary = index.refit(calibrator, {"seed": seed} if seed is not None else None, fit_queries=fit_queries,
                          progress=True)
    _report("refitted", summary, "re-calibrated")


def check(
    index: Annotated[Optional[str], typer.Argument(help="the index to check (or --name)", show_default=False)] = None,
    name: options.IndexName = None,
    seed: Seed = None,
    fit_sample: Annotated[int, typer.Option(
        "--fit-sample", help="stored raw vectors the candidates are fitted on (a seeded sample)")] = DEFAULT_FIT_SAMPLE,
    as_json: Json = False,
    index_dir: options.IndexDir = None,
) -> None:
    """Does calibration help this corpus? A retrieval check on the index's own documents, without labels.

    Pseudo-queries are cut out of a sample of the documents (a title, a sentence or a run of words, the document
    without it as the target; or a few of its words, the document itself as the target) and searched through the
    raw vectors, through each calibrator `auto` considers (fitted now on the stored raw vectors) and through the
    index's own calibrator. nDCG@10 x100; the intervals (paired bootstrap over pseudo-queries) are 95% for all
    candidates together. Writes nothing."""
    from retriever.index import Index

    home = _home(index_dir)
    opened = Index.open(_pick(home, _one_name(index, name)), home, device="cpu")
    record = opened.check(fit_sample=fit_sample, seed=seed or 0, progress=not as_json)
    if as_json:
        print_json({"index": opened.name, **record})
        return
    kinds = list(record["kinds"])
    chosen, current = record["auto"]["chosen"], record["current"]
    rows = [record["none"], *record.get("candidates", [])]
    if "ndcg@10" in current and current["name"] not in {row["name"] for row in rows}:
        rows.append(current)
    scores = Table(title=_plain(
        f"retrieval check of index '{opened.name}': {counted_queries(record)} among "
        f"{counted(record['pool'], 'document')}; vs none with "
        f"its {record['confidence']:.0%} interval; kinds: of the kinds of pseudo-query, how many it improves"),
        title_justify="left")
    for column in ("calibrator", "nDCG@10", "vs none", "kinds", "note"):
        scores.add_column(column, justify="left" if column in ("calibrator", "note") else "right", no_wrap=True)
    counts = ", ".join(f"{kind} {n:,}" for kind, n in record["kinds"].items())
    per_kind = Table(title=_plain(f"nDCG@10 by kind of pseudo-query ({counts}), and MRR@10"), title_justify="left")
    for column in ("calibrator", *kinds, "MRR@10"):
        per_kind.add_column(column, justify="left" if column == "calibrator" else "right", no_wrap=True)
    for row in rows:
        note = ", ".join(mark for mark, hit in (("auto", row["name"] == chosen),
                                                ("index", row["name"] == current["name"])) if hit)
        interval = row.get("interval")
        difference = f"{row['difference']:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else ""
        better = f"{len(row['kinds_improved'])} of {len(record['voting_kinds'])}" if "kinds_improved" in row else ""
        scores.add_row(_plain(row["name"]), f"{row['ndcg@10']:.2f}", difference, better, note)
        per_kind.add_row(_plain(row["name"]), *(f"{row['ndcg@10_by_kind'].get(kind, 0):.2f}" for kind in kinds),
                         f"{row['mrr@10']:.2f}")
    stdout.print(scores)
    stdout.print(per_kind)
    verdict = ("calibration helps this corpus" if chosen != "none" else
               "calibration does not help this corpus with confidence")
    _say(f"{verdict}: auto would choose {chosen} ({record['auto']['reason']}); this index uses "
         f"{current['calibrator']}{': ' + current['name'] if current['calibrator'] != current['name'] else ''}")
    hybrid = Table(title=_plain("hybrid search's weight: what this check decides now, and what the index records "
                                "(search --weight overrides both)"), show_header=False, title_justify="left")
    for key, value in [*_hybrid_rows(record["hybrid"]["now"], "now"),
                       *_hybrid_rows({k: v for k, v in record["hybrid"]["recorded"].items() if k != "evidence"},
                                     "recorded")]:
        cell = _plain(value)
        cell.overflow = "fold"
        hybrid.add_row(key, cell)
    stdout.print(hybrid)


def verify(
    index: Annotated[Optional[str], typer.Argument(help="the index to check (or --name)", show_default=False)] = None,
    name: options.IndexName = None,
    index_dir: options.IndexDir = None,
) -> None:
    """Re-hash every file of the index against its manifest.

    Opening an index checks only the manifest's own checksum and every file's size."""
    import time

    from retriever.versions.snapshot import verify_index

    started = time.perf_counter()
    home = _home(index_dir)
    name = _pick(home, _one_name(index, name))
    manifest, checked = verify_index(name, home)
    _say(f"index '{name}' is intact: {counted(len(manifest.files), 'file')}, {checked / 2**20:,.1f} MiB "
         f"re-hashed in {time.perf_counter() - started:.1f}s")


def versions(
    index: Annotated[Optional[str], typer.Argument(help="the index whose versions to list (or --name)",
                                                   show_default=False)] = None,
    name: options.IndexName = None,
    as_json: Json = False,
    index_dir: options.IndexDir = None,
) -> None:
    """The kept versions of an index, by number: the current one and the one it replaced (the last build, add,
    delete, compact, refit or rollback). `retriever rollback VERSION` makes one current again."""
    from retriever.versions.catalog import version_records

    home = _home(index_dir)
    name = _pick(home, _one_name(index, name))
    records = version_records(home, name)
    if as_json:
        print_json({"name": name, "versions": records})
        return
    table = Table(title=_plain(f"index '{name}': {counted(len(records), 'kept version')} (* current)"),
                  title_justify="left")
    # The version is what a user copies: never wrapped. The calibrator column shows what it is (`info` has the
    # auto check's evidence), so the table fits 80 columns.
    table.add_column("version", no_wrap=True)
    table.add_column("written (UTC)", no_wrap=True)
    table.add_column("documents", justify="right", no_wrap=True)
    table.add_column("calibrator", overflow="fold")
    for record in records:
        calibrator = record.get("calibrator", record.get("problem", ""))
        shown = str(record["version"] or record["folder"])  # 0: written before versions were numbered
        table.add_row(_plain(shown + (" *" if record["current"] else "")),
                      _plain(record.get("written", "")[:16].replace("T", " ")),
                      f"{record['documents']:,}" if "documents" in record else "",
                      _plain(calibrator.split(" (")[0] if "calibrator" in record else calibrator))
    stdout.print(table)
    if records and not any(record["current"] for record in records):  # the name's link is gone; its versions are not
        newest = records[0]["version"] or records[0]["folder"]
        _say(f"no version of '{name}' is current (searches find no index of that name): "
             f"retriever rollback {newest} {index_options(home, name)}".rstrip() + " makes the newest current again")


def rollback(
    arguments: Annotated[list[str], typer.Argument(
        help="VERSION: a kept version's number, as `retriever versions` lists it (the index by --name, or the only "
        "one), or INDEX VERSION", show_default=False, metavar="[INDEX] VERSION")],
    name: options.IndexName = None,
    index_dir: options.IndexDir = None,
) -> None:
    """Make a kept version of an index current again, after checking its files. The version it replaces is
    kept, so a rollback is undone the same way. Refuses at once while another process writes the index."""
    from retriever.index import Index

    name, version = _index_then(arguments, name, "rollback", "version")
    home = _home(index_dir)
    name = _pick(home, name, writing=True)
    on_interrupt(UNCHANGED.format(name=name))
    current = next((kept["folder"] for kept in Index.versions(name, home) if kept["current"]), None)
    index = Index.rollback(name, version, home, device="cpu")
    number = index.snapshot.manifest.version or index.snapshot.folder.name
    if index.snapshot.folder.name == current:
        _say(f"index '{name}' is at version {number} already: nothing changed")
        return
    _say(f"index '{name}' is at version {number} again: {counted(len(index), 'document')}; the version it "
         f"replaced is kept (retriever versions {index_options(home, name)})")


def remove(
    index: Annotated[Optional[str], typer.Argument(help="the index to remove (or --name)", show_default=False)] = None,
    name: Annotated[Optional[str], typer.Option(
        "--name", "-n", help="the index to remove " + default("none: remove never picks one"))] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="remove without asking")] = False,
    index_dir: options.IndexDir = None,
) -> None:
    """Remove an index: its name and every version of it, for good.

    Asks first (--yes does not). Refuses at once while another process writes the index."""
    from retriever.versions.catalog import describe_indexes
    from retriever.versions.folder import remove_index

    home = _home(index_dir)
    name = _one_name(index, name)
    if name is None:
        raise RetrieverError("say which index to remove: retriever remove NAME")
    name = check_name(name)
    record = next((r for r in describe_indexes(home) if r["name"] == name), None)
    if record is None and not (home / ".versions" / name).is_dir():
        raise RetrieverError(f"no index named '{name}' in {home}")
    if not yes:
        what = f" ({counted(record['documents'], 'document')})" if record and "documents" in record else ""
        on_interrupt(UNCHANGED.format(name=name).replace(" (the previous version is intact)", ""))
        try:
            agreed = typer.confirm(f"remove index '{name}'{what} from {home}?", default=False, err=True)
        except typer.Abort as aborted:  # click's answer to Ctrl-C or to the end of input: told apart by its context
            if isinstance(aborted.__context__, KeyboardInterrupt):
                raise KeyboardInterrupt from None  # Ctrl-C at the question
            raise RetrieverError("no answer to the question (input is closed); pass --yes to remove without "
                                 "asking") from None
        if sys.stdin is None or not sys.stdin.isatty():
            print(file=sys.stderr)  # the answer was not echoed: end the question's line
        if not agreed:
            _say(f"kept index '{name}'")
            raise typer.Exit(1)
    on_interrupt(f"index '{name}' may be partly removed; run the same command again to finish")
    remove_index(home, name)
    _say(f"removed index '{name}' from {home}")


def info(
    index: Annotated[Optional[str], typer.Argument(help="the index to describe (or --name)",
                                                   show_default=False)] = None,
    name: options.IndexName = None,
    as_json: Json = False,
    index_dir: options.IndexDir = None,
) -> None:
    """Show the manifest, counts, and isotropy before and after calibration."""
    from retriever.index import Index

    home = _home(index_dir)
    details = Index.open(_pick(home, _one_name(index, name)), home, device="cpu").info()
    if as_json:  # one line, as every other --json: a pipe reads it line by line
        print_json(details)
        return
    manifest = details["manifest"]
    table = Table(title=_plain(f"index '{manifest['name']}'"), show_header=False, title_justify="left")
    encoder = manifest["encoder"]
    pooling = f"layers {encoder['layers']}" if encoder["layers"] else encoder["pooling"]
    spec = {**manifest["index"], **details["search_settings"]}
    settings = ", ".join(f"{key} {value}" for key, value in spec.items() if key != "type")
    fitted = manifest.get("fit", {})
    calibrator = json.dumps({k: v for k, v in manifest["calibrator"].items() if k != "decision"})
    decision = manifest["calibrator"].get("decision")
    if decision:  # auto: what it chose and why, then its evidence on a line of its own
        from retriever.calibration import describe_decision

        chosen = {key: value for key, value in (decision.get("chosen") or {}).items() if key != "name"}
        calibrator = describe_decision(decision) + (f"; {_pairs(chosen)}" if chosen else "")
    if "calibrator_fallback" in manifest:
        fallback = manifest["calibrator_fallback"]
        calibrator += f" ({fallback['asked']} was asked for: {fallback['reason']})"
    rows = [
        ("version", f"{details['version']} ({details['folder']})"),
        *([("read from", _read_from(manifest))] if manifest.get("source") else []),
        ("documents", f"{details['documents']:,} ({counted(details['vectors'], 'vector')} in "
                      f"{counted(len(details['segments']), 'segment')}"
                      # a deleted document's vectors are all its passages'
                      + (f", {details['vectors'] - details['passages']:,} of them held for "
                         f"{counted(details['deleted'], 'deleted document')} until compaction drops them)"
                         if details["deleted"] else ")")),
        *([("passages", f"{details['passages']:,}")] if details["passages"] != details["documents"] else []),
        ("long texts", f"cut into passages of {manifest['passages']['window']} tokens, "
                       f"{manifest['passages']['overlap']} overlapping; a document scores by its best passage"
         if manifest.get("passages") else f"one vector per document: text past {encoder['max_length']} tokens is "
                                           "seen by keyword search only"),
        ("model", f"{encoder['model']} ({pooling}, max_length {encoder['max_length']}, {encoder['dtype']})"),
        ("calibrator", calibrator),
        *([("auto check", _check_summary(decision["check"]))] if decision and decision.get("check") else []),
        *([("auto evidence", _pairs(decision.get("evidence", {})))] if decision else []),
        ("fitted on", "a calibrator fitted before the build" if fitted.get("prefitted") else
                      f"{fitted.get('sample', 0):,} of {counted(fitted.get('of', 0), 'vector')} "
                      f"(seed {fitted.get('seed', 0)})" + (f", plus {fitted['queries']:,} example quer{'y' if fitted['queries'] == 1 else 'ies'} from "
                                                           f"{fitted['queries_from']}" if "queries" in fitted else "")),
        ("index", f"{spec['type']} ({settings or 'exact'}), {manifest['dim']} dims"
                  + (f", search on {details['search_backend']}" if details["search_backend"] else "")),
        ("search modes", ", ".join(details["search_modes"]) + f"; default {details['default_mode']}"
                         + ("" if details["default_mode"] == "hybrid" else
                            " (no keyword index: `retriever compact` adds one)")),
        *_hybrid_rows(details["hybrid"]),
        ("metadata fields", ", ".join(details["metadata_fields"]) or "none"),
        ("created", manifest["created"] + (f", refitted {manifest['refitted']}" if "refitted" in manifest else "")),
        ("versions", ", ".join(f"{k} {v}" for k, v in manifest["versions"].items())),
    ]
    for stage in ("raw", "calibrated"):
        values = details["isotropy"][stage]
        if values:
            rows.append((f"isotropy ({stage})", f"mean cosine of random pairs {values['mean_cosine']:+.3f}, "
                         f"top direction holds {values['top_direction_share']:.1%} of the variance"))
    for key, value in rows:
        cell = _plain(str(value))
        cell.overflow = "fold"  # a long path folds whole: it is the one value users copy
        table.add_row(key, cell)
    stdout.print(table)


def _read_from(manifest: dict) -> str:
    """Where the index's documents were read from: a corpus file, or a folder and the patterns `sync` reads it by."""
    source, folder = escape_undecodable(str(manifest["source"])), manifest.get("folder")
    if not folder:
        return source
    patterns = "".join(f", {option} " + " ".join(repr(pattern) for pattern in folder[option])
                       for option in ("include", "exclude") if folder.get(option))
    return f"the folder {source}{patterns} (as `retriever sync` reads it again)"


def _pairs(record: dict) -> str:
    """RECORD as "key value, key value" ("directions 95% 22, 99% 24"), a nested record's pairs after its key."""
    return ", ".join(f"{key} {_pairs(value) if isinstance(value, dict) else value}" for key, value in record.items())


def _hybrid_rows(record: dict, label: str = "hybrid") -> list[tuple[str, str]]:
    """The hybrid decision (`search.fusion_check`) as `info` and `check` show it: the weight and why, then its
    evidence on a line of its own."""
    from retriever.search.fusion_check import describe

    rows = [(label, describe(record))]
    evidence = record.get("evidence")
    if evidence:
        parts = []
        for group, found in evidence["groups"].items():
            if "ndcg@10" not in found:
                continue
            scores = found["ndcg@10"]
            gap = found.get("dense_minus_keyword")
            fused = ", ".join(f"{label.split('@')[1]} {value:.2f}" for label, value in scores.items() if "@" in label)
            parts.append(f"{group} ({found['queries']:,}): dense {scores['dense']:.2f}, keyword {scores['keyword']:.2f}"
                         + (f", dense - keyword {gap['difference']:+.2f} [{gap['interval'][0]:+.2f}, "
                            f"{gap['interval'][1]:+.2f}]" if gap else "") + f"; fused at weight {fused}")
        rows.append((f"{label} evidence", f"nDCG@10 of {counted_queries(evidence)} among "
                                          f"{evidence['pool']:,} documents: " + "; ".join(parts)))
    return rows


def _check_summary(check: dict) -> str:
    """auto's retrieval check on one line: the pseudo-queries, then nDCG@10 of none and each candidate's difference."""
    kinds = ", ".join(f"{kind} {number:,}" for kind, number in check["kinds"].items())
    scores = "; ".join(f"{c['name']} {c['difference']:+.2f} [{c['interval'][0]:+.2f}, {c['interval'][1]:+.2f}]"
                       for c in check["candidates"])
    return (f"{counted_queries(check)} ({kinds}) among {check['pool']:,} documents; nDCG@10 of "
            f"none {check['none']['ndcg@10']:.2f}; against none ({check['confidence']:.0%} intervals for all "
            f"together): {scores}")


# In workflow order, as `retriever --help` lists them (cli.main registers them after `encode`).
COMMANDS = (("build", build), ("list", list_indexes), ("search", search), ("show", show), ("add", add),
            ("sync", sync), ("delete", delete), ("compact", compact), ("refit", refit), ("check", check), ("info", info),
            ("verify", verify), ("versions", versions), ("rollback", rollback),
            ("remove", remove))
