"""Segments: the immutable parts an index version is made of.

    segments/<name>/vectors.faiss   calibrated, L2-normalized vectors (FAISS), keyed by row id
                    raw.npy         the uncalibrated vectors (float16 where they fit), for refits and re-ranking
                    rowids.npy      row id of each document, ascending
                    passages.npy    where documents are cut into passages: each raw vector's passage key, and
                    spans.npy       its span in the document (`retriever.store.passages`); else keyed by row id
                    documents.db    the documents (SQLite), keyed by the same row ids
                    keywords.db     the keyword index (`retriever.store.keywords`): its term dictionary and
                    keyword-*.npy   statistics, and the BM25 postings by position, a unit per document
                    keyword-passage*  the same with a unit per passage of a cut document, where any is

                    + the files of each registered per-segment structure (`STRUCTURES`; the keyword index is one)

A segment is written once, by a build, an add, a compaction or a refit, and never changed: later versions reuse
it through hard links, deletions are tombstones kept beside it (in the version), and compaction writes a new
segment instead. So a reader that opened a version can keep reading it while writers make new ones.

Every path that writes a segment (a build's engine, an add, a Ray worker, a merge) ends with `finish_segment`,
which builds each structure in `STRUCTURES` from the finished document table; a refit, which changes only the
vectors, carries them over with the documents (`document_files`). So a new per-segment structure is one entry
here, not a change to every writer. A segment written before a structure existed simply lacks its files
(`Segment.keywords` is None); compaction, which writes every segment again, gives it them. So does a segment whose
keyword index scored passages alone (written before documents were scored whole, `keywords_stale`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from retriever.errors import RetrieverError
from retriever.store.layout import DOCUMENTS, KEYWORDS, PASSAGE_KEYWORDS, PASSAGES, RAW, ROWIDS, SPANS, VECTORS
from retriever.store.arrays import NpyAppender, load_npy, read_rows
from retriever.store.documents import DocumentTable
from retriever.store.keywords import PASSAGE_FILES, KeywordIndex, KeywordSegment, default_tokenizer
from retriever.store.passages import PASSAGE_BITS, coverages, cut_positions, document_of, document_runs, keys_of
from retriever.store.vectors import VectorStore
from retriever.store.spec import IndexSpec


class SegmentStructure(Protocol):
    """Something every segment carries beside its vectors, built from its documents once they are all written."""

    name: str
    files: tuple[str, ...]  # its file names inside the segment folder
    needs_passages: bool  # built from the segment's passages too, so only once its documents are encoded

    def build(self, folder: Path, documents: DocumentTable) -> None:
        """Write this structure's files into the segment FOLDER from its finished DOCUMENTS."""


# The structures every new segment gets, in order.
STRUCTURES: list[SegmentStructure] = [KeywordIndex(),
                                      KeywordIndex(name="keyword-passages", files=PASSAGE_FILES, units="passages")]


def document_files() -> tuple[str, ...]:
    """A segment's files that depend on its documents alone: what a refit, which rewrites only the vectors,
    carries over as they are."""
    return (DOCUMENTS, RAW, ROWIDS, PASSAGES, SPANS, *(name for structure in STRUCTURES for name in structure.files))


def finish_segment(folder: Path, built: Sequence[SegmentStructure] = ()) -> None:
    """The last step of writing a segment, whichever write it is: build each registered structure from the
    segment's finished document table (but those BUILT already: `document_structures`, while a build encoded)."""
    build_structures(folder, [structure for structure in STRUCTURES if structure not in built])


def document_structures() -> list[SegmentStructure]:
    """The registered structures built from a segment's documents alone, not its passages: a build can write them
    while it encodes."""
    return [structure for structure in STRUCTURES if not structure.needs_passages]


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
    """An opened segment: vectors to search, documents to show, raw vectors to re-rank and refit from.

    Its vectors are keyed by passage (`keys`, ascending, row for row with the raw vectors): by row id where every
    document is one passage, else by passage key (`retriever.store.passages`). Documents, keywords, tombstones
    and filters speak in row ids; `documents_of` and `keys_of` go between the two."""

    def __init__(self, folder: Path, spec: IndexSpec, device: str = "auto"):
        self.folder = folder
        self.name = folder.name
        self.vectors = VectorStore.load(folder / VECTORS, spec, device=device)
        self.documents = DocumentTable.open(folder / DOCUMENTS)
        self.keywords: KeywordSegment | None = None  # a unit per document
        self.passage_keywords: KeywordSegment | None = None  # a unit per passage of a cut document, where any is
        self.passage_unit_keys: np.ndarray | None = None  # the vector key of each of those units, ascending
        self.keywords_stale = False  # its keyword index scores passages alone (written before documents were whole)
        self.passage_keys = self.spans = None
        self._keys_cache: list[tuple[object, np.ndarray]] = []
        self._coverage: np.ndarray | None = None
        self._document_coverage: np.ndarray | None = None  # `document_coverage`, by document position
        self._unit_starts: np.ndarray | None = None  # `unit_runs`: by document position, and one past the last
        try:
            # Mapped now, read on demand: the mappings keep this segment readable after a later write prunes the
            # version folder it was opened from, as the open SQLite connections do for the documents and keywords.
            self.raw = load_npy(folder / RAW, mmap_mode="r")
            self.rowids = load_npy(folder / ROWIDS, mmap_mode="r")
            if (folder / PASSAGES).is_file():
                self.passage_keys = load_npy(folder / PASSAGES, mmap_mode="r")
                self.spans = load_npy(folder / SPANS, mmap_mode="r")
                if not len(self.passage_keys) == len(self.spans) == len(self.raw):
                    raise RetrieverError(f"{folder}: {len(self.passage_keys)} passage keys and {len(self.spans)} "
                                         f"spans for {len(self.raw)} vectors")
            if (folder / KEYWORDS).is_file():
                self.keywords = KeywordSegment(folder)
                if self.keywords.documents != len(self.rowids):
                    if self.split and self.keywords.documents == len(self.keys) and not (folder / PASSAGE_KEYWORDS).is_file():
                        self.keywords.close()  # an earlier release's: a unit per passage only
                        self.keywords, self.keywords_stale = None, True
                    else:
                        raise RetrieverError(f"{folder / KEYWORDS}: {self.keywords.documents} units for "
                                             f"{len(self.rowids)} documents")
            if self.keywords is not None and self.split:
                if not (folder / PASSAGE_KEYWORDS).is_file():
                    raise RetrieverError(f"{folder}: documents cut into passages, but no keyword index of passages")
                self.passage_keywords = KeywordSegment(folder, PASSAGE_FILES)
                units = self.passage_keywords.documents
                # A unit per passage of a cut document; an index written before 2026-11-29 has one per passage.
                unit_keys = (self.passage_keys if units == len(self.keys)
                             else self.passage_keys[cut_positions(self.passage_keys)])
                if units != len(unit_keys):
                    raise RetrieverError(f"{folder / PASSAGE_KEYWORDS}: {units} units for the "
                                         f"{len(unit_keys)} passages of the cut documents")
                self.passage_unit_keys = np.asarray(unit_keys, np.int64)
        except BaseException:
            self.close()  # no connection left open by a segment that failed to open
            raise
        # Row ids with no gap between them (a segment as a build or an add writes it, before any compaction drops
        # deleted rows): a document's position among them is its row id less the first, found without a search.
        count = len(self.rowids)
        self._first = int(self.rowids[0]) if count else 0
        self._contiguous = count > 0 and int(self.rowids[-1]) - self._first + 1 == count

    def __len__(self) -> int:
        return len(self.rowids)

    @property
    def split(self) -> bool:
        """Whether some document here is cut into passages (its vectors keyed by passage key, not row id)."""
        return self.passage_keys is not None

    @property
    def written_as_today(self) -> bool:
        """Whether this release would write this segment as it is: its keyword indexes there, scoring documents
        whole, with today's tokenizer, and a unit per passage of its cut documents alone. Compaction writes anew a
        segment that is not (an earlier release's), whatever it has to drop."""
        indexes = [self.keywords] + ([self.passage_keywords] if self.split else [])
        if any(index is None or index.tokenizer != default_tokenizer() for index in indexes) or self.keywords_stale:
            return False
        return not self.split or len(self.passage_unit_keys) == len(cut_positions(self.passage_keys))

    @property
    def keys(self) -> np.ndarray:
        """Each vector's key, ascending, row for row with the raw vectors."""
        return self.passage_keys if self.passage_keys is not None else self.rowids

    def documents_of(self, keys: np.ndarray) -> np.ndarray:
        """The row id of each vector key's document (-1, padding, stays -1)."""
        return document_of(keys) if self.split else np.asarray(keys, np.int64)

    def keys_of(self, rowids: np.ndarray, remember: bool = False) -> np.ndarray:
        """The vector keys of the documents ROWIDS (ascending row ids; those not here have none), ascending.
        REMEMBER: keep the answer by the identity of ROWIDS (the last few), for arrays asked about at every search
        (a version's tombstones, a filter's matches)."""
        if not self.split:
            return rowids
        for asked, found in self._keys_cache:
            if asked is rowids:
                return found
        found = keys_of(self.passage_keys, rowids)
        if remember:
            self._keys_cache = [(rowids, found), *self._keys_cache[:3]]
        return found

    def spans_of(self, keys: np.ndarray) -> np.ndarray | None:
        """The (start, end) character span of each passage KEYS names in its document's text; None where every
        document here is one passage (the whole text)."""
        if not self.split:
            return None
        return np.asarray(self.spans[np.searchsorted(self.passage_keys, keys)], np.int64).reshape(-1, 2)

    def coverage_of(self, keys: np.ndarray) -> np.ndarray:
        """The coverage (`passages.coverages`: the share of its document's text the first passage spans) of the
        document of each vector KEYS names; 1 where every document here is one passage."""
        keys = np.asarray(keys, np.int64)
        if not self.split:
            return np.ones(len(keys), np.float32)
        return self._coverages()[np.searchsorted(self.passage_keys, keys)]

    def _coverages(self) -> np.ndarray:
        if self._coverage is None:  # computed once from the spans (two racing threads compute the same array)
            self._coverage = coverages(self.passage_keys, self.spans)
        return self._coverage

    def positions_of(self, rowids: np.ndarray) -> np.ndarray:
        """The position among this segment's documents of each of ROWIDS, all of which are here."""
        rowids = np.asarray(rowids, np.int64)
        return rowids - self._first if self._contiguous else np.searchsorted(self.rowids, rowids)

    def document_coverage(self, rowids: np.ndarray) -> np.ndarray:
        """`coverage_of` by document: the coverage of each of ROWIDS, all of which are here. A document's lookup
        costs an index, not a search of the passage keys (a keyword query asks for a few dozen at random)."""
        if not self.split:
            return np.ones(len(rowids), np.float32)
        if self._document_coverage is None:  # each document's passages are one run of keys, documents ascending
            self._document_coverage = self._coverages()[document_runs(self.passage_keys)[0]]
        return self._document_coverage[self.positions_of(rowids)]

    def unit_runs(self, rowids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where the units of each of ROWIDS' documents (all here) start and end in `passage_unit_keys`: a run
        of its passages, empty for a document that is one passage."""
        if self._unit_starts is None:  # found once for every document: a query then indexes instead of searching
            # Units are grouped by document in row id order: each run ends where the next document's starts.
            starts = np.searchsorted(self.passage_unit_keys, np.asarray(self.rowids, np.int64) << PASSAGE_BITS)
            self._unit_starts = np.append(starts, len(self.passage_unit_keys))
        positions = self.positions_of(rowids)
        return self._unit_starts[positions], self._unit_starts[positions + 1]

    def raw_for(self, keys: np.ndarray) -> np.ndarray:
        """The raw vectors (float32) of vector KEYS, all of which are in this segment."""
        positions = np.searchsorted(self.keys, keys)
        return np.asarray(self.raw[positions], dtype=np.float32)

    def contains(self, rowids: np.ndarray) -> np.ndarray:
        """Which of ROWIDS are in this segment (boolean mask)."""
        if len(self.rowids) == 0:
            return np.zeros(len(rowids), bool)
        if self._contiguous:
            rowids = np.asarray(rowids)
            return (rowids >= self._first) & (rowids < self._first + len(self.rowids))
        positions = np.minimum(np.searchsorted(self.rowids, rowids), len(self.rowids) - 1)
        return np.asarray(self.rowids)[positions] == rowids

    def raw_blocks(self, rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(vector keys, raw float32 vectors) in bounded blocks, read from the file (not mapped: RSS stays flat)."""
        keys = self.keys
        for start in range(0, len(keys), rows):
            ids = np.array(keys[start : start + rows])
            yield ids, read_rows(self.folder / RAW, start, len(ids))

    def close(self) -> None:
        """Release the segment's files: the SQLite connection at once; the FAISS index and the memory maps (each
        holds a descriptor) as soon as nothing else refers to them. Calling it again does nothing."""
        self.documents.close()
        for keywords in (self.keywords, self.passage_keywords):
            if keywords is not None:
                keywords.close()
        self.vectors = self.raw = self.rowids = self.keywords = self.passage_keywords = None
        self.passage_keys = self.spans = None
        self._keys_cache = []


class RawWriter:
    """Writes a segment's raw.npy and rowids.npy block by block; float16 unless the values need float32. SPLIT: the
    segment's vectors are passages keyed by passage key, with their spans (passages.npy, spans.npy); rowids.npy
    then lists their documents."""

    def __init__(self, folder: Path, dim: int, split: bool = False):
        self.folder, self.dim = folder, dim
        self._raw: NpyAppender | None = None
        self._rowids = NpyAppender(folder / ROWIDS, None, "int64")
        self._keys = NpyAppender(folder / PASSAGES, None, "int64") if split else None
        self._spans = NpyAppender(folder / SPANS, 2, "int64") if split else None
        self._last = -1
        self._last_document = -1

    def append(self, keys: np.ndarray, raw: np.ndarray, spans: np.ndarray | None = None) -> None:
        """Append the raw vectors RAW under their vector KEYS (ascending, after those before), with their passages'
        SPANS where the segment is split."""
        if len(keys) and keys[0] <= self._last:
            raise RetrieverError("raw vectors must be written in ascending key order")
        largest = float(np.abs(raw).max()) if raw.size else 0.0
        if self._raw is None:
            dtype = "float16" if largest * FLOAT16_HEADROOM < FLOAT16_MAX else "float32"
            self._raw = NpyAppender(self.folder / RAW, self.dim, dtype)
        if self._raw.dtype == np.float16 and largest >= FLOAT16_MAX:
            raise RetrieverError(
                f"raw vectors reach {largest:.0f}, beyond float16 storage; this model's vectors are out of range"
            )
        self._raw.append(raw)
        keys = np.asarray(keys, dtype=np.int64)
        if self._keys is not None:
            if spans is None or len(spans) != len(keys):
                raise RetrieverError("a split segment's passages are written with their spans")
            self._keys.append(keys)
            self._spans.append(np.asarray(spans, np.int64).reshape(-1, 2))
            documents = document_of(keys)
            first = np.ones(len(documents), bool)
            first[1:] = documents[1:] != documents[:-1]
            if len(documents):
                first[0] = documents[0] != self._last_document
                self._last_document = int(documents[-1])
            self._rowids.append(documents[first])
        else:
            self._rowids.append(keys)
        if len(keys):
            self._last = int(keys[-1])

    def close(self) -> None:
        if self._raw is None:
            self._raw = NpyAppender(self.folder / RAW, self.dim, "float16")
        self._raw.close()
        self._rowids.close()
        if self._keys is not None:
            self._keys.close()
            self._spans.close()
