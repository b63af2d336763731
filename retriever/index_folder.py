"""Index folders on disk: immutable versions swapped in atomically, so readers never see a mix.

    indexes/NAME                     -> symlink to .versions/NAME/<version>  (what readers open)
    indexes/.versions/NAME/<version>/  manifest.json, calibrator/, segments/<segment>/..., tombstones.npy
    indexes/.versions/NAME/lock        held while a writer works on NAME; holds that writer's pid

A writer fills `<version>.partial/`, fsyncs it, renames it to `<version>/` and replaces the symlink with
`os.replace` (atomic on POSIX). A write that fails or is killed leaves only a `.partial` folder, removed by the
next writer (or, for a build, resumed by the same build re-run); the symlink still points at the previous,
complete version. Readers resolve the symlink once and read every file from that version, so a concurrent swap
cannot mix two versions. The previous version is kept so that a reader that resolved it just before a swap can
still open it.

A version shares what it does not change with the one before it through hard links (`link_tree`): an add writes
one new segment, a delete one tombstone file, and neither copies the rest. Since files are never modified after
they are written, a shared file is the same file in every version that lists it.

The manifest lists every file with its size and sha256 and carries a checksum of itself. Opening checks the
manifest's checksum and every file's size, which costs microseconds at any index size; `verify` re-hashes every
file on demand. A writer re-hashes every file of the previous version whose bytes it reads into the new one
(`verify_read`), so a damaged file is refused instead of being copied into a version whose manifest vouches for
it; a file it only links keeps its old manifest entry, so its damage stays visible to `verify`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from retriever.errors import ConflictError, DamagedIndexError, NotFoundError, RetrieverError, param
from retriever.layout import BUILD_STATE, LOCK, MANIFEST, VERSIONS
from retriever.manifest import FileEntry, Manifest, check_format, record_checksum

KEEP_VERSIONS = 2  # the current version and the one it replaced (`rollback` returns to it)
HOME_VARIABLE = "RETRIEVER_HOME"
# One rule for every index name, so a name is always a safe file name, a URL path part and a shell word.
NAME_RULE = "1 to 64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# What `_new_version_name` makes: a version folder, and the middle of a writer's temporary link.
_VERSION = r"\d{8}T\d{12}-[0-9a-f]{6}"
_TEMPORARY_LINK = re.compile(rf"\.([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})\.{_VERSION}\.link")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        shown = repr(name) if len(str(name)) <= 40 else repr(str(name)[:40]) + f"... ({len(name)} characters)"
        raise RetrieverError(f"invalid index name {shown}: a name is {NAME_RULE}")
    return name


def resolve_index_dir(index_dir: str | Path | None = None) -> Path:
    """Where indexes live, independent of the current folder: INDEX_DIR when given, else $RETRIEVER_HOME, else
    the user's data folder ($XDG_DATA_HOME/retriever/indexes, by default ~/.local/share/retriever/indexes).
    Always absolute, so messages name the real place; a path that exists but is not a folder is refused."""
    if index_dir is None or str(index_dir) == "":
        index_dir = os.environ.get(HOME_VARIABLE) or None
    if index_dir is None:
        data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
        index_dir = Path(data_home) / "retriever" / "indexes"
    folder = Path(index_dir).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise RetrieverError(f"index folder {folder} is not a folder")
    return folder


def index_path(index_dir: str | Path, name: str) -> Path:
    return Path(index_dir) / check_name(name)


def index_options(index_dir: str | Path, name: str | None = None) -> str:
    """The CLI options that point at this index, for the hints in messages."""
    options = [f"--name {shlex.quote(name)}"] if name else []
    try:
        default = resolve_index_dir(None)
    except RetrieverError:
        default = None
    if Path(index_dir).absolute() != default:
        options.append(f"--index-dir {shlex.quote(str(Path(index_dir).absolute()))}")
    return " ".join(options)


def resolve_existing(index_dir: str | Path, name: str) -> Path:
    """The folder of the current version of NAME (a plain folder works too)."""
    link = index_path(index_dir, name)
    if not link.exists():
        raise NotFoundError(
            f"no index named '{name}' in {index_dir}; build it with: "
            f"retriever build CORPUS {index_options(index_dir, name)}"
        )
    return link.resolve()


def check_target(index_dir: str | Path, name: str) -> None:
    """Writing NAME replaces a link; a plain folder in its place is someone else's and is never replaced."""
    link = index_path(index_dir, name)
    if Path(index_dir).exists() and not Path(index_dir).is_dir():
        raise RetrieverError(f"index folder {Path(index_dir).absolute()} is not a folder")
    if link.exists() and not link.is_symlink():
        raise RetrieverError(f"{link} is a plain folder, not a retriever index link; move it away first")


def damaged_index(label: str, problem: str) -> DamagedIndexError:
    return DamagedIndexError(f"{label} is damaged: {problem}; rebuild the index")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path) -> FileEntry:
    return FileEntry(path.stat().st_size, sha256_file(path))


def read_manifest(folder: Path, name: str | None = None) -> Manifest:
    """The manifest of a complete version, after the cheap checks: its own checksum, every file's size and its
    fields' types (`Manifest.from_record`).

    NAME (the index's name) is what error messages call the index; the version folder's name otherwise."""
    label = f"index '{name}'" if name else f"index {folder.name}"
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RetrieverError(f"{label} is incomplete: {folder} has no {MANIFEST}; rebuild the index") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise damaged_index(label, f"{manifest_path} is not valid JSON") from None
    if not isinstance(manifest, dict):
        raise damaged_index(label, f"{manifest_path} lists no files")
    check_format(manifest, label)
    files = manifest.get("files")
    # Without its file list a manifest could vouch for nothing, so it is damaged too.
    if not files or not isinstance(files, dict) or not all(_is_entry(entry) for entry in files.values()):
        raise damaged_index(label, f"{manifest_path} lists no files")
    if manifest.get("checksum") != record_checksum(manifest):
        raise damaged_index(label, f"{manifest_path} does not match its own checksum")
    # The checksum catches accidents, not a manifest written on purpose: a path must stay inside the version.
    outside = next((relative for relative in files if not _inside(relative)), None)
    if outside is not None:
        raise damaged_index(label, f"{manifest_path} lists a file outside its version: {outside[:80]!r}")
    for relative, entry in files.items():
        try:
            size = (folder / relative).stat().st_size
        except FileNotFoundError:
            raise damaged_index(label, f"{relative} is missing") from None
        if size != entry["bytes"]:
            raise damaged_index(label, f"{relative} has {size} bytes, its manifest says {entry['bytes']}")
    return Manifest.from_record(manifest, label)


def verify_files(folder: Path, manifest: Manifest, name: str | None = None, progress=None) -> int:
    """Re-hash every file the manifest lists (the full check `retriever verify` runs); returns the bytes read."""
    label = f"index '{name}'" if name else f"index {folder.name}"
    total = 0
    for relative, entry in manifest.files.items():
        path = folder / relative
        if not path.is_file():
            raise damaged_index(label, f"{relative} is missing")
        if sha256_file(path) != entry.sha256:
            raise damaged_index(label, f"{relative} does not match its manifest checksum")
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
                             "carry the damage on); rebuild the index")


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


def link_tree(source: Path, target: Path, skip: Callable[[str], bool] = lambda relative: False) -> None:
    """Hard-link every file under SOURCE into TARGET (same relative paths), except the manifest and SKIP's."""
    for path in sorted(source.rglob("*")):
        relative = str(path.relative_to(source))
        if not path.is_file() or path.name == MANIFEST or skip(relative):
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, destination)


class IndexWriter:
    """Creates a new version of NAME; `commit()` swaps it in, leaving the context without commit discards it."""

    def __init__(self, index_dir: str | Path, name: str):
        self.link = index_path(index_dir, name)
        self.versions = Path(index_dir) / VERSIONS / name
        self.version = _new_version_name()
        self.folder = self.versions / f"{self.version}.partial"
        self.resumed = False  # True: the folder holds a killed build's finished work, matched by its resume key
        self.keep_partial = False  # True: leave the partial folder for a later resume (an interrupted build)
        self.replaced: Path | None = None  # the version the commit replaced: kept, so `rollback` can return to it

    def commit(self) -> Path:
        (self.folder / BUILD_STATE).unlink(missing_ok=True)
        _fsync_tree(self.folder)
        self.version = _new_version_name()  # named at commit: a resumed build's folder dates from its first run
        final = self.versions / self.version
        os.rename(self.folder, final)
        _fsync_dir(self.versions)
        # Read at the swap, under the writer lock: the version current now, which may be newer than the one this
        # writer was made beside (another write can commit while it waits for the lock).
        self.replaced = self.link.resolve() if self.link.is_symlink() else None
        self._link(final)
        self.folder = final
        self._after_commit(final)
        return final

    def _link(self, final: Path) -> None:
        _point(self.link, final)

    def _after_commit(self, final: Path) -> None:
        """Make the swap durable and prune old versions. The write has happened by now, so nothing here may turn
        it into an error: a caller told "failed" would retry a write that is already in."""
        try:
            _fsync_dir(self.link.parent)
            self._prune(keep=final)
        except Exception as error:
            warnings.warn(f"index '{self.link.name}' was written, but tidying up after it failed "
                          f"({_first_line(error)}); the next write tries again", stacklevel=3)

    def _prune(self, keep: Path) -> None:
        _prune_versions(self.versions, keep, self.replaced)


def _point(link: Path, final: Path) -> None:
    """Point LINK (an index's name) at FINAL: a temporary link beside it, then swapped in (`_swap`)."""
    check_target(link.parent, link.name)  # again: a folder could have appeared meanwhile
    temporary_link = link.with_name(f".{link.name}.{final.name}.link")
    os.symlink(os.path.relpath(final, link.parent), temporary_link)
    _swap(temporary_link, link)


def _prune_versions(versions: Path, current: Path, replaced: Path | None) -> None:
    """The retention rule (KEEP_VERSIONS): the current version and the one it replaced; the others are removed."""
    for path in versions.iterdir():
        if path.is_dir() and not path.name.endswith(".partial") and path not in (current, replaced):
            shutil.rmtree(path, ignore_errors=True)


def list_versions(index_dir: str | Path, name: str) -> list[dict]:
    """The kept versions of NAME, newest first (`retriever versions`): version, current (bool), written (ISO 8601
    UTC), and documents and calibrator read from its manifest, or "problem" where that fails."""
    check_name(name)
    versions = Path(index_dir) / VERSIONS / name
    if not versions.is_dir():
        raise NotFoundError(f"no index named '{name}' in {Path(index_dir).absolute()}")
    link = index_path(index_dir, name)
    current = link.resolve() if link.is_symlink() else None
    records = []
    for folder in sorted((path for path in versions.iterdir()
                          if path.is_dir() and not path.name.endswith(".partial")), reverse=True):
        record: dict = {"version": folder.name, "current": folder == current}
        try:
            record["written"] = datetime.fromtimestamp((folder / MANIFEST).stat().st_mtime,
                                                       timezone.utc).isoformat(timespec="seconds")
            manifest = read_manifest(folder, name=name)
            record.update(documents=manifest.documents, calibrator=calibrator_label(manifest.calibrator))
        except (OSError, RetrieverError, KeyError, TypeError) as error:
            record["problem"] = str(error) if isinstance(error, RetrieverError) else f"version {folder.name} is damaged"
        records.append(record)
    return records


def refuse_replacing(index_dir: str | Path, name: str) -> None:
    """Refuse to build NAME over an index of that name, saying what it holds and how to go ahead."""
    link = index_path(index_dir, check_name(name))
    if not link.is_symlink():
        return
    what = ""
    try:
        manifest = read_manifest(link.resolve(), name=name)
        written = datetime.fromtimestamp((link / MANIFEST).stat().st_mtime, timezone.utc)
        what = f" ({manifest.documents:,} documents, written {written.isoformat(timespec='seconds')})"
    except (OSError, RetrieverError, KeyError, TypeError):
        pass  # a damaged index is still one the build would replace
    raise ConflictError(f"index '{name}' exists{what}; building it again replaces it: pass {param('replace', True)} "
                        f"(its current version is kept, and rollback restores it), or choose another {param('name')}")


def rollback(index_dir: str | Path, name: str, version: str) -> Path:
    """Make VERSION, one of NAME's kept versions (`list_versions`), current again, after checking every file of
    it against its manifest. The version it replaces is kept, so a rollback can be undone the same way. Holds the
    writer lock: refused at once while a write runs."""
    check_name(name)
    versions = Path(index_dir) / VERSIONS / name
    target = versions / version
    if not re.fullmatch(r"[0-9A-Za-z_-]+", version) or not target.is_dir():
        kept = [record["version"] for record in list_versions(index_dir, name)]
        raise NotFoundError(f"index '{name}' has no kept version '{version}'; kept: {', '.join(kept) or 'none'}")
    link = index_path(index_dir, name)
    with writer_lock(index_dir, name, wait=False, busy_hint="wait for it to finish, then roll back"):
        verify_files(target, read_manifest(target, name=name), name=name)
        replaced = link.resolve() if link.is_symlink() else None
        if replaced != target:
            _remove_stray_links(index_dir, name)  # a rollback killed between its two link steps
            _point(link, target)
            _fsync_dir(link.parent)
            _prune_versions(versions, target, replaced)
    return target


# Called with (index name, seconds) each time a writer lock is taken, after however long it waited: a server
# reports how long its writes queue behind each other (`retriever.metrics`).
LOCK_WAIT_OBSERVERS: list[Callable[[str, float], None]] = []


@contextmanager
def writer_lock(index_dir: str | Path, name: str, wait: bool = True,
                busy_hint: str = "wait for it to finish") -> Iterator[None]:
    """Hold NAME's writer lock: an exclusive flock on .versions/NAME/lock, which records the holder's pid.

    WAIT: block until the current holder is done (writes of one name take turns: add, delete, compact, refit);
    else refuse at once with a line naming the holder's pid and BUSY_HINT (build, remove)."""
    versions = Path(index_dir) / VERSIONS / name
    started = time.perf_counter()
    while True:
        versions.mkdir(parents=True, exist_ok=True)
        # Opened without truncating: the holder's pid must stay readable to a writer that is refused.
        descriptor = os.open(versions / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = _lock_holder(descriptor)
            os.close(descriptor)
            raise RetrieverError(f"index '{name}' is being written by another retriever process{holder}; "
                                 f"{busy_hint}") from None
        except BaseException:
            os.close(descriptor)
            raise
        if _is_lock_file(descriptor, versions / LOCK):
            break
        os.close(descriptor)  # the index was removed while this writer waited: lock the file there now
    try:
        for observe in LOCK_WAIT_OBSERVERS:
            observe(name, time.perf_counter() - started)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _is_lock_file(descriptor: int, path: Path) -> bool:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(descriptor)
    return (mine.st_dev, mine.st_ino) == (status.st_dev, status.st_ino)


def _lock_holder(descriptor: int) -> str:
    try:
        pid = int(os.pread(descriptor, 32, 0).decode().strip())
    except (OSError, ValueError):
        return ""
    return f" (pid {pid})"


@contextmanager
def writing(index_dir: str | Path, name: str, resume_key: dict | None = None, wait: bool = True,
            busy_hint: str = "wait for it to finish") -> Iterator[IndexWriter]:
    """Hold NAME's lock, give a partial folder, and clean it up unless committed.

    With RESUME_KEY (a build's corpus and encoder), a partial folder a killed build left with the same key is
    handed back (`writer.resumed`) instead of a fresh one; every other leftover is removed. Read-modify-write
    operations (add, delete, refit, compact) must read the current version inside this block. WAIT and
    BUSY_HINT: as in `writer_lock` (a build does not wait: it would replace what the other writer wrote).
    """
    writer = IndexWriter(index_dir, name)
    check_target(index_dir, name)
    with writer_lock(index_dir, name, wait, busy_hint):  # writers of one name take turns; readers never wait
        _remove_stray_links(index_dir, name)
        for leftover in sorted(writer.versions.glob("*.partial")):  # from writes that were killed
            if resume_key is not None and not writer.resumed and _build_key(leftover) == resume_key:
                writer.folder, writer.version, writer.resumed = leftover, leftover.name[: -len(".partial")], True
                continue
            shutil.rmtree(leftover, ignore_errors=True)
        _remove_orphans(writer)
        try:
            writer.folder.mkdir(exist_ok=writer.resumed)
            yield writer
        except KeyboardInterrupt:
            # An interrupted build keeps what it finished, to resume from; anything else is discarded.
            writer.keep_partial = writer.keep_partial or (writer.folder / BUILD_STATE).is_file()
            raise
        except Exception as error:
            full = _disk_full(error)  # whichever library hit it, and however it words it: one line
            if full:
                kept = "the previous version is intact" if writer.link.is_symlink() else "no index was made"
                raise RetrieverError(f"index '{name}' was not written: the disk is full ({full}); {kept}; free some "
                                     "space and run it again") from None
            raise
        finally:
            if writer.folder.name.endswith(".partial") and not writer.keep_partial:
                shutil.rmtree(writer.folder, ignore_errors=True)
            _remove_if_unused(writer.versions, writer.link)


_FULL_DISK_WORDS = ("No space left on device", "Disk quota exceeded", "database or disk is full")


def _disk_full(error: BaseException | None) -> str | None:
    """How ERROR, or an error it was raised from, says the disk is full (None: it does not): an OSError's ENOSPC
    or EDQUOT, or the words faiss (strerror inside a RuntimeError), SQLite and torch put it in."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return os.strerror(error.errno)
        found = next((words for words in _FULL_DISK_WORDS if words in str(error)), None)
        if found:
            return found
        error = error.__cause__ or error.__context__
    return None


def _first_line(error: BaseException) -> str:
    text = (error.strerror if isinstance(error, OSError) and error.strerror else str(error)).strip()
    return text.splitlines()[0][:160] if text else type(error).__name__


def _remove_stray_links(index_dir: str | Path, name: str) -> None:
    """Remove NAME's temporary links: a writer killed between making one and swapping it in left it dangling.
    Called holding NAME's writer lock, so no writer is between those two steps now."""
    for path in Path(index_dir).glob(f".{name}.*.link"):
        found = _TEMPORARY_LINK.fullmatch(path.name)
        if found and found.group(1) == name:
            path.unlink(missing_ok=True)


def _remove_if_unused(versions: Path, link: Path) -> None:
    """Remove .versions/NAME when it holds nothing but its lock and no link points into it (a first build that
    failed). Called holding the lock, which goes last, as in `remove_index`: a writer waiting for it then finds its
    lock file gone and locks a fresh one."""
    try:
        if link.is_symlink() or [path.name for path in versions.iterdir()] != [LOCK]:
            return
        (versions / LOCK).unlink()
        versions.rmdir()
    except OSError:
        pass  # not ours to tidy (a read-only home), or someone else's file appeared: keep it


def sweep_leftovers(index_dir: str | Path) -> None:
    """Tidy what killed writers left where no writer is at work now: temporary links never swapped in, and
    .versions/NAME folders holding nothing but a lock. A writer tidies its own name as it starts; `list` calls
    this for all of them. A name whose writer lock is held, or a home this process may not write, is skipped."""
    folder = Path(index_dir)
    if not folder.is_dir():
        return
    names = {found.group(1) for path in folder.glob(".*.link") if (found := _TEMPORARY_LINK.fullmatch(path.name))}
    versions = folder / VERSIONS
    if versions.is_dir():
        names |= {path.name for path in versions.iterdir() if path.is_dir() and _NAME.fullmatch(path.name)
                  and not (folder / path.name).is_symlink() and (path / LOCK).is_file()}
    for name in sorted(names):
        try:
            with writer_lock(folder, name, wait=False):
                _remove_stray_links(folder, name)
                _remove_if_unused(versions / name, folder / name)
        except (RetrieverError, OSError):
            continue


def _remove_orphans(writer: IndexWriter) -> None:
    """Remove complete versions newer than the current one: a writer killed between renaming its folder and
    swapping the link left them, and no reader ever saw them (pruning by age must not count them)."""
    current = writer.link.resolve() if writer.link.is_symlink() else None
    for folder in writer.versions.iterdir():
        if folder.is_dir() and not folder.name.endswith(".partial") and (current is None or folder.name > current.name):
            shutil.rmtree(folder, ignore_errors=True)


def _new_version_name() -> str:
    # Sortable by commit time, so pruning keeps the newest.
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:6]}"


def _build_key(folder: Path) -> dict | None:
    try:
        return json.loads((folder / BUILD_STATE).read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        return None


def _fsync_tree(folder: Path) -> None:
    """Make a version folder durable before it is renamed in: every file written for it, and every folder in it,
    deepest first (a new file's or folder's name lives in its parent folder, which a power loss could otherwise
    lose even with the file itself on disk)."""
    folders = [folder]
    for path in folder.rglob("*"):
        if path.is_dir():
            folders.append(path)
        # A file with other links was reused from an earlier version, made durable when that one was written.
        elif path.is_file() and path.stat().st_nlink == 1:
            descriptor = os.open(path, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
    for directory in sorted(folders, key=lambda path: len(path.parts), reverse=True):
        _fsync_dir(directory)


def _swap(temporary_link: Path, link: Path) -> None:
    os.replace(temporary_link, link)  # the atomic moment: readers now open the new version


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
    links = [path for path in folder.iterdir()
             if _NAME.fullmatch(path.name) and (path / MANIFEST).is_file()]  # a name never starts with "."
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
        raise RetrieverError(f"{len(names)} indexes in {index_dir} ({', '.join(names)}); say which with {param('name')}")
    return names[0]


def describe_indexes(index_dir: str | Path) -> list[dict]:
    """What `retriever list` shows: one record per index in INDEX_DIR, most recently written first, with name,
    documents, model, calibrator, index_type, written (when its current version was written, ISO 8601 UTC) and
    folder, read from each manifest after the cheap checks; an index that fails them has "problem" instead.
    Tidies what killed writers left first (`sweep_leftovers`)."""
    sweep_leftovers(index_dir)
    records = []
    for name in list_indexes(index_dir):
        link = Path(index_dir) / name
        try:
            modified = (link / MANIFEST).stat().st_mtime
        except FileNotFoundError:
            continue  # removed since it was listed
        written = datetime.fromtimestamp(modified, timezone.utc).isoformat(timespec="seconds")
        record: dict = {"name": name, "written": written, "folder": str(link.resolve())}
        try:
            manifest = read_manifest(link.resolve(), name=name)
            record.update(documents=manifest.documents, model=manifest.encoder["model"],
                          calibrator=calibrator_label(manifest.calibrator), index_type=str(manifest.index["type"]),
                          fields=manifest.metadata_fields)
            if manifest.calibrator_fallback:
                record["calibrator_asked"] = str(manifest.calibrator_fallback["asked"])
        except (RetrieverError, KeyError, TypeError) as error:
            record["problem"] = str(error) if isinstance(error, RetrieverError) else f"index '{name}' is damaged"
        records.append(record)
    return records


def interrupted_builds(index_dir: str | Path) -> list[dict]:
    """Builds a kill or Ctrl-C left unfinished in INDEX_DIR, resumable by running the same command again: name,
    documents (read so far: None until all are), encoded, model, since (ISO 8601 UTC) and folder, for `list`."""
    records = []
    for state_path in sorted(Path(index_dir).glob(f"{VERSIONS}/*/*.partial/{BUILD_STATE}")):
        try:
            state = json.loads(state_path.read_text(encoding="utf-8"))
            since = datetime.fromtimestamp(state_path.parent.stat().st_mtime, timezone.utc)
        except (OSError, ValueError):
            continue  # being written or removed right now
        encoder = (state.get("key") or {}).get("encoder") or {}
        records.append({"name": state_path.parent.parent.name, "documents": state.get("documents"),
                        "encoded": int(state.get("encoded") or 0), "model": encoder.get("model"),
                        "since": since.isoformat(timespec="seconds"), "folder": str(state_path.parent)})
    return records


def describe_calibrator(manifest: Manifest) -> str:
    """What a version's calibrator is, for one line after a write: the label (`calibrator_label`) and, where
    too few documents made the build fall back, what was asked for and why."""
    label = calibrator_label(manifest.calibrator)
    fallback = manifest.calibrator_fallback
    if isinstance(fallback, dict) and fallback.get("asked"):
        label += f" (asked for {fallback['asked']}: {fallback.get('reason', 'too few documents')})"
    return label


def calibrator_label(record: dict) -> str:
    """The calibrator's name; for auto, with what it chose and the retrieval check's evidence:
    "auto: none (flow +0.31 [-0.52, +1.14] on 2,000 pseudo-queries)"."""
    decision = record.get("decision")
    if not isinstance(decision, dict) or not isinstance(decision.get("chosen"), dict):
        return str(record["name"])
    return f"{record['name']}: {short_decision(decision)}"


def short_decision(decision: dict) -> str:
    """What auto chose, with the retrieval check's difference for it (or, where it kept the raw vectors, for the
    best candidate): "flow-254 (flow-254 +14.20 [+12.10, +16.40] on 2,000 pseudo-queries)". Plain dict work: `list`
    reads many manifests and must not import torch for it."""
    chosen = str((decision.get("chosen") or {}).get("name", "?"))
    check = decision.get("check")
    if not isinstance(check, dict) or not check.get("candidates"):
        reason = decision.get("reason")  # no check was run: say why (e.g. too few pseudo-queries)
        return f"{chosen} ({str(reason).split(' (')[0].split(':')[0]})" if reason else chosen
    shown = next((c for c in check["candidates"] if c.get("name") == chosen), None) or \
        max(check["candidates"], key=lambda c: c.get("ndcg@10", 0))
    low, high = shown["interval"]
    kinds = (f", {len(shown['kinds_improved'])} of {len(check['voting_kinds'])} kinds better"
             if "kinds_improved" in shown and check.get("voting_kinds") else "")
    return (f"{chosen} ({shown['name']} {shown['difference']:+.2f} [{low:+.2f}, {high:+.2f}]{kinds} on "
            f"{check['pseudo_queries']:,} pseudo-queries)")


def remove_index(index_dir: str | Path, name: str) -> None:
    """Remove NAME: its link and every version of it (.versions/NAME), holding its writer lock, so a running
    writer is never cut short: then this refuses at once, naming the writer's pid. The link goes first, so new
    readers find no index at once; a reader that had already opened a version keeps the files it opened."""
    link = index_path(index_dir, name)
    versions = Path(index_dir) / VERSIONS / name
    if not link.is_symlink() and not versions.is_dir():
        check_target(index_dir, name)
        raise RetrieverError(f"no index named '{name}' in {Path(index_dir).absolute()}")
    check_target(index_dir, name)
    with writer_lock(index_dir, name, wait=False, busy_hint="wait for it to finish, then remove it"):
        if link.is_symlink():
            link.unlink()
            _fsync_dir(link.parent)
        _remove_stray_links(index_dir, name)  # a writer killed between its two link steps
        for path in versions.iterdir():
            if path.name != LOCK:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        # Last, still held: a writer that was waiting sees its lock file gone and locks a fresh one instead.
        (versions / LOCK).unlink(missing_ok=True)
        versions.rmdir()
