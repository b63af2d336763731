"""A Haystack document store over a `retriever` index, and the retrievers Haystack users expect beside it.

    store = RetrieverDocumentStore(name="docs")
    store.write_documents([Document(content="open() reads a file", meta={"tags": ["io"]}, embedding=vector)])
    pipeline.add_component("retriever", RetrieverHybridRetriever(document_store=store, top_k=5))

Documents bring their own embeddings (Haystack's embedders make them): the first embedding written fixes the
store's dimension, and the index is built from those vectors (`retriever.encode.external`: no model of ours).
A document without an embedding is stored all the same, and found by its keywords and by filters; dense search
never returns it. `RetrieverEmbeddingRetriever` searches by a query embedding, `RetrieverBM25Retriever` by the
query's keywords, `RetrieverHybridRetriever` by both, fused as `retriever search` fuses them. Haystack's filter
language translates to retriever's (`haystack_filter`), which the index's one filter engine runs. What maps to
what, and the limits: docs/frameworks.md.
"""

from __future__ import annotations

import base64
import re
from dataclasses import replace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from retriever.encode.external import ExternalEncoder, is_external
from retriever.errors import ConflictError, RetrieverError
from retriever.filters import parse_where
from retriever.index import Index
from retriever.metadata import HAYSTACK_KEY
from retriever.integrations._records import LazyIndex, id_strings, require, vector_rows

require("haystack", "haystack", "haystack-ai")
from haystack import component, default_from_dict, default_to_dict  # noqa: E402
from haystack.dataclasses import Document  # noqa: E402
from haystack.document_stores.errors import DuplicateDocumentError  # noqa: E402
from haystack.document_stores.types import DuplicatePolicy  # noqa: E402
from haystack.errors import FilterError  # noqa: E402

# The metadata key under which a document keeps what Haystack gives and retriever's fields do not hold: whether it
# has an embedding (`dense`), and the embedding exactly as given (`embedding`, float64, base64 in pieces), since
# the index keeps its vectors at float32 or less and Haystack hands documents back as they were written.
HIDDEN = HAYSTACK_KEY
_PIECE = 8_000  # characters of base64 per string: metadata strings hold at most 10,000
# A filter that selects nothing (every document has an id): Haystack's comparisons with None.
_NOTHING = {"doc_id": {"$exists": False}}
_EVERYTHING = {"doc_id": {"$exists": True}}
_COMPARISONS = {">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}
_FIELDS = {"id": "doc_id", "content": "text"}
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?")
EXTERNAL_NAME = "haystack"


class RetrieverDocumentStore:
    """A Haystack `DocumentStore` on the retriever index NAME in INDEX_DIR (default: the index home).
    CALIBRATOR and BUILD_OPTIONS go to `Index.build` when the first write makes the index (index_type, ...).

    CALIBRATOR is "none" unless asked: auto decides by searching pseudo-queries encoded with the index's model,
    and a store whose embeddings come from Haystack's embedders has none, so auto would keep the raw vectors anyway
    (after computing the spectrum it decides nothing with: seconds per build at 768 dimensions). Name one
    ("whitening", "flow") to calibrate; later writes reuse it, as `Index.add` does."""

    def __init__(self, name: str = "haystack", index_dir: str | Path | None = None, device: str = "auto",
                 calibrator: str = "none", **build_options: Any):
        self.name, self.index_dir, self.device = name, index_dir, device
        self.build_options = {"calibrator": calibrator, **build_options}
        self._store = LazyIndex(name, index_dir, device)
        if self._store.index is not None and not is_external(self._store.index.snapshot.manifest.encoder):
            raise RetrieverError(f"index '{name}' encodes with its own model; a Haystack store keeps the embeddings "
                                 "its documents bring: give another name")

    @property
    def index(self) -> Index | None:
        """The retriever index behind the store (None until the first write makes it)."""
        return self._store.index

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, name=self.name, index_dir=None if self.index_dir is None else str(self.index_dir),
                               device=self.device, **self.build_options)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetrieverDocumentStore:
        return default_from_dict(cls, data)

    def count_documents(self) -> int:
        return self._store.count()

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        """The documents FILTERS selects (Haystack's filter language), all without it, in the order written."""
        return [_document(row) for row in self._store.documents(where=_where(filters))]

    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        """Write DOCUMENTS; returns how many were written. An id already here: FAIL (and NONE) refuses the whole
        write (DuplicateDocumentError), SKIP leaves the stored one, OVERWRITE replaces it in the same version
        (`Index.add(upsert=True)`). An id twice in DOCUMENTS: FAIL refuses, SKIP keeps the first, OVERWRITE the
        last."""
        if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
            raise ValueError("write_documents takes a list of haystack Documents")
        policy = DuplicatePolicy.FAIL if policy == DuplicatePolicy.NONE else policy
        chosen: dict[str, Document] = {}
        for document in documents:
            if document.id in chosen:
                if policy == DuplicatePolicy.FAIL:
                    raise DuplicateDocumentError(f"id '{document.id}' is given twice")
                if policy == DuplicatePolicy.SKIP:
                    continue
                del chosen[document.id]  # OVERWRITE: the last one stays, where it was given
            chosen[document.id] = document
        with self._store.write_lock:  # what is here is decided on the version the write then adds to
            present = set(self._store.present(list(chosen)))
            if present and policy == DuplicatePolicy.FAIL:
                raise DuplicateDocumentError(f"{len(present)} of these ids are in the store already, e.g. "
                                             f"'{sorted(present)[0]}'")
            if policy == DuplicatePolicy.SKIP:
                chosen = {doc_id: d for doc_id, d in chosen.items() if doc_id not in present}
            if not chosen:
                return 0
            self._write(list(chosen.values()), upsert=policy == DuplicatePolicy.OVERWRITE)
            return len(chosen)

    def delete_documents(self, document_ids: list[str]) -> None:
        """Delete the documents of DOCUMENT_IDS (an id not here is no error)."""
        self._store.delete(id_strings(document_ids))

    # --- retrieval (what the retriever components call) ---------------------------------------------------

    def embedding_retrieval(self, query_embedding: list[float], filters: dict | None = None,
                            top_k: int = 10) -> list[Document]:
        """The TOP_K documents nearest QUERY_EMBEDDING (cosine in the index's space); documents without an
        embedding are not among them."""
        if self.index is None or not self._has_vectors():
            return []
        hits = self.index.search(None, k=top_k, mode="dense", where=_with_embeddings(_where(filters)),
                                 vectors=self._query_vector(query_embedding))
        return [_document(hit, hit.score) for hit in hits]

    def bm25_retrieval(self, query: str, filters: dict | None = None, top_k: int = 10) -> list[Document]:
        """The TOP_K documents for QUERY's keywords (BM25), with or without an embedding."""
        if self.index is None:
            return []
        return [_document(hit, hit.score) for hit in
                self.index.search(query, k=top_k, mode="keyword", where=_where(filters))]

    def hybrid_retrieval(self, query: str, query_embedding: list[float], filters: dict | None = None,
                         top_k: int = 10, **options: Any) -> list[Document]:
        """The TOP_K documents for QUERY's keywords and QUERY_EMBEDDING, the two rankings fused (OPTIONS: fusion,
        weight), among the documents with an embedding: one without has no dense score to fuse (BM25 retrieval
        finds it)."""
        if self.index is None or not self._has_vectors():
            return []
        hits = self.index.search(query, k=top_k, mode="hybrid", where=_with_embeddings(_where(filters)),
                                 vectors=self._query_vector(query_embedding), **options)
        return [_document(hit, hit.score) for hit in hits]

    # --- inside -------------------------------------------------------------------------------------------

    def _has_vectors(self) -> bool:
        """Whether some document brought an embedding (before that, the index's vectors are placeholders)."""
        return self._store.any_matching({f"metadata.{HIDDEN}.dense": True})

    def _query_vector(self, query_embedding: Sequence[float]) -> np.ndarray:
        vector = vector_rows([list(query_embedding)], "query_embedding")
        dim = self.index.snapshot.manifest.encoder["dim"]
        if vector.shape[1] != dim:
            raise RetrieverError(f"query_embedding has {vector.shape[1]} dimensions; store '{self.name}' holds "
                                 f"{dim}-dimensional embeddings")
        return vector[0]

    def _write(self, documents: list[Document], upsert: bool) -> None:
        """Write DOCUMENTS (under the store's write lock): added to the index, or the index built by the first
        write, or built again by the first embedding after documents with none."""
        given = [d.embedding for d in documents if d.embedding is not None]
        rows = vector_rows(given, "embedding") if given else None
        index = self.index
        stored_dim = index.snapshot.manifest.encoder["dim"] if index is not None else None
        placeholders = index is not None and not self._has_vectors()
        dim = rows.shape[1] if rows is not None else stored_dim or 1
        if rows is not None and stored_dim is not None and rows.shape[1] != stored_dim and not placeholders:
            raise RetrieverError(f"embeddings of {rows.shape[1]} dimensions; store '{self.name}' holds "
                                 f"{stored_dim}-dimensional ones (its first embedding fixed them)")
        records = [_record(d) for d in documents]
        vectors = _vectors(documents, dim)
        if index is None or (placeholders and dim != stored_dim):
            # The first write, or the first embedding after documents with none: the dimension is fixed now, and
            # the documents already here (none with an embedding) are written again beside the new ones.
            written = {record["_id"] for record in records}
            kept = [row for row in self._store.documents() if row["doc_id"] not in written]
            records = [{"_id": row["doc_id"], "text": row["text"], "metadata": row["metadata"]} for row in kept] \
                + records
            vectors = np.concatenate([_placeholders(len(kept), dim), vectors])
            # Placeholders alone give a calibrator nothing to fit: it is fitted when the first embeddings come.
            options = {**self.build_options, **({} if rows is not None else {"calibrator": "none"})}
            try:
                self._store.built(Index.build(records, self.name, self.index_dir, vectors=vectors,
                                              encoder=ExternalEncoder(EXTERNAL_NAME, dim), device=self.device,
                                              replace=index is not None, **options))
            except ConflictError:
                if index is not None or self.index is None:
                    raise
                self._write(documents, upsert)  # another process built it first: add to what it built
        else:
            index.add(records, vectors=vectors, upsert=upsert)


def _record(document: Document) -> dict:
    if document.content is None or not document.content.strip():
        raise ValueError(f"document '{document.id}' has no text content; this store keeps text documents")
    if document.blob is not None or document.sparse_embedding is not None:
        raise ValueError(f"document '{document.id}': blobs and sparse embeddings are not kept by this store")
    meta = dict(document.meta or {})
    if HIDDEN in meta:
        raise ValueError(f"document '{document.id}': the meta key '{HIDDEN}' is the store's own")
    hidden: dict[str, Any] = {"dense": document.embedding is not None}
    if document.embedding is not None:
        encoded = base64.b64encode(np.asarray(document.embedding, dtype="<f8").tobytes()).decode("ascii")
        hidden["embedding"] = [encoded[i:i + _PIECE] for i in range(0, len(encoded), _PIECE)]
    return {"_id": document.id, "text": document.content, "metadata": {**meta, HIDDEN: hidden}}


def _with_embeddings(where: dict | None) -> dict:
    """WHERE, kept to the documents that brought an embedding (the hidden `dense` flag)."""
    key = f"metadata.{HIDDEN}.dense"
    if not where:
        return {key: True}
    # A clause's keys all hold: the flag joins WHERE's own level, so a filter within the documented depth stays
    # within it (an `$and` around it once made one at the limit fail in embedding and hybrid retrieval only).
    return {**where, key: True} if key not in where else {"$and": [where, {key: True}]}


def _placeholders(rows: int, dim: int) -> np.ndarray:
    """The vectors of documents without an embedding: the index keeps a unit vector for every document, and these
    are never searched (dense and hybrid retrieval keep to `_with_embeddings`)."""
    vectors = np.zeros((rows, dim), np.float32)
    vectors[:, 0] = 1.0
    return vectors


def _vectors(documents: list[Document], dim: int) -> np.ndarray:
    """A row per document: its embedding, or a placeholder where it has none."""
    vectors = _placeholders(len(documents), dim)
    for row, document in enumerate(documents):
        if document.embedding is not None:
            vectors[row] = vector_rows([document.embedding], f"document '{document.id}'s embedding")[0]
    return vectors


def _document(found: Any, score: float | None = None) -> Document:
    """A Haystack Document of a stored row or a search hit: meta and embedding exactly as written."""
    row = found if isinstance(found, dict) else {"doc_id": found.doc_id, "text": found.text,
                                                  "metadata": found.metadata}
    meta = dict(row["metadata"] or {})
    hidden = meta.pop(HIDDEN, None) or {}
    embedding = None
    if hidden.get("embedding"):
        embedding = np.frombuffer(base64.b64decode("".join(hidden["embedding"])), dtype="<f8").tolist()
    return Document(id=row["doc_id"], content=row["text"], meta=meta, embedding=embedding, score=score)


def _where(filters: dict | None) -> dict | None:
    """Haystack FILTERS as retriever's filter language, or FilterError naming what is wrong with them."""
    if not filters:
        return None
    translated = haystack_filter(filters)
    try:
        parse_where(translated)  # refused here, as Haystack's FilterError, rather than deep in a search
    except RetrieverError as error:
        raise FilterError(str(error)) from None
    return translated


def haystack_filter(filters: dict) -> dict:
    """Haystack's filter language (`{"field": "meta.x", "operator": "==", "value": 1}`, and `AND`/`OR`/`NOT` over
    `conditions`) as retriever's, with Haystack's meanings: == None holds where the field is null or missing,
    != None where it has a value, a comparison with None holds nowhere, > and its kin compare numbers, or strings
    that are ISO dates (as strings: ISO dates of one format order as their text does), `not in` holds where the
    field is missing."""
    if not isinstance(filters, dict):
        raise FilterError(f"a filter is a dict, got {type(filters).__name__}")
    if "field" in filters:
        return _comparison(filters)
    if "operator" not in filters:
        raise FilterError("a logical condition needs 'operator' (AND, OR or NOT) and 'conditions'")
    if "conditions" not in filters:
        raise FilterError(f"a logical condition ({filters['operator']}) needs 'conditions'")
    operator, conditions = filters["operator"], filters["conditions"]
    if not isinstance(conditions, list) or not conditions:
        raise FilterError(f"{operator}: 'conditions' must be a non-empty list")
    parts = [haystack_filter(condition) for condition in conditions]
    if operator == "AND":
        return {"$and": parts}
    if operator == "OR":
        return {"$or": parts}
    if operator == "NOT":
        return {"$not": {"$and": parts}}
    raise FilterError(f"unknown logical operator {operator!r}; known: AND, OR, NOT")


def _comparison(condition: dict) -> dict:
    for key in ("field", "operator", "value"):
        if key not in condition:
            raise FilterError(f"a comparison needs 'field', 'operator' and 'value'; {key!r} is missing")
    field, operator, value = _field(condition["field"]), condition["operator"], condition["value"]
    if operator == "==":
        if value is None:
            return {"$or": [{field: None}, {field: {"$exists": False}}]}
        return {field: {"$eq": _scalar(value, operator)}}
    if operator == "!=":
        if value is None:
            return {field: {"$exists": True, "$ne": None}}
        return {field: {"$ne": _scalar(value, operator)}}
    if operator in _COMPARISONS:
        if value is None:
            return _NOTHING
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise FilterError(f"'{operator}' compares with a number or an ISO date, got {type(value).__name__}")
        if isinstance(value, str) and not _ISO_DATE.fullmatch(value):
            # Compared as text, which orders dates of this one form as time does; an offset or another form
            # (20210501, week dates) would not order so, and is refused rather than answered wrongly.
            raise FilterError(f"'{operator}' compares strings only as ISO dates without a UTC offset "
                              f"(2021-05-01 or 2021-05-01T08:00:00); {value!r} is not one")
        return {field: {_COMPARISONS[operator]: value}}
    if operator in ("in", "not in"):
        if not isinstance(value, list):
            raise FilterError(f"'{operator}' takes a list of values, got {type(value).__name__}")
        if not value:
            return _NOTHING if operator == "in" else _EVERYTHING
        listed = [_scalar(v, operator) for v in value if v is not None]
        if len(listed) == len(value):
            return {field: {"$in" if operator == "in" else "$nin": listed}}
        # None in the list: a missing field reads as None, as == None reads it.
        missing = {"$or": [{field: None}, {field: {"$exists": False}}]}
        if operator == "in":
            return {"$or": [{field: {"$in": listed}}, missing]} if listed else missing
        present = {field: {"$exists": True, "$ne": None}}
        return {"$and": [{field: {"$nin": listed}}, present]} if listed else present
    raise FilterError(f"unknown comparison operator {operator!r}; known: ==, !=, >, >=, <, <=, in, not in")


def _field(name: Any) -> str:
    if isinstance(name, str) and name.startswith("meta.") and len(name) > len("meta."):
        return "metadata." + name[len("meta."):]
    if name in _FIELDS:
        return _FIELDS[name]
    raise FilterError(f"field {name!r}: filters name meta.<key>, id or content")


def _scalar(value: Any, operator: str) -> Any:
    if isinstance(value, (list, dict)):
        raise FilterError(f"'{operator}' compares with one value, got a {type(value).__name__}")
    return value


class _StoreRetriever:
    """What the three retrievers share: their store, default filters and top_k, and their serialisation (the
    store's own with them)."""

    def __init__(self, document_store: RetrieverDocumentStore, filters: dict | None = None, top_k: int = 10):
        if not isinstance(document_store, RetrieverDocumentStore):
            raise ValueError("document_store must be a RetrieverDocumentStore")
        self.document_store, self.filters, self.top_k = document_store, filters, top_k

    def _settings(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, document_store=self.document_store.to_dict(), filters=self.filters,
                               top_k=self.top_k, **self._settings())

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        parameters = data.get("init_parameters", {})
        parameters["document_store"] = RetrieverDocumentStore.from_dict(parameters["document_store"])
        return default_from_dict(cls, data)


@component
class RetrieverEmbeddingRetriever(_StoreRetriever):
    """Documents nearest a query embedding, from a RetrieverDocumentStore (documents without one are never
    returned)."""

    @component.output_types(documents=list[Document])
    def run(self, query_embedding: list[float], filters: dict | None = None, top_k: int | None = None):
        return {"documents": self.document_store.embedding_retrieval(
            query_embedding, filters if filters is not None else self.filters, self.top_k if top_k is None else top_k)}


@component
class RetrieverBM25Retriever(_StoreRetriever):
    """Documents for a query's keywords (BM25), from a RetrieverDocumentStore."""

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict | None = None, top_k: int | None = None):
        return {"documents": self.document_store.bm25_retrieval(
            query, filters if filters is not None else self.filters, self.top_k if top_k is None else top_k)}


@component
class RetrieverHybridRetriever(_StoreRetriever):
    """Documents for a query's keywords and its embedding, the two rankings fused (retriever's hybrid search:
    FUSION and WEIGHT as `retriever search --fusion --weight` take them; None: the index's own)."""

    def __init__(self, document_store: RetrieverDocumentStore, filters: dict | None = None, top_k: int = 10,
                 fusion: str | None = None, weight: float | None = None):
        # Named, not super(): Haystack's @component makes a new class, which zero-argument super() does not know.
        _StoreRetriever.__init__(self, document_store, filters, top_k)
        self.fusion, self.weight = fusion, weight

    def _settings(self) -> dict[str, Any]:
        return {"fusion": self.fusion, "weight": self.weight}

    @component.output_types(documents=list[Document])
    def run(self, query: str, query_embedding: list[float], filters: dict | None = None, top_k: int | None = None):
        return {"documents": self.document_store.hybrid_retrieval(
            query, query_embedding, filters if filters is not None else self.filters, self.top_k if top_k is None else top_k,
            fusion=self.fusion, weight=self.weight)}


class _Embedder:
    """What the two embedders share: retriever's encoder, loaded on first use (Haystack's `warm_up`), and their
    serialisation. MODEL: a Hugging Face name or a local folder (default: the embedded all-MiniLM-L6-v2, which
    needs no download); POOLING, MAX_LENGTH, DEVICE and BATCH_SIZE as `retriever build` takes them."""

    runtime = "auto"  # documents: as a build encodes them (ONNX Runtime on a CPU)

    def __init__(self, model: str | None = None, pooling: str = "last-avg", max_length: int | None = None,
                 device: str = "auto", batch_size: int | None = None):
        self.model, self.pooling, self.max_length = model, pooling, max_length
        self.device, self.batch_size = device, batch_size
        self._encoder = None

    def warm_up(self) -> None:
        if self._encoder is None:
            from retriever.encode.model_card import encoder_for

            # As a build makes its encoder: from the model's kept kit on a CPU where there is one (no model loaded).
            self._encoder = encoder_for(self.model, self.pooling, None, self.max_length, self.device,
                                        batch_size=self.batch_size, runtime=self.runtime)

    def _encode(self, texts: list[str]) -> np.ndarray:
        self.warm_up()
        return self._encoder.encode(texts)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, model=self.model, pooling=self.pooling, max_length=self.max_length,
                               device=self.device, batch_size=self.batch_size)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return default_from_dict(cls, data)


@component
class RetrieverTextEmbedder(_Embedder):
    """A query's embedding by retriever's own encoder, for RetrieverEmbeddingRetriever and RetrieverHybridRetriever:
    the embedded model works in a pipeline with no download (Haystack's own embedders fetch theirs from the hub)."""

    runtime = "auto"  # one query at a time: ONNX Runtime on a CPU

    @component.output_types(embedding=list[float])
    def run(self, text: str):
        if not isinstance(text, str):
            raise TypeError("RetrieverTextEmbedder takes one string; embed documents with RetrieverDocumentEmbedder")
        return {"embedding": self._encode([text])[0].tolist()}


@component
class RetrieverDocumentEmbedder(_Embedder):
    """Documents with their embeddings by retriever's own encoder (each document's content), to write to a
    RetrieverDocumentStore; the documents given are left as they were."""

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]):
        if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
            raise TypeError("RetrieverDocumentEmbedder takes a list of haystack Documents; embed a query with "
                            "RetrieverTextEmbedder")
        vectors = self._encode([d.content or "" for d in documents]) if documents else []
        return {"documents": [replace(d, embedding=vector.tolist()) for d, vector in zip(documents, vectors)]}


__all__ = ["RetrieverDocumentStore", "RetrieverEmbeddingRetriever", "RetrieverBM25Retriever",
           "RetrieverHybridRetriever", "RetrieverTextEmbedder", "RetrieverDocumentEmbedder", "haystack_filter"]
