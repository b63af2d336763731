"""Index folders on disk: immutable versions swapped in atomically, so readers never see a mix.

    indexes/NAME                      -> symlink to .versions/NAME/<folder>  (what readers open)
    indexes/.versions/NAME/<folder>/  manifest.json, calibrator/, segments/<segment>/..., tombstones.npy
    indexes/.versions/NAME/lock       held while a writer works on NAME; holds that writer's pid

A writer fills `<folder>.partial/`, fsyncs it, renames it to `<folder>/` and replaces the symlink with
`os.replace` (atomic on POSIX). A write that fails or is killed leaves only a `.partial` folder, removed by the
next writer (or, for a build, resumed by the same build re-run); the symlink still points at the previous,
complete version. Readers resolve the symlink once and read every file from that version, so a concurrent swap
cannot mix two versions. The previous version is kept so that a reader that resolved it just before a swap can
still open it, and so that `rollback` can return to it.

Versions are numbered (Lance's versions). Under the writer lock, a write takes one more than any number given out
for the name and records it, durably, before it writes anything (`NUMBERS`: the highest number given out, and the
highest committed); its commit records that number in the version's manifest. So numbers only grow, whatever the
clock does, and a number readers saw never names another version (a write that fails leaves a gap). Folder names
are random and carry no order; what is newer is read from the manifests (`integrity.version_number`).

A version shares what it does not change with the one before it through hard links (`link_tree`): an add writes
one new segment, a delete one tombstone file, and neither copies the rest. Since files are never modified after
they are written, a shared file is the same file in every version that lists it (`retriever.versions.integrity`
keeps them honest).

Only writers delete: a writer tidies what killed writers left (`sweep_leftovers`), as a server does at start-up;
reading, listing and describing never remove a file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from retriever.errors import ConflictError, NotFoundError, RetrieverError, UnavailableError
from retriever.versions.home import NAME, check_name, check_target, index_path
from retriever.versions.integrity import read_manifest, verify_files, version_number
from retriever.versions.layout import BUILD_STATE, LOCK, MANIFEST, NUMBERS, VERSIONS

KEEP_VERSIONS = 2  # the current version and the one it replaced (`rollback` returns to it)
# How long a writer that does not wait (build, remove, rollback) retries a held lock before it refuses.
REFUSAL_PATIENCE_S = 0.5
# A version folder's name (random: the order is the manifests' numbers), and the older names (a commit time and a
# random part) that versions written before numbering still carry.
_FOLDER = r"[0-9a-f]{12}|\d{8}T\d{12}-[0-9a-f]{6}"
# A writer's temporary link: .NAME.FOLDER.link
_TEMPORARY_LINK = re.compile(rf"\.([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})\.(?:{_FOLDER})\.link")


def link_tree(source: Path, target: Path, skip: Callable[[str], bool] = lambda relative: False) -> None:
    """Hard-link every file under SOURCE into TARGET (same relative paths), except the manifest and SKIP's."""
    for path in sorted(source.rglob("*")):
        relative = str(path.relative_to(source))
        if not path.is_file() or path.name == MANIFEST or skip(relative):
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, destination)


class PartialVersion:
    """A new version of NAME being written: a partial folder, which `commit()` renames into place and swaps NAME's
    link to. Made by `writing`, which holds the writer lock and numbers it (`number`)."""

    def __init__(self, index_dir: str | Path, name: str):
        self.link = index_path(index_dir, name)
        self.versions = Path(index_dir) / VERSIONS / name
        self.folder = self.versions / f"{_new_folder_name()}.partial"
        self.number = 1  # one more than any kept version's: set under the lock, recorded by the manifest
        self.resumed = False  # True: the folder holds a killed build's finished work, matched by its resume key
        self.keep_partial = False  # True: leave the partial folder for a later resume (an interrupted build)
        self.replaced: Path | None = None  # the version the commit replaced: kept, so `rollback` can return to it

    def commit(self) -> Path:
        (self.folder / BUILD_STATE).unlink(missing_ok=True)
        _fsync_tree(self.folder)
        final = self.versions / _new_folder_name()
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
        _settle(self.link, final, lambda: self._prune(keep=final), "was written", stacklevel=4)

    def _prune(self, keep: Path) -> None:
        _prune_versions(self.versions, keep, self.replaced)


def _settle(link: Path, final: Path, prune: Callable[[], None], done: str, stacklevel: int = 3) -> None:
    """After LINK was swapped to FINAL (the index DONE: "was written", "was rolled back"): the swap made durable,
    the commit recorded and old versions pruned (PRUNE). Each failure is a warning, never an error (readers see
    FINAL already): a swap the disk did not confirm says that a power loss could undo it; the rest is tidying that
    the next write does again."""
    name = link.name
    try:
        _fsync_dir(link.parent)
    except OSError as error:
        warnings.warn(f"index '{name}' {done} and is read as such, but the disk did not confirm it is saved "
                      f"({_first_line(error)}): a power loss now could undo it; check the disk", stacklevel=stacklevel)
    try:
        Numbers.read(final.parent, final).write(final.parent)  # committed now (the next writer would settle it)
        prune()
    except Exception as error:
        warnings.warn(f"index '{name}' {done}, but tidying up after it failed ({_first_line(error)}); the next "
                      "write tries again", stacklevel=stacklevel)


def _point(link: Path, final: Path) -> None:
    """Point LINK (an index's name) at FINAL: a temporary link beside it, then swapped in (`_swap`)."""
    check_target(link.parent, link.name)  # again: a folder could have appeared meanwhile
    temporary_link = link.with_name(f".{link.name}.{final.name}.link")
    os.symlink(os.path.relpath(final, link.parent), temporary_link)
    _swap(temporary_link, link)


def _prune_versions(versions: Path, current: Path, replaced: Path | None) -> None:
    """The retention rule (KEEP_VERSIONS): the current version and the one it replaced; the others are removed.
    By folder name: all of them live in VERSIONS, however its path was spelled (a link resolves elsewhere). Where
    none was current before (REPLACED None: the name's link was gone, removed by hand, left out of a copy of the
    home, or a `remove` killed half way), the newest other version stands for the one replaced: a rollback or a
    build then kept it, where they removed every other version."""
    if replaced is None:
        others = [path for path in _complete(versions) if path.name != current.name]
        replaced = max(others, key=lambda path: (version_number(path), path.name), default=None)
    kept = {current.name, *([replaced.name] if replaced is not None else [])}
    for path in versions.iterdir():
        if path.is_dir() and not path.name.endswith(".partial") and path.name not in kept:
            shutil.rmtree(path, ignore_errors=True)


def _complete(versions: Path) -> list[Path]:
    """The complete version folders of one name (partial ones are a writer's)."""
    if not versions.is_dir():
        return []
    return [path for path in versions.iterdir() if path.is_dir() and not path.name.endswith(".partial")]


@dataclass(frozen=True)
class Numbers:
    """A name's version numbers, kept beside its lock (`NUMBERS`): the highest GIVEN out to a writer, and the
    highest COMMITTED (swapped in at least once). A version numbered above every commit was never seen by a
    reader: a writer killed between renaming its folder and swapping the link left it."""

    given: int
    committed: int

    @classmethod
    def read(cls, versions: Path, current: Path | None) -> Numbers:
        """The record, settled: the CURRENT version is committed whatever the record says (a writer may have died
        after its swap, before it recorded it). Without a record (versions from before numbering, an index copied
        without it), every kept version counts as committed."""
        kept = [version_number(folder) for folder in _complete(versions)]
        try:
            record = json.loads((versions / NUMBERS).read_text(encoding="utf-8"))
            numbers = cls(int(record["given"]), int(record["committed"]))
        except (OSError, ValueError, KeyError, TypeError):
            numbers = cls(max([0, *kept]), max([0, *kept]))
        seen = version_number(current) if current is not None else 0
        return cls(max(numbers.given, numbers.committed, seen, *kept), max(numbers.committed, seen))

    def write(self, versions: Path) -> None:
        """Durably (the file and its folder fsynced), replaced atomically."""
        record = versions / NUMBERS
        partial = record.with_name(NUMBERS + ".partial")
        try:
            with open(partial, "w", encoding="utf-8") as file:
                file.write(json.dumps({"given": self.given, "committed": self.committed}) + "\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, record)
        except BaseException:
            partial.unlink(missing_ok=True)  # a full disk left an empty one
            raise
        _fsync_dir(versions)


def _current(link: Path) -> Path | None:
    return link.resolve() if link.is_symlink() else None


@contextmanager
def writing(index_dir: str | Path, name: str, resume_key: dict | None = None, wait: bool = True,
            busy_hint: str = "wait for it to finish", build: bool = False) -> Iterator[PartialVersion]:
    """Hold NAME's lock, give a numbered partial version, and clean it up unless committed.

    With RESUME_KEY (a build's corpus and encoder), a partial folder a killed build left with the same key is
    handed back (`version.resumed`) instead of a fresh one; every other leftover is removed, except by a write
    other than a BUILD: an interrupted build's partial folder is kept for that build's re-run. Read-modify-write
    operations (add, delete, refit, compact) must read the current version inside this block. WAIT and
    BUSY_HINT: as in `writer_lock` (a build does not wait: it would replace what the other writer wrote). Writes
    are where killed writers' leftovers are tidied: this name's under its lock, the others' by `sweep_leftovers`.
    """
    version = PartialVersion(index_dir, name)
    check_target(index_dir, name)
    sweep_leftovers(index_dir, skip=name)
    with ExitStack() as held:
        try:  # writers of one name take turns; readers never wait
            held.enter_context(writer_lock(index_dir, name, wait, busy_hint))
        except OSError as error:  # no byte left even for the lock file: the same one line, nothing left behind
            full = _disk_full_error(name, version.link, error)
            if full is None:
                raise
            _remove_if_empty(version.versions)
            raise full from None
        _remove_stray_links(index_dir, name)
        for leftover in sorted(version.versions.glob("*.partial")):  # from writes that were killed
            if resume_key is not None and not version.resumed and _build_key(leftover) == resume_key:
                version.folder, version.resumed = leftover, True
                continue
            if not build and (leftover / BUILD_STATE).is_file():
                continue  # an interrupted build's encoding, kept for its re-run: another build replaces it
            shutil.rmtree(leftover, ignore_errors=True)
        numbers = Numbers.read(version.versions, _current(version.link))
        _remove_orphans(version, numbers.committed)
        version.number = numbers.given + 1
        try:
            Numbers(version.number, numbers.committed).write(version.versions)  # given out before anything is written
            version.folder.mkdir(exist_ok=version.resumed)
            yield version
        except KeyboardInterrupt:
            # An interrupted build keeps what it finished, to resume from; anything else is discarded.
            version.keep_partial = version.keep_partial or (version.folder / BUILD_STATE).is_file()
            raise
        except Exception as error:
            full = _disk_full_error(name, version.link, error)  # whichever library hit it, however it words it
            if full is not None:
                raise full from None
            raise
        finally:
            if version.folder.name.endswith(".partial") and not version.keep_partial:
                shutil.rmtree(version.folder, ignore_errors=True)
            _remove_if_unused(version.versions, version.link)


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


def _disk_full_error(name: str, link: Path, error: BaseException) -> UnavailableError | None:
    """The one line of a write of index NAME that found the disk full (None where ERROR is not that)."""
    full = _disk_full(error)
    if not full:
        return None
    kept = "the previous version is intact" if link.is_symlink() else "no index was made"
    # The machine's, not the input's: a server answers 503, which a client retries.
    return UnavailableError(f"index '{name}' was not written: the disk is full ({full}); {kept}; free some space "
                            "and run it again")


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty, or not there: nothing of this write's


def _remove_if_unused(versions: Path, link: Path) -> None:
    """Remove .versions/NAME when it holds nothing but its lock (and its numbers) and no link points into it (a
    first build that failed). Called holding the lock, which goes last, as in `remove_index`: a writer
    waiting for it then finds its lock file gone and locks a fresh one."""
    try:
        if link.is_symlink() or {path.name for path in versions.iterdir()} - {NUMBERS} != {LOCK}:
            return
        (versions / NUMBERS).unlink(missing_ok=True)
        (versions / LOCK).unlink()
        versions.rmdir()
    except OSError:
        pass  # not ours to tidy (a read-only home), or someone else's file appeared: keep it


def sweep_leftovers(index_dir: str | Path, skip: str | None = None) -> None:
    """Tidy what killed writers left where no writer is at work now: temporary links never swapped in, and
    .versions/NAME folders holding nothing but a lock. Every write calls it (a writer tidies its own name, SKIP,
    under its lock), and so does a server as it starts; reads never do. A name whose writer lock is held, or a
    home this process may not write, is skipped."""
    folder = Path(index_dir)
    if not folder.is_dir():
        return
    versions = folder / VERSIONS
    try:
        names = {found.group(1) for path in folder.glob(".*.link")
                 if (found := _TEMPORARY_LINK.fullmatch(path.name))}
        if versions.is_dir():
            names |= {path.name for path in versions.iterdir() if path.is_dir() and NAME.fullmatch(path.name)
                      and not (folder / path.name).is_symlink() and (path / LOCK).is_file()}
    except OSError:
        return  # a home this process may not read whole: nothing of it to tidy
    for name in sorted(names - {skip}):
        try:
            with writer_lock(folder, name, wait=False, patience=0, observed=False):
                _remove_stray_links(folder, name)
                _remove_if_unused(versions / name, folder / name)
        except (RetrieverError, OSError):
            continue


def _remove_orphans(version: PartialVersion, committed: int) -> None:
    """Remove complete versions numbered above every commit (COMMITTED): a writer killed between renaming its
    folder and swapping the link left them, and no reader ever saw them. (A version a rollback replaced was
    committed: it stays, and the next commit prunes it.)"""
    current = _current(version.link)
    for folder in _complete(version.versions):
        if (current is None or folder.name != current.name) and version_number(folder) > committed:
            shutil.rmtree(folder, ignore_errors=True)


def _new_folder_name() -> str:
    return uuid.uuid4().hex[:12]  # random: versions are ordered by the numbers in their manifests, not by name


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


class KeptVersion:
    """One kept version of a name, as its folder and manifest say: NUMBER (0: written before versions were
    numbered), FOLDER, whether it is CURRENT, when it was WRITTEN (ISO 8601 UTC) and its MANIFEST (None where the
    cheap checks fail: PROBLEM says why)."""

    def __init__(self, folder: Path, current: bool, name: str):
        self.folder, self.current, self.number = folder, current, version_number(folder)
        self.written: str | None = None
        self.manifest = None
        self.problem: str | None = None
        try:
            self.written = datetime.fromtimestamp((folder / MANIFEST).stat().st_mtime,
                                                  timezone.utc).isoformat(timespec="seconds")
            self.manifest = read_manifest(folder, name=name)
        except (OSError, RetrieverError, KeyError, TypeError) as error:
            self.problem = str(error) if isinstance(error, RetrieverError) else f"version {folder.name} is damaged"


def kept_versions(index_dir: str | Path, name: str) -> list[KeptVersion]:
    """The kept versions of NAME, newest first (by number; versions from before numbering by folder name)."""
    check_name(name)
    versions = Path(index_dir) / VERSIONS / name
    if not versions.is_dir():
        raise NotFoundError(f"no index named '{name}' in {Path(index_dir).absolute()}")
    current = _current(index_path(index_dir, name))
    committed = Numbers.read(versions, current).committed
    # A version numbered above every commit was never current (a writer killed between renaming its folder and
    # swapping the link left it): no version of the index, and the next write removes it (`_remove_orphans`).
    kept = [KeptVersion(folder, current is not None and folder.name == current.name, name)
            for folder in _complete(versions)
            if (current is not None and folder.name == current.name) or version_number(folder) <= committed]
    if not kept:  # a build killed before its first commit left its work to resume, and no version
        raise NotFoundError(f"no index named '{name}' in {Path(index_dir).absolute()} (a build of it was "
                            "interrupted before its first version: `retriever list` shows what it left)")
    return sorted(kept, key=lambda version: (version.number, version.folder.name), reverse=True)


def rollback(index_dir: str | Path, name: str, version: int | str) -> Path:
    """Make VERSION, one of NAME's kept versions (`kept_versions`: its number, or its folder's name), current
    again, after checking every file of it against its manifest. The version it replaces is kept, so a rollback
    can be undone the same way. Holds the writer lock: refused at once while a write runs."""
    kept = kept_versions(index_dir, name)
    wanted = str(version).strip()
    found = []
    if re.fullmatch(r"[0-9]{1,20}", wanted):  # longer is no version's number, and int() refuses 4,300 digits
        found = [kept_version for kept_version in kept if kept_version.number == int(wanted)]
    if not found:
        found = [kept_version for kept_version in kept if kept_version.folder.name == wanted]
    if not found:
        listed = ", ".join(str(v.number or v.folder.name) for v in kept) or "none"
        raise NotFoundError(f"index '{name}' has no kept version '{wanted}'; kept: {listed}")
    if len(found) > 1:  # versions written before numbering all read 0
        folders = ", ".join(kept_version.folder.name for kept_version in found)
        raise RetrieverError(f"index '{name}' keeps {len(found)} versions numbered {wanted} (written before "
                             f"versions were numbered); name one by its folder: {folders}")
    target = found[0].folder
    link = index_path(index_dir, name)
    with writer_lock(index_dir, name, wait=False, busy_hint="wait for it to finish, then roll back"):
        # The version asked for is the one at fault, not the index (its current version may be intact).
        label, hint = (f"version {found[0].number or target.name} of index '{name}'",
                       "it cannot be made current, and the current version is as it was")
        verify_files(target, read_manifest(target, label=label, hint=hint), label=label, hint=hint)
        replaced = _current(link)
        # The version replaced here is committed, whatever a writer that died after its swap did not record: it
        # must never pass for an orphan (`_remove_orphans`), nor its number be given out again.
        Numbers.read(target.parent, replaced).write(target.parent)
        if replaced is None or replaced.name != target.name:
            _remove_stray_links(index_dir, name)  # a rollback killed between its two link steps
            _point(link, target)
            _settle(link, target, lambda: _prune_versions(target.parent, target, replaced), "was rolled back")
    return target


# Called with (index name, seconds) each time a writer lock is taken, after however long it waited: a server
# reports how long its writes queue behind each other (`retriever.serve.metrics`).
LOCK_WAIT_OBSERVERS: list[Callable[[str, float], None]] = []
# Called with (index name, who holds the lock) when a writer starts to wait for another: the CLI says so, where a
# write would otherwise sit silent for as long as the other one runs.
LOCK_WAIT_NOTICES: list[Callable[[str, str], None]] = []
# The lock files (device, inode) a writer of this process holds: a refusal then names this process, not its pid as
# another one's (a server's other request holds it).
_HELD_HERE: set[tuple[int, int]] = set()


@contextmanager
def writer_lock(index_dir: str | Path, name: str, wait: bool = True, busy_hint: str = "wait for it to finish",
                patience: float = REFUSAL_PATIENCE_S, observed: bool = True) -> Iterator[None]:
    """Hold NAME's writer lock: an exclusive flock on .versions/NAME/lock, which records the holder's pid.

    WAIT: block until the current holder is done (writes of one name take turns: add, delete, compact, refit);
    else refuse with a line naming the holder's pid and BUSY_HINT (build, remove, rollback), once PATIENCE seconds
    have not freed it (another process's tidying holds a lock for microseconds: no reason to refuse). OBSERVED:
    report the wait to `LOCK_WAIT_OBSERVERS` (a tidying's locks are not writes)."""
    versions = Path(index_dir) / VERSIONS / name
    started = time.perf_counter()
    while True:
        versions.mkdir(parents=True, exist_ok=True)
        # Opened without truncating: the holder's pid must stay readable to a writer that is refused.
        descriptor = os.open(versions / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise
                for notice in LOCK_WAIT_NOTICES if observed else ():
                    notice(name, _lock_holder(descriptor))
                fcntl.flock(descriptor, fcntl.LOCK_EX)
        except BlockingIOError:
            holder = _lock_holder(descriptor)
            os.close(descriptor)
            if time.perf_counter() - started < patience:
                time.sleep(0.02)
                continue
            raise ConflictError(f"index '{name}' is being written by {holder}; {busy_hint}") from None
        except BaseException:
            os.close(descriptor)
            raise
        if _is_lock_file(descriptor, versions / LOCK):
            break
        os.close(descriptor)  # the index was removed while this writer waited: lock the file there now
    held = _file_key(descriptor)
    _HELD_HERE.add(held)
    try:
        for observe in LOCK_WAIT_OBSERVERS if observed else ():
            observe(name, time.perf_counter() - started)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        _HELD_HERE.discard(held)
        os.close(descriptor)  # releases the lock


def _is_lock_file(descriptor: int, path: Path) -> bool:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return False
    return _file_key(descriptor) == (status.st_dev, status.st_ino)


def _file_key(descriptor: int) -> tuple[int, int]:
    status = os.fstat(descriptor)
    return status.st_dev, status.st_ino


def _lock_holder(descriptor: int) -> str:
    """Who holds the lock, as a refusal names it: a writer of this process (a server's other request) is not
    another process."""
    if _file_key(descriptor) in _HELD_HERE:
        return "another writer in this process"
    try:
        return f"another retriever process (pid {int(os.pread(descriptor, 32, 0).decode().strip())})"
    except (OSError, ValueError):
        return "another retriever process"


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
