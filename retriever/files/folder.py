"""A folder of files as a corpus: every file a reader reads (`retriever.files.readers`), found recursively, one
document each.

What is read: every file under the folder whose suffix a reader knows, in path order, but hidden files and folders
(a name starting with "."), what a `.gitignore` or `.retrieverignore` anywhere in the tree ignores (git's rules,
scoped to its folder, by the `pathspec` library), and what `exclude` patterns name; with `include` patterns, only
files they name (git's pattern syntax, from the folder: `*.md`, `docs/**/*.rst`). Symbolic links are followed, a
folder reached twice (a loop) read once. Files of other formats are counted, not read.

A file that cannot be read (damaged, encrypted, in an unknown encoding, larger than `max_bytes`, vanished while the
build ran) is skipped with one line naming it and why (`on_skip`), and the build goes on; `strict` stops at the
first instead.

Each document: id the file's path relative to the folder (`/`-separated), its title (the file's own: a first
heading, `<title>`, PDF or Word metadata; else the file name), its text, and metadata `path`, `folder` (the folder
read, resolved: what `Index.sync` reads again), `type` (the reader's name), `size` (bytes), `modified` (UTC, ISO
8601) and `sha256` (of its bytes); a PDF's `page_starts`, where each page starts in the text (`page_of`).
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from retriever.corpus import CORPUS_FORMATS, Document
from retriever.errors import RetrieverError, param
from retriever.files.readers import NoText, UnreadableFile, reader_for

# The metadata key of the folder a document was read from (absolute, resolved): `sync` finds its files by it.
FOLDER_KEY = "folder"
# Larger files are skipped: a file this size is a data dump or a disk image more often than a document, and reading
# it whole would hold the build's memory.
MAX_FILE_BYTES = 256 * 1024 * 1024
IGNORE_FILES = (".gitignore", ".retrieverignore")
# A document's metadata holds at most 1,000 values (`retriever.metadata`): the page starts of longer PDFs are
# left out (their hits say no page).
MAX_PAGES_RECORDED = 900


@dataclass(frozen=True)
class FolderOptions:
    """What of a folder is read: INCLUDE (patterns: only files they name; empty: every file a reader reads),
    EXCLUDE (patterns left out), files of at most MAX_BYTES; STRICT: a file that cannot be read stops the read;
    CORPUS_FILES: the folder is not a person's files but corpus files, many documents each."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_bytes: int = MAX_FILE_BYTES
    strict: bool = False
    # The folder holds corpus files instead (.txt one document per line, .jsonl, .csv/.tsv, or .gz of them), each
    # read as it is when given alone, in name order: one meaning of a folder for every engine, overridden here.
    corpus_files: bool = False

    def __post_init__(self) -> None:
        for option, patterns in (("include", self.include), ("exclude", self.exclude)):
            for pattern in patterns:  # a pattern pathspec cannot read matches nothing: refused, not ignored
                if not pattern.strip() or pattern.lstrip().startswith("#"):
                    continue
                try:
                    readable = _patterns([pattern]).patterns[0].regex is not None
                except ValueError:  # pathspec's GitWildMatchPatternError
                    readable = False
                if not readable:
                    raise RetrieverError(f"{param(option)} {pattern!r} is no pattern git reads (an unclosed '[', a "
                                         "lone '!' or '\\'?): it would match no file", parameter=option)

    def to_record(self) -> dict:
        """What the manifest keeps (`strict` is the build's, not the folder's)."""
        return {"include": list(self.include), "exclude": list(self.exclude), "max_bytes": self.max_bytes}

    @classmethod
    def from_record(cls, record: dict) -> FolderOptions:
        return cls(tuple(record.get("include") or ()), tuple(record.get("exclude") or ()),
                   int(record.get("max_bytes") or MAX_FILE_BYTES))


@dataclass
class FolderReport:
    """What a read of a folder did: documents read, files SKIPPED ((relative path, why) each) and files of other
    formats left out, counted by suffix."""

    read: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    other_formats: Counter = field(default_factory=Counter)
    linked: list[tuple[str, str]] = field(default_factory=list)  # links inside the folder: (path, target's path)

    def summary(self) -> str:
        parts = [f"{self.read:,} file{'s' if self.read != 1 else ''} read"]
        if self.skipped:
            parts.append(f"{len(self.skipped):,} skipped (no text read from them)")
        if self.linked:
            parts.append(f"{len(self.linked):,} symbolic link{'s' if len(self.linked) != 1 else ''} within the "
                         "folder not followed (what they name is read where it lies)")
        if self.other_formats:
            kinds = ", ".join(f"{suffix or 'no suffix'} {count:,}" for suffix, count in self.other_formats.most_common(5))
            parts.append(f"{sum(self.other_formats.values()):,} of other formats left out ({kinds})")
        return "; ".join(parts)


def _patterns(lines: Sequence[str]):
    pathspec = _pathspec()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _ignore_patterns(lines: Sequence[str]):
    """An ignore file's patterns, as git reads them: a line that is no pattern (a lone '!') is passed over, not a
    traceback that stops the build."""
    kept = []
    for line in lines:
        try:
            _patterns([line])
        except ValueError:  # pathspec's GitWildMatchPatternError
            continue
        kept.append(line)
    return _patterns(kept)


def _pathspec():
    try:
        import pathspec
    except ImportError:
        raise RetrieverError("reading a folder needs pathspec: pip install pathspec") from None
    return pathspec


# Why a folder is skipped where it cannot be listed, and a link where what it names is gone
# (`FolderReport.skipped`): a sync keeps what they held (an unmounted drive comes back).
UNLISTABLE = "a folder that cannot be listed"
BROKEN_LINK = "a broken symbolic link"


def folder_files(root: Path, options: FolderOptions, report: FolderReport,
                 on_skip: Callable[[str, str], None] | None = None) -> Iterator[tuple[Path, str]]:
    """(path, path relative to ROOT) of every file to read under ROOT, in path order. What the walk itself leaves
    out with a reason (a link loop, a broken link, a folder it cannot list) goes in REPORT, ON_SKIP told.

    A symbolic link to a file or folder the walk reaches in ROOT (where it lies, or through an earlier link) is not
    followed: it is read once, under that path (REPORT counts the link). One to a hidden file or folder of ROOT,
    which the walk passes by, is read through the link, as one to something outside ROOT; one to what ROOT's
    patterns leave out (ignore files, --exclude, --include) is skipped with a line. So the folder is walked twice:
    first without any link, for what it holds where it lies."""
    reached: set[str] = set()
    for _ in _walk(root, options, FolderReport(), None, reached, through_links=False):
        pass
    yield from _walk(root, options, report, on_skip, reached, through_links=True)


def _walk(root: Path, options: FolderOptions, report: FolderReport, on_skip: Callable[[str, str], None] | None,
          reached: set[str], through_links: bool) -> Iterator[tuple[Path, str]]:
    """`folder_files`' walk. THROUGH_LINKS False: links to what lies in ROOT are passed by, and REACHED is filled
    with the real paths of the files and folders met; True: such a link is followed where its target is not in
    REACHED."""

    def skip(relative: str, why: str) -> None:
        report.skipped.append((relative, why))
        if on_skip is not None:
            on_skip(relative, why)

    include = _patterns(options.include) if options.include else None
    exclude = _patterns(options.exclude) if options.exclude else None
    seen: set[str] = set()
    taken: set[str] = set()  # the real paths of the files this walk gave
    root_real = os.path.realpath(root)

    def within(real: str) -> str | None:
        """REAL's path relative to ROOT ('.' for ROOT itself), or None where it lies outside."""
        if real == root_real:
            return "."
        return real[len(root_real) + 1:] if real.startswith(root_real + os.sep) else None

    def walk(folder: Path, relative: str, ignores: list[tuple[str, object]]) -> Iterator[tuple[Path, str]]:
        real = os.path.realpath(folder)
        if real in seen:
            skip(relative or ".", "a symbolic link loop (the folder was read already)")
            return
        seen.add(real)
        reached.add(real)
        ignores = list(ignores)
        for name in IGNORE_FILES:
            ignore_file = folder / name
            try:
                if ignore_file.is_file():
                    ignores.append((relative, _ignore_patterns(ignore_file.read_text(encoding="utf-8",
                                                                                     errors="replace").splitlines())))
            except OSError:
                pass  # a folder that cannot be entered: listing it, below, says so
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError as error:
            skip(relative or ".", f"{UNLISTABLE} ({error.strerror})")
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = f"{relative}/{entry.name}" if relative else entry.name
            try:
                is_folder = entry.is_dir()  # follows links
            except OSError:
                is_folder = False
            if any(spec.match_file(path[len(base) + 1:] if base else path) or (is_folder and spec.match_file(
                    (path[len(base) + 1:] if base else path) + "/")) for base, spec in ignores):
                continue
            if exclude is not None and (exclude.match_file(path) or (is_folder and exclude.match_file(path + "/"))):
                continue
            broken = entry.is_symlink() and not os.path.exists(entry.path)
            readable = reader_for(Path(entry.name)) is not None and (include is None or include.match_file(path))
            if broken:  # said where it named a file to read, or may have named a folder (no suffix)
                if through_links and (readable or not Path(entry.name).suffix):
                    skip(path, f"{BROKEN_LINK} (to {_link_target(entry.path)}, which does not exist)")
                continue
            if not is_folder and not readable:  # a file, or a link to one, left out by --include or its format
                if reader_for(Path(entry.name)) is None:
                    report.other_formats[Path(entry.name).suffix.lower()] += 1
                continue
            if entry.is_symlink():
                if not through_links:
                    continue  # the first walk: what lies in the folder itself
                linked = os.path.realpath(entry.path)
                if is_folder and (real == linked or real.startswith(linked + os.sep)):  # to a folder above, or ROOT's
                    skip(path, "a symbolic link loop (the folder was read already)")
                    continue
                target = within(linked)
                shown = linked if target is None else target.replace(os.sep, "/")
                if linked in reached:  # read where it lies, or through an earlier link
                    report.linked.append((path, shown))
                    continue
                if target is not None:
                    if not any(part.startswith(".") for part in target.split(os.sep)):
                        skip(path, f"a symbolic link to {shown}, which this folder's patterns leave out")
                        continue
                    # A hidden file or folder the walk passes by, named on purpose: read through the link.
            if is_folder:
                yield from walk(Path(entry.path), path, ignores)
            elif entry.is_file() or entry.is_symlink():  # readable: checked above
                real_file = os.path.realpath(entry.path)
                if real_file in taken:  # read already, through a link to it or to its folder
                    report.linked.append((path, real_file if within(real_file) is None else within(real_file)))
                    continue
                taken.add(real_file)
                reached.add(real_file)
                yield Path(entry.path), path
            else:  # a named pipe, a socket or a device: a read would wait or never end
                skip(path, "not a regular file")

    yield from walk(root, "", [])


def read_folder(root: str | Path, options: FolderOptions = FolderOptions(),
                on_skip: Callable[[str, str], None] | None = None,
                report: FolderReport | None = None) -> Iterator[Document]:
    """The documents of the folder ROOT, one a file, in path order; each file that cannot be read is skipped and
    ON_SKIP(relative path, why) told (or, with `strict`, the read stops with that line)."""
    root = Path(root)
    if not root.is_dir():
        raise RetrieverError(f"{root}: no such folder")
    report = report if report is not None else FolderReport()
    source = str(root.resolve())
    for path, relative in folder_files(root, options, report, on_skip):
        document = _read_or_skip(path, relative, source, options, report, on_skip)
        if document is not None:
            yield document


def _link_target(path: str) -> str:
    """What the symbolic link PATH names, as written in it."""
    try:
        return os.readlink(path)
    except OSError:
        return "?"


_CORPUS_SUFFIXES = CORPUS_FORMATS + (".gz",)  # a corpus file's name ends so: many documents, not one


def is_file_list(corpus: object) -> bool:
    """Whether CORPUS names files to read one document each: a list of `Path`s (a list of strings is a list of
    documents gone wrong, and is refused as one), or one file of a format a reader reads that is not a corpus format
    (a `.txt` given alone stays a corpus file: one document per line)."""
    if isinstance(corpus, (list, tuple)):
        return bool(corpus) and all(isinstance(item, os.PathLike) for item in corpus)
    if isinstance(corpus, (str, os.PathLike)):
        path = Path(corpus)
        return path.suffix.lower() not in _CORPUS_SUFFIXES and reader_for(path) is not None
    return False


def read_files(paths: str | Path | Sequence[str | Path], options: FolderOptions = FolderOptions(),
               on_skip: Callable[[str, str], None] | None = None,
               report: FolderReport | None = None) -> list[Document]:
    """Files named one by one (PATHS), one document each, as a folder's files are read: their ids are their paths
    relative to the folder that holds them all. A path that is not a file, or not of a format a reader reads, is
    refused; a file that cannot be read is skipped (ON_SKIP told) or, with `strict`, refused."""
    paths = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(path) for path in paths]
    for path in paths:
        if not path.is_file():
            raise RetrieverError(f"{path}: no such file")
        if reader_for(path) is None:
            corpus_file = len(paths) > 1 and path.suffix.lower() in _CORPUS_SUFFIXES
            also = (" (a corpus file, .jsonl, .csv, .tsv, is read alone: build from one, then add the others)"
                    if corpus_file else "")
            raise RetrieverError(f"{path}: not a format a reader reads (Markdown, HTML, reStructuredText, text, PDF, "
                                 f"Word){also}")
    common = Path(os.path.commonpath([str(path.resolve().parent) for path in paths]))
    report = report if report is not None else FolderReport()
    documents = [_read_or_skip(path, path.resolve().relative_to(common).as_posix(), str(common), options, report,
                               on_skip) for path in paths]
    return [document for document in documents if document is not None]


def noted_documents(corpus: str | Path | Sequence[Path], options: FolderOptions,
                    note: Callable[[str], None]) -> Iterator[Document]:
    """The documents of a folder, or of files named one by one (`is_file_list`), NOTE told one line for each file
    skipped and, at the end, one for what was read."""
    report = FolderReport()

    def on_skip(path: str, why: str) -> None:
        note(f"skipped {path}: {why}")

    if is_file_list(corpus):
        yield from read_files(corpus, options, on_skip, report)
        note(report.summary())
    else:
        yield from read_folder(corpus, options, on_skip, report)
        note(f"{corpus}: {report.summary()}")


def _read_or_skip(path: Path, relative: str, source: str, options: FolderOptions, report: FolderReport,
                  on_skip: Callable[[str, str], None] | None) -> Document | None:
    """The document of PATH, counted in REPORT; None where it cannot be read (skipped, ON_SKIP told), or with
    `strict` a one-line error."""
    try:
        document = read_file(path, relative, source, options.max_bytes)
    except UnreadableFile as why:
        if options.strict:
            raise RetrieverError(f"{relative}: {why} (without --strict it would be skipped)") from None
        report.skipped.append((relative, str(why)))
        if on_skip is not None:
            on_skip(relative, str(why))
        return None
    report.read += 1
    return document


def checked_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> os.stat_result:
    """PATH's status, where it is a regular file of at most MAX_BYTES; else `UnreadableFile` saying why (a FIFO or
    a device would block or never end a read; OSError where it cannot be looked at)."""
    status = path.stat()
    if not path.is_file():
        raise UnreadableFile("not a regular file")
    if status.st_size > max_bytes:
        raise UnreadableFile(f"{_size(status.st_size)}, over the {_size(max_bytes)} a file may hold")
    return status


def read_file(path: Path, relative: str, source: str, max_bytes: int = MAX_FILE_BYTES) -> Document:
    """The document of the file PATH (RELATIVE to the folder SOURCE); `UnreadableFile` where it cannot be read."""
    reader = reader_for(path)
    try:
        status = checked_file(path, max_bytes)
        data = path.read_bytes()
        found = reader.read(data)
    except FileNotFoundError:
        raise UnreadableFile("it vanished while the folder was read") from None
    except PermissionError:
        raise UnreadableFile("permission denied") from None
    except IsADirectoryError:
        raise UnreadableFile("not a regular file") from None
    except OSError as error:
        raise UnreadableFile(f"cannot be read ({error.strerror or type(error).__name__})") from None
    except RecursionError:
        raise UnreadableFile("nested too deeply to parse") from None
    if not found.text.strip():
        raise NoText("no text in it")
    metadata = {"path": relative, FOLDER_KEY: source, "type": reader.name, "size": status.st_size,
                "modified": datetime.fromtimestamp(status.st_mtime, timezone.utc).isoformat(timespec="seconds"),
                "sha256": hashlib.sha256(data).hexdigest()}
    if found.page_starts is not None and len(found.page_starts) <= MAX_PAGES_RECORDED:
        metadata["page_starts"] = list(found.page_starts)
    # A title is one line, as a browser's tab shows one: an HTML <title> or a file's name may hold line breaks.
    title = " ".join((found.title or path.name).split()) or path.name
    return Document(relative, found.text, title, source, 1, metadata)


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} bytes"


def page_of(metadata: dict | None, offset: int) -> int | None:
    """The 1-based page a character OFFSET of a document's text lies on, where its METADATA records page starts."""
    starts = (metadata or {}).get("page_starts")
    if not isinstance(starts, list) or not starts:
        return None
    return max(1, bisect.bisect_right(starts, int(offset)))
