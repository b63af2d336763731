"""A LangChain vector store over a `retriever` index: `RetrieverVectorStore`.

    store = RetrieverVectorStore(embedding=None, name="docs")        # the index's own encoder and calibrator
    store.add_documents([Document(page_content="open() reads a file", metadata={"tags": ["io"]})])
    retriever = store.as_retriever(search_kwargs={"k": 5, "filter": {"tags": "io"}})
    retriever.invoke("how do I read a file")

With `embedding=` a LangChain `Embeddings`, the vectors come from it (`embed_documents` for documents,
`embed_query` for queries) and the index is built from them, calibrated as it decides (`encode.external`); with
`embedding=None`, the index's own encoder and calibrator encode both, exactly as `retriever search` does. Searches
are hybrid (dense and BM25 fused) where the index has a keyword index, as everywhere in retriever; `mode="dense"` or
`mode="keyword"` (on the store, or per search) picks one side. Max-marginal-relevance search (`search_type="mmr"`)
re-ranks dense search's candidates by the vectors the index stores for them. Filters are LangChain's usual metadata
dicts (`{"lang": "en"}`, `{"year": {"$gte": 2020}}`, `$and`/`$or`/`$not`, `$in`, `$nin`, `$between`...), translated
to retriever's filter language (`retriever.filters`) over the documents' metadata. docs/frameworks.md has the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from retriever.encode.external import PREFIX, ExternalEncoder, is_external
from retriever.errors import ConflictError, RetrieverError
from retriever.index import Index, load_encoder
from retriever.integrations._records import LazyIndex, id_strings, require, vector_rows
from retriever.numeric import l2_normalize
from retriever.search.options import MODES
from retriever.search.top_lists import passage_vectors

if TYPE_CHECKING:
    from retriever.encode.encoder import Encoder

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
        self._encoder: Encoder | None = None  # the index's own, for MMR's query vectors (embedding=None)
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
        record = index.snapshot.manifest.encoder
        external = is_external(record)
        if self._embedding is not None and not external:
            raise RetrieverError(f"index '{index.name}' encodes with its own model ({record['model']}): open it "
                                 "with embedding=None")
        if self._embedding is None and external:
            raise RetrieverError(f"index '{index.name}' holds vectors made outside it ({record['model']}): open it "
                                 "with that embedding=")
        # Another model's vectors, even of the same width, are in another space: added to this index they would
        # be compared with vectors they have nothing in common with.
        if self._embedding is not None and record["model"] != PREFIX + type(self._embedding).__name__:
            raise RetrieverError(f"index '{index.name}' holds vectors made by {record['model'][len(PREFIX):]}, not "
                                 f"by {type(self._embedding).__name__}: open it with a "
                                 f"{record['model'][len(PREFIX):]}, or give another name")

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
        # Any id but None is the caller's, made a string as LangChain's stores do (0 is "0", not a new uuid).
        ids = [str(uuid.uuid4()) if doc_id is None else str(doc_id) for doc_id in (ids or [None] * len(texts))]
        blank = next((number for number, doc_id in enumerate(ids) if not doc_id.strip()), None)
        if blank is not None:
            raise ValueError(f"ids[{blank}] is {'empty' if not ids[blank] else 'whitespace only'}: a document id is a "
                             "string with something in it, kept as given (None: a new uuid)")
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
        with self._store.write_lock:  # two threads' first adds: one builds, the other then adds
            index = self._store.index
            if index is None:
                options: dict[str, Any] = dict(self.build_options)
                if vectors is not None:
                    embedding = self._embedding
                    options.update(vectors=vectors, encoder=ExternalEncoder(
                        type(embedding).__name__, vectors.shape[1], embed=embedding.embed_documents))
                try:
                    self._store.built(Index.build(records, self._store.name, self._store.index_dir,
                                                  device=self._store.device, **options))
                    return ids
                except ConflictError:  # another process built it first: add to what it built
                    index = self._store.index
                    if index is None:
                        raise
                    self._check_encoder(index)
            index.add(records, vectors=vectors, upsert=True)
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete the documents of IDS (an id not here is no error); None deletes every document."""
        if self._store.index is None:
            return True
        if ids is None:
            ids = [row["doc_id"] for row in self._store.documents()]
        self._store.delete(id_strings(ids))
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents of IDS that are here, in IDS' order."""
        return [_document(row) for row in self._store.documents(id_strings(ids))]

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
        _dense_only(kwargs, "search by vector")
        if self._store.index is None:
            return []
        hits = self._store.index.search(None, k=k, where=langchain_filter(filter), mode="dense",
                                        vectors=vector_rows([embedding], "embedding")[0], **kwargs)
        return [_document(hit) for hit in hits]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: dict | None = None, **kwargs: Any) -> list[Document]:
        """K documents for QUERY, each chosen for its relevance (LAMBDA_MULT's share, 0 to 1) and for how unlike
        the ones chosen before it it is (the rest), among the FETCH_K that dense search finds. Cosines are in the
        index's space, as dense search ranks; KWARGS: retriever's dense search options (min_score, nprobe, ...)."""
        _dense_only(kwargs, "max-marginal-relevance search")
        if self._store.index is None:
            return []
        return self._max_marginal_relevance(self._query_vector(query), k, fetch_k, lambda_mult, filter, **kwargs)

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: dict | None = None,
                                                **kwargs: Any) -> list[Document]:
        """`max_marginal_relevance_search` for a query vector (as `similarity_search_by_vector` takes it)."""
        _dense_only(kwargs, "max-marginal-relevance search")
        if self._store.index is None:
            return []
        return self._max_marginal_relevance(vector_rows([embedding], "embedding")[0], k, fetch_k, lambda_mult,
                                            filter, **kwargs)

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
            vectors = self._query_vector(query)
        return index.search(query, k=k, where=langchain_filter(filter), vectors=vectors, **kwargs)

    def _query_vector(self, query: str) -> np.ndarray:
        """QUERY's raw vector (uncalibrated): the embedding's, or the index's own encoder's."""
        if self._embedding is not None:
            return vector_rows([self._embedding.embed_query(query)],
                               f"{type(self._embedding).__name__}.embed_query")[0]
        if self._encoder is None:
            # The store's own instance of the encoder the index records, loaded at its first use: the one the
            # index loads for its searches by text is private to it.
            self._encoder = load_encoder(self._store.index.snapshot)
        return self._encoder.encode([query])[0]

    def _max_marginal_relevance(self, query: np.ndarray, k: int, fetch_k: int, lambda_mult: float,
                                filter: dict | None, **kwargs: Any) -> list[Document]:
        space = kwargs.pop("space", "calibrated")
        if space != "calibrated":
            raise RetrieverError("max-marginal-relevance search compares the vectors in the index's space: it "
                                 f"takes no space={space!r}")
        index = self._store.index
        # max(k, fetch_k): a K above FETCH_K still gets K documents.
        hits = index.search(None, k=max(k, fetch_k), where=langchain_filter(filter), mode="dense", vectors=query,
                            **kwargs)
        if not hits:
            return []
        snapshot = index.snapshot
        found = snapshot.live_rowids([hit.doc_id for hit in hits])
        rowids = np.array([found[hit.doc_id][0] for hit in hits], np.int64)
        # The vectors the index stores, as dense search scored them: no document is embedded again.
        stored = passage_vectors(snapshot, rowids)
        calibrated = snapshot.calibrate(query.reshape(1, -1))[0]
        # Relevance is each document's score as dense search gave it; for likeness, a document cut into passages
        # stands for the passage the search matched it by, its nearest the query.
        _, best_keys = stored.best(calibrated, rowids)
        row_of = {(owner, key): row for row, (owner, key) in enumerate(zip(stored.owners.tolist(),
                                                                           stored.keys.tolist()))}
        vectors = stored.vectors[[row_of[rowid, key] for rowid, key in zip(rowids.tolist(), best_keys.tolist())]]
        relevance = np.array([hit.dense_score for hit in hits], np.float32)
        chosen = maximal_marginal_relevance(relevance, vectors, lambda_mult, k)
        return [_document(hits[number]) for number in chosen]

    # --- making one ----------------------------------------------------------------------------------------

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, name: str = "langchain", index_dir: str | Path | None = None,
                   **kwargs: Any) -> RetrieverVectorStore:
        """A store on index NAME holding TEXTS (added to it if it exists)."""
        store = cls(embedding=embedding, name=name, index_dir=index_dir, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store


def _dense_only(kwargs: dict, search: str) -> None:
    """Take from a search's KWARGS what SEARCH, which is dense, settles itself: a mode (dense or none; anything else
    refused in one line) and LangChain's score_threshold (for relevance scores, which it gives none of)."""
    mode = kwargs.pop("mode", None)
    if mode not in (None, "dense"):
        raise RetrieverError(f"{search} is dense search (it ranks by vectors alone): it takes no mode={mode!r}")
    kwargs.pop("score_threshold", None)


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
        else:  # every other key is a metadata key, "$k" too: LangChain's filters have no other operators here
            translated[f"metadata.{key}"] = _condition(value)
    return translated


def _condition(condition: Any) -> Any:
    if not isinstance(condition, dict):
        return condition
    spelled: dict = {}
    for op, value in condition.items():
        if op == "$between":
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                raise RetrieverError(f"$between takes [low, high], got {value!r}")
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


def maximal_marginal_relevance(relevance: np.ndarray, vectors: np.ndarray, lambda_mult: float, k: int) -> list[int]:
    """Maximal marginal relevance (Carbonell and Goldstein, SIGIR 1998) over candidates of RELEVANCE (their scores
    for the query) and VECTORS: each next pick maximises LAMBDA_MULT x its relevance - (1 - LAMBDA_MULT) x its
    highest cosine to those picked; the positions of the K picked, in order. LangChain's own takes the query's
    cosine to each vector as relevance, which for a document scored from two passages is not the search's score."""
    vectors = l2_normalize(np.asarray(vectors, np.float32))
    chosen: list[int] = []
    for _ in range(min(k, len(relevance))):
        marginal = np.asarray(relevance, np.float32).copy()
        if chosen:  # the first pick is the most relevant; each later one is penalised for its likeness
            marginal = lambda_mult * marginal - (1 - lambda_mult) * (vectors @ vectors[chosen].T).max(axis=1)
        marginal[chosen] = -np.inf
        chosen.append(int(np.argmax(marginal)))
    return chosen
