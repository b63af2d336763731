"""The local build engine: one process, streamed in chunks, resumable after a kill.

Reads the corpus (a file, or Documents given in Python) into the first segment's document table, encodes it in
chunks into the build's partial folder (or takes precomputed vectors), and writes one segment. What it has
finished is saved after every chunk (`pipeline.BuildState`), so a killed build re-run with the same corpus and
encoder settings continues from there.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from itertools import chain
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retriever.engines.steps import check_encoded_alike, fitted_out_dim, note
from retriever.calibration import Calibrator
from retriever.corpus import Document, check_exists, corpus_format, given_documents, iter_corpus
from retriever.engines.base import BuildEngine
from retriever.engines.workers import corpus_files
from retriever.text import counted
from retriever.errors import RetrieverError, param
from retriever.processes import spawn_context, start_worker
from retriever.files.folder import FolderOptions, noted_documents
from retriever.versions.layout import BUILD_STATE, ENCODED
from retriever.store.layout import DOCUMENTS
from retriever.encode.device import resolve_device, surely_cpu
from retriever.encode.model_card import DeferredEncoder, encoder_for
from retriever.engines.stages import (
    CHUNK_ROWS,
    BuildState,
    IndexWhileEncoding,
    calibrated_blocks,
    check_vectors,
    encode_table,
    encoded_passages_path,
    ingest,
    passage_cutter,
    split_segment,
    source_fingerprint,
    table_texts,
    write_segment_vectors,
)
from retriever.store.arrays import VectorSource, load_npy, npy_layout, vector_source
from retriever.encode.passages import MAX_PASSAGES
from retriever.store.passages import passage_keys
from retriever.store.documents import DocumentTable
from retriever.store.segment import build_structures, document_structures, finish_segment
from retriever.store.spec import IndexSpec
from retriever.versions.writer import IndexWriter

if TYPE_CHECKING:  # the encoder (and torch) loads only where text is encoded
    from retriever.encode.encoder import Encoder

# From this many documents a build from vectors writes their keyword index in a process of its own (`LocalEngine.
# keywords_in_process`): where the index's tokenizing outweighs a process's start (spawning an interpreter and
# importing the library) on the other core (benchmarks/results/keywords_apart.md).
KEYWORDS_APART_FROM = 20_000


@dataclass
class LocalEngine(BuildEngine):
    """CORPUS: a corpus file or a list of Documents. VECTORS: precomputed raw vectors (a .npy, a folder of .npy
    shards, or an array; row i = document i) made with the spec's encoder; nothing is encoded. VECTOR_SPANS (with
    VECTORS: a .npy or an int array of (document, start, end) rows): row i of VECTORS is the passage of document
    number VECTOR_SPANS[i, 0] (0-based, ascending, every document at least once) spanning characters start to end
    of its text; without it each document is one vector. ENCODER: an already
    loaded encoder, used instead of loading the spec's (many builds, one model). RESUME: continue a killed build
    of the same corpus and encoder settings."""

    corpus: str | Path | Sequence[Document] = ""
    vectors: str | Path | np.ndarray | None = None
    vector_spans: str | Path | np.ndarray | None = None
    encoder: Encoder | None = None
    resume: bool = True
    chunk_rows: int = CHUNK_ROWS
    # The documents' keyword index written while the build encodes, fits and checks (the same files as written
    # after, one step after the other: False, for the test that says so).
    overlap: bool = True
    # Written by a process of its own (True) or a thread (False); None: a process where the build encodes on a GPU,
    # whose feeding thread needs the interpreter lock that the index's tokenizing holds (benchmarks/results/gpu.md),
    # and where it is given the vectors of KEYWORDS_APART_FROM documents or more, whose checks and fits would take
    # turns with that tokenizing for the lock; a thread where the encoder runs on the CPU (it takes every core: a
    # process would only add its start) and for fewer vectors given (the start costs more than the turns).
    keywords_in_process: bool | None = None
    # Where the calibrator needs no fit and the index no training, the vector index built from each chunk as it
    # is encoded (`stages.IndexWhileEncoding`) rather than after; None: where the build encodes on a GPU, whose
    # machine's cores are otherwise idle; on a CPU the encoder takes them all.
    index_during_encoding: bool | None = None
    # The threads that index takes (None: every core; with fewer the encoder waits for it, which then sets the
    # pace: benchmarks/results/gpu.md).
    index_threads: int | None = None
    # A folder CORPUS: which of its files are read, and whether an unreadable one stops the build.
    folder_options: FolderOptions = field(default_factory=FolderOptions)
    _folder: Path | None = field(default=None, init=False, repr=False)
    _paths: list[Path] = field(default_factory=list, init=False, repr=False)  # a folder of corpus files
    _early: Future | None = field(default=None, init=False, repr=False)
    _given: list[Document] | None = field(default=None, init=False, repr=False)
    _source: VectorSource | None = field(default=None, init=False, repr=False)
    _state: BuildState | None = field(default=None, init=False, repr=False)
    _segment: Path | None = field(default=None, init=False, repr=False)
    _key: dict | None = field(default=None, init=False, repr=False)
    _resumable: bool = field(default=True, init=False, repr=False)
    _streamed: IndexWhileEncoding | None = field(default=None, init=False, repr=False)

    def check(self) -> None:
        corpus = self.corpus
        self._resumable = True  # a re-run could take over what this build finishes (RESUME: this one takes over)
        if isinstance(corpus, (list, tuple)):
            self._given = given_documents(corpus)
            self._resumable = False  # nothing on disk to resume from
        elif Path(corpus).is_dir() and self.folder_options.corpus_files:
            self._paths = corpus_files(corpus)  # many documents each, read in name order
        elif Path(corpus).is_dir():
            self._folder = Path(corpus)
            self._resumable = False  # a folder's files are read again: cheap beside encoding them
        else:
            check_exists(corpus)
            corpus_format(corpus)
        if isinstance(self.vectors, np.ndarray) or isinstance(self.vector_spans, np.ndarray):
            self._resumable = False  # vectors in memory: nothing on disk to tell a rerun's from this one's
        self.resume = self.resume and self._resumable
        self._source = vector_source(self.vectors) if self.vectors is not None else None
        self._spans = None
        if self.vector_spans is not None:
            if self._source is None:
                raise RetrieverError(f"{param('vector_spans')} says which passage each of the given vectors is: "
                                     f"give {param('vectors')} too")
            self._spans = _checked_spans(self.vector_spans, self._source.rows)

    def _folder_documents(self) -> Iterator[Document]:
        """The folder's documents, a note for each file skipped and one for what was read."""
        yield from noted_documents(self._folder, self.folder_options, lambda line: note(self.notes, line, self.progress))

    def _label(self) -> str:
        return "the given documents" if self._given is not None else str(self.corpus)

    def session(self, index_dir: Path, name: str) -> AbstractContextManager[IndexWriter]:
        spec = self.spec
        settings = (self.encoder.config() if self.encoder is not None else
                    {"model": spec.model, "pooling": spec.pooling,
                     "layers": spec.layers if spec.layers is None or isinstance(spec.layers, str) else list(spec.layers),
                     "max_length": spec.max_length, "dtype": spec.dtype})
        # What a killed build's partial folder must match to be resumed (saved with its state either way).
        self._key = {"corpus": ([source_fingerprint(path) for path in self._paths] if self._paths else
                                source_fingerprint(self.corpus) if self._given is None and self._folder is None else
                                {"folder": str(self._folder.resolve()), **self.folder_options.to_record()}
                                if self._folder is not None else None),
                     "encoding": spec.encoding, "encoder": settings,
                     "vectors": self._source.fingerprint() if self._source else None,
                     "passages": spec.passages.to_record(),
                     "vector_spans": (source_fingerprint(self.vector_spans)
                                      if isinstance(self.vector_spans, (str, Path)) else None)}
        return self._joined(IndexWriter(index_dir, name, build=True, resume_key=self._key if self.resume else None,
                                        device=spec.device,
                                        busy_hint=f"wait for it to finish, or build under another {param('name')}"))

    @contextmanager
    def _joined(self, writer: IndexWriter) -> Iterator[IndexWriter]:
        """WRITER's transaction, which ends only once the keyword index's writing has: a failed build leaves no
        process writing into the folder its writer then cleans up or keeps to resume."""
        with writer:
            try:
                yield writer
            finally:
                streamed, self._streamed = self._streamed, None
                if streamed is not None:
                    streamed.close()
                early, self._early = self._early, None
                if early is not None:
                    wait([early])

    def read(self, writer: IndexWriter) -> int:
        folder = writer.folder
        self._segment = segment = writer.new_segment_folder()
        # Saved only where a re-run can take it over: a partial folder holding it is kept for that re-run
        # (`versions.folder.writing`), which one that cannot resume would never come to.
        state = (BuildState.load(folder / BUILD_STATE) if writer.resumed else
                 BuildState(folder / BUILD_STATE if self._resumable else None, self._key))
        if writer.resumed:
            _resumable(folder, segment, state, self.notes, self.progress,
                       cut=self._source is None and self.spec.passages.enabled)
        self._state = state
        if state.documents is None:
            table = DocumentTable.create(segment / DOCUMENTS)
            documents = (iter(self._given) if self._given is not None else
                         self._folder_documents() if self._folder is not None else
                         chain.from_iterable(iter_corpus(path, self.spec.encoding) for path in self._paths)
                         if self._paths else iter_corpus(self.corpus, self.spec.encoding))
            state.documents = ingest(documents, table, 1, self.progress, self.chunk_rows)
            table.close()
            if state.documents == 0:
                raise RetrieverError(f"{self._label()}: no documents (" + (
                    self._no_file_read() if self._folder is not None else "the file is empty or all blank lines")
                    + ")")
            state.save()
        source = self._source  # checked before anything starts writing the keyword index
        if source is not None and self._spans is None and source.rows != state.documents:
            raise RetrieverError(f"{source.path} holds {counted(source.rows, 'vector')} for "
                                 f"{counted(state.documents, 'document')} in {self._label()}; row i must be document i")
        if self._spans is not None and int(self._spans[-1, 0]) + 1 != state.documents:
            raise RetrieverError(f"{param('vector_spans')} names {counted(int(self._spans[-1, 0]) + 1, 'document')}; "
                                 f"{self._label()} holds {state.documents:,}")
        if self.overlap:
            # The documents are all in their table: their keyword index needs nothing else, so it is written now,
            # while the encoder and the checks work.
            apart = self.keywords_in_process
            if apart is None:
                apart = self._encodes_on_gpu() or (source is not None and state.documents >= KEYWORDS_APART_FROM)
            self._early = _in_background(build_structures, segment, document_structures(), process=apart)
        return state.documents

    def _no_file_read(self) -> str:
        """Why a folder gave no document: no file a reader reads, or none its patterns let through."""
        why = "no file in it that a reader reads: Markdown, HTML, reStructuredText, text, PDF, Word"
        options = self.folder_options
        patterns = [param(name, " ".join(given)) for name, given in (("include", options.include),
                                                                     ("exclude", options.exclude)) if given]
        return why + (f", among the files {' and '.join(patterns)} let through" if patterns else "")

    def _encodes_on_gpu(self) -> bool:
        if self._source is not None:  # a build from vectors feeds no encoder (and imports no torch)
            return False
        if isinstance(self.encoder, DeferredEncoder):  # texts encoded from a kit: on the CPU (`load_encoder`)
            return False
        if self.encoder is None and surely_cpu(self.spec.device):
            return False  # told without importing torch (most of a second)
        device = self.encoder.device if self.encoder is not None else resolve_device(self.spec.device)
        return device.type == "cuda"

    def index_while_encoding(self, calibrator: Calibrator, spec: IndexSpec) -> None:
        state = self._state
        wanted = self._encodes_on_gpu() if self.index_during_encoding is None else self.index_during_encoding
        if not wanted or self._source is not None or state.encoded:  # resumed: earlier chunks are on disk only
            return
        dim = self.encoder.dim
        self._streamed = IndexWhileEncoding(self._segment, calibrator, dim, fitted_out_dim(calibrator, dim),
                                            spec.for_segment(state.documents), threads=self.index_threads)

    def load_encoder(self) -> Encoder | DeferredEncoder:
        """The spec's encoder (`model_card.encoder_for`: from the kit an earlier run kept, where there is one and the
        encoder would run on ONNX Runtime on the CPU, else loaded); from precomputed vectors, one that loads its
        model only if text is encoded (pseudo-queries, example queries), its record and dimension read from the
        model's files."""
        spec = self.spec
        if self.encoder is None:
            settings = dict(model=spec.model, pooling=spec.pooling, layers=spec.layers, max_length=spec.max_length,
                            device=spec.device, dtype=spec.dtype, batch_size=spec.batch_size, runtime=spec.runtime)
            self.encoder = encoder_for(**settings, deferred=self._source is not None)
        encoder = self.encoder
        source = self._source
        if source is not None and source.dim != encoder.dim:
            raise RetrieverError(f"{source.path} holds {source.dim}-dimensional vectors; {encoder.model_name} "
                                 f"gives {encoder.dim}")
        if isinstance(source, VectorSource):
            check_encoded_alike(source.path, encoder.config())
        return encoder

    def encode(self, writer: IndexWriter, encoder: Encoder) -> tuple[VectorSource, int]:
        clock = time.perf_counter()
        state, source = self._state, self._source
        if source is not None:
            check_vectors(source, self.progress)
            if self._spans is not None:  # the given passages, keyed as a build's own (`split_segment` reads them)
                spans = self._spans
                counts = np.bincount(spans[:, 0])
                rows = np.column_stack([passage_keys(np.arange(1, len(counts) + 1), counts), spans[:, 1:]])
                np.save(encoded_passages_path(writer.folder / ENCODED), rows)
            self.timings["check_vectors"] = time.perf_counter() - clock
            return source, state.truncated
        if state.encoded:
            note(self.notes, f"resumed a killed build: {state.encoded:,} of {state.documents:,} documents were "
                             "already encoded", self.progress)
        cutter = passage_cutter(encoder, self.spec.passages)
        with DocumentTable.open(self._segment / DOCUMENTS) as table:
            encode_table(encoder, table, writer.folder / ENCODED, state, progress=self.progress,
                         chunk_rows=self.chunk_rows, cutter=cutter,
                         encoded=self._streamed.add if self._streamed is not None else None)
        self.timings["encode"] = time.perf_counter() - clock
        return VectorSource(writer.folder / ENCODED), state.truncated

    def documents_at(self, writer: IndexWriter) -> Callable[[np.ndarray], list[tuple[str | None, str]]]:
        path = self._segment / DOCUMENTS

        def documents_at(positions: np.ndarray) -> list[tuple[str | None, str]]:
            with DocumentTable.open(path) as table:
                return table_texts(table)(positions)
        return documents_at

    def passage_rows(self, writer: IndexWriter) -> np.ndarray | None:
        return split_segment(writer.folder / ENCODED, self._state.documents)

    def write_segments(self, writer: IndexWriter, source: VectorSource, calibrator: Calibrator, spec: IndexSpec,
                       template) -> list[tuple[str, int]]:
        documents, dim = self._state.documents, source.dim
        passages = split_segment(writer.folder / ENCODED, documents)
        streamed, self._streamed = self._streamed, None
        # Ended, with nothing left of it, where a document was cut (passages) or the index trains a template.
        if not (streamed is not None and streamed.finish(source.rows, spec.for_segment(source.rows))):
            blocks = calibrated_blocks(source, calibrator, 1, self.progress, passages)
            write_segment_vectors(self._segment, blocks, dim, fitted_out_dim(calibrator, dim),
                                  spec.for_segment(source.rows), template, split=passages is not None)
        clock = time.perf_counter()
        built = []
        if self._early is not None:
            early, self._early = self._early, None
            early.result()  # its error, if it failed, is the build's
            built = document_structures()
        finish_segment(self._segment, built)  # the keyword index (the passages' where documents were cut)
        self.timings["keywords"] = time.perf_counter() - clock  # what the build waited for it
        (writer.folder / ENCODED).unlink(missing_ok=True)
        encoded_passages_path(writer.folder / ENCODED).unlink(missing_ok=True)
        return [(self._segment.name, documents, source.rows)]

    def corpus_record(self) -> str | Path | None:
        return None if self._given is not None else self.corpus

    def manifest_extras(self) -> dict:
        return {"vectors_from": None if isinstance(self.vectors, np.ndarray) else self.vectors,
                "folder": self.folder_options.to_record() if self._folder is not None else None}

    def passages_record(self, encoder: Encoder) -> dict | None:
        # Precomputed vectors: the caller decided what each holds (one per document, or the passages
        # VECTOR_SPANS name), so the index does not cut what is added to it either.
        return None if self._source is not None else super().passages_record(encoder)


def _checked_spans(given: str | Path | np.ndarray, rows: int) -> np.ndarray:
    """VECTOR_SPANS as an int64 (ROWS, 3) array of (document, start, end), documents ascending from 0 with none
    skipped, spans non-empty; one line naming what is wrong otherwise."""
    name = param("vector_spans")
    if not isinstance(given, np.ndarray):
        if not Path(given).is_file():
            raise RetrieverError(f"{name} {given}: no such file")
        given = load_npy(given)
    spans = np.asarray(given)
    if spans.ndim != 2 or spans.shape[1] != 3 or spans.dtype.kind not in "iu":
        raise RetrieverError(f"{name} must be integer rows of (document, start, end); got shape {spans.shape}, "
                             f"{spans.dtype}")
    spans = spans.astype(np.int64)
    if len(spans) != rows:
        raise RetrieverError(f"{name} has {len(spans):,} rows for {counted(rows, 'vector')}; row i says which "
                             "passage vector i is")
    steps = np.diff(spans[:, 0])
    if spans[0, 0] != 0 or (steps < 0).any() or (steps > 1).any():
        raise RetrieverError(f"{name}: documents must be numbered from 0, ascending, each with a passage")
    if (spans[:, 1] < 0).any() or (spans[:, 2] < spans[:, 1]).any():
        raise RetrieverError(f"{name}: every span must have 0 <= start <= end")
    most = int(np.bincount(spans[:, 0]).max())
    if most > MAX_PASSAGES:
        raise RetrieverError(f"{name}: a document has {most:,} passages; at most {MAX_PASSAGES:,}")
    return spans


def _resumable(folder: Path, segment: Path, state: BuildState, notes: list[str], progress: bool, cut: bool) -> None:
    """Match a killed build's STATE to what its folder really holds, so the re-run continues from there whatever
    step the kill hit: its temporary files go; documents without their table are read again; vectors on record
    but not on disk are encoded again (the build deletes them once the segment is written: a kill between that
    and the commit leaves the state saying "all encoded" with no file)."""
    for stale in [path for path in folder.rglob("*.partial") if path.is_file()]:
        stale.unlink()  # a file a killed step was writing, never renamed into place
    if state.documents is not None and not (segment / DOCUMENTS).is_file():
        state.documents, state.encoded, state.truncated, state.vectors = None, 0, 0, 0
    if state.encoded and (_encoded_rows(folder / ENCODED) < state.vectors or
                          (cut and _encoded_rows(encoded_passages_path(folder / ENCODED)) < state.vectors)):
        note(notes, f"resumed a killed build: its {state.documents:,} documents were already read; their "
                     "vectors were gone, so they are encoded again", progress)
        state.encoded, state.truncated, state.vectors = 0, 0, 0
        state.save()


def _encoded_rows(path: Path) -> int:
    """Rows a build's encoded-vectors file holds whole: as many as its header says (rewritten at every flush), if
    the file is that long; 0 for no file, or one that is not a 2-D .npy."""
    try:
        (rows, dim), dtype, offset = npy_layout(path)
        return min(int(rows), (path.stat().st_size - offset) // max(1, dim * dtype.itemsize))
    except (RetrieverError, OSError, ValueError):
        return 0


def _in_background(function: Callable, *args, process: bool) -> Future:
    """FUNCTION(*ARGS) on a thread, or with PROCESS in a process of its own (but inside a daemonic process, which
    may start none)."""
    if process and not multiprocessing.current_process().daemon:
        pool = ProcessPoolExecutor(1, mp_context=spawn_context(), initializer=start_worker)
    else:
        pool = ThreadPoolExecutor(1, thread_name_prefix="retriever-keywords")
    future = pool.submit(function, *args)
    pool.shutdown(wait=False)  # the worker ends with its one task
    return future
