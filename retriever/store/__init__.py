"""Storage for an index folder: vectors in a FAISS index, document metadata in SQLite, joined by row id."""

from retriever.store.metadata import MetadataStore
from retriever.store.vectors import VectorStore

__all__ = ["MetadataStore", "VectorStore"]
