"""A version's integrity: its manifest on disk, with its own checksum and every file's size and sha256.

Opening checks the manifest's checksum and every file's size (`read_manifest`), which costs microseconds at any
index size; `verify_files` re-hashes every file on demand. A writer re-hashes every file of the previous version
whose bytes it reads into the new one (`verify_read`), so a damaged file is refused instead of being copied into
a version whose manifest vouches for it; a file it only links keeps its old manifest entry (`write_manifest`), so
its damage stays visible to `verify`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

from retriever.errors import DamagedIndexError, RetrieverError
from retriever.versions.layout import BUILD_STATE, MANIFEST
from retriever.versions.manifest import DAMAGE_HINT, FileEntry, Manifest, check_format, record_checksum


def damaged_index(label: str, problem: str, hint: str = DAMAGE_HINT) -> DamagedIndexError:
    return DamagedIndexError(f"{label} is damaged: {problem}; {hint}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(path.stat().st_size, sha256_file(path))


def read_manifest(folder: Path, name: str | None = None, label: str | None = None, hint: str = DAMAGE_HINT
                  ) -> Manifest:
    """The manifest of a complete version, after the cheap checks: its own checksum, every file's size and its
    fields' types (`Manifest.from_record`).

    NAME (the index's name) is what error messages call the index; the version folder's name otherwise; LABEL,
    given, instead ("version 3 of index 'notes'"); HINT what a damage's message says to do."""
    label = label or (f"index '{name}'" if name else f"index {folder.name}")
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RetrieverError(f"{label} is incomplete: {folder} has no {MANIFEST}; rebuild the index") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise damaged_index(label, f"{manifest_path} is not valid JSON", hint) from error
    if not isinstance(manifest, dict):
        raise damaged_index(label, f"{manifest_path} lists no files", hint)
    check_format(manifest, label)
    files = manifest.get("files")
    # Without its file list a manifest could vouch for nothing, so it is damaged too.
    if not files or not isinstance(files, dict) or not all(_is_entry(entry) for entry in files.values()):
        raise damaged_index(label, f"{manifest_path} lists no files", hint)
    if manifest.get("checksum") != record_checksum(manifest):
        raise damaged_index(label, f"{manifest_path} does not match its own checksum", hint)
    # The checksum catches accidents, not a manifest written on purpose: a path must stay inside the version.
    outside = next((relative for relative in files if not _inside(relative)), None)
    if outside is not None:
        raise damaged_index(label, f"{manifest_path} lists a file outside its version: {outside[:80]!r}",
                            hint)
    for relative, entry in files.items():
        try:
            size = (folder / relative).stat().st_size
        except FileNotFoundError:
            raise damaged_index(label, f"{relative} is missing", hint) from None
        if size != entry["bytes"]:
            raise damaged_index(label, f"{relative} has {size} bytes, its manifest says {entry['bytes']}", hint)
    return Manifest.from_record(manifest, label)


def verify_files(folder: Path, manifest: Manifest, name: str | None = None, progress=None,
                 label: str | None = None, hint: str = DAMAGE_HINT) -> int:
    """Re-hash every file the manifest lists (the full check `retriever verify` runs); returns the bytes read.
    LABEL and HINT: what a damage's message calls the version and says to do (as `read_manifest`)."""
    label = label or (f"index '{name}'" if name else f"index {folder.name}")
    total = 0
    for relative, entry in manifest.files.items():
        path = folder / relative
        if not path.is_file():
            raise damaged_index(label, f"{relative} is missing", hint)
        if sha256_file(path) != entry.sha256:
            raise damaged_index(label, f"{relative} does not match its manifest checksum", hint)
        total += entry.bytes
        if progress:
            progress(entry.bytes)
    return total


def _is_entry(entry: object) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str))


def _inside(relative: str) -> bool:
    """Whether RELATIVE names a file inside a version folder: relative, no '..', no empty or odd parts."""
    parts = relative.split("/")
    return (relative == relative.strip() and "\\" not in relative and "\0" not in relative
            and all(part not in ("", ".", "..") for part in parts))


# Files a writer has re-hashed in this process, by identity: versions never change a file, so one that kept its
# inode, size and modification time since it matched needs no second hash (a server writing all day re-hashes
# the tombstones and the calibrator once per version, not once per request). Bounded: cleared when full.
_VERIFIED: dict[tuple[int, int, int, int], str] = {}
_VERIFIED_LOCK = threading.Lock()
_VERIFIED_MAX = 65536


def verify_read(folder: Path, relatives, known: dict[str, FileEntry], name: str) -> None:
    """Refuse to write a new version from damaged bytes: re-hash each of RELATIVES (files in FOLDER, the version
    being written over or a partial folder linked from it) that the previous manifest lists in KNOWN. A file not
    in KNOWN was written by this writer and is skipped. Only what a writer reads is hashed here; a file it only
    links keeps its manifest entry (`write_manifest`), so damage there stays visible to `verify` without making
    every add cost a hash of the whole index."""
    for relative in relatives:
        entry = known.get(relative)
        if entry is None:
            continue
        path = folder / relative
        try:
            status = path.stat()
        except FileNotFoundError:
            raise _refused(name, f"{relative} is missing") from None
        identity = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
        with _VERIFIED_LOCK:
            if _VERIFIED.get(identity) == entry.sha256:
                continue
        if status.st_size != entry.bytes or sha256_file(path) != entry.sha256:
            raise _refused(name, f"{relative} does not match its manifest checksum")
        with _VERIFIED_LOCK:
            if len(_VERIFIED) >= _VERIFIED_MAX:
                _VERIFIED.clear()
            _VERIFIED[identity] = entry.sha256


def _refused(name: str, problem: str) -> DamagedIndexError:
    return DamagedIndexError(f"index '{name}' is damaged: {problem}; nothing was written (a new version would "
                             f"carry the damage on); {DAMAGE_HINT}")


def changed_since_commit(folder: Path, manifest: Manifest) -> list[str]:
    """The files MANIFEST lists that were modified after it was written (or are gone): a writer re-hashes these
    before linking them into a new version (`verify_read`). One stat a file: a file edited in place (a byte
    flipped by hand, a tool that rewrote it) has a newer time than the manifest written after it; bit rot that
    leaves the time as it was is for `verify`. A home copied without its times makes some files look newer:
    hashed once more, no harm."""
    try:
        committed = (folder / MANIFEST).stat().st_mtime_ns
    except OSError:
        return []
    changed = []
    for relative in manifest.files:
        try:
            if (folder / relative).stat().st_mtime_ns > committed:
                changed.append(relative)
        except OSError:
            changed.append(relative)  # missing: `verify_read` says so
    return changed


def write_manifest(folder: Path, manifest: Manifest, previous: Path | None = None,
                   known: dict[str, FileEntry] | None = None) -> Manifest:
    """Write MANIFEST into FOLDER with an entry for every file there and a checksum of itself.

    A file that is a hard link to a file of PREVIOUS (the version it was linked from, whose manifest entries are
    KNOWN), under the same name or another (a refit's renamed segments), keeps that file's entry without being
    hashed again: it is the very file hashed when written, and if it was damaged since, the old entry keeps the
    damage visible to `verify`, where a new hash would vouch for it. Temporary files (`*.partial`, a killed
    writer's) are never listed."""
    linked = _entries_by_identity(previous, known or {}) if previous is not None else {}
    files = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name in (MANIFEST, BUILD_STATE) or path.name.endswith(".partial"):
            continue
        relative = str(path.relative_to(folder))
        status = path.stat()
        files[relative] = linked.get((status.st_dev, status.st_ino)) or file_entry(path)
    manifest = manifest.with_files(files)
    partial = folder / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest.to_record(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, folder / MANIFEST)
    return manifest


def _entries_by_identity(previous: Path, known: dict[str, FileEntry]) -> dict[tuple[int, int], FileEntry]:
    """KNOWN's entries keyed by the (device, inode) of their file in PREVIOUS."""
    entries = {}
    for relative, entry in known.items():
        try:
            status = (previous / relative).stat()
        except OSError:
            continue
        entries[(status.st_dev, status.st_ino)] = entry
    return entries


def version_number(folder: Path) -> int:
    """The version number FOLDER's manifest records, read without any check (0: none recorded, or unreadable):
    what a writer needs to number the next version and to tell an orphan from the current one."""
    try:
        number = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("version", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return number if type(number) is int and number >= 0 else 0
