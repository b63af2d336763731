"""Index folders on disk: immutable versions swapped in atomically, so readers never see a mix.

    indexes/NAME                     -> symlink to .versions/NAME/<version>  (what readers open)
    indexes/.versions/NAME/<version>/  manifest.json, vectors.faiss, documents.db, raw_vectors.npy, ...
    indexes/.versions/NAME/lock        held while a writer works on NAME

A writer fills `<version>.partial/`, fsyncs it, renames it to `<version>/` and replaces the symlink with
`os.replace` (atomic on POSIX). A build that fails or is killed leaves only a `.partial` folder, removed by the
next writer; the symlink still points at the previous, complete version. Readers resolve the symlink once and
read every file from that version, so a concurrent swap cannot mix two versions. The previous version is kept
so that a reader that resolved it just before a swap can still open it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from retriever.errors import RetrieverError

MANIFEST = "manifest.json"
VERSIONS = ".versions"
KEEP_VERSIONS = 2  # the current one and the one before it
DEFAULT_INDEX_DIR = "indexes"


def check_name(name: str) -> str:
    if not name or name.startswith(".") or "/" in name or "\\" in name or name != name.strip():
        raise RetrieverError(f"invalid index name '{name}': use letters, digits, '-', '_' (no slashes, no leading dot)")
    return name


def index_path(index_dir: str | Path, name: str) -> Path:
    return Path(index_dir) / check_name(name)


def index_options(index_dir: str | Path, name: str | None = None) -> str:
    """The CLI options that point at this index, for the hints in messages."""
    options = [f"--name {name}"] if name else []
    if Path(index_dir) != Path(DEFAULT_INDEX_DIR):
        options.append(f"--index-dir {index_dir}")
    return " ".join(options)


def resolve_existing(index_dir: str | Path, name: str) -> Path:
    """The folder of the current version of NAME (a plain folder works too)."""
    link = index_path(index_dir, name)
    if not link.exists():
        raise RetrieverError(
            f"no index named '{name}' in {index_dir}; build it with: "
            f"retriever build CORPUS {index_options(index_dir, name)}"
        )
    return link.resolve()


def check_target(index_dir: str | Path, name: str) -> None:
    """Writing NAME replaces a link; a plain folder in its place is someone else's and is never replaced."""
    link = index_path(index_dir, name)
    if link.exists() and not link.is_symlink():
        raise RetrieverError(f"{link} is a plain folder, not a retriever index link; move it away first")


def damaged_index(label: str, problem: str) -> RetrieverError:
    return RetrieverError(f"{label} is damaged: {problem}; rebuild the index")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder except the manifest, keyed by relative path."""
    return {
        str(path.relative_to(folder)): sha256_file(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def read_manifest(folder: Path, verify: bool = True, name: str | None = None) -> dict:
    """The manifest of a complete version; with verify, every file's checksum is compared with it.

    NAME (the index's name) is what error messages call the index; the version folder's name otherwise."""
    label = f"index '{name}'" if name else f"index {folder.name}"
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RetrieverError(f"{label} is incomplete: {folder} has no {MANIFEST}; rebuild the index") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise damaged_index(label, f"{manifest_path} is not valid JSON") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    # Without its checksums a manifest could vouch for nothing, so it is damaged too.
    if not files or not isinstance(files, dict) or not all(isinstance(d, str) for d in files.values()):
        raise damaged_index(label, f"{manifest_path} lists no file checksums")
    if verify:
        for relative, digest in files.items():
            path = folder / relative
            if not path.is_file():
                raise damaged_index(label, f"{relative} is missing")
            if sha256_file(path) != digest:
                raise damaged_index(label, f"{relative} does not match its manifest checksum")
    return manifest


def write_manifest(folder: Path, manifest: dict) -> dict:
    manifest = {**manifest, "files": checksums(folder)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


class IndexWriter:
    """Creates a new version of NAME; `commit()` swaps it in, leaving the context without commit discards it."""

    def __init__(self, index_dir: str | Path, name: str):
        self.link = index_path(index_dir, name)
        self.versions = Path(index_dir) / VERSIONS / name
        # Sortable by creation time, so pruning keeps the newest.
        self.version = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:6]}"
        self.folder = self.versions / f"{self.version}.partial"

    def commit(self) -> Path:
        _fsync_tree(self.folder)
        final = self.versions / self.version
        os.rename(self.folder, final)
        _fsync_dir(self.versions)
        check_target(self.link.parent, self.link.name)  # again: a folder could have appeared meanwhile
        temporary_link = self.link.with_name(f".{self.link.name}.{self.version}.link")
        os.symlink(os.path.relpath(final, self.link.parent), temporary_link)
        os.replace(temporary_link, self.link)  # the atomic moment: readers now open the new version
        _fsync_dir(self.link.parent)
        self.folder = final
        self._prune(keep=final)
        return final

    def _prune(self, keep: Path) -> None:
        finished = sorted(path for path in self.versions.iterdir() if path.is_dir() and not path.name.endswith(".partial"))
        for old in finished[:-KEEP_VERSIONS]:
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)


@contextmanager
def writing(index_dir: str | Path, name: str) -> Iterator[IndexWriter]:
    """Hold NAME's lock, give a fresh partial folder, and clean it up unless committed.

    Read-modify-write operations (add, delete, refit) must read the current version inside this block.
    """
    writer = IndexWriter(index_dir, name)
    check_target(index_dir, name)
    writer.versions.mkdir(parents=True, exist_ok=True)
    with open(writer.versions / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # writers of one name take turns; readers never wait
        for leftover in writer.versions.glob("*.partial"):  # from builds that were killed
            shutil.rmtree(leftover, ignore_errors=True)
        writer.folder.mkdir()
        try:
            yield writer
        finally:
            if writer.folder.name.endswith(".partial"):
                shutil.rmtree(writer.folder, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def list_indexes(index_dir: str | Path) -> list[str]:
    """Names of the indexes in index_dir, most recently written first."""
    folder = Path(index_dir)
    if not folder.is_dir():
        return []
    links = [path for path in folder.iterdir() if not path.name.startswith(".") and (path / MANIFEST).is_file()]
    return [path.name for path in sorted(links, key=lambda path: (path / MANIFEST).stat().st_mtime, reverse=True)]


def pick_index(index_dir: str | Path, name: str | None, writing: bool = False) -> str:
    """NAME when given; else the only index, or for reading the most recently written one."""
    if name:
        return check_name(name)
    names = list_indexes(index_dir)
    if not names:
        build = f"retriever build CORPUS {index_options(index_dir)}".rstrip()
        raise RetrieverError(f"no index in {index_dir}; build one with: {build}")
    if len(names) > 1 and writing:
        raise RetrieverError(f"{len(names)} indexes in {index_dir} ({', '.join(names)}); say which with --name")
    return names[0]
