"""A read snapshot of an index: one version, opened and checked, never changed.

A version is a manifest (`retriever.versions.manifest`) over immutable segments (`retriever.store.segment`) plus
the calibrator every segment was written with and tombstones (row ids deleted since). `Snapshot.open` resolves the
index's link once and reads only that version, so a write committed meanwhile (by `retriever.versions.writer`) is
never half seen; `close()` releases its files (a server swapping versions calls it).

A snapshot holds the version's data and its integrity: segments, documents, raw vectors, the calibrator and the
tombstones. Searching it is the search layer's (`retriever.search`); encoding text, the index's
(`retriever.index`).

Damage found while reading (a file that no longer parses, counts that disagree) is a `DamagedIndexError` naming
the index, in one line, chained to what the parser raised (`reading`). Only reads are guarded: an exception
anywhere else is a bug and propagates as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from retriever.calibration import Calibrator, fit_sample_rows, load_calibrator, loads_torch, saved_config
from retriever.errors import DamagedIndexError, RetrieverError
from retriever.filters import Filter
from retriever.numeric import l2_normalize
from retriever.store.arrays import load_npy, npy_layout
from retriever.store.layout import DOCUMENTS, PASSAGES, RAW, ROWIDS
from retriever.store.passages import passage_numbers
from retriever.store.segment import Segment
from retriever.store.vectors import load_template
from retriever.store.spec import IndexSpec
from retriever.text import counted
from retriever.versions.home import resolve_existing, resolve_index_dir
from retriever.versions.integrity import damaged_index, read_manifest, verify_files, verify_read
from retriever.versions.layout import CALIBRATOR, MANIFEST, SEGMENTS, TEMPLATE, TOMBSTONES
from retriever.versions.manifest import Manifest, SegmentEntry

# How often `open` starts again when the version it resolved is pruned under it (two writes in the meantime).
OPEN_ATTEMPTS = 5


class Snapshot:
    """An opened, read-only version of an index: its manifest, segments, calibrator and tombstones.

    Safe to share between threads: a version never changes, and what is loaded on first use (a flow's weights)
    is loaded once, under a lock. `close()` must wait until no thread reads it any more."""

    def __init__(self, folder: Path, manifest: Manifest, device: str = "auto", index_dir: str | Path | None = None):
        self.folder = folder
        self.manifest = manifest
        self.name = manifest.name
        self.index_dir = resolve_index_dir(index_dir)
        self.device = device
        self._segments: list[Segment] = []
        self._closed = False
        self._calibrator_lock = threading.Lock()
        self._calibrator: Calibrator | None = None
        if device not in ("cpu", "auto"):  # a device this machine lacks is the caller's error, not damage: refused
            # before the guard (auto always resolves, to the CPU where there is no GPU)
            from retriever.encode.device import resolve_device

            resolve_device(device)
        try:
            with self.reading(MANIFEST, opening=True):
                self.spec = IndexSpec.from_dict(manifest.index)
            for entry in manifest.segments:
                with self.reading(f"{SEGMENTS}/{entry.name}", opening=True):
                    self._segments.append(Segment(folder / SEGMENTS / entry.name, segment_spec(entry, self.spec),
                                                  device=device))
            with self.reading(CALIBRATOR, opening=True):
                config = saved_config(folder / CALIBRATOR, expected_dim=manifest.encoder["dim"])
                # A flow's weights load at first use (one saved before its NumPy map needs torch): show, delete,
                # verify... never import it.
                self._calibrator = (None if loads_torch(config) else
                                    load_calibrator(folder / CALIBRATOR, expected_dim=manifest.encoder["dim"]))
            with self.reading(TOMBSTONES, opening=True):
                self.tombstones = (load_npy(folder / TOMBSTONES) if (folder / TOMBSTONES).is_file()
                                   else np.empty(0, dtype=np.int64))
                _check_tombstones(self.tombstones)
            check_counts(manifest, [len(segment) for segment in self._segments],
                         [segment.vectors.ntotal for segment in self._segments], len(self.tombstones), self.name)
        except BaseException:
            self.close()  # the segments opened before the damage was found
            raise

    @classmethod
    def open(cls, name: str, index_dir: str | Path | None = None, device: str = "auto") -> Snapshot:
        """Open the current version: checks the manifest's checksum and every file's size (`verify` re-hashes).
        INDEX_DIR: where indexes live (default: the index home, `home.resolve_index_dir`)."""
        index_dir = resolve_index_dir(index_dir)
        attempts = OPEN_ATTEMPTS
        while True:
            folder = resolve_existing(index_dir, name)  # resolved once: a concurrent swap cannot mix versions
            try:
                return cls(folder, read_manifest(folder, name=name), device=device, index_dir=index_dir)
            except (RetrieverError, OSError):
                # Writes committed while it opened, and one pruned the version it had resolved: files went missing
                # under it. Not damage: the index is whole, in the newer version the link points at now.
                attempts -= 1
                if not attempts or resolve_existing(index_dir, name) == folder:
                    raise

    @classmethod
    def open_version(cls, folder: str | Path, name: str, index_dir: str | Path | None = None,
                     device: str = "auto") -> Snapshot:
        """Open one version folder of NAME (as a write's `ChangeSummary.snapshot` does), current or not."""
        folder = Path(folder)
        return cls(folder, read_manifest(folder, name=name), device=device, index_dir=index_dir)

    @property
    def calibrator(self) -> Calibrator:
        """The saved calibrator (a flow's weights are read here, on first use)."""
        calibrator = self._calibrator
        if calibrator is None:
            with self._calibrator_lock, self.reading(CALIBRATOR, opening=True):
                if self._calibrator is None:
                    self._calibrator = load_calibrator(self.folder / CALIBRATOR,
                                                       expected_dim=self.manifest.encoder["dim"])
                calibrator = self._calibrator
        return calibrator

    @property
    def segments(self) -> list[Segment]:
        if self._closed:
            raise RetrieverError(f"index '{self.name}' was closed; open it again to use it")
        return self._segments

    @property
    def has_keywords(self) -> bool:
        """Whether every segment has a keyword index (those written before keyword search have none, and those
        written when a cut document was scored by its passages alone have none this release reads)."""
        return all(segment.keywords is not None for segment in self.segments)

    def close(self) -> None:
        """Release this version's files: each segment's SQLite connection, FAISS index and memory maps (a few
        descriptors a segment). A long-running process that swaps in new versions (the server) calls it once no
        request uses the old one, so pruned versions do not pile up open; using the index afterwards is refused.
        Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            segment.close()
        self._segments = []

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.manifest.documents

    @contextmanager
    def reading(self, part: str, opening: bool = False,
                errors: tuple[type[BaseException], ...] = (Exception,)) -> Iterator[None]:
        """Around a read of PART of this version (a file, or a folder of them): a file that no longer parses
        becomes one line naming the index, a DamagedIndexError chained to whatever the parser raised
        (UnicodeDecodeError, ValueError, faiss's RuntimeError, sqlite3.DatabaseError...). Put only reads inside:
        anything raised there is taken for the file's fault (ERRORS narrows that where a read shares its block
        with work of its own). OPENING: our own refusals (RetrieverError) too, where no argument of the caller's is
        involved, so any failure is the files'. Not damage: an OSError (a file that cannot be opened is not a
        damaged one), a missing module, or memory running out (on a GPU too)."""
        try:
            yield
        except (OSError, ImportError, MemoryError):
            raise
        except DamagedIndexError as error:
            if str(error).startswith(f"index '{self.name}' "):
                raise
            raise self.damaged(part, error) from error
        except RetrieverError as error:
            if not opening:
                raise
            raise self.damaged(part, error) from error
        except errors as error:
            if "OutOfMemory" in type(error).__name__:
                raise
            raise self.damaged(part, error) from error

    def damaged(self, part: str, error: BaseException | str) -> DamagedIndexError:
        """The one line saying PART of this version cannot be read, and why (ERROR, without server paths)."""
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = reason.replace(f"{self.folder}/", "").replace(str(self.folder), "")[:200]
        return damaged_index(f"index '{self.name}'", f"{part} cannot be read ({reason}); `retriever verify` checks "
                                                     "every file")

    # --- documents -------------------------------------------------------------------------------------------

    def rows(self, rowids: np.ndarray, columns: Sequence[str] | None = None) -> dict[int, dict]:
        """The document rows of ROWIDS (-1, padding, skipped), each read from the segment that holds it. A row id no
        segment holds is damage: the vectors and the documents disagree."""
        wanted = np.unique(np.asarray(rowids, dtype=np.int64))
        wanted = wanted[wanted >= 0]
        rows: dict[int, dict] = {}
        for segment in self.segments:
            here = wanted[segment.contains(wanted)]
            if len(here):
                with self.reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                    found = segment.documents.get(here) if columns is None else segment.documents.get(here, columns)
                rows.update((row["rowid"], row) for row in found)
        if len(rows) < len(wanted):
            missing = [int(rowid) for rowid in wanted if int(rowid) not in rows][:5]
            raise self.damaged(SEGMENTS, f"row ids {missing} have no segment")
        return rows

    def document(self, doc_id: str) -> dict | None:
        """The stored row of DOC_ID (doc_id, title, text, source, line, metadata), or None if it is not here."""
        for segment in self.segments:
            with self.reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                rowid = segment.documents.rowids_for([doc_id]).get(doc_id)
                if rowid is not None and not _in(rowid, self.tombstones):
                    return segment.documents.get([rowid])[0]
        return None

    def live_rowids(self, doc_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """doc_id -> (row id, segment position) for those of DOC_IDS in the index (deleted ones are not)."""
        found: dict[str, tuple[int, int]] = {}
        for position, segment in enumerate(self.segments):
            with self.reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                for doc_id, rowid in segment.documents.rowids_for(doc_ids).items():
                    if not _in(rowid, self.tombstones):
                        found[doc_id] = (rowid, position)
        return found

    def matching(self, where: Filter) -> np.ndarray:
        """The live row ids (int64, ascending) WHERE selects, over every segment (every document's fields read:
        the search layer remembers the recent filters' answers)."""
        parts = []
        for segment in self.segments:
            with self.reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                parts.append(segment.documents.matching(where))
        found = np.concatenate(parts) if parts else np.empty(0, np.int64)
        return found[~np.isin(found, self.tombstones)] if len(self.tombstones) else found

    def field_kinds(self, paths: list[str]) -> dict[str, set[int]]:
        """The kinds of value each metadata path of PATHS holds over every segment (`DocumentTable.field_kinds`)."""
        found: dict[str, set[int]] = {}
        for segment in self.segments:
            with self.reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                for path, kinds in segment.documents.field_kinds(paths).items():
                    found.setdefault(path, set()).update(kinds)
        return found

    # --- vectors ---------------------------------------------------------------------------------------------

    def calibrate(self, raw: np.ndarray) -> np.ndarray:
        """Raw encoder output to the index's space: the saved calibrator, then L2 normalization."""
        return l2_normalize(self.calibrator.transform(raw))

    def raw_of(self, segment: Segment, keys: np.ndarray) -> np.ndarray:
        """The raw vectors (float32) of vector KEYS, all held by SEGMENT."""
        with self.reading(f"{SEGMENTS}/{segment.name}/{RAW}"):
            return segment.raw_for(keys)

    def live_documents(self, segment: Segment) -> np.ndarray:
        """SEGMENT's mask of documents that are not deleted (row for row with its row ids)."""
        return ~np.isin(np.asarray(segment.rowids), self.tombstones)

    def live_vectors(self, segment: Segment) -> np.ndarray:
        """SEGMENT's mask of vectors whose documents are not deleted (row for row with its raw vectors)."""
        return ~np.isin(segment.documents_of(np.asarray(segment.keys)), self.tombstones)

    def raw_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """All uncalibrated vectors (float32) of documents in the index (a vector per passage), with their
        documents' row ids. Holds every vector in memory: for small indexes and tests; the library itself streams
        (`Segment.raw_blocks`)."""
        raws, ids = [], []
        for segment in self.segments:
            keep = self.live_vectors(segment)
            raws.append(np.asarray(segment.raw[keep], dtype=np.float32))
            ids.append(segment.documents_of(np.asarray(segment.keys)[keep]))
        dim = self.manifest.encoder["dim"]
        return (np.concatenate(raws) if raws else np.empty((0, dim), np.float32),
                np.concatenate(ids) if ids else np.empty(0, np.int64))

    def document_vectors(self, segment: Segment) -> np.ndarray:
        """SEGMENT's mask of its live documents' own vectors (row for row with its raw vectors): what the encoder
        read of each document, a cut document's first passage. What a calibrator is fitted and checked on."""
        keys = np.asarray(segment.keys)
        own = passage_numbers(keys) == 0 if segment.split else np.ones(len(keys), bool)
        return own & self.live_vectors(segment)

    def raw_sample(self, size: int, seed: int = 0) -> np.ndarray:
        """At most SIZE raw vectors (float32) of the documents in the index (their own vectors, `document_vectors`),
        drawn uniformly with SEED; a value that is not finite (what a flipped bit in a float16 file can make) is a
        damaged segment, not something to fit on."""
        positions = [np.flatnonzero(self.document_vectors(segment)) for segment in self.segments]
        rows = fit_sample_rows(sum(len(held) for held in positions), size, seed)
        parts, offset = [], 0
        for segment, held in zip(self.segments, positions):
            local = held if rows is None else held[rows[(rows >= offset) & (rows < offset + len(held))] - offset]
            if len(local):
                vectors = np.asarray(segment.raw[local], dtype=np.float32)
                if not np.isfinite(vectors).all():
                    raise self.damaged(f"{SEGMENTS}/{segment.name}/{RAW}", "it holds values that are not finite")
                parts.append(vectors)
            offset += len(held)
        return np.concatenate(parts) if parts else np.empty((0, self.manifest.encoder["dim"]), np.float32)

    def check_sources(self):
        """DOCUMENTS_AT and VECTORS_AT over the documents in the index (deleted ones left out), for
        `calibration.pseudo_queries.CheckRounds`: position i is the i-th live document, segment by segment, its
        text whole and its vector its own (`document_vectors`); and how many there are."""
        live = [np.asarray(segment.keys)[self.document_vectors(segment)] for segment in self.segments]
        keys = np.concatenate(live) if live else np.empty(0, np.int64)
        owner = np.concatenate([np.full(len(ids), number) for number, ids in enumerate(live)]) if live else keys

        def each_segment(positions: np.ndarray, read) -> list:
            found: list = [None] * len(positions)
            for number, segment in enumerate(self.segments):
                mine = np.flatnonzero(owner[positions] == number)
                if len(mine):
                    with self.reading(f"{SEGMENTS}/{segment.name}"):
                        for slot, value in zip(mine.tolist(), read(segment, keys[positions[mine]])):
                            found[slot] = value
            return found

        def texts(segment: Segment, ids: np.ndarray) -> list[tuple[str | None, str]]:
            return [(row["title"], row["text"])
                    for row in segment.documents.get(segment.documents_of(ids), ("title", "text"))]

        def documents_at(positions: np.ndarray) -> list[tuple[str | None, str]]:
            return each_segment(positions, texts)

        def vectors_at(positions: np.ndarray) -> np.ndarray:
            dim = self.manifest.encoder["dim"]
            return np.asarray(each_segment(positions, lambda segment, ids: list(segment.raw_for(ids))),
                              dtype=np.float32).reshape(len(positions), dim)

        return documents_at, vectors_at, len(keys)

    def spans(self, rowids: np.ndarray, keys: np.ndarray) -> dict[int, tuple[int, int] | None]:
        """Row id -> the character span of its passage KEYS names (row for row with ROWIDS; -1: none known), or
        None where the document is one passage (its whole text)."""
        rowids, keys = np.asarray(rowids, np.int64), np.asarray(keys, np.int64)
        found: dict[int, tuple[int, int] | None] = {int(rowid): None for rowid in rowids.tolist()}
        for segment in self.segments:
            mine = segment.contains(rowids) & (keys >= 0)
            if segment.split and mine.any():
                with self.reading(f"{SEGMENTS}/{segment.name}"):
                    spans = segment.spans_of(keys[mine])
                found.update((rowid, (start, end)) for rowid, (start, end) in zip(rowids[mine].tolist(), spans.tolist()))
        return found

    # --- integrity -------------------------------------------------------------------------------------------

    def verify(self, progress=None) -> int:
        """Re-hash every file against the manifest (opening only checks sizes, and the counts); returns the bytes
        checked."""
        return verify_files(self.folder, self.manifest, name=self.name, progress=progress)

    def template(self):
        """This version's trained template (IVF types), re-hashed first, for a write whose new segments start from
        a copy of it; None for the types that train nothing."""
        if not (self.folder / TEMPLATE).is_file():
            return None
        self.check_read(TEMPLATE)
        with self.reading(TEMPLATE, opening=True):
            return load_template(self.folder / TEMPLATE, self.spec)

    def check_read(self, *parts: str) -> None:
        """Before a write reads PARTS of this version (files, or folders of them) into a new one: re-hash them
        against the manifest (`integrity.verify_read`), so damage is refused instead of carried on."""
        files = self.manifest.files
        verify_read(self.folder, [relative for relative in files
                                  if any(relative == part or relative.startswith(part + "/") for part in parts)],
                    files, self.name)


def verify_index(name: str, index_dir: str | Path | None = None, progress=None) -> tuple[Manifest, int]:
    """Re-hash every file of NAME's current version against its manifest, without opening (and so trusting)
    any of them first; returns the manifest and the bytes checked."""
    index_dir = resolve_index_dir(index_dir)
    folder = resolve_existing(index_dir, name)
    manifest = read_manifest(folder, name=name)  # its types checked before a path from it is followed
    checked = verify_files(folder, manifest, name=name, progress=progress)
    check_counts(manifest, [_stored_rows(folder, f"{SEGMENTS}/{entry.name}/{ROWIDS}", name)
                            for entry in manifest.segments],
                 [_stored_rows(folder, f"{SEGMENTS}/{entry.name}/{PASSAGES if entry.vectors is not None else ROWIDS}",
                               name) for entry in manifest.segments],
                 _stored_rows(folder, TOMBSTONES, name) if (folder / TOMBSTONES).is_file() else 0, name)
    return manifest, checked


def _stored_rows(folder: Path, relative: str, name: str) -> int:
    """The rows of a .npy of the version in FOLDER, from its header alone."""
    try:
        return int(npy_layout(folder / relative)[0][0])
    except (RetrieverError, IndexError) as error:
        reason = str(error).replace(f"{folder}/", "") if isinstance(error, RetrieverError) else "no rows"
        raise damaged_index(f"index '{name}'", f"{relative} cannot be read ({reason})") from error


def check_counts(manifest: Manifest, rows: list[int], vectors: list[int] | None, deleted: int, name: str) -> None:
    """The manifest's counts against the files': each segment's ROWS (and VECTORS, when loaded), and its document
    count against all rows less the DELETED ones. Header reads only, so opening stays cheap; a manifest written
    by hand or a swapped file shows here rather than as wrong counts or missing rows later."""
    def damaged(problem: str) -> DamagedIndexError:
        return damaged_index(f"index '{name}'", problem)

    for number, (entry, held) in enumerate(zip(manifest.segments, rows)):
        where = f"{SEGMENTS}/{entry.name}"
        if held != entry.rows:
            raise damaged(f"{where}/{ROWIDS} holds {held:,} rows, the manifest says {entry.rows:,}")
        if vectors is not None and vectors[number] != entry.vector_rows:
            raise damaged(f"{where} holds {vectors[number]:,} vectors, the manifest says "
                          f"{entry.vector_rows:,}")
    if manifest.documents != sum(rows) - deleted:
        raise damaged(f"the manifest counts {counted(manifest.documents, 'document')}, but its segments hold "
                      f"{counted(sum(rows), 'row')} of which {deleted:,} are deleted")


def _check_tombstones(tombstones: np.ndarray) -> None:
    """Tombstones are row ids, ascending and distinct (searches look them up by bisection)."""
    if tombstones.ndim != 1 or tombstones.dtype.kind not in "iu" or (np.diff(tombstones) <= 0).any():
        raise RetrieverError("not an ascending list of row ids")


def segment_spec(entry: SegmentEntry, spec: IndexSpec) -> IndexSpec:
    """The index settings of the segment ENTRY in a version whose settings are SPEC (small hnsw segments are
    flat)."""
    kind = entry.index or spec.type
    return spec if kind == spec.type else IndexSpec(type=kind)


def _in(rowid: int, sorted_ids: np.ndarray) -> bool:
    position = np.searchsorted(sorted_ids, rowid)
    return bool(position < len(sorted_ids) and sorted_ids[position] == rowid)
