"""Writing an index: one transaction per write, over the version that was current when it began.

`IndexWriter` holds the index's writer lock (writers of one name take turns; readers never wait), gives a
partial version folder (`folder.writing`) and, for a write to an existing index, hard-links the current
version's files into it (`link_tree`) and keeps a working copy of its manifest and tombstones. The write's steps
change that copy: a new segment, tombstones, merges, a new calibrator with every segment's vectors rewritten.
`commit` applies the merge policy, writes the tombstones and the manifest and swaps the version in; leaving the
block without it discards everything, so a failed or killed write loses nothing.

A write re-hashes what it reads from the previous version into the new one (`Snapshot.check_read`), so damage is
refused rather than carried on; what it only links keeps its old manifest entry (`integrity.write_manifest`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from retriever.calibration import Calibrator
from retriever.errors import ConflictError, NotFoundError, RetrieverError, param
from retriever.files.folder import FOLDER_KEY
from retriever.filters import Filter
from retriever.versions.folder import link_tree, writing
from retriever.versions.home import resolve_existing
from retriever.versions.integrity import changed_since_commit, read_manifest, write_manifest
from retriever.versions.layout import CALIBRATOR, SEGMENTS, TEMPLATE, TOMBSTONES
from retriever.store.layout import DOCUMENTS, RAW, ROWIDS, VECTORS, segment_name
from retriever.versions.manifest import Manifest, SegmentEntry
from retriever.numeric import l2_normalize
from retriever.versions.snapshot import Snapshot, segment_spec
from retriever.store.arrays import load_npy
from retriever.store.documents import DocumentTable
from retriever.store.passages import PASSAGE_BITS
from retriever.store.segment import RawWriter, Segment, document_files, finish_segment
from retriever.store.vectors import VectorStore
from retriever.store.spec import IndexSpec


@dataclass(frozen=True)
class MergePolicy:
    """Which segments a write merges before it commits. Only small segments or heavily deleted ones are
    rewritten, so a write's cost stays proportional to what it changes, while searches never face many segments
    or many tombstones."""

    tombstone_share: float = 0.3  # a segment with this share of its rows deleted is rewritten without them...
    max_segments: int = 8  # ...and past this many segments, the adjacent run with the fewest rows is merged

    def next_merge(self, segments: Sequence[SegmentEntry]) -> list[str] | None:
        """The names of the adjacent segments to merge next (one name: rewrite it without its deleted rows), or
        None when SEGMENTS are as the policy wants them. Deleted counts must be known (`deleted` not None)."""
        for entry in segments:
            if entry.rows and entry.deleted >= self.tombstone_share * entry.rows:
                return [entry.name]
        if len(segments) > self.max_segments:
            rows = [entry.rows for entry in segments]
            run = len(segments) - self.max_segments + 1
            start = min(range(len(segments) - run + 1), key=lambda first: sum(rows[first : first + run]))
            return [entry.name for entry in segments[start : start + run]]
        return None


class IndexWriter:
    """One write to index NAME in INDEX_DIR, as a context manager; `commit()` makes it the current version.

    CURRENT: a snapshot the caller already holds, used as the base if it is still the current version (its
    loaded model is kept); otherwise the current version is opened. BUILD: a new index (no base; the caller
    commits a whole manifest), with RESUME_KEY to take over a killed build's partial folder of the same key;
    a build never waits for another writer, since one of the two would silently replace the other."""

    def __init__(self, index_dir: Path, name: str, *, current: Snapshot | None = None, device: str = "auto",
                 merge_policy: MergePolicy | None = None, build: bool = False, resume_key: dict | None = None,
                 busy_hint: str = "wait for it to finish"):
        self.index_dir, self.name, self.device = Path(index_dir), name, device
        self.merge_policy = merge_policy or MergePolicy()
        self.merged = 0  # segments merged by the policy at commit
        self.merges: list[int] = []  # how many segments each of those merges took (1: a rewrite without deletions)
        self._given, self._build, self._resume_key, self._busy_hint = current, build, resume_key, busy_hint
        self._base: Snapshot | None = None
        self._template_loaded = False
        self._template = None
        self._stack = ExitStack()
        self.manifest: Manifest | None = None
        self.tombstones = np.empty(0, np.int64)

    def __enter__(self) -> IndexWriter:
        with ExitStack() as stack:
            self._version = stack.enter_context(writing(
                self.index_dir, self.name, resume_key=self._resume_key if self._build else None,
                wait=not self._build, busy_hint=self._busy_hint, build=self._build))
            self.folder: Path = self._version.folder
            if not self._build:
                self._base = self._current()
                if self._base is not self._given:
                    stack.callback(self._base.close)
                base = self._base
                # Written again, with whatever this write changes; and every file changed since the version was
                # committed (a write links the rest on unread, and pruning would leave only damaged versions).
                base.check_read(TOMBSTONES, *changed_since_commit(base.folder, base.manifest))
                link_tree(base.folder, self.folder, skip=lambda relative: relative == TOMBSTONES)
                self.tombstones = base.tombstones
                self.manifest = base.manifest.replace(segments=tuple(
                    entry if entry.deleted is not None else
                    replace(entry, deleted=_deleted_rows(base.folder, entry, base.tombstones))
                    for entry in base.manifest.segments))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc_info: object) -> bool | None:
        return self._stack.__exit__(*exc_info)

    @property
    def number(self) -> int:
        """The number the committed version gets (one more than any kept version's)."""
        return self._version.number

    @property
    def resumed(self) -> bool:
        """A build that took over a killed build's partial folder (its finished work is in `folder`)."""
        return self._version.resumed

    @property
    def base(self) -> Snapshot:
        """The version this write started from."""
        if self._base is None:
            raise RetrieverError("a build writes a new index: it has no previous version to read")
        return self._base

    def _current(self) -> Snapshot:
        given = self._given
        if given is not None and resolve_existing(self.index_dir, self.name) == given.folder:
            # Versions never change, but their files can be damaged after they were opened (a server holds one for
            # hours): the sizes checked again, as an open checks them, before a new version links them in.
            read_manifest(given.folder, name=self.name)
            return given
        return Snapshot.open(self.name, self.index_dir, device=self.device)

    # --- steps ---------------------------------------------------------------------------------------------

    def new_segment_folder(self) -> Path:
        """An empty folder for the next segment (its entry is recorded by `add_segment` once it is written)."""
        number = self.manifest.next_segment if self.manifest is not None else 1
        folder = self.folder / SEGMENTS / segment_name(number)
        folder.mkdir(parents=True, exist_ok=self._build)
        if self.manifest is not None:
            self.manifest = self.manifest.replace(next_segment=number + 1)
        return folder

    def add_segment(self, folder: Path, rows: int, vectors: int | None = None) -> None:
        """Record the written segment FOLDER of ROWS new documents (VECTORS passages), row ids from
        `manifest.next_rowid`."""
        manifest = self.manifest
        entry = SegmentEntry.written(folder.name, rows, self.base.spec, vectors=vectors)
        self.manifest = manifest.replace(segments=(*manifest.segments, entry),
                                         documents=manifest.documents + rows, next_rowid=manifest.next_rowid + rows)

    def template(self):
        """The trained template (IVF types) new segments start from: the previous version's, re-hashed first since
        every new segment starts from a copy of it, or the one `replace_calibrator` trained. None for the types
        that train nothing."""
        if not self._template_loaded:
            self._template = self.base.template()
            self._template_loaded = True
        return self._template

    def existing_ids(self, table: DocumentTable) -> list:
        """TABLE's documents whose ids are already live in the index."""
        clashes, batch = [], []
        for _, document in table.documents():
            batch.append(document)
            if len(batch) == 10000:
                clashes += self._clashing(batch)
                batch = []
        return clashes + self._clashing(batch)

    def refuse_existing_ids(self, table: DocumentTable) -> None:
        """Refuse (one line, before any encoding) TABLE's documents whose ids are already in the index."""
        clashes = self.existing_ids(table)
        if clashes:
            # A file of a folder is a document whole: no line to name.
            shown = ", ".join(f"{d.doc_id!r}" + ("" if FOLDER_KEY in (d.metadata or {}) else f" (line {d.line})")
                              for d in clashes[:5])
            more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
            noun = "id is" if len(clashes) == 1 else "ids are"
            raise ConflictError(f"{clashes[0].source}: {len(clashes)} {noun} already in the index: {shown}{more}; "
                                f"to replace {'it' if len(clashes) == 1 else 'them'}, add with {param('upsert', True)}")

    def _clashing(self, documents: list) -> list:
        found = self.base.live_rowids([d.doc_id for d in documents]) if documents else {}
        return [d for d in documents if d.doc_id in found]

    def delete(self, doc_ids: Sequence[str]) -> int:
        """Tombstone DOC_IDS, all or nothing (a missing id refuses the whole write); returns how many."""
        found = self.base.live_rowids(doc_ids)
        missing = [doc_id for doc_id in doc_ids if doc_id not in found]
        if missing:
            shown = ", ".join(repr(d) for d in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            noun = "id is" if len(missing) == 1 else "ids are"
            raise NotFoundError(f"{len(missing)} {noun} not in the index: {shown}{more}")
        removed = np.fromiter((rowid for rowid, _ in found.values()), dtype=np.int64, count=len(found))
        return self._tombstone(removed, np.array([position for _, position in found.values()], dtype=np.int64))

    def delete_where(self, where: Filter) -> int:
        """Tombstone every live document WHERE selects (`retriever.filters`); returns how many. None selected
        is refused: a delete that changes nothing should say so, not commit a version."""
        removed = self.base.matching(where)
        removed = removed[~np.isin(removed, self.tombstones)]
        if not len(removed):
            raise NotFoundError(f"no document in index '{self.name}' matches the filter; nothing deleted")
        positions = np.zeros(len(removed), dtype=np.int64)
        for position, segment in enumerate(self.base.segments):
            positions[segment.contains(removed)] = position
        return self._tombstone(removed, positions)

    def _tombstone(self, removed: np.ndarray, positions: np.ndarray) -> int:
        """Record REMOVED row ids (live, held by the segments at POSITIONS) as deleted."""
        newly = np.bincount(positions, minlength=len(self.manifest.segments))
        segments = []
        for number, (entry, count) in enumerate(zip(self.manifest.segments, newly)):
            entry = replace(entry, deleted=entry.deleted + int(count))
            if entry.vectors is not None and count:  # a segment of passages: its deleted documents' vectors
                vectors = len(self.base.segments[number].keys_of(np.sort(removed[positions == number])))
                entry = replace(entry, deleted_vectors=(entry.deleted_vectors or 0) + vectors)
            segments.append(entry)
        self.tombstones = np.union1d(self.tombstones, removed)
        self.manifest = self.manifest.replace(segments=tuple(segments),
                                              documents=self.manifest.documents - len(removed))
        return len(removed)

    def merge(self, names: Sequence[str]) -> None:
        """Replace the adjacent segments NAMES by one, without their deleted rows (those tombstones go). Every byte
        of the merged segments is copied into the new one, so they are re-hashed first: a new segment, hashed as
        it is written, would vouch for any damage it copied. No names (an index whose every document was deleted
        holds no segment): nothing to merge."""
        if not names:
            return
        base, manifest, tombstones = self.base, self.manifest, self.tombstones
        base.check_read(*(f"{SEGMENTS}/{name}" for name in names))
        new = self.new_segment_folder()
        entries = {entry.name: entry for entry in manifest.segments}
        old = [Segment(self.folder / SEGMENTS / name, segment_spec(entries[name], base.spec), device="cpu")
               for name in names]
        dropped = np.zeros(len(tombstones), dtype=bool)
        rows = vectors = 0
        # One segment cut into passages makes the merged one keyed by passage: the others' row ids become the
        # keys of their documents' first (only) passage, spanning the whole text.
        split = any(segment.split for segment in old)
        try:
            with DocumentTable.create(new / DOCUMENTS) as table:
                for segment in old:
                    rows += table.copy_from(segment.documents, tombstones)
                table.finish()
            raw = RawWriter(new, manifest.encoder["dim"], split=split)
            shifts, excluded = [], []
            for segment in old:
                dropped |= segment.contains(tombstones)
                shifts.append(PASSAGE_BITS if split and not segment.split else 0)
                excluded.append(segment.keys_of(tombstones[segment.contains(tombstones)]))
                for keys, block in segment.raw_blocks():
                    owners = segment.documents_of(keys)
                    keep = ~np.isin(owners, tombstones)
                    spans = None
                    if split:
                        spans = (segment.spans_of(keys[keep]) if segment.split else
                                 np.column_stack([np.zeros(int(keep.sum()), np.int64),
                                                  segment.documents.text_lengths(owners[keep])]))
                    raw.append(keys[keep] << shifts[-1], block[keep], spans)
                    vectors += int(keep.sum())
            raw.close()
            VectorStore.merged([s.vectors for s in old], excluded, base.spec.for_segment(vectors), self.template(),
                               shifts).save(new / VECTORS)
        finally:
            for segment in old:
                segment.close()
        if rows:
            finish_segment(new)
        for folder in [self.folder / SEGMENTS / name for name in names] + ([new] if rows == 0 else []):
            _remove_links(folder)
        segments = []
        for entry in self.manifest.segments:
            if entry.name == names[0] and rows:
                segments.append(SegmentEntry.written(new.name, rows, base.spec, vectors=vectors))
            elif entry.name not in names:
                segments.append(entry)
        self.manifest = self.manifest.replace(segments=tuple(segments))
        self.tombstones = tombstones[~dropped]

    def replace_calibrator(self, calibrator: Calibrator, spec: IndexSpec, template) -> None:
        """Rewrite every segment's vector index through CALIBRATOR (fitted) into SPEC's index type, from the
        stored raw vectors; the documents and raw vectors are linked into the renamed segments as they are."""
        base = self.base
        base.check_read(*(f"{SEGMENTS}/{entry.name}/{part}" for entry in base.manifest.segments
                          for part in (RAW, ROWIDS)))
        for relative in (CALIBRATOR, TEMPLATE):
            _remove_links(self.folder / relative)
        segments = []
        for old, entry in zip(base.segments, self.manifest.segments):
            _remove_links(self.folder / SEGMENTS / entry.name)
            new = self.new_segment_folder()
            for file_name in document_files():  # unchanged by a new calibrator (a structure newer than the
                if (old.folder / file_name).is_file():  # segment is missing: compaction adds it)
                    (new / file_name).hardlink_to(old.folder / file_name)
            store = None
            for rowids, raw in old.raw_blocks():
                calibrated = l2_normalize(calibrator.transform(raw))
                if store is None:
                    store = VectorStore.create(calibrated.shape[1], spec.for_segment(len(old.keys)), template,
                                               device="cpu")
                store.add(rowids, calibrated)
            if store is None:
                dim = int(calibrator.transform(np.zeros((1, base.manifest.encoder["dim"]), np.float32)).shape[1])
                store = VectorStore.create(dim, spec.for_segment(len(old.keys)), template, device="cpu")
            store.save(new / VECTORS)
            segments.append(replace(SegmentEntry.written(new.name, len(old), spec, entry.deleted,
                                                         vectors=len(old.keys)), fields=entry.fields,
                                    deleted_vectors=entry.deleted_vectors))
        calibrator.save(self.folder / CALIBRATOR)
        if template is not None:
            VectorStore(template, spec).save(self.folder / TEMPLATE)
        self._template, self._template_loaded = template, True
        self.manifest = self.manifest.replace(segments=tuple(segments), calibrator=calibrator.config(),
                                              index=spec.to_dict(), index_type=spec.type, calibrator_fallback=None)

    # --- commit --------------------------------------------------------------------------------------------

    def commit(self, manifest: Manifest | None = None, merge: bool = True) -> Path:
        """Make this write the current version: apply the merge policy (MERGE), write the tombstones and the
        manifest (MANIFEST: a build's whole new one), swap it in. Returns the committed version's folder."""
        if manifest is not None:
            self.manifest = manifest
        if self._base is not None:
            while merge and (names := self.merge_policy.next_merge(self.manifest.segments)):
                self.merge(names)
                self.merged += len(names)
                self.merges.append(len(names))
        # Each new segment's metadata keys, read once from its finished table, so `list` shows them from the
        # manifest alone (a segment of before metadata gets its record at the first write after).
        self.manifest = self.manifest.replace(segments=tuple(
            entry if entry.fields is not None else replace(entry, fields=_fields(self.folder, entry))
            for entry in self.manifest.segments))
        self.manifest = self.manifest.replace(version=self._version.number)
        if self._base is not None:
            path = self.folder / TOMBSTONES
            path.unlink(missing_ok=True)  # a hard link to the previous version's file must not be written through
            if len(self.tombstones):
                np.save(path, np.asarray(self.tombstones, dtype=np.int64))
            self.manifest = self.manifest.replace(deleted=len(self.tombstones))
            self.manifest = write_manifest(self.folder, self.manifest, self._base.folder, self._base.manifest.files)
        else:
            self.manifest = write_manifest(self.folder, self.manifest)
        return self._version.commit()


def _fields(folder: Path, entry: SegmentEntry) -> tuple[str, ...]:
    with DocumentTable.open(folder / SEGMENTS / entry.name / DOCUMENTS) as table:
        return tuple(table.metadata_fields())


def _deleted_rows(folder: Path, entry: SegmentEntry, tombstones: np.ndarray) -> int:
    """How many of the segment's rows are tombstoned, counted from its row ids (for a record without the count)."""
    if not len(tombstones):
        return 0
    return int(np.isin(load_npy(folder / SEGMENTS / entry.name / ROWIDS, mmap_mode="r"), tombstones).sum())


def _remove_links(path: Path) -> None:
    """Remove PATH (a file or a folder of files) from the version being written: hard links, so the previous
    version keeps its files."""
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    elif path.exists():
        path.unlink()
