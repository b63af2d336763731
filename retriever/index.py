"""The calibrated index, as a library user meets it: `Index`, a facade over one opened version of an index
(`snapshot`, a `retriever.versions.snapshot.Snapshot`), the search layer (`retriever.search`) and the writer
(`retriever.versions.writer`).

    index = Index.build("corpus.jsonl", "notes").open()
    hits = index.search("how do I read a file", k=5, mode="hybrid")  # one query: its hits
    index.add([{"_id": "n1", "text": "a new note"}])  # records as a .jsonl holds them, or Documents
    hits = index.search("a new note")  # the index is on the version its write made

`build` streams a corpus through the pipeline stages (`retriever.engines`) and fits the calibrator unsupervised on
a sample of the corpus's own embeddings; `add` writes one new segment calibrated with the saved calibrator;
`delete` writes tombstones; `compact` merges every segment (writes also merge by themselves, by the writer's
`MergePolicy`); `refit` fits a new calibrator on the stored raw vectors and rewrites the vector indexes, without
re-encoding. Each write is one transaction that commits a new, numbered version and returns a `ChangeSummary`;
the `Index` it went through moves to that version (`summary.open()` opens it as another object). A failed or
killed write loses nothing (`retriever.versions.folder`).
"""

from __future__ import annotations

import io
import os
import threading
import time
import warnings
from dataclasses import dataclass
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retriever.calibration import (
    DEFAULT_CALIBRATOR,
    DEFAULT_FIT_SAMPLE,
    Calibrator,
    fit_calibrator,
    make_calibrator,
    too_few_to_fit,
)
from retriever.calibration.diagnostics import isotropy, retrieval_check
from retriever.calibration.linear import Identity
from retriever.calibration.pseudo_queries import CheckRounds
from retriever.corpus import Document, check_exists, corpus_format, given_documents, iter_corpus, unread_keys
from retriever.engines import ENGINES
from retriever.engines.base import BuildEngine, BuildSpec, run_build
from retriever.engines.local import LocalEngine
from retriever.engines.stages import (
    CHUNK_ROWS,
    BuildState,
    calibrated_blocks,
    check_set,
    check_vectors,
    encode_table,
    encoded_passages_path,
    passage_cutter,
    split_segment,
    fitted_query_count,
    ingest,
    with_queries,
    write_segment_vectors,
)
from retriever.engines.steps import (ChangeSummary, check_encoded_alike, fitted_out_dim, now_iso, parse_fit_queries,
                                     written_passages)
from retriever.encode.external import is_external
from retriever.encode.passages import PassageSettings
from retriever.encode.model_card import DeferredEncoder, kit_fits, kit_opener
from retriever.encode.query_kit import QueryKitEncoder, kit_may_serve
from retriever.errors import NotFoundError, RetrieverError, param
from retriever.files.folder import (BROKEN_LINK, FOLDER_KEY, UNLISTABLE, FolderOptions, FolderReport, checked_file,
                                    folder_files, is_file_list, noted_documents, read_file)
from retriever.files.readers import NoText, UnreadableFile
from retriever.filters import Filter, FilterWarning, filter_notes, parse_where
from retriever.metadata import listed_fields
from retriever.numeric import l2_normalize_in_place, row_norms
from retriever.search.fusion_check import hybrid_check, recorded_hybrid
from retriever.search.options import MODES, SearchOptions
from retriever.search.results import SearchHit, cut
from retriever.search.searcher import Searcher
from retriever.store.arrays import VectorSource, vector_source
from retriever.store.documents import DocumentTable
from retriever.store.layout import DOCUMENTS, RAW, ROWIDS, VECTORS
from retriever.store.segment import finish_segment
from retriever.store.vectors import train_template
from retriever.store.spec import IndexSpec, check_index_options
from retriever.text import check_queries, counted, id_list, query_list
from retriever.versions.catalog import version_records
from retriever.versions.folder import rollback
from retriever.versions.home import resolve_existing, resolve_index_dir
from retriever.versions.integrity import sha256_file
from retriever.versions.layout import CALIBRATOR, ENCODED, MANIFEST, SEGMENTS
from retriever.versions.snapshot import Snapshot, verify_index
from retriever.versions.writer import IndexWriter, MergePolicy

if TYPE_CHECKING:  # the encoder (and torch) loads only where text is encoded
    from retriever.encode.encoder import Encoder

# What every write of the library API merges by itself (`compact` merges everything).
MERGE_POLICY = MergePolicy()


class Index:
    """An index, opened at one version, searched and written through. A write moves the object to the version
    it wrote, as Chroma's, LanceDB's and txtai's objects see their own writes: `index.add(...)` then
    `index.search(...)` finds the new documents. (Another process's writes are seen by opening the index again;
    `ChangeSummary.open()` opens the version a write made.)

    Thread safety: `search`, `document`, `info` and `check` may run from any number of threads at once (whatever
    is loaded on first use, the model or a filter's matches, is loaded once); a search that has begun finishes on
    the version it began on. Writes may too: each takes the index's writer lock, so writes of one index (from any
    thread or process) take turns. `close` must come after every other call has returned."""

    def __init__(self, snapshot: Snapshot, *, encoder: Encoder | None = None, runtime: str = "auto",
                 searcher: Searcher | None = None, follow_writes: bool = True):
        """SNAPSHOT searched with ENCODER, already loaded (a server holding one model for many indexes, and for
        their versions; the caller vouches that it is the recorded encoder), else the recorded one loaded at the
        first search by text, its forward pass on RUNTIME (`retriever.encode.runtimes`; auto: ONNX Runtime on a
        CPU, the same vectors for less time per query, else PyTorch; "torch" or "onnx" to choose). SEARCHER: the search layer over SNAPSHOT, where the
        caller shares one (a server's batches; one searching its vectors on a distributed server's shards).
        FOLLOW_WRITES: move to the version each write makes (False: stay on SNAPSHOT, for a server that swaps
        versions itself)."""
        self.snapshot = snapshot
        self._follow_writes = follow_writes
        self._encoder = encoder
        self._runtime = runtime
        self._query_kit: QueryKitEncoder | None | bool = None  # False: looked for, none kept
        self._encoder_lock = threading.Lock()
        self._searcher = searcher or Searcher(snapshot)
        # Each filter's notes, per version (a version never changes): a search in a loop reads the fields' kinds once.
        self._filter_notes: dict[tuple[Path, str], list[str]] = {}

    @classmethod
    def open(cls, name: str, index_dir: str | Path | None = None, device: str = "auto", runtime: str = "auto",
             **options: Any) -> Index:
        """Open NAME's current version (its manifest's checksum and every file's size checked; `verify_index`
        re-hashes). INDEX_DIR: where indexes live (default: the index home, `versions.home.resolve_index_dir`).
        DEVICE and RUNTIME: where queries are encoded and searched. OPTIONS: as `Index(...)` takes them."""
        return cls(Snapshot.open(name, index_dir, device=device), runtime=runtime, **options)

    @property
    def name(self) -> str:
        return self.snapshot.name

    def __len__(self) -> int:
        return len(self.snapshot)

    def __repr__(self) -> str:
        return f"Index({self.name!r}, version {self.snapshot.manifest.version}, {counted(len(self), 'document')})"

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the version's files (`Snapshot.close`); using the index afterwards is refused."""
        self.snapshot.close()

    # --- reading -------------------------------------------------------------------------------------------

    def search(self, queries: str | Sequence[str] | None, options: SearchOptions | int | None = None, /, *,
               progress: bool = False, vectors: np.ndarray | Sequence | None = None,
               **settings: Any) -> list[SearchHit] | list[list[SearchHit]]:
        """The top-k documents of one query (a string), or a list of them for each of several (a list).

        OPTIONS: a `SearchOptions` (or just k), and its fields as keywords (SETTINGS: k, mode, fusion, weight,
        where, min_score, space, stop_words, nprobe, ef_search, rerank; over OPTIONS' where both are given):
        `index.search("a query", 5, mode="hybrid")`.
        Dense search runs through exactly the encode path the manifest records: the encoder, the saved
        calibrator, L2 normalization (`retriever.search.searcher.Searcher` takes vectors already encoded).

        VECTORS: the queries' raw vectors, already computed (in the encoder's space, uncalibrated: the index
        calibrates them), a row per query, or one vector for one query; nothing is encoded. QUERIES may then be
        None for dense search (the texts are what keyword and hybrid search read). An index built from vectors
        computed elsewhere (`retriever.encode.external`) is searched so."""
        single = queries is None and vectors is not None and np.ndim(vectors) == 1 or isinstance(queries, str)
        if single:
            vectors = None if vectors is None else np.asarray(vectors).reshape(1, -1)
            queries = None if queries is None else [queries]
        if queries is not None:
            queries = query_list(queries)
            check_queries(queries)
        elif vectors is None:
            raise RetrieverError("no query given: give query texts, or their vectors")
        raw = None if vectors is None else self._query_vectors(vectors, queries)
        if not isinstance(options, (SearchOptions, type(None))):
            options, settings = None, {"k": options, **settings}
        options = self._searcher.resolve(SearchOptions.of(options, **settings))
        if queries is None and options.mode != "dense":
            raise RetrieverError(f"{options.mode} search reads the query texts: give them beside their vectors, or "
                                 f"search by vectors alone with {param('mode', 'dense')}")
        self._warn_of_filter(options.where)
        if options.mode == "keyword":
            found = self._searcher.search(queries, None, options)
        else:
            if raw is None:
                raw = self._query_encoder().encode(queries, progress=progress)
            if options.space == "raw":
                found = self._searcher.search_raw(raw, options)
            else:
                texts = queries if queries is not None else [""] * len(raw)  # dense search reads no text
                found = self._searcher.search(texts, self.snapshot.calibrate(raw), options)
        found = cut(found, options)
        return found[0] if single else found

    def _query_vectors(self, vectors: np.ndarray | Sequence, queries: list[str] | None) -> np.ndarray:
        """Given query VECTORS as float32 rows, checked against the QUERIES they stand for and the index's encoder."""
        dim = self.snapshot.manifest.encoder["dim"]
        try:
            raw = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError):
            raise RetrieverError(f"{param('vectors')} must be numbers: a row of {dim} per query") from None
        if raw.ndim != 2 or raw.shape[1] != dim:
            raise RetrieverError(f"{param('vectors')} has shape {raw.shape}; index '{self.name}' takes "
                                 f"{dim}-dimensional vectors, a row per query")
        if queries is not None and len(queries) != len(raw):
            raise RetrieverError(f"{counted(len(raw), 'query vector')} for {len(queries):,} quer"
                                 f"{'y' if len(queries) == 1 else 'ies'}: give a vector per query")
        if not len(raw):
            raise RetrieverError("no query given: give query texts, or their vectors")
        if not np.isfinite(raw).all():
            raise RetrieverError(f"{param('vectors')} holds a NaN or infinite value")
        # A row of no length has no direction, and one whose length overflows float32 (1e30s) is normalized to
        # zeros: either would rank every document alike.
        with np.errstate(over="ignore"):
            norms = row_norms(raw)
        bad = np.flatnonzero(~((norms > 0) & np.isfinite(norms)))
        if len(bad):
            row = int(bad[0])
            raise RetrieverError(f"{param('vectors')} row {row} " + (
                "is all zeros: a vector of no direction ranks every document alike" if norms[row] == 0 else
                "is too large: its length overflows float32"))
        return raw

    def _warn_of_filter(self, where: Filter | None) -> list[str]:
        """Warn (FilterWarning, at the caller's caller) of a filter requiring a field no document has, or values of
        a kind it never holds: it runs, and selects nothing. The CLI, the server and the MCP tools say such notes
        (`filters.filter_notes`), of any field; this returns those it warned of."""
        if where is None:
            return []
        # A field only a condition such as $ne reads is no mistake of this kind (Haystack's `== None`).
        snapshot = self.snapshot
        notes = self._filter_notes.get((snapshot.folder, where.key))
        if notes is None:
            notes = filter_notes(where, snapshot.manifest.metadata_fields, snapshot.field_kinds, required_only=True)
            if len(self._filter_notes) >= FILTER_NOTES_KEPT:
                self._filter_notes.clear()
            self._filter_notes[(snapshot.folder, where.key)] = notes
        for note in notes:
            warnings.warn(note, FilterWarning, stacklevel=3)
        return notes

    def documents(self, doc_ids: str | Sequence[str] | None = None, where: str | dict | None = None) -> list[dict]:
        """Stored documents, as `document` gives each: those of DOC_IDS (one id, or a list) that are here, in
        DOC_IDS' order (an id not here is left out), or every document the filter WHERE selects
        (`retriever.filters`; without it, all), in the order they were written."""
        snapshot = self.snapshot
        if doc_ids is not None:
            if where is not None:
                raise RetrieverError(f"give document ids or {param('where')}: one of the two, not both")
            wanted = list(dict.fromkeys(id_list(doc_ids)))
            found = snapshot.live_rowids(wanted)
            rows = snapshot.rows(np.array([rowid for rowid, _ in found.values()], dtype=np.int64))
            return [rows[found[doc_id][0]] for doc_id in wanted if doc_id in found]
        compiled = parse_where(where)
        if compiled is not None:
            self._warn_of_filter(compiled)
            rowids = snapshot.matching(compiled)
        else:
            parts = [np.empty(0, np.int64)]
            for segment in snapshot.segments:
                with snapshot.reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                    parts.append(segment.documents.rowids())
            rowids = np.concatenate(parts)
            rowids = rowids[~np.isin(rowids, snapshot.tombstones)]
        rows = snapshot.rows(rowids)
        return [rows[rowid] for rowid in rowids.tolist()]

    def document(self, doc_id: str) -> dict | None:
        """The stored document DOC_ID (doc_id, title, text, source, line, metadata), or None if it is not here."""
        if not isinstance(doc_id, str):  # as `documents` refuses it: 5 is no id, where "5" may be one
            raise RetrieverError(f"a document id is a string; got {doc_id!r} ({type(doc_id).__name__})")
        return self.snapshot.document(doc_id)

    def info(self, sample: int = 5000, seed: int = 0) -> dict:
        """The manifest, counts, search settings, and the isotropy of a sample of the stored vectors before and
        after calibration (`calibration.diagnostics.isotropy`)."""
        snapshot = self.snapshot
        files = snapshot.manifest.files
        listed = {f"{SEGMENTS}/{s.name}/{VECTORS}" for s in snapshot.segments} - set(files)
        if listed:
            raise snapshot.damaged(MANIFEST, f"it lists no {sorted(listed)[0]}")
        segments = [{"name": s.name, "rows": len(s), "passages": len(s.keys),
                     "index_bytes": files[f"{SEGMENTS}/{s.name}/{VECTORS}"].bytes} for s in snapshot.segments]
        default_mode = self._searcher.resolve(SearchOptions()).mode
        return {
            "manifest": snapshot.manifest.described(),
            "version": snapshot.manifest.version,
            "folder": str(snapshot.folder),
            "documents": len(snapshot),
            "passages": snapshot.manifest.live_vectors,  # a vector each
            "vectors": sum(segment.vectors.ntotal for segment in snapshot.segments),
            "deleted": len(snapshot.tombstones),
            "segments": segments,
            "search_backend": snapshot.segments[0].vectors.backend if snapshot.segments else "none",
            "search_settings": snapshot.spec.search_settings(),
            "metadata_fields": listed_fields(snapshot.manifest.metadata_fields),
            "search_modes": list(MODES) if default_mode == "hybrid" else ["dense"],
            "default_mode": default_mode,
            "hybrid": recorded_hybrid(snapshot.manifest.hybrid),
            "isotropy": isotropy(snapshot.raw_sample(sample, seed), snapshot.calibrator, seed),
        }

    def check(self, fit_sample: int | None = DEFAULT_FIT_SAMPLE, seed: int = 0, progress: bool = False) -> dict:
        """Does calibration help this corpus? The retrieval check on the index's own documents, without labels
        (`calibration.diagnostics.retrieval_check`): what auto would choose now, and how the index's own
        calibrator does; and hybrid search's weight on the same pseudo-queries (`search.fusion_check`): "hybrid",
        what the check decides now ("now") beside what the version records ("recorded")."""
        snapshot = self.snapshot
        documents_at, vectors_at, passages = snapshot.check_sources()
        encoder = self._encoder_for(snapshot)
        check = CheckRounds(passages, documents_at, vectors_at, encoder, seed, progress=progress)
        record = retrieval_check(self.name, passages, documents_at, vectors_at, snapshot.raw_sample, encoder,
                                 snapshot.calibrator, snapshot.manifest.calibrator["name"], fit_sample, seed, progress,
                                 check=check)
        record["hybrid"] = {"now": hybrid_check(check, snapshot.calibrator.transform, seed),
                            "recorded": recorded_hybrid(snapshot.manifest.hybrid)}
        return record

    def _query_encoder(self):
        """What encodes this version's queries: the full encoder where it is loaded (or was given), else, where
        queries run on ONNX Runtime on this CPU and a kit for the recorded encoder was kept, the kit
        (`encode.query_kit`: the same vectors without loading torch, transformers or the weights: a one-off search
        in a fraction of the time), else the full encoder, loaded now."""
        if self._encoder is None and self._query_kit is None and self._kit_may_serve():
            with self._encoder_lock:
                if self._query_kit is None:
                    # One caller's queries, a run at a time (a script, the CLI, a query file): the kit's workers
                    # spin within a run; a server's kit, encoding concurrent batches, does not.
                    self._query_kit = QueryKitEncoder.open(self.snapshot.manifest.encoder,
                                                           spin_within_runs=True) or False
        return self._encoder or self._query_kit or self._encoder_for(self.snapshot)

    def _kit_may_serve(self) -> bool:
        return kit_may_serve(self.snapshot.manifest.encoder, self.snapshot.device, self._runtime)

    def _encoder_for(self, snapshot: Snapshot) -> Encoder:
        """The encoder SNAPSHOT's manifest records: this index's own (loaded on first use, once), or for another
        version built with another encoder, that one."""
        if snapshot.manifest.encoder != self.snapshot.manifest.encoder:
            return load_encoder(snapshot)
        if self._encoder is None:
            with self._encoder_lock:
                if self._encoder is None:
                    self._encoder = load_encoder(self.snapshot, self._runtime)
        return self._encoder

    # --- versions ------------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        corpus: str | Path | Sequence[Document],
        name: str,
        index_dir: str | Path | None = None,
        *,
        vectors: str | Path | np.ndarray | None = None,
        model: str | None = None,
        pooling: str | None = "last-avg",
        layers: str | Sequence[int] | None = None,
        max_length: int | None = None,
        calibrator: str | Calibrator = DEFAULT_CALIBRATOR,
        calibrator_options: dict | None = None,
        fit_sample: int | None = DEFAULT_FIT_SAMPLE,
        index_type: str = "auto",
        index_options: dict | None = None,
        device: str = "auto",
        dtype: str = "fp32",
        batch_size: int | None = None,
        runtime: str = "auto",
        encoding: str = "utf-8",
        resume: bool = True,
        progress: bool = False,
        chunk_rows: int = CHUNK_ROWS,
        encoder: Encoder | None = None,
        fit_queries: str | Path | Sequence[str] | np.ndarray | None = None,
        engine: str = "local",
        ray_options=None,
        replace: bool = False,
        passages: PassageSettings | None = None,
        vector_spans: str | Path | np.ndarray | None = None,
        folder: FolderOptions | None = None,
    ) -> ChangeSummary:
        """Stream CORPUS (a corpus file, a folder of files, or a list of Documents or records, or any iterable of
        them) through the pipeline into a new index version
        under NAME and swap it in. A NAME that exists is refused unless REPLACE (then its current version is
        kept, and `rollback` restores it), as the CLI and the HTTP API refuse it.

        VECTORS: precomputed raw vectors (a .npy, a folder of .npy shards, or an array; row i = document i) made
        with the encoder that MODEL/POOLING/LAYERS/MAX_LENGTH name; no encoding happens. CALIBRATOR may be a name
        or an already fitted calibrator (then nothing is fitted). With RESUME, a killed build of the same corpus
        with the same encoder settings continues from its last finished chunk. ENCODER: an already loaded
        encoder, used instead of loading the one MODEL/POOLING/LAYERS/MAX_LENGTH/DTYPE name (many builds, one
        model). RUNTIME: where the encoder's forward pass runs (`retriever.encode.runtimes`; auto: ONNX Runtime on a
        CPU, PyTorch on a GPU). FIT_QUERIES: a file of example queries (.txt, one per line, or BEIR
        queries.jsonl), a list of them, or their raw vectors; the calibrator is fitted on the documents' sample
        plus these, unlabeled (ignored with a prefitted calibrator). ENGINE "ray" runs the build on a Ray cluster
        (`retriever.engines.ray_build`, set up by RAY_OPTIONS, a `RayOptions`); a failed build then starts over
        rather than resuming. PASSAGES: how documents longer than
        the encoder reads are cut into passages, a vector each (default `PassageSettings()`: windows of the
        encoder's max_length, overlapping; `PassageSettings(enabled=False)`: one vector per document, cut).
        VECTOR_SPANS, with VECTORS: which passage each given vector is, (document, start, end) rows (document
        numbers from 0); without it each given vector is one document's. A folder (local engine) is a corpus of
        its files, one document each (`retriever.files.folder`: Markdown, HTML, reStructuredText, text, PDF, Word),
        read as FOLDER says (a `FolderOptions`: include and exclude patterns, strict); each file that cannot be read
        is skipped with a note. `FolderOptions(corpus_files=True)`: the folder holds corpus files instead, many
        documents each, read in name order."""
        if engine not in ENGINES:
            raise RetrieverError(f"unknown engine '{engine}'; choose one of {', '.join(ENGINES)}")
        check_index_options(index_type, index_options)  # before anything is read or encoded
        read_notes: list[str] = []
        corpus = _corpus_argument(corpus, "build")
        if is_file_list(corpus):  # files named one by one: one document each, read here
            corpus = _read_files(corpus, folder or FolderOptions(), read_notes)
        spec = BuildSpec(model=model, pooling=pooling, layers=layers, max_length=max_length, calibrator=calibrator,
                         calibrator_options=calibrator_options, fit_sample=fit_sample, index_type=index_type,
                         index_options=index_options, device=device, dtype=dtype, batch_size=batch_size,
                         runtime=runtime, encoding=encoding, fit_queries=fit_queries,
                         passages=passages or PassageSettings())
        if engine == "ray":
            if isinstance(corpus, (list, tuple)):
                raise RetrieverError("the ray engine reads corpus files; build from a list of documents with the "
                                     "local engine")
            if vectors is not None or encoder is not None:
                raise RetrieverError(f"the ray engine encodes the corpus itself; build from {param('vectors')} with "
                                     "the local engine")
            from retriever.engines.ray_build import RayEngine, RayOptions

            runner: BuildEngine = RayEngine(spec, progress, corpus=corpus, options=ray_options or RayOptions(),
                                            folder_options=folder or FolderOptions())
        else:
            runner = LocalEngine(spec, progress, corpus=corpus, vectors=vectors, encoder=encoder, resume=resume,
                                 chunk_rows=chunk_rows, vector_spans=vector_spans,
                                 folder_options=folder or FolderOptions())
        index_dir = resolve_index_dir(index_dir)
        summary = run_build(runner, name, index_dir, replace, hybrid_check=hybrid_check)
        summary.opener = _version_opener(Path(summary.folder), name, index_dir, device)
        summary.notes[:0] = read_notes
        return summary

    @staticmethod
    def versions(name: str, index_dir: str | Path | None = None) -> list[dict]:
        """NAME's kept versions, newest first: the current one and the one it replaced
        (`versions.catalog.version_records`: version, folder, current, written, documents, calibrator)."""
        return version_records(resolve_index_dir(index_dir), name)

    @classmethod
    def rollback(cls, name: str, version: int | str, index_dir: str | Path | None = None,
                 device: str = "auto") -> Index:
        """Make VERSION (a number from `versions`, or a kept version's folder name) NAME's current version again,
        after checking its files, and open it. The version it replaces is kept: rolling back is undone the same
        way."""
        index_dir = resolve_index_dir(index_dir)
        rollback(index_dir, name, version)
        return cls.open(name, index_dir, device=device)

    # --- writing -------------------------------------------------------------------------------------------

    def add(self, corpus: str | Path | Sequence[Document], encoding: str = "utf-8", progress: bool = False,
            vectors: str | Path | np.ndarray | None = None, chunk_rows: int = CHUNK_ROWS,
            upsert: bool = False, folder: FolderOptions | None = None, delete: Sequence[str] = ()) -> ChangeSummary:
        """Write CORPUS's documents (a corpus file, a folder of files as `build` reads one, with FOLDER, or a list
        of Documents or records, or any iterable of them) as one new segment, encoded (or taken from VECTORS) and
        calibrated with the saved calibrator (no refit); every existing segment is reused. An id already in the index is refused, or with UPSERT its
        old document is deleted in the same version; so are the documents DELETE names (`sync`)."""
        started = time.perf_counter()
        read_notes: list[str] = []
        corpus = _corpus_argument(corpus, "add")
        if is_file_list(corpus) or (not isinstance(corpus, (list, tuple)) and Path(corpus).is_dir()):
            corpus = _read_files(corpus, folder or FolderOptions(), read_notes)  # one document a file
        given = given_documents(corpus) if isinstance(corpus, (list, tuple)) else None  # Documents or records
        if given is None:
            check_exists(corpus)
            corpus_format(corpus)
        source = vector_source(vectors) if vectors is not None else None
        with self._writer() as writer:
            return self._add_into(writer, corpus, given, source, encoding, progress, chunk_rows, upsert, delete,
                                  read_notes, started)

    def _add_into(self, writer: IndexWriter, corpus, given: list[Document] | None, source: VectorSource | None,
                  encoding: str, progress: bool, chunk_rows: int, upsert: bool, delete: Sequence[str],
                  read_notes: list[str], started: float) -> ChangeSummary:
        """`add`'s write, in WRITER's transaction (`sync` works out what to write in the same one)."""
        timings: dict[str, float] = {}
        current = writer.base
        # Read into the new version: the calibrator (through the new vectors), the template (`template`) and
        # merged segments (`merge`) are re-hashed; the rest is linked, or only looked up in (the ids already
        # there): hashing it would make every add cost the whole index.
        current.check_read(CALIBRATOR)
        folder = writer.folder
        segment = writer.new_segment_folder()
        first = writer.manifest.next_rowid
        dim = current.manifest.encoder["dim"]

        clock = time.perf_counter()
        table = DocumentTable.create(segment / DOCUMENTS)
        documents = iter(given) if given is not None else iter_corpus(corpus, encoding)
        count = ingest(documents, table, first, chunk_rows=chunk_rows)
        if count == 0:
            raise RetrieverError("no documents given" if given is not None else
                                 f"{corpus}: no documents (the file is empty or all blank lines)")
        # Before any encoding: ids already in the index are refused, or (upsert) replaced in this same version.
        if upsert:
            replaced = [document.doc_id for document in writer.existing_ids(table)]
        else:
            writer.refuse_existing_ids(table)
            replaced = []
        table.close()
        timings["read"] = time.perf_counter() - clock
        if source is not None and source.rows != count:
            raise RetrieverError(f"{source.path} holds {counted(source.rows, 'vector')} for "
                                 f"{counted(count, 'document')} in {corpus}")
        if source is not None and source.dim != dim:
            raise RetrieverError(f"{source.path} holds {source.dim}-dimensional vectors; this index's encoder "
                                 f"gives {dim}")
        if isinstance(source, VectorSource):  # as a build refuses them: queries encoded otherwise rank them poorly
            check_encoded_alike(source.path, current.manifest.encoder, building=False)

        clock = time.perf_counter()
        state = BuildState(None, {}, documents=count)
        if source is None:
            encoder = self._encoder_for(current)
            # Cut as the index's build cut (an index of before passages: one vector per document, as built).
            cutter = passage_cutter(encoder, PassageSettings.from_record(current.manifest.passages))
            with DocumentTable.open(segment / DOCUMENTS) as table:
                encode_table(encoder, table, folder / ENCODED, state, first, progress, chunk_rows, cutter)
            source = VectorSource(folder / ENCODED)
            timings["encode"] = time.perf_counter() - clock
        else:
            check_vectors(source)
            timings["check_vectors"] = time.perf_counter() - clock

        clock = time.perf_counter()
        passages = split_segment(folder / ENCODED, count)
        blocks = calibrated_blocks(source, current.calibrator, first, passages=passages)
        write_segment_vectors(segment, blocks, dim, current.manifest.dim, current.spec.for_segment(source.rows),
                              writer.template(), split=passages is not None)
        finish_segment(segment)
        (folder / ENCODED).unlink(missing_ok=True)
        encoded_passages_path(folder / ENCODED).unlink(missing_ok=True)
        if replaced or delete:
            # The old documents of those ids, and those asked: tombstones, in this same version.
            writer.delete(list(dict.fromkeys([*replaced, *delete])))
        writer.add_segment(segment, count, source.rows)
        final = writer.commit()
        timings["write"] = time.perf_counter() - clock
        notes = read_notes + ([f"replaced {counted(len(replaced), 'document')} whose "
                               f"{'id was' if len(replaced) == 1 else 'ids were'} already in the index"]
                 if replaced else [])
        summary = self._summary(writer, final, count, started, state.truncated, timings, notes + _merge_notes(writer))
        # The new segment, unless a merge at commit took it in (then its counts are the merged one's).
        if (final / SEGMENTS / segment.name).is_dir():
            summary.cut, summary.passages = written_passages(final, [segment.name])
        return summary

    def sync(self, progress: bool = False, allow_empty: bool = False) -> SyncSummary:
        """Bring the index in step with the folder it was built from, read again as the build read it: files new
        since are added, changed ones (by the SHA-256 of their bytes) replaced, removed ones deleted, all in one
        version; an untouched file is hashed, not read again or encoded. A file that cannot be read now is skipped
        with a note, its indexed version kept; so are the files of a folder that cannot be listed now. A file read
        whole with no text in it now is deleted, with a note. Nothing changed: no new version. A folder that holds
        no file at all now, where the index holds some, is refused unless ALLOW_EMPTY (a drive not mounted, a
        folder moved away and another made in its place: every document would be deleted)."""
        started = time.perf_counter()
        manifest = self.snapshot.manifest
        if manifest.folder is None or manifest.source is None:
            raise RetrieverError(f"index '{self.name}' was not built from a folder of files; sync reads again the "
                                 "folder a build read (`retriever build FOLDER`)")
        root, options = Path(manifest.source), FolderOptions.from_record(manifest.folder)
        if not root.is_dir():
            raise RetrieverError(f"index '{self.name}' was built from {root}, which is no longer a folder")
        # Worked out against the current version (another sync or write may have committed since this index was
        # opened), and written in a transaction: where one committed meanwhile (the lock gives a later version),
        # worked out again against that before anything is written.
        here = self.snapshot
        current = (here if resolve_existing(here.index_dir, self.name) == here.folder
                   else Snapshot.open(self.name, here.index_dir, device=here.device))
        try:
            result, fresh, removed = self._folder_changes(root, options, current)
            if not allow_empty:
                _refuse_emptied(self.name, root, result, removed)
            if fresh or removed:
                with self._writer() as writer:
                    if writer.base.manifest.version != current.manifest.version:
                        result, fresh, removed = self._folder_changes(root, options, writer.base)
                        if not allow_empty:
                            _refuse_emptied(self.name, root, result, removed)
                    if fresh:
                        result.change = self._add_into(
                            writer, corpus=None, given=given_documents(fresh), source=None, encoding="utf-8",
                            progress=progress, chunk_rows=CHUNK_ROWS, upsert=True, delete=removed, read_notes=[],
                            started=time.perf_counter())
                    elif removed:
                        deleted = writer.delete(removed)
                        result.change = self._summary(writer, writer.commit(), deleted, time.perf_counter(),
                                                      notes=_merge_notes(writer))
        finally:
            if current is not here:
                current.close()
        result.seconds = time.perf_counter() - started
        return result

    def _folder_changes(self, root: Path, options: FolderOptions,
                        snapshot: Snapshot) -> tuple[SyncSummary, list[Document], list[str]]:
        """What a sync of ROOT (read with OPTIONS) would write to SNAPSHOT: its summary so far, the documents to
        add or replace (read), and the ids to delete."""
        # The documents read from that folder; those added from elsewhere (another folder, a corpus file) stay.
        stored = self._file_digests(str(root.resolve()), snapshot)
        report, notes, seen, fresh, unchanged, stale = FolderReport(), [], set(), [], 0, 0
        for path, relative in folder_files(root, options, report):
            try:
                checked_file(path, options.max_bytes)  # before hashing: a FIFO or a device would never end
                if stored.get(relative) == sha256_file(path):
                    unchanged += 1
                    seen.add(relative)
                    continue
                fresh.append(read_file(path, relative, str(root.resolve()), options.max_bytes))
                seen.add(relative)
            except NoText as why:  # read whole, and nothing in it now: what it held is deleted, as for a file gone
                notes.append(f"skipped {relative}: {why}" + ("; its indexed version deleted" if relative in stored
                                                             else ""))
            except (UnreadableFile, OSError) as why:
                seen.add(relative)
                reason = str(why) if isinstance(why, UnreadableFile) else "it cannot be read"
                notes.append(f"skipped {relative}: {reason}" + ("; its indexed version kept" if relative in stored
                                                                else ""))
                stale += relative in stored
        # A folder that cannot be listed now hides its files, and a link whose target is gone its file (an
        # unmounted drive): they are not gone, and their indexed versions are kept.
        hidden = [relative for relative, why in report.skipped if why.startswith(UNLISTABLE)]
        hidden += [relative for relative, why in report.skipped if why.startswith(BROKEN_LINK)]
        held = [relative for relative in set(stored) - seen
                if any(folder in (".", relative) or relative.startswith(folder + "/") for folder in hidden)]
        removed = sorted(set(stored) - seen - set(held))
        stale += len(held)
        notes += [f"skipped {relative}: {why}" + ("; its indexed version kept" if relative in held else
                                                  "; its indexed documents kept" if relative in hidden and any(
                                                      path.startswith(relative + "/") for path in held) else "")
                  for relative, why in report.skipped]  # loops, broken links, unlistable folders
        added = sum(document.doc_id not in stored for document in fresh)
        summary = SyncSummary(self.name, added, len(fresh) - added, len(removed), unchanged, notes, stale=stale)
        return summary, fresh, removed

    def _file_digests(self, source: str, snapshot: Snapshot) -> dict[str, str | None]:
        """The id of each live document of SNAPSHOT read from SOURCE (a folder) and the SHA-256 its metadata
        records."""
        digests = {}
        for segment in snapshot.segments:
            rowids = np.asarray(segment.rowids)[snapshot.live_documents(segment)]
            for row in snapshot.rows(rowids, ("doc_id", "metadata")).values():
                metadata = row["metadata"] or {}
                if metadata.get(FOLDER_KEY) == source:  # whichever engine read it
                    digests[row["doc_id"]] = metadata.get("sha256")
        return digests

    def delete(self, doc_ids: str | Sequence[str] | None = None, where: str | dict | None = None) -> ChangeSummary:
        """Delete documents by id (one id, or a list), all or nothing, or every document the filter WHERE selects
        (`retriever.filters`): their row ids become tombstones that searches filter out."""
        started = time.perf_counter()
        doc_ids = list(dict.fromkeys(id_list(doc_ids) if doc_ids is not None else ()))
        if bool(doc_ids) == (where is not None):
            raise RetrieverError(f"give document ids to delete or {param('where')}: one of the two"
                                 + (", not both" if doc_ids else ""))
        compiled = parse_where(where)
        notes = self._warn_of_filter(compiled)
        with self._writer() as writer:
            try:
                removed = writer.delete(doc_ids) if compiled is None else writer.delete_where(compiled)
            except NotFoundError as error:  # a misspelt field is the likeliest reason a filter selects nothing
                if not notes:
                    raise
                raise NotFoundError(f"{error} ({notes[0]})") from None
            final = writer.commit()
        return self._summary(writer, final, removed, started, notes=_merge_notes(writer))

    def compact(self) -> ChangeSummary:
        """Merge every segment into one and drop the deleted documents for good. An index of at most one segment,
        no deleted document and nothing an earlier release wrote (`Segment.written_as_today`) is compact already: no
        new version (one would push the version before it out of the two kept), and the summary's notes say so."""
        started = time.perf_counter()
        with self._writer() as writer:
            dropped = len(writer.tombstones)
            base = writer.base
            if not dropped and len(base.segments) <= 1 and all(segment.written_as_today for segment in base.segments):
                return ChangeSummary(
                    self.name, str(base.folder), base.manifest.documents, 0, seconds=time.perf_counter() - started,
                    notes=[f"index '{self.name}' is compact already ({counted(len(base.manifest.segments), 'segment')}"
                           ", no deleted document): no new version"], version=base.manifest.version,
                    opener=_version_opener(base.folder, self.name, base.index_dir, base.device))
            writer.merge([entry.name for entry in writer.manifest.segments])
            final = writer.commit(merge=False)
        return self._summary(writer, final, dropped, started)

    def refit(self, calibrator: str | None = None, calibrator_options: dict | None = None,
              fit_sample: int | None = DEFAULT_FIT_SAMPLE,
              fit_queries: str | Path | Sequence[str] | np.ndarray | None = None,
              progress: bool = False) -> ChangeSummary:
        """Fit a new calibrator on a sample of the stored raw vectors (no re-encoding of documents) and rewrite every
        segment's vector index with it; documents and raw vectors are reused as they are. FIT_QUERIES, as in
        `build`: example queries fitted on too (texts are encoded with the index's encoder)."""
        started = time.perf_counter()
        dim = self.snapshot.manifest.encoder["dim"]
        # None: the index's own; "" is no calibrator's name (it refitted the index's own without a word)
        name = self.snapshot.manifest.calibrator["name"] if calibrator is None else calibrator
        fitted = make_calibrator(name, **(calibrator_options or {}))
        fitted.check_dim(dim)  # before any query is encoded
        query_texts, query_vectors, queries_from = parse_fit_queries(fit_queries, "utf-8")
        if query_texts and name != "none":
            query_vectors = load_encoder(self.snapshot).encode(query_texts, progress=progress,
                                                               description="Encoding queries")
        if query_vectors is not None and query_vectors.shape[1] != dim:
            raise RetrieverError(f"fit_queries holds {query_vectors.shape[1]}-dimensional vectors; index "
                                 f"'{self.name}' stores {dim}")
        if name == "none":
            query_vectors = None
        with self._writer() as writer:
            current = writer.base
            # Read into the new version: every raw vector and row id (the new vector indexes); re-hashed before the
            # sample is drawn from them.
            current.check_read(*(f"{SEGMENTS}/{entry.name}/{part}" for entry in current.manifest.segments
                                 for part in (RAW, ROWIDS)))
            rows = min(len(current), fit_sample or len(current))
            shortfall = too_few_to_fit(fitted, rows, dim)
            if shortfall:  # refit is an explicit request: refused, never quietly replaced by another calibrator
                have = (f"{param('fit_sample', fit_sample)} is" if rows < len(current) else
                        f"index '{self.name}' holds only {counted(len(current), 'document')}:")
                raise RetrieverError(f"{have} {shortfall}")
            seed = getattr(fitted, "seed", 0)
            sample = current.raw_sample(fit_sample or len(current), seed=seed)
            documents_at, vectors_at, passages = current.check_sources()
            check = (check_set(fitted, passages, documents_at, vectors_at, self._encoder_for(current), seed,
                               progress) if fitted.uses_check else None)  # only auto needs the model here
            fit_calibrator(fitted, with_queries(sample, query_vectors, fit_sample, seed), check)
            out_dim = fitted_out_dim(fitted, dim)
            spec_record = dict(current.manifest.index)
            if out_dim != current.manifest.dim:
                spec_record.pop("pq_m", None)  # set again for the new dimension
            spec = IndexSpec.from_dict(spec_record).for_dim(out_dim)
            # The sample is calibrated only for an index that trains on it (flat and hnsw train nothing).
            template = (train_template(spec, l2_normalize_in_place(fitted.transform(sample))) if spec.kind.trained
                        else None)
            writer.replace_calibrator(fitted, spec, template)
            # The dense side changed: the hybrid weight is decided again, in the new space (a calibrator that
            # takes no check leaves no evidence, and the default stays). Raw vectors before and after (`none`
            # refitted where none was used, by name or by auto's choice) change nothing: the decision stays.
            unchanged = check is None and _keeps_raw(fitted) and _keeps_raw(current.calibrator)
            hybrid = current.manifest.hybrid if unchanged else hybrid_check(check, fitted.transform, seed)
            writer.manifest = writer.manifest.replace(
                dim=out_dim, refitted=now_iso(), hybrid=hybrid,
                fit={"sample": len(sample), "of": len(current), "seed": seed,
                     **({"queries": fitted_query_count(query_vectors, fit_sample), "queries_from": queries_from}
                        if query_vectors is not None else {})})
            final = writer.commit(merge=False)
        return self._summary(writer, final, len(current), started)

    def _move_to(self, folder: Path) -> None:
        """Search the version in FOLDER from now on. The version left is not closed here: a search of another
        thread may still be reading it; its files are released when the last reference goes."""
        old = self.snapshot
        new = Snapshot.open_version(folder, self.name, old.index_dir, device=old.device)
        self.snapshot, self._searcher = new, Searcher(new)

    def _writer(self) -> IndexWriter:
        """A write transaction on this index, based on this version if it is still the current one (its loaded
        model is kept), else on the current one."""
        snapshot = self.snapshot
        return IndexWriter(snapshot.index_dir, self.name, current=snapshot, device=snapshot.device,
                           merge_policy=MERGE_POLICY)

    def _summary(self, writer: IndexWriter, final: Path, changed: int, started: float, truncated: int = 0,
                 timings: dict | None = None, notes: list[str] | None = None) -> ChangeSummary:
        snapshot = self.snapshot
        if self._follow_writes:
            self._move_to(final)
        return ChangeSummary(self.name, str(final), writer.manifest.documents, changed, truncated,
                             time.perf_counter() - started, timings or {}, notes or [], writer.manifest.version,
                             opener=_version_opener(final, self.name, snapshot.index_dir, snapshot.device))


def _keeps_raw(calibrator: Calibrator) -> bool:
    """Whether CALIBRATOR (fitted) leaves the raw vectors as they are: `none`, or `auto` having chosen it."""
    return isinstance(getattr(calibrator, "chosen", calibrator), Identity)


def _read_files(corpus, options: FolderOptions, notes: list[str]) -> list[Document]:
    """The documents of a folder or of files named one by one (`files.folder.noted_documents`), NOTES told of
    each file skipped; refused where none could be read."""
    documents = list(noted_documents(corpus, options, notes.append))
    if not documents:
        raise RetrieverError(f"{corpus}: no documents (no file a reader reads: Markdown, HTML, reStructuredText, "
                             "text, PDF, Word)" if not is_file_list(corpus) else
                             "no documents: none of the files given could be read")
    return documents


@dataclass
class SyncSummary:
    """What a `sync` did: files ADDED, CHANGED (replaced) and DELETED, UNCHANGED ones (hashed, not read again or
    encoded), NOTES (files skipped), the version it wrote (CHANGE; None where nothing changed), and STALE: indexed
    files it could not read now (alone or in a folder it could not list), whose indexed versions it kept."""

    name: str
    added: int
    changed: int
    deleted: int
    unchanged: int
    notes: list[str]
    change: ChangeSummary | None = None
    seconds: float = 0.0
    stale: int = 0

    def line(self) -> str:
        done = (f"{self.added:,} added, {self.changed:,} changed, {self.deleted:,} deleted, {self.unchanged:,} "
                "unchanged (not read again)")
        if self.stale:
            done += f", {self.stale:,} kept as indexed (not readable now)"
        if self.change is None:
            if self.stale:
                return f"index '{self.name}' has nothing it can write from its folder: {done}; no new version"
            return f"index '{self.name}' is in step with its folder: {done}; no new version"
        return f"synced index '{self.name}' to version {self.change.version}: {done}, in {self.seconds:.1f}s"


FILTER_NOTES_KEPT = 256  # distinct filters whose notes an Index keeps


def _corpus_argument(corpus: object, verb: str) -> str | os.PathLike | list | tuple:
    """CORPUS as `build` and `add` (VERB) read it: a corpus file or folder, or a list of records; records from
    any other iterable (a generator) are taken into a list. One record alone, or anything else, is refused."""
    if isinstance(corpus, Iterable) and not isinstance(corpus, (str, os.PathLike, dict, Document, bytes, io.IOBase)):
        corpus = corpus if isinstance(corpus, (list, tuple)) else list(corpus)
        unread = unread_keys(corpus)
        if unread:  # a record's values to filter on go under "metadata": said, where they would be lost unseen
            warnings.warn(f"records' keys {', '.join(repr(key) for key in unread[:10])}"
                          f"{f' and {len(unread) - 10:,} more' if len(unread) > 10 else ''} are not read: a record "
                          'is read for "_id" (or "id"), "text", "title" and "metadata", which holds its values to '
                          "filter on", stacklevel=3)
        return corpus
    if isinstance(corpus, (str, os.PathLike)):
        return corpus
    kind = type(corpus).__name__
    raise RetrieverError(f"{verb} takes a list of records (dicts or Documents), a corpus file or a folder; got "
                         f"{'None' if corpus is None else ('an ' if kind[0] in 'aeiou' else 'a ') + kind}"
                         + (": put the one record in a list" if isinstance(corpus, (dict, Document)) else
                            ": give the file's path" if isinstance(corpus, io.IOBase) else ""))


def load_encoder(snapshot: Snapshot, runtime: str = "auto", kit: QueryKitEncoder | None = None,
                 ) -> Encoder | DeferredEncoder:
    """A new instance of the encoder SNAPSHOT's manifest records, on its device; RUNTIME picks PyTorch or ONNX
    Runtime for its forward pass (`retriever.encode.runtimes`: auto, the faster where it can run). Where it would run
    on ONNX Runtime on the CPU and its kit is kept (`encode.query_kit`), one that encodes from the kit
    (`model_card.DeferredEncoder`: the same vectors and passages, no model loaded: a write of a few documents in a
    second, not in the seconds of loading the model). KIT: that kit, already open (the server's, for its queries),
    so its graph is loaded once."""
    if is_external(snapshot.manifest.encoder):
        raise RetrieverError(f"index '{snapshot.name}' holds vectors computed outside it "
                             f"({snapshot.manifest.encoder['model']}): search it with query vectors "
                             f"({param('vectors')}), or open it with the encoder that made them")
    record = snapshot.manifest.encoder
    if kit is None:
        open_kit = kit_opener(record, snapshot.device, runtime, None)
        kit = open_kit() if open_kit is not None else None
    elif not (kit_may_serve(record, snapshot.device, runtime) and kit_fits(kit, record)):
        kit = None
    if kit is not None:
        return DeferredEncoder(record, lambda: _loaded_encoder(snapshot, runtime), kit=lambda: kit)
    return _loaded_encoder(snapshot, runtime)


def _loaded_encoder(snapshot: Snapshot, runtime: str) -> Encoder:
    """The encoder SNAPSHOT's manifest records, loaded (`load_encoder`)."""
    from retriever.encode.encoder import Encoder

    try:
        encoder = Encoder.from_config(snapshot.manifest.encoder, device=snapshot.device, runtime=runtime)
    except RetrieverError as error:  # e.g. built elsewhere with a model this machine does not have
        raise RetrieverError(
            f"index '{snapshot.name}' cannot encode text with the model it was built with: {error}"
        ) from None
    encoder.keep_query_kit(snapshot.manifest.encoder)  # on ONNX Runtime: the next process's queries need no model
    return encoder



def _refuse_emptied(name: str, root: Path, result: SyncSummary, removed: list[str]) -> None:
    """Refuse a sync that would delete every file's documents because ROOT holds no file now (RESULT: what it read;
    REMOVED: the ids it would delete)."""
    if removed and not (result.added or result.changed or result.unchanged or result.stale) and not result.notes:
        raise RetrieverError(
            f"{root} holds none of the {counted(len(removed), 'file')} index '{name}' was built from now (a drive "
            f"not mounted, or the folder moved?): nothing deleted. If they were removed on purpose, sync with "
            f"{param('allow_empty', True)} to delete their documents")

def _merge_notes(writer: IndexWriter) -> list[str]:
    rewritten = writer.merges.count(1)
    merged = sum(size for size in writer.merges if size > 1)
    return ([f"rewrote {counted(rewritten, 'segment')} without {'its' if rewritten == 1 else 'their'} deleted "
             "documents"] if rewritten else []) + ([f"merged {merged} segments into "
                                                    f"{counted(len(writer.merges) - rewritten, 'segment')}"]
                                                   if merged else [])


def _version_opener(folder: Path, name: str, index_dir: Path, device: str):
    return lambda: Index(Snapshot.open_version(folder, name, index_dir, device))


__all__ = ["Index", "IndexWriter", "MergePolicy", "SearchHit", "SearchOptions", "ChangeSummary", "load_encoder",
           "verify_index"]
