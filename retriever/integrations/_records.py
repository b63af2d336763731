"""What both framework adapters need of an index: the store's index, opened if it exists and made on the first
write otherwise, and the framework's import, refused in one line naming the extra that installs it."""

from __future__ import annotations

import fcntl
import importlib
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from retriever.errors import NotFoundError, RetrieverError
from retriever.filters import parse_where
from retriever.index import Index
from retriever.versions.home import index_path, resolve_index_dir


def id_strings(ids: str | Sequence[object]) -> list[str]:
    """A framework's ids as the index's: one string is one id (iterated, "abc" was the ids a, b and c, and a delete
    removed those documents), anything else each of its items as text."""
    return [ids] if isinstance(ids, str) else [str(doc_id) for doc_id in ids]


def require(module: str, extra: str, package: str) -> ModuleType:
    """MODULE, or an ImportError whose one line says how to install it (the EXTRA of ours that brings PACKAGE)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"retriever.integrations.{extra} needs {package}: pip install 'retriever[{extra}]'") from None


class StoreWriteLock:
    """One writer at a time on a store's index, among this process's threads (a re-entrant lock) and other
    processes (an exclusive `flock` on PATH, held by the outermost holder): a writer waits for the other, where
    the index's own writer lock would refuse it (`ConflictError`) and leave its caller to retry."""

    def __init__(self, path: Path):
        self.path = path
        self._threads = threading.RLock()
        self._depth = 0
        self._file = None

    def __enter__(self) -> StoreWriteLock:
        self._threads.acquire()
        try:
            if self._depth == 0:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                handle = open(self.path, "a+b")
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                except BaseException:
                    handle.close()
                    raise
                self._file = handle
            self._depth += 1
        except BaseException:
            self._threads.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._depth -= 1
            if self._depth == 0 and self._file is not None:
                self._file.close()  # releases the flock
                self._file = None
        finally:
            self._threads.release()


class LazyIndex:
    """The index NAME in INDEX_DIR behind a framework's store. A store exists before its index does: until the first
    write there is no index on disk, and the store reads as empty (no documents, no hits); the first write builds
    the index (`build`), every later one adds to it (`Index.add`).

    A store sees every write to its index, as the frameworks' other stores do: its own (the `Index` follows them)
    and those of another store on the same index, in this process or another (`index` opens the current version
    again when the index's link has moved). WRITE_LOCK: what a store holds around a write (`StoreWriteLock`), so
    that two writers' first writes build the index once and the second adds to it, in threads or processes, and
    what a write checks (ids present, the embeddings' width) is the version it then writes to."""

    def __init__(self, name: str, index_dir: str | Path | None, device: str = "auto"):
        if not isinstance(name, str) or not name:
            raise RetrieverError("a store needs the name of its index (name='...')")
        self.name, self.index_dir, self.device = name, index_dir, device
        self._link = index_path(resolve_index_dir(index_dir), name)
        self._index: Index | None = None
        self._open_lock = threading.Lock()
        self.write_lock = StoreWriteLock(self._link.parent / f".{name}.store-lock")

    @property
    def index(self) -> Index | None:
        """The index's current version (None until the first write makes it)."""
        try:
            folder = self._link.resolve(strict=True)
        except FileNotFoundError:
            return self._index  # not made yet (or removed under the store: what it had stays readable)
        held = self._index
        if held is None or Path(held.snapshot.folder) != folder:
            with self._open_lock:
                held = self._index
                if held is None or Path(held.snapshot.folder) != folder:
                    try:
                        # The version held before is not closed: a search on another thread may still read it.
                        self._index = held = Index.open(self.name, self.index_dir, device=self.device)
                    except NotFoundError:
                        pass
        return held

    def built(self, summary) -> Index:
        """Take the index a build (SUMMARY, its ChangeSummary) made, from now on."""
        with self._open_lock:
            self._index = summary.open()
        return self._index

    def count(self) -> int:
        index = self.index
        return len(index) if index is not None else 0

    def documents(self, doc_ids: Sequence[str] | None = None, where: dict | None = None) -> list[dict]:
        index = self.index
        return index.documents(doc_ids, where) if index is not None else []

    def any_matching(self, where: dict) -> bool:
        """Whether some document WHERE selects is here (its row ids only: no document is read)."""
        index = self.index
        return index is not None and len(index.snapshot.matching(parse_where(where))) > 0

    def present(self, doc_ids: Sequence[str]) -> list[str]:
        """Those of DOC_IDS the index holds, in their order."""
        return [row["doc_id"] for row in self.documents(list(doc_ids))] if doc_ids else []

    def delete(self, doc_ids: Sequence[str]) -> int:
        """Delete those of DOC_IDS that are here (an id that is not is no error, as both frameworks want);
        returns how many were."""
        with self.write_lock:
            found = self.present(doc_ids)
            if found:
                self.index.delete(found)
            return len(found)


def vector_rows(vectors: Sequence[Sequence[float]], what: str) -> np.ndarray:
    """Embeddings as float32 rows of one width, or one line saying what is wrong with them."""
    try:
        rows = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError):
        raise RetrieverError(f"{what}: every embedding must be a list of numbers of one length") from None
    if rows.ndim != 2 or rows.shape[1] == 0:
        raise RetrieverError(f"{what}: every embedding must be a list of numbers of one length (got shape "
                             f"{rows.shape})")
    if not np.isfinite(rows).all():
        raise RetrieverError(f"{what}: an embedding holds a NaN or infinite value")
    return rows
