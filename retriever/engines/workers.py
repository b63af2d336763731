"""The work of each stage of a distributed build, as plain Python: Ray calls these, tests call them directly.

    count:  a corpus file -> its pieces (byte ranges of at most N documents) and their counts; every line is
            checked here, before any model loads
    read:   a piece -> column batches of documents, each row carrying its final row id
    encode: `EncodeWorker`, one per actor: a batch -> raw vectors, written with their documents as shards
    write:  `write_segment`: a run of shards -> one index segment (SQLite documents, calibrated vectors, raw store)

Row ids are fixed after the count stage (a piece's documents follow the pieces before it, in file order), so the
index a distributed build writes numbers its documents exactly as a local build of the same corpus would, however
Ray schedules the work. Shards live in the build's partial folder, which every node must see.
"""

from __future__ import annotations

import codecs
import json
import os
import socket
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path

import numpy as np

from retriever.corpus import CORPUS_FORMATS, Document, corpus_format, document_text, iter_corpus, splittable
from retriever.errors import RetrieverError, param

SHARDS = "shards"  # in the build's partial folder: raw vectors and documents, one pair of files per shard
_SHARD_DIGITS = 12  # shard files are named by their first row id, zero-padded, so names sort in row order


def corpus_files(corpus: str | Path) -> list[Path]:
    """The files of CORPUS in the order their documents are numbered: the file itself, or the corpus files of a
    folder in name order (a file of another kind in the folder is refused rather than silently skipped)."""
    corpus = Path(corpus)
    if corpus.is_file():
        corpus_format(corpus)
        return [corpus]
    if not corpus.is_dir():
        raise RetrieverError(f"{corpus}: no such file or folder")
    files = sorted(path for path in corpus.iterdir() if not path.name.startswith("."))
    if not files:
        raise RetrieverError(f"{corpus}: an empty folder; a corpus folder holds {', '.join(CORPUS_FORMATS)} files "
                             "(or .gz of them)")
    for path in files:
        if not path.is_file():
            raise RetrieverError(f"{corpus}: {path.name} is not a file; a corpus folder holds corpus files only")
        corpus_format(path)
    return files


def split_file(path: str | Path, encoding: str = "utf-8", piece_documents: int = 2048) -> list[dict]:
    """Count stage: a corpus file -> its pieces, {"path", "start", "first_line", "documents"}, each of at most
    PIECE_DOCUMENTS documents starting at a line's byte offset, so the read stage can give every encode actor its
    own share of a single large file. Every line is parsed here (a bad one fails with its line number). Files that
    cannot be read from an offset (.csv, .tsv, .gz, other encodings) are one piece."""
    path = Path(path)
    if not splittable(path, encoding):
        count = sum(1 for _ in iter_corpus(path, encoding))
        return [{"path": str(path), "start": 0, "first_line": 1, "documents": count}] if count else []
    pieces, offset, start, first_line, documents = [], 0, 0, 1, 0
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if documents == 0:
                start, first_line = offset, number
            text = line[3:] if number == 1 and line.startswith(codecs.BOM_UTF8) else line
            offset += len(line)
            if text.decode("utf-8", "surrogateescape").strip():  # what the parser counts as a document
                documents += 1
                if documents == piece_documents:
                    pieces.append({"path": str(path), "start": start, "first_line": first_line,
                                   "documents": documents})
                    documents = 0
    if documents:
        pieces.append({"path": str(path), "start": start, "first_line": first_line, "documents": documents})
    for piece in pieces:  # the check: parse each piece as the read stage will
        parsed = sum(1 for _ in islice(iter_corpus(path, encoding, piece["start"], piece["first_line"]),
                                       piece["documents"]))
        if parsed < piece["documents"]:
            raise RetrieverError(f"{path}: line {piece['first_line']} on holds {parsed} documents where "
                                 f"{piece['documents']} were counted")
    return pieces


def count_stage(batch: dict, encoding: str = "utf-8", piece_documents: int = 2048) -> dict:
    """The count stage over Ray Data's {"file", "path"} rows: every file's pieces, as columns."""
    rows = [{"file": int(file), **piece} for file, path in zip(batch["file"], batch["path"])
            for piece in split_file(path, encoding, piece_documents)]
    return {key: np.array([row[key] for row in rows], dtype=object if key == "path" else np.int64)
            for key in ("file", "path", "start", "first_line", "documents")}


def read_stage(batch: dict, batch_rows: int, encoding: str = "utf-8") -> Iterator[dict]:
    """Read stage: for each piece row ({"path", "start", "first_line", "documents", "first_rowid"}), its documents
    in column batches of at most BATCH_ROWS, numbered from the piece's first row id."""
    for path, start, first_line, count, rowid in zip(batch["path"], batch["start"], batch["first_line"],
                                                     batch["documents"], batch["first_rowid"]):
        documents = islice(iter_corpus(path, encoding, int(start), int(first_line)), int(count))
        rowid = int(rowid)
        while chunk := list(islice(documents, batch_rows)):
            yield document_columns(chunk, rowid)
            rowid += len(chunk)


def document_columns(documents: Sequence[Document], first_rowid: int) -> dict:
    """Documents as the column batch the stages pass along (numpy columns, as Ray Data's numpy batches are)."""
    return {
        "rowid": np.arange(first_rowid, first_rowid + len(documents), dtype=np.int64),
        "doc_id": np.array([d.doc_id for d in documents], dtype=object),
        "title": np.array([d.title or "" for d in documents], dtype=object),
        "text": np.array([d.text for d in documents], dtype=object),
        "source": np.array([d.source for d in documents], dtype=object),
        "line": np.array([d.line for d in documents], dtype=np.int64),
        "metadata": np.array([json.dumps(d.metadata) if d.metadata else "" for d in documents], dtype=object),
    }


def column_documents(batch: dict) -> list[Document]:
    metadata = batch.get("metadata", [""] * len(batch["doc_id"]))  # a batch of before metadata existed: none
    return [Document(doc_id=str(doc_id), text=str(text), title=str(title) if title else None, source=str(source),
                     line=int(line), metadata=json.loads(meta) if meta else None)
            for doc_id, title, text, source, line, meta in zip(batch["doc_id"], batch["title"], batch["text"],
                                                              batch["source"], batch["line"], metadata)]


class EncodeWorker:
    """Encode stage, one instance per actor: loads the encoder the build records once, then turns each batch of
    documents into raw vectors and writes them, with the documents, as shards in SHARD_DIR. PASSAGES (the build's
    `PassageSettings` record; None: one vector per document): long documents are cut into passages, a vector
    each, and the shard keeps their (key, start, end) rows. Returns one summary row per shard written
    ({"shard": first row id, "rows", "vectors", "truncated"}), so only counts travel back."""

    def __init__(self, config: dict, shard_dir: str, device: str = "auto", threads: int | None = None,
                 batch_size: int | None = None, passages: dict | None = None, runtime: str = "auto"):
        where = f"on {socket.gethostname()}"
        if not Path(shard_dir).is_dir():
            raise RetrieverError(f"{where}: {shard_dir} is not there; the index folder must be on storage every "
                                 f"Ray node sees (e.g. a shared file system), or build with {param('engine', 'local')}")
        if threads:
            import torch

            torch.set_num_threads(threads)
        from retriever.encode.encoder import Encoder
        from retriever.encode.passages import PassageCutter, PassageSettings

        try:
            self.encoder = Encoder.from_config(config, device=device, batch_size=batch_size, runtime=runtime)
        except RetrieverError as error:  # typically the model is not on this node
            raise RetrieverError(f"{where}: {error}") from None
        self.cutter = (PassageCutter(self.encoder.tokenizer, PassageSettings.from_record(passages),
                                     self.encoder.max_length) if passages is not None else None)
        self.shard_dir = Path(shard_dir)

    def __call__(self, batch: dict) -> dict:
        from retriever.store.passages import passage_keys

        documents = column_documents(batch)
        rowids = np.asarray(batch["rowid"], dtype=np.int64)
        order = np.argsort(rowids, kind="stable")
        rowids, documents = rowids[order], [documents[i] for i in order]
        if self.cutter is None:
            texts, counts, spans, cut_short = [document_text(d) for d in documents], np.ones(len(rowids), int), None, 0
        else:
            passages = self.cutter.cut(documents)
            texts, counts, spans = passages.texts, passages.counts(), passages.spans
            # A cut document's first passage is its whole text, cut at max_length by design (`stages.encode_into`).
            cut_short = passages.truncated - int(np.count_nonzero(counts > 1))
        vectors, truncated = self.encoder.encode_counting_truncated(texts)
        ends_at = np.cumsum(counts)  # each document's passages end at this vector row
        # A batch may join the ends of two pieces: one shard per run of consecutive row ids.
        starts = np.flatnonzero(np.diff(rowids, prepend=rowids[0] - 2) != 1) if len(rowids) else np.empty(0, int)
        ends = list(starts[1:]) + [len(rowids)]
        vector_counts = []
        for start, end in zip(starts, ends):
            first, last = (int(ends_at[start - 1]) if start else 0), int(ends_at[end - 1])
            rows = None
            if spans is not None:
                rows = np.column_stack([passage_keys(rowids[start:end], counts[start:end]), spans[first:last]])
            write_shard(self.shard_dir, int(rowids[start]), documents[start:end], vectors[first:last], rows)
            vector_counts.append(last - first)
        return {"shard": rowids[starts], "rows": np.asarray(ends) - starts,
                "vectors": np.asarray(vector_counts, dtype=np.int64),
                "truncated": np.asarray([truncated + cut_short] + [0] * (len(starts) - 1), dtype=np.int64)}


def shard_path(shard_dir: Path, first_rowid: int) -> Path:
    return Path(shard_dir) / f"{first_rowid:0{_SHARD_DIGITS}d}.npy"


def passages_path(shard_dir: Path, first_rowid: int) -> Path:
    """Where a shard keeps its passages' (key, start, end) rows: not a .npy name, which the shards' vectors (read
    as one `VectorSource`) are."""
    return shard_path(shard_dir, first_rowid).with_suffix(".passages")


def write_shard(shard_dir: Path, first_rowid: int, documents: Sequence[Document], vectors: np.ndarray,
                passages: np.ndarray | None = None) -> None:
    """A shard's vectors (.npy), documents (.jsonl) and, where its documents were cut, its passages' (key, start,
    end) rows, each written whole and then renamed into place, the vectors last: a shard whose vectors exist is
    complete (a retried task rewrites the same names)."""
    vectors_path = shard_path(shard_dir, first_rowid)
    documents_path = vectors_path.with_suffix(".jsonl")
    with open(documents_path.with_suffix(".jsonl.partial"), "w", encoding="utf-8") as file:
        for d in documents:
            file.write(json.dumps({"doc_id": d.doc_id, "title": d.title, "text": d.text, "source": d.source,
                                   "line": d.line, "metadata": d.metadata}, ensure_ascii=False) + "\n")
    os.replace(documents_path.with_suffix(".jsonl.partial"), documents_path)
    if passages is not None:
        path = passages_path(shard_dir, first_rowid)
        with open(path.with_suffix(".passages.partial"), "wb") as file:
            np.save(file, np.ascontiguousarray(passages, dtype=np.int64))
        os.replace(path.with_suffix(".passages.partial"), path)
    with open(vectors_path.with_suffix(".npy.partial"), "wb") as file:
        np.save(file, np.ascontiguousarray(vectors, dtype=np.float32))
    os.replace(vectors_path.with_suffix(".npy.partial"), vectors_path)


def read_shard(shard_dir: Path, first_rowid: int) -> tuple[np.ndarray, list[Document], np.ndarray, np.ndarray | None]:
    """(row ids, documents, float32 vectors, the passages' (key, start, end) rows or None) of the shard that starts
    at FIRST_ROWID."""
    vectors = _load(shard_path(shard_dir, first_rowid))
    passages = shard_passages(shard_dir, first_rowid)
    path = shard_path(shard_dir, first_rowid)
    with open(path.with_suffix(".jsonl"), encoding="utf-8") as file:
        documents = [Document(**json.loads(line)) for line in file]
    if len(vectors) != (len(documents) if passages is None else len(passages)):
        raise RetrieverError(f"{path}: {len(vectors)} vectors for {len(documents)} documents")
    return np.arange(first_rowid, first_rowid + len(documents), dtype=np.int64), documents, vectors, passages


def shard_passages(shard_dir: Path, first_rowid: int) -> np.ndarray | None:
    """The (key, start, end) rows of the shard's passages, or None where its documents were not cut."""
    path = passages_path(shard_dir, first_rowid)
    return _load(path) if path.is_file() else None


def _load(path: Path) -> np.ndarray:
    from retriever.store.arrays import HEADER_LOCK  # a header parse under the lock every .npy read takes

    with HEADER_LOCK, open(path, "rb") as file:
        return np.load(file)


def write_segment(folder: str | Path, segment: str, shards: Sequence[int], shard_dir: str | Path, spec: dict,
                  threads: int | None = None) -> int:
    """Write stage: the shards starting at row ids SHARDS (ascending) -> the segment SEGMENT of the index version
    in FOLDER, calibrated with the calibrator saved there and indexed into a copy of its trained template (so every
    segment shares one IVF quantizer and segments can be merged). Returns the segment's documents and vectors.
    A shard of passages holds a vector per passage (one each where nothing was cut: the segment then keys its
    vectors by row id)."""
    from retriever.calibration import load_calibrator
    from retriever.engines.steps import fitted_out_dim
    from retriever.versions.layout import CALIBRATOR, SEGMENTS, TEMPLATE
    from retriever.engines.stages import write_segment_vectors
    from retriever.numeric import l2_normalize_in_place
    from retriever.store.arrays import load_npy
    from retriever.store.documents import DocumentTable
    from retriever.store.segment import finish_segment
    from retriever.store.layout import DOCUMENTS
    from retriever.store.vectors import load_template, set_threads
    from retriever.store.passages import PASSAGE_BITS
    from retriever.store.spec import IndexSpec

    if threads:
        set_threads(threads)
    folder, shard_dir = Path(folder), Path(shard_dir)
    target = folder / SEGMENTS / segment
    target.mkdir(parents=True, exist_ok=True)
    index_spec = IndexSpec.from_dict(spec)
    template = (load_template(folder / TEMPLATE, index_spec)
                if (folder / TEMPLATE).is_file() else None)
    dim = int(load_npy(shard_path(shard_dir, shards[0]), mmap_mode="r").shape[1])
    calibrator = load_calibrator(folder / CALIBRATOR, expected_dim=dim)
    vectors_count = sum(len(load_npy(shard_path(shard_dir, first), mmap_mode="r")) for first in shards)  # headers
    cut = [shard_passages(shard_dir, first) for first in shards]
    # Split (keyed by passage) where some document of the segment is more than one passage.
    split = any(rows is not None and len(rows) > len(np.unique(rows[:, 0] >> PASSAGE_BITS)) for rows in cut)
    table = DocumentTable.create(target / DOCUMENTS)
    documents = 0

    def blocks():  # each shard read once: its documents go to SQLite, its vectors on to the index
        nonlocal documents
        for first in shards:
            rowids, shard_documents, vectors, passages = read_shard(shard_dir, first)
            table.insert(rowids, shard_documents)
            documents += len(rowids)
            keys, spans = rowids, None
            if split:
                keys, spans = passages[:, 0], passages[:, 1:]
            yield keys, vectors, l2_normalize_in_place(calibrator.transform(vectors)), spans

    try:
        write_segment_vectors(target, blocks(), dim, fitted_out_dim(calibrator, dim),
                              index_spec.for_segment(vectors_count), template, split=split)
        table.finish()  # a doc_id repeated inside this segment fails here, with its lines
    finally:
        table.close()
    finish_segment(target)
    return documents, vectors_count
