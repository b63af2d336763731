"""Storage for an index version: segments (FAISS vectors, raw vectors, SQLite documents) joined by row id."""

from retriever.store.documents import DocumentTable
from retriever.store.segment import Segment
from retriever.store.vectors import VectorStore
from retriever.store.spec import IndexSpec

__all__ = ["DocumentTable", "IndexSpec", "Segment", "VectorStore"]
