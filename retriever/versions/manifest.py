"""A version's manifest, typed: what a version holds (its number, segments, counts, encoder, calibrator, index
settings) and every file with its size and hash.

`Manifest.from_record` is the one place that reads a manifest's JSON: it checks every field's type against the
annotations below (a manifest edited by hand or written by a buggy tool fails with one line, not a KeyError
later) and turns records of older formats into today's. `Manifest.to_record` is the one place that writes it.
The nested records (`encoder`, `calibrator`, `index`, `fit`) belong to the modules that make them
(`Encoder.config`, `Calibrator.config`, `IndexSpec.to_dict`, the build) and stay plain dicts here; only the
fields readers rely on are checked. Fields this release does not know (a newer writer's) are kept in `extra`,
so rewriting a manifest loses nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypedDict, Union

from retriever.errors import DamagedIndexError, RetrieverError
from retriever.store.layout import SEGMENT_NAME

FORMAT_VERSION = 2
# Formats this release reads; 1 had no segments (one FAISS file per index) and must be rebuilt.
READABLE_FORMATS = (2,)

# What to do about a damaged version: the version before it may be intact (a write keeps it).
DAMAGE_HINT = ("rebuild the index, or roll back to a kept version (`retriever versions` lists them; a rollback checks "
               "every file of it first)")


class EncoderRecord(TypedDict):
    """`Encoder.config()`: what a query must be encoded with to land in the index's space."""

    model: str
    pooling: str
    layers: list | None
    max_length: int
    dtype: str
    dim: int


@dataclass(frozen=True)
class FileEntry:
    bytes: int
    sha256: str

    def to_record(self) -> dict:
        return {"bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class SegmentEntry:
    """A segment of the version: its folder name under segments/, its rows, how many of them are tombstoned (so
    the merge policy reads counts instead of scanning row ids) and its index type (small hnsw segments are
    flat)."""

    name: str
    rows: int
    deleted: int | None = None  # None: a record from before counts were kept (then counted from the row ids)
    index: str | None = None  # None: the version's index type
    fields: tuple[str, ...] | None = None  # its documents' metadata keys; None: not recorded yet (set at commit)
    vectors: int | None = None  # its passages' vectors, where documents are cut into passages; None: one a row
    deleted_vectors: int | None = None  # of those, the deleted documents'; None: as many as deleted rows

    @classmethod
    def written(cls, name: str, rows: int, spec, deleted: int = 0, vectors: int | None = None) -> SegmentEntry:
        """A new segment's record of ROWS documents (VECTORS passages where some are cut into several): its index
        type is the one SPEC (the version's `IndexSpec`) gives its vectors' count (small hnsw segments are flat)."""
        vectors = None if vectors is None or vectors == rows else int(vectors)
        return cls(name, int(rows), int(deleted), spec.for_segment(vectors or rows).type, None, vectors)

    @property
    def vector_rows(self) -> int:
        """How many vectors it holds: one per passage."""
        return self.rows if self.vectors is None else self.vectors

    @property
    def live_vectors(self) -> int:
        """Its vectors less the deleted documents'."""
        deleted = self.deleted_vectors if self.deleted_vectors is not None else (self.deleted or 0)
        return self.vector_rows - deleted

    def to_record(self) -> dict:
        return {"name": self.name, "rows": self.rows,
                **({"deleted": self.deleted} if self.deleted is not None else {}),
                **({"index": self.index} if self.index is not None else {}),
                **({"fields": list(self.fields)} if self.fields is not None else {}),
                **({"vectors": self.vectors} if self.vectors is not None else {}),
                **({"deleted_vectors": self.deleted_vectors} if self.deleted_vectors is not None else {})}


@dataclass(frozen=True)
class Manifest:
    name: str
    created: str
    encoder: EncoderRecord
    calibrator: dict
    index: dict
    dim: int  # of the calibrated vectors (whitening-K and flow-K reduce the encoder's)
    documents: int  # live: every segment's rows less the tombstoned ones
    segments: tuple[SegmentEntry, ...]
    next_rowid: int
    next_segment: int
    versions: dict  # library versions that wrote it
    format_version: int = FORMAT_VERSION
    # The version's number: one more than any kept version of the index when it was committed, so numbers only
    # grow (`retriever.versions.folder`); 0: written before versions were numbered.
    version: int = 0
    source: str | None = None  # the corpus file (or folder); None: documents given in Python
    # A folder of files as the corpus (`retriever.files`): the patterns and limit it is read with, which `sync`
    # reads it with again; None: a corpus file, or documents given in Python.
    folder: dict | None = None
    vectors_from: str | None = None
    fit: dict = field(default_factory=dict)
    index_type: str | None = None
    deleted: int = 0
    truncated_at_build: int = 0
    # How long documents are cut into passages ({"window", "overlap"} in tokens; `retriever.encode.passages`);
    # None: one vector per document, cut at the encoder's max_length (an index of before passages, or built so).
    passages: dict | None = None
    engine: dict | None = None
    calibrator_fallback: dict | None = None  # what was asked for, when too few documents made the build fall back
    refitted: str | None = None
    # Hybrid search's fusion and dense weight for this corpus, why, and the evidence (`search.fusion_check`);
    # None: written before the check, searched with the defaults.
    hybrid: dict | None = None
    files: dict[str, FileEntry] = field(default_factory=dict)
    checksum: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def live_vectors(self) -> int:
        """The vectors of its live documents: one per passage."""
        return sum(entry.live_vectors for entry in self.segments)

    @property
    def metadata_fields(self) -> list[str]:
        """The metadata keys its segments' documents have (as recorded; a segment of before metadata: none yet)."""
        return sorted({key for entry in self.segments for key in (entry.fields or ())})

    @classmethod
    def from_record(cls, record: Any, label: str = "index") -> Manifest:
        """The manifest RECORD (parsed JSON) after its type checks; LABEL names the index in errors."""
        def damaged(problem: str) -> DamagedIndexError:
            return DamagedIndexError(f"{label} is damaged: its manifest {problem}; {DAMAGE_HINT}")

        if not isinstance(record, dict):
            raise damaged("is not a JSON object")
        check_format(record, label)
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            if spec.name == "extra":
                continue
            if spec.name not in record:
                if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                    raise damaged(f"lacks '{spec.name}'")
                continue
            values[spec.name] = record[spec.name]
        for name, hint in hints.items():
            if name in values and name not in ("segments", "files", "encoder") and not _accepts(hint, values[name]):
                raise damaged(f"has a wrong type for '{name}'")
        encoder = values["encoder"]
        if not isinstance(encoder, dict):
            raise damaged("has a wrong type for 'encoder'")
        for name, hint in typing.get_type_hints(EncoderRecord).items():
            if name not in encoder:
                raise damaged(f"lacks 'encoder.{name}'")
            if not _accepts(hint, encoder[name]):
                raise damaged(f"has a wrong type for 'encoder.{name}'")
        if not isinstance(values["calibrator"].get("name"), str):
            raise damaged("lacks 'calibrator.name'")
        values["segments"] = tuple(_segment(entry, damaged) for entry in _list(values["segments"], damaged))
        files = values.get("files", {})
        if not isinstance(files, dict) or not all(_is_file_entry(entry) for entry in files.values()):
            raise damaged("has a malformed 'files' list")
        values["files"] = {relative: FileEntry(entry["bytes"], entry["sha256"]) for relative, entry in files.items()}
        known = {spec.name for spec in dataclasses.fields(cls)}
        return cls(**values, extra={key: value for key, value in record.items() if key not in known})

    def to_record(self) -> dict:
        """The JSON record, as written to manifest.json (`extra` fields put back where they came from)."""
        record: dict[str, Any] = {}
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if spec.name == "extra":
                continue
            if value is None and spec.name in _OMITTED_WHEN_NONE:
                continue
            if spec.name == "segments":
                value = [entry.to_record() for entry in value]
            elif spec.name == "files":
                value = {relative: entry.to_record() for relative, entry in value.items()}
            record[spec.name] = value
        return {**record, **self.extra}

    def described(self) -> dict:
        """The record without the file list and checksum: what `info` and the server show."""
        return {key: value for key, value in self.to_record().items() if key not in ("files", "checksum")}

    def with_files(self, files: dict[str, FileEntry]) -> Manifest:
        """This manifest listing FILES, with its checksum computed over the result."""
        listed = dataclasses.replace(self, files=files, checksum=None)
        return dataclasses.replace(listed, checksum=record_checksum(listed.to_record()))

    def replace(self, **changes: Any) -> Manifest:
        return dataclasses.replace(self, **changes)

    def segment(self, name: str) -> SegmentEntry:
        return next(entry for entry in self.segments if entry.name == name)


def check_format(record: dict, label: str) -> None:
    """Refuse a manifest of a format this release cannot read, before anything else about it is looked at."""
    version = record.get("format_version", FORMAT_VERSION)
    if version not in READABLE_FORMATS:
        older = type(version) is int and version < min(READABLE_FORMATS)
        raise RetrieverError(f"{label} was built by {'an older' if older else 'another'} retriever (index format "
                             f"{version}); rebuild it with this one")


# Optional fields a version leaves out of its JSON when they do not apply (as they were before typing).
_OMITTED_WHEN_NONE = ("engine", "calibrator_fallback", "refitted", "checksum", "index_type", "passages", "folder")


def record_checksum(record: dict) -> str:
    """sha256 of a manifest record's canonical JSON, its own checksum field left out."""
    body = {key: value for key, value in record.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def _segment(entry: Any, damaged) -> SegmentEntry:
    if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and type(entry.get("rows")) is int
            and type(entry.get("deleted", 0)) is int and isinstance(entry.get("index", ""), str)
            and isinstance(entry.get("fields", []), list) and all(isinstance(f, str) for f in entry.get("fields", []))
            and type(entry.get("vectors", 0)) is int and type(entry.get("deleted_vectors", 0)) is int):
        raise damaged("has a malformed 'segments' list")
    if not SEGMENT_NAME.fullmatch(entry["name"]):  # written by hand: followed, '../x' would reach outside
        raise damaged(f"names a segment {entry['name'][:40]!r}, which is not a segment's name")
    fields = entry.get("fields")
    return SegmentEntry(entry["name"], entry["rows"], entry.get("deleted"), entry.get("index"),
                        tuple(fields) if fields is not None else None, entry.get("vectors"),
                        entry.get("deleted_vectors"))


def _list(value: Any, damaged) -> list:
    if not isinstance(value, list):
        raise damaged("has a malformed 'segments' list")
    return value


def _is_file_entry(entry: object) -> bool:
    return isinstance(entry, dict) and type(entry.get("bytes")) is int and isinstance(entry.get("sha256"), str)


def _accepts(hint: Any, value: Any) -> bool:
    """Whether VALUE, parsed from JSON, fits the annotation HINT (int is not bool; containers by kind only)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_accepts(option, value) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is int:
        return type(value) is int
    kind = origin or hint
    if kind is EncoderRecord or (isinstance(kind, type) and issubclass(kind, dict)):
        return isinstance(value, dict)
    return isinstance(value, kind)
