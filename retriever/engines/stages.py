"""The streamed stages that turn a corpus into a segment, in bounded memory and resumably:

    1 ingest: chunked read -> SQLite       (every line checked before any model loads)
    2 encode: SQLite -> encoder -> float32 vectors on disk     (or precomputed vectors: `--vectors`)
    3 fit:    a bounded, seeded sample of the vectors -> calibrator (`auto`: with pseudo-queries made from a sample
              of the documents, `check_set`, to check each candidate on)
    4 index:  vectors block by block -> calibrator -> L2 -> FAISS, and raw vectors -> the segment's raw store

A corpus is never held whole: documents and vectors move in chunks, and only the FAISS index grows in memory.
A build records its progress after every encoded chunk (`BuildState`), so a killed build re-run with the same
corpus and encoder continues from its last finished chunk instead of encoding everything again. `Index` (the
facade) strings these stages together for build and add.
"""

from __future__ import annotations

import json
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TypeVar

import numpy as np

from retriever.calibration import Calibrator, fit_calibrator, fit_sample_rows
from retriever.calibration.check import CheckSet
from retriever.corpus import Document, document_text, iter_corpus
from retriever.calibration.pseudo_queries import CheckRounds
from retriever.encode.passages import PassageCutter, PassageSettings
from retriever.errors import RetrieverError
from retriever.numeric import l2_normalize_in_place
from retriever.versions.integrity import sha256_file
from retriever.progress import progress_bar, stderr_console
from retriever.store.arrays import BLOCK_ROWS, NpyAppender, RowSubset, VectorSource, load_npy
from retriever.store.documents import DocumentTable
from retriever.store.segment import RawWriter
from retriever.store.layout import RAW, ROWIDS, VECTORS
from retriever.store.passages import passage_keys, passage_numbers
from retriever.store.vectors import VectorStore, set_threads
from retriever.store.spec import IndexSpec

# Documents per chunk: the encoder sorts a chunk by length, so larger chunks pad less; 16,384 texts of a few
# hundred characters each are a few MB, and their vectors 25 MB at 384 dimensions.
CHUNK_ROWS = 16384

T = TypeVar("T")


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def count_documents(corpus: str | Path, encoding: str = "utf-8") -> int:
    """Read the whole corpus once, streamed: every format error surfaces here, before any model loads."""
    return sum(1 for _ in iter_corpus(corpus, encoding))


def source_fingerprint(path: str | Path) -> dict:
    """What identifies an input file for resuming: its size and the hash of its bytes. Not its modification time:
    a corpus copied or restored from a backup (new time, same bytes) resumes; reading it once costs seconds per
    gigabyte, against hours of encoding."""
    path = Path(path).resolve()
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def same_source(recorded, path: str | Path, fingerprint: dict) -> bool:
    """Whether RECORDED, a fingerprint a run saved, names the file at PATH (whose `source_fingerprint` is
    FINGERPRINT). A record from before content hashes (path, size, modification time) counts when all three
    still match."""
    if isinstance(recorded, dict) and "mtime_ns" in recorded:
        path = Path(path).resolve()
        status = path.stat()
        return recorded == {"path": str(path), "bytes": status.st_size, "mtime_ns": status.st_mtime_ns}
    return recorded == fingerprint


def write_json_atomically(path: Path, record: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as file:
        file.write(json.dumps(record, indent=2) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def encode_into(encoder, documents: Iterable[Document] | Iterable[tuple[int, Document]], writer: NpyAppender,
                record: Callable[[int, int, int], None], total: int | None = None, done: int = 0,
                progress: bool = False, chunk_rows: int = CHUNK_ROWS, cutter: PassageCutter | None = None,
                passage_writer: NpyAppender | None = None,
                encoded: Callable[[np.ndarray, int], None] | None = None) -> None:
    """Encode DOCUMENTS chunk by chunk into WRITER; each chunk's vectors are durable on disk before
    RECORD(documents, vectors, truncated) notes the chunk as done (DONE: documents an earlier run already encoded).
    CUTTER: DOCUMENTS are (row id, Document) pairs, each cut into passages (`retriever.encode.passages`); a vector
    per passage, and its (key, start, end) row in PASSAGE_WRITER. ENCODED(vectors, documents): each chunk's
    vectors, once recorded (`IndexWhileEncoding.add`)."""
    cuts: deque = deque()  # per chunk, in order: (documents, truncated, passage rows); filled on the reading thread

    def texts() -> Iterator[list[str]]:
        for chunk in chunked(documents, chunk_rows):
            if cutter is None:
                cuts.append((len(chunk), 0, None))
                yield [document_text(document) for document in chunk]
                continue
            rowids = np.fromiter((rowid for rowid, _ in chunk), np.int64, len(chunk))
            passages = cutter.cut([document for _, document in chunk])
            rows = np.column_stack([passage_keys(rowids, passages.counts()), passages.spans])
            # A cut document's first passage is its whole text, which the encoder cuts at max_length by design: not
            # a truncation to report (a document with more passages than keys hold is one).
            cuts.append((len(chunk), passages.truncated - int(np.count_nonzero(passages.counts() > 1)), rows))
            yield passages.texts

    with progress_bar("Encoding", total=total, enabled=progress) as advance:
        advance(done)
        shown = 0.0  # of the chunk being encoded, in documents

        def batch_done(texts_done: int) -> None:
            # The bar counts documents and moves as each batch is encoded (a corpus smaller than a chunk sat at 0%
            # until its end): a batch of a chunk's texts, passages where documents are cut, is their share of its
            # documents. The chunk being encoded leads CUTS (the reading thread appends the next behind it).
            nonlocal shown
            count, _, rows = cuts[0]
            step = texts_done * count / max(len(rows) if rows is not None else count, 1)
            shown += step
            advance(step)

        # The next chunk is read, cut and tokenized on another thread while this one is encoded (`encode_chunks`).
        for vectors, truncated in encoder.encode_chunks(texts(), on_batch=batch_done if progress else None):
            count, cut_short, rows = cuts.popleft()
            writer.append(vectors)
            writer.flush()
            if rows is not None:
                passage_writer.append(rows)
                passage_writer.flush()
            record(count, len(vectors), truncated + cut_short)
            if encoded is not None:
                encoded(vectors, count)
            advance(count - shown)  # the chunk whole, whatever float rounding left of its batches' shares
            shown = 0.0


@dataclass
class EncodeResult:
    count: int
    truncated: int
    resumed_from: int  # documents already encoded by an earlier, interrupted run (0: a fresh run)


def encode_corpus(corpus: str | Path, out: str | Path, encoder, encoding: str = "utf-8",
                  total: int | None = None, progress: bool = False, chunk_rows: int = CHUNK_ROWS) -> EncodeResult:
    """Encode every document of CORPUS (title and text, exactly what `build` encodes) into OUT, a float32 .npy.

    OUT.json records the source, the encoder and the rows done; while it says the run is not complete, running
    again with the same corpus and encoder settings resumes after the last finished chunk.
    """
    out = Path(out)
    record_path = out.with_suffix(".json")
    _check_output(out, record_path)
    total = count_documents(corpus, encoding) if total is None else total
    if total == 0:
        raise RetrieverError(f"{corpus}: no documents (the file is empty or all blank lines)")
    fresh = {"source": source_fingerprint(corpus), "encoder": encoder.config(), "count": total}
    done, truncated = 0, 0
    previous = _read_record(record_path)
    if (previous and not previous.get("complete") and previous.get("encoder") == fresh["encoder"]
            and previous.get("count") == total and same_source(previous.get("source"), corpus, fresh["source"])):
        done, truncated = int(previous["rows"]), int(previous["truncated"])
        if progress:
            stderr_console.print(f"resuming: {done:,} of {total:,} documents were encoded by an interrupted run")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = NpyAppender.resume(out, encoder.dim, "float32", done) if done else NpyAppender(out, encoder.dim)
    state = {"rows": done, "truncated": truncated}

    def record(rows: int, vectors: int, chunk_truncated: int) -> None:
        state["rows"] += rows
        state["truncated"] += chunk_truncated
        write_json_atomically(record_path, {**fresh, "complete": False, **state})

    try:
        with writer:
            encode_into(encoder, islice(iter_corpus(corpus, encoding), done, None), writer, record, total, done,
                        progress, chunk_rows)
        write_json_atomically(record_path, {**fresh, "complete": True, **state})
    except OSError as error:  # a full disk, a quota: which file, and that the rows written so far are kept
        raise RetrieverError(f"writing {out} failed ({error.strerror or type(error).__name__}); "
                             f"{state['rows']:,} of {total:,} documents are encoded: re-run the same command to "
                             "resume") from None
    return EncodeResult(state["rows"], state["truncated"], done)


def _check_output(out: Path, record_path: Path) -> None:
    """Refuse, before anything is encoded, an OUT that cannot be written: a folder in its place or in its record's,
    or a file where a folder above it should be (the errors said "Is a directory" of a file of ours)."""
    for path in (out, record_path):
        if path.is_dir():
            raise RetrieverError(f"{out}: {'it' if path == out else f'its record {record_path.name}'} is a folder; "
                                 "choose another name for the vectors")
    above = next((folder for folder in out.parents if folder.exists() or folder.is_symlink()), None)
    if above is not None and not above.is_dir():
        raise RetrieverError(f"{out}: {above} is a file, not a folder")


def _read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


# --- the stages of writing a segment ---------------------------------------------------------------------------


def ingest(documents: Iterable[Document], table: DocumentTable, first_rowid: int, progress: bool = False,
           chunk_rows: int = CHUNK_ROWS) -> int:
    """Stage 1: stream DOCUMENTS into TABLE under consecutive row ids from FIRST_ROWID; returns the count.

    Every document is read and checked here, before any model loads, and then read back from TABLE to encode:
    a bad line fails the build in seconds instead of after hours of encoding."""
    count = 0
    with progress_bar("Reading", total=None, enabled=progress, unit="docs", transient=True) as advance:
        for chunk in chunked(documents, chunk_rows):
            table.insert(np.arange(first_rowid + count, first_rowid + count + len(chunk)), chunk)
            count += len(chunk)
            advance(len(chunk))
    table.finish()  # builds the doc_id index: a repeated id fails here, with its lines
    return count


@dataclass
class BuildState:
    """What a build in a partial folder has finished, saved after every chunk so a re-run can resume."""

    path: Path | None  # None: nothing to resume (an add), so nothing is saved
    key: dict
    documents: int | None = None  # set once every document is in SQLite
    encoded: int = 0  # documents whose vectors are durable in the encoded-vectors file
    truncated: int = 0
    vectors: int = 0  # rows of the encoded-vectors file those documents' passages fill

    @classmethod
    def load(cls, path: Path) -> BuildState:
        record = json.loads(path.read_text(encoding="utf-8"))
        encoded = int(record.get("encoded", 0))
        return cls(path, record["key"], record.get("documents"), encoded, int(record.get("truncated", 0)),
                   int(record.get("vectors", encoded)))

    def save(self) -> None:
        if self.path is None:
            return
        write_json_atomically(self.path, {"key": self.key, "documents": self.documents, "encoded": self.encoded,
                                          "truncated": self.truncated, "vectors": self.vectors})


def encoded_passages_path(encoded: Path) -> Path:
    """Where a build keeps the (key, start, end) rows of the passages its ENCODED vectors file holds."""
    return encoded.with_name(encoded.stem + "-passages.npy")


def encode_table(encoder, table: DocumentTable, out: Path, state: BuildState, first_rowid: int = 1,
                 progress: bool = False, chunk_rows: int = CHUNK_ROWS, cutter: PassageCutter | None = None,
                 encoded: Callable[[np.ndarray, int], None] | None = None) -> None:
    """Stage 2: encode TABLE's documents in row id order into OUT (float32 .npy), after the STATE.encoded
    already there; STATE is saved after each chunk, once its vectors are durable. CUTTER: long documents are cut
    into passages, a vector each, their (key, start, end) rows beside OUT (`encoded_passages_path`). ENCODED: as
    `encode_into`'s."""
    writer = (NpyAppender.resume(out, encoder.dim, "float32", state.vectors) if state.encoded
              else NpyAppender(out, encoder.dim, "float32"))
    passage_writer = None
    if cutter is not None:
        path = encoded_passages_path(out)
        passage_writer = (NpyAppender.resume(path, 3, "int64", state.vectors) if state.encoded
                          else NpyAppender(path, 3, "int64"))
    pairs = table.documents_to_encode(after_rowid=first_rowid - 1 + state.encoded)
    documents = pairs if cutter is not None else (document for _, document in pairs)

    def record(rows: int, vectors: int, truncated: int) -> None:
        state.encoded += rows
        state.vectors += vectors
        state.truncated += truncated
        state.save()

    with writer:
        try:
            encode_into(encoder, documents, writer, record, state.documents, state.encoded, progress, chunk_rows,
                        cutter, passage_writer, encoded)
        finally:
            if passage_writer is not None:
                passage_writer.close()


def check_vectors(source: VectorSource, progress: bool = False) -> None:
    """Read every precomputed vector once: a NaN or infinite value fails here, before anything is fitted."""
    with progress_bar("Checking vectors", total=source.rows, enabled=progress, unit="vectors",
                      transient=True) as advance:
        for block in source.blocks():
            advance(len(block))


def fit(calibrator: Calibrator, source: VectorSource, fit_sample: int | None, seed: int,
        queries: np.ndarray | None = None, check: CheckSet | CheckRounds | None = None) -> np.ndarray:
    """Stage 3: fit CALIBRATOR on at most FIT_SAMPLE of SOURCE's vectors, plus at most FIT_SAMPLE raw QUERIES
    vectors when given (`--fit-queries`: so the calibrated space also covers what users will search with), checking
    its candidates on CHECK where it takes one (`auto`); returns the documents' sample, raw (what an IVF index
    trains its buckets on once calibrated, `steps.train_index`)."""
    rows = fit_sample_rows(source.rows, fit_sample, seed)
    sample = np.concatenate(list(source.blocks())) if rows is None else source.take(rows)
    if not calibrator.fitted:
        fit_calibrator(calibrator, with_queries(sample, queries, fit_sample, seed), check)
    return sample


def check_set(calibrator: Calibrator, rows: int, documents_at, vectors_at, encoder, seed: int,
              progress: bool = False) -> CheckRounds | None:
    """The pseudo-queries CALIBRATOR checks its candidates on (`pseudo_queries.CheckRounds`: encoded as far as its
    decision and the hybrid check need), or None for a calibrator that takes none, or where ENCODER cannot encode
    text (vectors computed outside the index with no model to encode pseudo-queries: `encode.external.ExternalEncoder`;
    auto then keeps the raw vectors and says why)."""
    if not calibrator.uses_check or calibrator.fitted or not getattr(encoder, "encodes_text", True):
        return None
    return CheckRounds(rows, documents_at, vectors_at, encoder, seed, progress=progress)


def table_texts(table: DocumentTable, first_rowid: int = 1):
    """DOCUMENTS_AT for `CheckRounds`: (title, text) of 0-based positions in TABLE, from FIRST_ROWID on."""
    def documents_at(positions: np.ndarray) -> list[tuple[str | None, str]]:
        return [(row["title"], row["text"]) for row in table.get(positions + first_rowid, ("title", "text"))]
    return documents_at


def document_reads(source: VectorSource, passages: np.ndarray | None):
    """SOURCE's rows that are documents' own vectors: each document's first passage where PASSAGES (the (key,
    start, end) rows of SOURCE, row for row) say documents were cut, else every row."""
    if passages is None:
        return source
    return RowSubset(source, np.flatnonzero(passage_numbers(np.asarray(passages[:, 0], np.int64)) == 0))


def passage_cutter(encoder, settings: PassageSettings) -> PassageCutter | None:
    """What cuts long documents for ENCODER as SETTINGS say (checked against what it reads); None: one vector
    per document."""
    if not settings.enabled:
        return None
    return PassageCutter(encoder.tokenizer, settings.checked(encoder.max_length), encoder.max_length)


def stream_texts(documents: Callable[[], Iterable[Document]]):
    """DOCUMENTS_AT for `CheckRounds` from documents read in order (a corpus no table holds yet): each call
    reads DOCUMENTS() afresh, as far as its last wanted position (the check asks twice: the sample, then the hybrid
    check's distractors)."""
    def documents_at(positions: np.ndarray) -> list[tuple[str | None, str]]:
        wanted, found = set(positions.tolist()), {}
        for number, document in enumerate(documents()):
            if number in wanted:
                found[number] = (document.title, document.text)
                if len(found) == len(wanted):
                    break
        return [found[position] for position in positions.tolist()]
    return documents_at


def with_queries(sample: np.ndarray, queries: np.ndarray | None, fit_sample: int | None, seed: int) -> np.ndarray:
    """What a calibrator is fitted on: the documents' SAMPLE, plus at most FIT_SAMPLE of QUERIES (seeded)."""
    if queries is None or not len(queries):
        return sample
    rows = fit_sample_rows(len(queries), fit_sample, seed)
    return np.concatenate([sample, queries if rows is None else queries[rows]])


def fitted_query_count(queries: np.ndarray | None, fit_sample: int | None) -> int:
    """How many of QUERIES `with_queries` adds (the manifest records it)."""
    return 0 if queries is None else min(len(queries), fit_sample or len(queries))


def calibrated_blocks(source: VectorSource, calibrator: Calibrator, first_rowid: int, progress: bool = False,
                      passages: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                            np.ndarray | None]]:
    """(vector keys, raw vectors, calibrated unit vectors, spans) block by block, for stage 4: keyed by row id from
    FIRST_ROWID on, one vector per document; or, with PASSAGES (the (key, start, end) rows of a split segment's
    passages, `split_segment`), by passage key with their spans (else spans None)."""
    with progress_bar("Indexing", total=source.rows, enabled=progress, unit="vectors") as advance:
        start = 0
        for block in source.blocks():
            if passages is None:
                keys, spans = np.arange(first_rowid + start, first_rowid + start + len(block), dtype=np.int64), None
            else:
                rows = np.asarray(passages[start : start + len(block)], np.int64)
                keys, spans = rows[:, 0], rows[:, 1:]
            yield keys, block, l2_normalize_in_place(calibrator.transform(block)), spans
            start += len(block)
            advance(len(block))


def split_segment(encoded: Path, documents: int) -> np.ndarray | None:
    """The (key, start, end) rows of the passages a build encoded into ENCODED, mapped, if its DOCUMENTS are more
    than one passage each somewhere (the segment is then keyed by passage); None where each is one passage (keyed
    by row id, as before passages) or nothing was cut."""
    path = encoded_passages_path(encoded)
    if not path.is_file():
        return None
    rows = load_npy(path, mmap_mode="r")
    return rows if len(rows) > documents else None


class SegmentVectorWriter:
    """Stage 4's writer: calibrated unit vectors into a new vector store, raw vectors (with their passages' spans,
    SPLIT) into the segment's raw store. Only the vector store grows in memory."""

    def __init__(self, folder: Path, dim: int, out_dim: int, spec: IndexSpec, template, split: bool = False):
        self.folder = folder
        self.store = VectorStore.create(out_dim, spec, template, device="cpu")
        self.raw = RawWriter(folder, dim, split=split)

    def add(self, keys: np.ndarray, raw: np.ndarray, calibrated: np.ndarray, spans: np.ndarray | None = None) -> None:
        self.store.add(keys, calibrated)
        self.raw.append(keys, raw, spans)

    def finish(self) -> VectorStore:
        self.raw.close()
        self.store.save(self.folder / VECTORS)
        return self.store


def write_segment_vectors(folder: Path, blocks: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]],
                          dim: int, out_dim: int, spec: IndexSpec, template, split: bool = False) -> VectorStore:
    """Stage 4: add each block's calibrated vectors to a new vector store and its raw vectors (with their passages'
    spans, SPLIT) to the segment's raw store; save both."""
    writer = SegmentVectorWriter(folder, dim, out_dim, spec, template, split)
    for keys, raw_block, calibrated, spans in blocks:
        writer.add(keys, raw_block, calibrated, spans)
    return writer.finish()


class IndexWhileEncoding:
    """Stage 4 beside stage 2: each chunk's vectors, once encoded, are calibrated and added to the segment's stores
    on a thread of their own, so that the vector index is built when the encoder finishes rather than after it.
    For a build whose CALIBRATOR needs no fit (`none`, or given fitted) and whose index SPEC trains no template.
    It writes what stage 4 after encoding would, byte for byte: the raw store's first `BLOCK_ROWS` rows are held
    back and written as one block, as stage 4 reads them (the first block decides the raw vectors' precision).

    Its keys are row ids. A segment some document was cut for is keyed by passage instead, which is known only
    once every document is encoded, so the first chunk with a cut document ends it (`abandoned`; so does a vector
    that is not finite, for stage 4 to name it), and stage 4 runs after encoding as it does for every other build."""

    # Chunks handed to the index thread and not yet indexed, the one it is on included, at most: beyond, the
    # encoder waits (their vectors are held in memory).
    WAITING = 2

    def __init__(self, folder: Path, calibrator: Calibrator, dim: int, out_dim: int, spec: IndexSpec,
                 first_rowid: int = 1, threads: int | None = None):
        self.spec, self.calibrator, self.threads = spec, calibrator, threads
        self._first = self._next = first_rowid
        self._folder, self._dim, self._out_dim = folder, dim, out_dim
        self._writer: SegmentVectorWriter | None = None
        # Raw rows not yet written, while they are fewer than a block (None once the first block is written).
        self._held: list[tuple[np.ndarray, np.ndarray]] | None = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="retriever-index")
        self._waiting: deque[Future] = deque()
        self.abandoned = False

    def add(self, vectors: np.ndarray, documents: int) -> None:
        """The next DOCUMENTS documents' VECTORS (one each, unless one was cut)."""
        if self.abandoned:
            return
        if len(vectors) != documents:
            self.abandoned = True
            self._waiting = deque(future for future in self._waiting if not future.cancel())
            self._waiting.append(self._pool.submit(self._discard))  # the memory and files go now, not at the end
            return
        keys = np.arange(self._next, self._next + documents, dtype=np.int64)
        self._next += documents
        while len(self._waiting) >= self.WAITING:
            self._waiting.popleft().result()
        self._waiting.append(self._pool.submit(self._add, keys, vectors))

    def _add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        if not np.isfinite(vectors).all():  # checked here, off the thread that feeds the encoder
            self.abandoned = True
            self._discard()
            return
        if self.abandoned:  # a later chunk's, handed over before the check above ended it
            return
        if self._writer is None:  # made here: faiss's thread count is set per thread
            self._writer = SegmentVectorWriter(self._folder, self._dim, self._out_dim, self.spec, None)
            set_threads(self.threads)  # None: every core
        self._writer.store.add(keys, l2_normalize_in_place(self.calibrator.transform(vectors)))
        if self._held is None:
            self._writer.raw.append(keys, vectors)
            return
        self._held.append((keys, vectors))
        if sum(len(held) for held, _ in self._held) >= BLOCK_ROWS:
            self._write_held()

    def _write_held(self) -> None:
        keys = np.concatenate([held for held, _ in self._held])
        raw = np.concatenate([vectors for _, vectors in self._held])
        self._held = None
        for start in range(0, len(keys), BLOCK_ROWS):
            self._writer.raw.append(keys[start : start + BLOCK_ROWS], raw[start : start + BLOCK_ROWS])

    def _discard(self) -> None:
        if self._writer is not None:
            self._writer.raw.close()
            self._writer = None
            for name in (RAW, ROWIDS):
                (self._folder / name).unlink(missing_ok=True)
        self._held = []

    def finish(self, rows: int, spec: IndexSpec) -> bool:
        """Wait for the index thread; whether the segment's vectors are written, ROWS of them with SPEC (the
        index the build chose once every vector was counted). Where not, nothing of them is left."""
        try:
            while self._waiting:
                self._waiting.popleft().result()
        except BaseException:
            self.close()
            raise
        self._pool.shutdown(wait=True)
        if self._writer is None:
            return False
        if self.abandoned or self._next - self._first != rows or spec != self.spec:
            self._discard()
            return False
        if self._held:
            self._write_held()
        self._writer.finish()
        return True

    def close(self) -> None:
        """Stop after the chunk in hand, leaving nothing of it (a failed build)."""
        for future in self._waiting:
            future.cancel()
        self._pool.shutdown(wait=True)
        self._discard()
