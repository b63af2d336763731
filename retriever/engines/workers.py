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
    documents into raw vectors and writes them, with the documents, as shards in SHARD_DIR. Returns one summary
    row per shard written ({"shard": first row id, "rows", "truncated"}), so only counts travel back."""

    def __init__(self, config: dict, shard_dir: str, device: str = "auto", threads: int | None = None,
                 batch_size: int = 64):
        where = f"on {socket.gethostname()}"
        if not Path(shard_dir).is_dir():
            raise RetrieverError(f"{where}: {shard_dir} is not there; the index folder must be on storage every "
                                 f"Ray node sees (e.g. a shared file system), or build with {param('engine', 'local')}")
        if threads:
            import torch

            torch.set_num_threads(threads)
        from retriever.encode.encoder import Encoder

        try:
            self.encoder = Encoder.from_config(config, device=device, batch_size=batch_size)
        except RetrieverError as error:  # typically the model is not on this node
            raise RetrieverError(f"{where}: {error}") from None
        self.shard_dir = Path(shard_dir)

    def __call__(self, batch: dict) -> dict:
        documents = column_documents(batch)
        vectors, truncated = self.encoder.encode_counting_truncated([document_text(d) for d in documents])
        rowids = np.asarray(batch["rowid"], dtype=np.int64)
        order = np.argsort(rowids, kind="stable")
        rowids, vectors, documents = rowids[order], vectors[order], [documents[i] for i in order]
        # A batch may join the ends of two pieces: one shard per run of consecutive row ids.
        starts = np.flatnonzero(np.diff(rowids, prepend=rowids[0] - 2) != 1) if len(rowids) else np.empty(0, int)
        ends = list(starts[1:]) + [len(rowids)]
        for start, end in zip(starts, ends):
            write_shard(self.shard_dir, int(rowids[start]), documents[start:end], vectors[start:end])
        return {"shard": rowids[starts], "rows": np.asarray(ends) - starts,
                "truncated": np.asarray([truncated] + [0] * (len(starts) - 1), dtype=np.int64)}


def shard_path(shard_dir: Path, first_rowid: int) -> Path:
    return Path(shard_dir) / f"{first_rowid:0{_SHARD_DIGITS}d}.npy"


def write_shard(shard_dir: Path, first_rowid: int, documents: Sequence[Document], vectors: np.ndarray) -> None:
    """A shard's vectors (.npy) and documents (.jsonl), each written whole and then renamed into place, so a
    shard either exists complete or not at all (a retried task rewrites the same names)."""
    vectors_path = shard_path(shard_dir, first_rowid)
    documents_path = vectors_path.with_suffix(".jsonl")
    with open(documents_path.with_suffix(".jsonl.partial"), "w", encoding="utf-8") as file:
        for d in documents:
            file.write(json.dumps({"doc_id": d.doc_id, "title": d.title, "text": d.text, "source": d.source,
                                   "line": d.line, "metadata": d.metadata}, ensure_ascii=False) + "\n")
    os.replace(documents_path.with_suffix(".jsonl.partial"), documents_path)
    with open(vectors_path.with_suffix(".npy.partial"), "wb") as file:
        np.save(file, np.ascontiguousarray(vectors, dtype=np.float32))
    os.replace(vectors_path.with_suffix(".npy.partial"), vectors_path)


def read_shard(shard_dir: Path, first_rowid: int) -> tuple[np.ndarray, list[Document], np.ndarray]:
    """(row ids, documents, float32 vectors) of the shard that starts at FIRST_ROWID."""
    from retriever.store.arrays import load_npy  # a header parse under the lock every .npy read takes

    path = shard_path(shard_dir, first_rowid)
    vectors = load_npy(path)
    with open(path.with_suffix(".jsonl"), encoding="utf-8") as file:
        documents = [Document(**json.loads(line)) for line in file]
    if len(documents) != len(vectors):
        raise RetrieverError(f"{path}: {len(vectors)} vectors for {len(documents)} documents")
    return np.arange(first_rowid, first_rowid + len(vectors), dtype=np.int64), documents, vectors


def write_segment(folder: str | Path, segment: str, shards: Sequence[int], shard_dir: str | Path, spec: dict,
                  threads: int | None = None) -> int:
    """Write stage: the shards starting at row ids SHARDS (ascending) -> the segment SEGMENT of the index version
    in FOLDER, calibrated with the calibrator saved there and indexed into a copy of its trained template (so every
    segment shares one IVF quantizer and segments can be merged). Returns the segment's row count."""
    from retriever.calibration import load_calibrator
    from retriever.engines.steps import fitted_out_dim
    from retriever.versions.layout import CALIBRATOR, SEGMENTS, TEMPLATE
    from retriever.engines.stages import write_segment_vectors
    from retriever.numeric import l2_normalize
    from retriever.store.arrays import load_npy
    from retriever.store.documents import DocumentTable
    from retriever.store.segment import finish_segment
    from retriever.store.layout import DOCUMENTS
    from retriever.store.vectors import load_template, set_threads
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
    rows = sum(len(load_npy(shard_path(shard_dir, first), mmap_mode="r")) for first in shards)  # headers only
    table = DocumentTable.create(target / DOCUMENTS)

    def blocks():  # each shard read once: its documents go to SQLite, its vectors on to the index
        for first in shards:
            rowids, documents, vectors = read_shard(shard_dir, first)
            table.insert(rowids, documents)
            yield rowids, vectors, l2_normalize(calibrator.transform(vectors))

    try:
        write_segment_vectors(target, blocks(), dim, fitted_out_dim(calibrator, dim), index_spec.for_segment(rows),
                              template)
        table.finish()  # a doc_id repeated inside this segment fails here, with its lines
    finally:
        table.close()
    finish_segment(target)
    return rows
