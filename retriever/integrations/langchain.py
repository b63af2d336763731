"""A LangChain vector store over a `retriever` index: `RetrieverVectorStore`.

    store = RetrieverVectorStore(embedding=None, name="docs")        # the index's own encoder and calibrator
    store.add_documents([Document(page_content="open() reads a file", metadata={"tags": ["io"]})])
    retriever = store.as_retriever(search_kwargs={"k": 5, "filter": {"tags": "io"}})
    retriever.invoke("how do I read a file")

With `embedding=` a LangChain `Embeddings`, the vectors come from it (`embed_documents` for documents,
`embed_query` for queries) and the index is built from them, calibrated as it decides (`encode.external`); with
`embedding=None`, the index's own encoder and calibrator encode both, exactly as `retriever search` does. Searches
are hybrid (dense and BM25 fused) where the index has a keyword index, as everywhere in retriever; `mode="dense"` or
`mode="keyword"` (on the store, or per search) picks one side. Filters are LangChain's usual metadata dicts
(`{"lang": "en"}`, `{"year": {"$gte": 2020}}`, `$and`/`$or`/`$not`, `$in`, `$nin`, `$between`...), translated to
retriever's filter language (`retriever.filters`) over the documents' metadata. docs/frameworks.md has the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from retriever.encode.external import ExternalEncoder, is_external
from retriever.errors import RetrieverError
from retriever.index import Index
from retriever.integrations._records import LazyIndex, require, vector_rows
from retriever.search.options import MODES

_core = require("langchain_core", "langchain", "langchain-core")
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.runnables.config import run_in_executor  # noqa: E402
from langchain_core.vectorstores import VectorStore  # noqa: E402



class RetrieverVectorStore(VectorStore):
    """A LangChain `VectorStore` over the retriever index NAME in INDEX_DIR (default: the index home). EMBEDDING:
    a LangChain `Embeddings` that makes every vector, or None for the index's own encoder. MODE: how searches
    rank, "hybrid", "dense" or "keyword" (None: hybrid where the index has a keyword index). BUILD_OPTIONS go to
    `Index.build` when the first write makes the index (calibrator, model, index_type, ...)."""

    def __init__(self, embedding: Embeddings | None = None, name: str = "langchain",
                 index_dir: str | Path | None = None, *, mode: str | None = None, device: str = "auto",
                 **build_options: Any):
        if mode is not None and mode not in MODES:
            raise RetrieverError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
        self._embedding = embedding
        self.mode = mode
        self.build_options = build_options
        self._store = LazyIndex(name, index_dir, device)
        if self._store.index is not None:
            self._check_encoder(self._store.index)

    @property
    def embeddings(self) -> Embeddings | None:
        return self._embedding

    @property
    def index(self) -> Index | None:
        """The retriever index behind the store (None until the first write makes it)."""
        return self._store.index

    def _check_encoder(self, index: Index) -> None:
        external = is_external(index.snapshot.manifest.encoder)
        if self._embedding is not None and not external:
            raise RetrieverError(f"index '{index.name}' encodes with its own model "
                                 f"({index.snapshot.manifest.encoder['model']}): open it with embedding=None")
        if self._embedding is None and external:
            raise RetrieverError(f"index '{index.name}' holds vectors made outside it "
                                 f"({index.snapshot.manifest.encoder['model']}): open it with that embedding=")

    # --- writing -------------------------------------------------------------------------------------------

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                  ids: Sequence[str | None] | None = None, **kwargs: Any) -> list[str]:
        """Add TEXTS (with METADATAS) under IDS, a new uuid4 for each id not given; an id already in the store is
        replaced (LangChain's re-add), as is an id given twice here (the last one stays)."""
        texts = list(texts)
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"{len(metadatas)} metadatas for {len(texts)} texts")
        if ids is not None and len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        ids = [str(doc_id) if doc_id else str(uuid.uuid4()) for doc_id in (ids or [None] * len(texts))]
        if not texts:
            return []
        last = {doc_id: number for number, doc_id in enumerate(ids)}  # a repeated id: its last text stays
        kept = sorted(last.values())
        records = [{"_id": ids[n], "text": texts[n], "metadata": (metadatas[n] if metadatas else None) or None}
                   for n in kept]
        vectors = None
        if self._embedding is not None:
            vectors = vector_rows(self._embedding.embed_documents([texts[n] for n in kept]),
                                  f"{type(self._embedding).__name__}.embed_documents")
        index = self._store.index
        if index is None:
            options: dict[str, Any] = dict(self.build_options)
            if vectors is not None:
                embedding = self._embedding
                options.update(vectors=vectors, encoder=ExternalEncoder(type(embedding).__name__, vectors.shape[1],
                                                                        embed=embedding.embed_documents))
            self._store.built(Index.build(records, self._store.name, self._store.index_dir,
                                          device=self._store.device, **options))
        else:
            index.add(records, vectors=vectors, upsert=True)
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete the documents of IDS (an id not here is no error); None deletes every document."""
        if self._store.index is None:
            return True
        if ids is None:
            ids = [row["doc_id"] for row in self._store.documents()]
        self._store.delete([str(doc_id) for doc_id in ids])
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents of IDS that are here, in IDS' order."""
        return [_document(row) for row in self._store.documents([str(doc_id) for doc_id in ids])]

    async def aget_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        return await run_in_executor(None, self.get_by_ids, ids)

    # --- searching -----------------------------------------------------------------------------------------

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None,
                          **kwargs: Any) -> list[Document]:
        return [document for document, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """The top K documents for QUERY with the score the mode ranked by (hybrid: the fused score; dense: the
        cosine in the index's space; keyword: BM25). KWARGS: mode, and retriever's other search options (fusion,
        weight, min_score, ...)."""
        return [(_document(hit), hit.score) for hit in self._search(query, k, filter, **kwargs)]

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: dict | None = None,
                                    **kwargs: Any) -> list[Document]:
        """The top K documents for a query vector (dense search: there is no text for the keyword side)."""
        if self._store.index is None:
            return []
        hits = self._store.index.search(None, k=k, where=langchain_filter(filter), mode="dense",
                                        vectors=vector_rows([embedding], "embedding")[0], **kwargs)
        return [_document(hit) for hit in hits]

    def _similarity_search_with_relevance_scores(self, query: str, k: int = 4,
                                                 **kwargs: Any) -> list[tuple[Document, float]]:
        """Relevance in [0, 1]: each hit's cosine in the index's space (its dense score, which hybrid hits have
        too) as (1 + cosine) / 2. BM25 has no such scale: keyword search has no relevance scores."""
        filter = kwargs.pop("filter", None)
        hits = self._search(query, k, filter, **kwargs)
        if hits and hits[0].dense_score is None:
            raise RetrieverError("keyword search has no relevance scores in [0, 1] (BM25 has no fixed scale): "
                                 "search with mode='hybrid' or mode='dense'")
        return [(_document(hit), min(1.0, max(0.0, (1.0 + hit.dense_score) / 2.0))) for hit in hits]

    async def _asimilarity_search_with_relevance_scores(self, query: str, k: int = 4,
                                                        **kwargs: Any) -> list[tuple[Document, float]]:
        return await run_in_executor(None, self._similarity_search_with_relevance_scores, query, k, **kwargs)

    def _search(self, query: str, k: int, filter: dict | None, **kwargs: Any) -> list:
        index = self._store.index
        if index is None:
            return []  # a store no write has made an index for yet: nothing to find
        kwargs.setdefault("mode", self.mode)
        kwargs.pop("score_threshold", None)  # LangChain's own, applied by the caller to relevance scores
        vectors = None
        if self._embedding is not None and kwargs["mode"] != "keyword":
            vectors = vector_rows([self._embedding.embed_query(query)],
                                  f"{type(self._embedding).__name__}.embed_query")[0]
        return index.search(query, k=k, where=langchain_filter(filter), vectors=vectors, **kwargs)

    # --- making one ----------------------------------------------------------------------------------------

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, name: str = "langchain", index_dir: str | Path | None = None,
                   **kwargs: Any) -> RetrieverVectorStore:
        """A store on index NAME holding TEXTS (added to it if it exists)."""
        store = cls(embedding=embedding, name=name, index_dir=index_dir, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store


def langchain_filter(filter: dict | None) -> dict | None:
    """A LangChain metadata filter as retriever's filter language: every field a metadata key (so a key such as
    `source`, which LangChain's loaders set, is the metadata's, never the document's own field), `$between` as
    `$gte` and `$lte`; the rest is retriever's own (`retriever.filters` refuses what it does not know, in one
    line)."""
    if filter is None or filter == {}:
        return None
    if not isinstance(filter, dict):
        raise RetrieverError(f"a filter is a dict such as {{'lang': 'en'}}, got {type(filter).__name__}")
    return _clause(filter)


def _clause(clause: dict) -> dict:
    translated: dict = {}
    for key, value in clause.items():
        if key in ("$and", "$or"):
            translated[key] = [_clause(item) if isinstance(item, dict) else item for item in value] \
                if isinstance(value, list) else value
        elif key == "$not":
            translated[key] = _clause(value) if isinstance(value, dict) else value
        elif isinstance(key, str) and key.startswith("$"):
            translated[key] = value  # refused by the filter engine, by name
        else:
            translated[f"metadata.{key}"] = _condition(value)
    return translated


def _condition(condition: Any) -> Any:
    if not isinstance(condition, dict):
        return condition
    spelled: dict = {}
    for op, value in condition.items():
        if op == "$between" and isinstance(value, (list, tuple)) and len(value) == 2:
            spelled["$gte"], spelled["$lte"] = value
        else:
            spelled[op] = value
    return spelled


def _document(found: Any) -> Document:
    """A LangChain Document of a stored row or a search hit."""
    if isinstance(found, dict):
        return Document(page_content=found["text"], metadata=found["metadata"] or {}, id=found["doc_id"])
    return Document(page_content=found.text, metadata=found.metadata or {}, id=found.doc_id)


__all__ = ["RetrieverVectorStore", "langchain_filter"]
