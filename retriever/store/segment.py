"""Segments: the immutable parts an index version is made of.

    segments/<name>/vectors.faiss   calibrated, L2-normalized vectors (FAISS), keyed by row id
                    raw.npy         the uncalibrated vectors (float16 where they fit), for refits and re-ranking
                    rowids.npy      row id of each raw vector, ascending
                    documents.db    the documents (SQLite), keyed by the same row ids
                    keywords.db     the keyword index (`retriever.store.keywords`): its term dictionary and
                    keyword-*.npy   statistics, and the BM25 postings by position

                    + the files of each registered per-segment structure (`STRUCTURES`; the keyword index is one)

A segment is written once, by a build, an add, a compaction or a refit, and never changed: later versions reuse
it through hard links, deletions are tombstones kept beside it (in the version), and compaction writes a new
segment instead. So a reader that opened a version can keep reading it while writers make new ones.

Every path that writes a segment (a build's engine, an add, a Ray worker, a merge) ends with `finish_segment`,
which builds each structure in `STRUCTURES` from the finished document table; a refit, which changes only the
vectors, carries them over with the documents (`document_files`). So a new per-segment structure is one entry
here, not a change to every writer. A segment written before a structure existed simply lacks its files
(`Segment.keywords` is None); compaction, which writes every segment again, gives it them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from retriever.errors import RetrieverError
from retriever.store.layout import DOCUMENTS, KEYWORDS, RAW, ROWIDS, VECTORS
from retriever.store.arrays import NpyAppender, load_npy, read_rows
from retriever.store.documents import DocumentTable
from retriever.store.keywords import KeywordIndex, KeywordSegment
from retriever.store.vectors import VectorStore
from retriever.store.spec import IndexSpec


class SegmentStructure(Protocol):
    """Something every segment carries beside its vectors, built from its documents once they are all written."""

    name: str
    files: tuple[str, ...]  # its file names inside the segment folder

    def build(self, folder: Path, documents: DocumentTable) -> None:
        """Write this structure's files into the segment FOLDER from its finished DOCUMENTS."""


# The structures every new segment gets, in order.
STRUCTURES: list[SegmentStructure] = [KeywordIndex()]


def document_files() -> tuple[str, ...]:
    """A segment's files that depend on its documents alone: what a refit, which rewrites only the vectors,
    carries over as they are."""
    return (DOCUMENTS, RAW, ROWIDS, *(name for structure in STRUCTURES for name in structure.files))


def finish_segment(folder: Path) -> None:
    """The last step of writing a segment, whichever write it is: build each registered structure from the
    segment's finished document table."""
    build_structures(folder, STRUCTURES)


def build_structures(folder: Path, structures: list[SegmentStructure]) -> None:
    if not structures:
        return
    with DocumentTable.open(folder / DOCUMENTS) as documents:
        for structure in structures:
            structure.build(folder, documents)


FLOAT16_MAX = 65504.0
# Raw vectors are kept as float16 when the first block's largest value leaves this much headroom.
FLOAT16_HEADROOM = 16.0


class Segment:
    """An opened segment: vectors to search, documents to show, raw vectors to re-rank and refit from."""

    def __init__(self, folder: Path, spec: IndexSpec, device: str = "auto"):
        self.folder = folder
        self.name = folder.name
        self.vectors = VectorStore.load(folder / VECTORS, spec, device=device)
        self.documents = DocumentTable.open(folder / DOCUMENTS)
        self.keywords: KeywordSegment | None = None
        try:
            # Mapped now, read on demand: the mappings keep this segment readable after a later write prunes the
            # version folder it was opened from, as the open SQLite connections do for the documents and keywords.
            self.raw = load_npy(folder / RAW, mmap_mode="r")
            self.rowids = load_npy(folder / ROWIDS, mmap_mode="r")
            if (folder / KEYWORDS).is_file():
                self.keywords = KeywordSegment(folder)
                if self.keywords.documents != len(self.rowids):
                    raise RetrieverError(f"{folder / KEYWORDS}: {self.keywords.documents} documents for "
                                         f"{len(self.rowids)} rows")
        except BaseException:
            self.close()  # no connection left open by a segment that failed to open
            raise

    def __len__(self) -> int:
        return len(self.rowids)

    def raw_for(self, rowids: np.ndarray) -> np.ndarray:
        """The raw vectors (float32) of ROWIDS, all of which are in this segment."""
        positions = np.searchsorted(self.rowids, rowids)
        return np.asarray(self.raw[positions], dtype=np.float32)

    def contains(self, rowids: np.ndarray) -> np.ndarray:
        """Which of ROWIDS are in this segment (boolean mask)."""
        if len(self.rowids) == 0:
            return np.zeros(len(rowids), bool)
        positions = np.minimum(np.searchsorted(self.rowids, rowids), len(self.rowids) - 1)
        return np.asarray(self.rowids)[positions] == rowids

    def raw_blocks(self, rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(row ids, raw float32 vectors) in bounded blocks, read from the file (not mapped: RSS stays flat)."""
        for start in range(0, len(self.rowids), rows):
            ids = np.array(self.rowids[start : start + rows])
            yield ids, read_rows(self.folder / RAW, start, len(ids))

    def close(self) -> None:
        """Release the segment's files: the SQLite connection at once; the FAISS index and the memory maps (each
        holds a descriptor) as soon as nothing else refers to them. Calling it again does nothing."""
        self.documents.close()
        if self.keywords is not None:
            self.keywords.close()
        self.vectors = self.raw = self.rowids = self.keywords = None


class RawWriter:
    """Writes a segment's raw.npy and rowids.npy block by block; float16 unless the values need float32."""

    def __init__(self, folder: Path, dim: int):
        self.folder, self.dim = folder, dim
        self._raw: NpyAppender | None = None
        self._rowids = NpyAppender(folder / ROWIDS, None, "int64")
        self._last = -1

    def append(self, rowids: np.ndarray, raw: np.ndarray) -> None:
        if len(rowids) and rowids[0] <= self._last:
            raise RetrieverError("raw vectors must be written in ascending row id order")
        largest = float(np.abs(raw).max()) if raw.size else 0.0
        if self._raw is None:
            dtype = "float16" if largest * FLOAT16_HEADROOM < FLOAT16_MAX else "float32"
            self._raw = NpyAppender(self.folder / RAW, self.dim, dtype)
        if self._raw.dtype == np.float16 and largest >= FLOAT16_MAX:
            raise RetrieverError(
                f"raw vectors reach {largest:.0f}, beyond float16 storage; this model's vectors are out of range"
            )
        self._raw.append(raw)
        self._rowids.append(np.asarray(rowids, dtype=np.int64))
        if len(rowids):
            self._last = int(rowids[-1])

    def close(self) -> None:
        if self._raw is None:
            self._raw = NpyAppender(self.folder / RAW, self.dim, "float16")
        self._raw.close()
        self._rowids.close()
