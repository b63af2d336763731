"""What both framework adapters need of an index: the store's index, opened if it exists and made on the first
write otherwise, and the framework's import, refused in one line naming the extra that installs it."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from retriever.errors import NotFoundError, RetrieverError
from retriever.index import Index


def require(module: str, extra: str, package: str) -> ModuleType:
    """MODULE, or an ImportError whose one line says how to install it (the EXTRA of ours that brings PACKAGE)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"retriever.integrations.{extra} needs {package}: pip install 'retriever[{extra}]'") from None


class LazyIndex:
    """The index NAME in INDEX_DIR behind a framework's store. A store exists before its index does: until the first
    write there is no index on disk, and the store reads as empty (no documents, no hits); the first write builds
    the index (`build`), every later one adds to it (`Index.add`)."""

    def __init__(self, name: str, index_dir: str | Path | None, device: str = "auto"):
        if not isinstance(name, str) or not name:
            raise RetrieverError("a store needs the name of its index (name='...')")
        self.name, self.index_dir, self.device = name, index_dir, device
        self.index: Index | None = None
        try:
            self.index = Index.open(name, index_dir, device=device)
        except NotFoundError:
            pass  # made by the first write

    def built(self, summary) -> Index:
        """Take the index a build (SUMMARY, its ChangeSummary) made, from now on."""
        if self.index is not None:
            self.index.close()
        self.index = summary.open()
        return self.index

    def count(self) -> int:
        return len(self.index) if self.index is not None else 0

    def documents(self, doc_ids: Sequence[str] | None = None, where: dict | None = None) -> list[dict]:
        return self.index.documents(doc_ids, where) if self.index is not None else []

    def present(self, doc_ids: Sequence[str]) -> list[str]:
        """Those of DOC_IDS the index holds, in their order."""
        return [row["doc_id"] for row in self.documents(list(doc_ids))] if doc_ids else []

    def delete(self, doc_ids: Sequence[str]) -> int:
        """Delete those of DOC_IDS that are here (an id that is not is no error, as both frameworks want);
        returns how many were."""
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
