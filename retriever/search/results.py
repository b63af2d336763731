"""Search results: a ranked row id (`Ranked`), a hit with its document (`SearchHit`), and the one JSON shape of a
query's results (`search_record`) that `retriever search --json` and the server both give."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from retriever.files.folder import page_of
from retriever.search.options import SearchOptions
from retriever.versions.snapshot import Snapshot


@dataclass
class Ranked:
    """A ranked row id before its document is read: the fields of a SearchHit."""

    rowid: int
    score: float
    dense_score: float | None = None
    keyword_score: float | None = None
    dense_rank: int | None = None
    keyword_rank: int | None = None
    passage: int = -1  # the vector key of its best passage (-1: not known, or the document is one passage)


# What a hit may carry beyond where it matched, which a caller may leave out (`search_record`): the whole text of a
# long document runs to tens of thousands of characters.
HIT_PARTS = ("text", "metadata")


@dataclass
class SearchHit:
    """One result. SCORE is what the search mode ranked by (the fused score in hybrid search); DENSE_SCORE (cosine
    in the index's space) and KEYWORD_SCORE (BM25) are each side's own score where that side was searched, and
    DENSE_RANK / KEYWORD_RANK the result's 1-based rank in that side's own top list (None: not in it). PASSAGE is
    where the document matched, its best passage's text (the whole text where the document is one passage), and
    SPAN that passage's (start, end) character offsets in TEXT."""

    rank: int
    doc_id: str
    score: float
    title: str | None
    text: str = field(repr=False)  # a long document's whole text: a hit's repr shows where it matched instead
    dense_score: float | None = None
    keyword_score: float | None = None
    dense_rank: int | None = None
    keyword_rank: int | None = None
    metadata: dict | None = None
    passage: str = ""
    span: tuple[int, int] = (0, 0)

    @property
    def page(self) -> int | None:
        """The page the matching passage starts on, where the document records its pages (a PDF read from a
        folder: `retriever.files.folder`); None elsewhere."""
        return page_of(self.metadata, self.span[0])


def ranked_hits(snapshot: Snapshot, found: list[list[Ranked]]) -> list[list[SearchHit]]:
    """SearchHits with their documents and best passages (read from SNAPSHOT) for each query's ranked row ids."""
    ranked = [r for query in found for r in query]
    rows = snapshot.rows(np.array([r.rowid for r in ranked], dtype=np.int64))
    hits = []
    for query in found:
        spans = snapshot.spans(np.array([r.rowid for r in query], np.int64), np.array([r.passage for r in query], np.int64))
        listed = []
        for rank, r in enumerate(query, start=1):
            row = rows[r.rowid]
            start, end = spans[r.rowid] or (0, len(row["text"]))
            listed.append(SearchHit(rank, row["doc_id"], r.score, row["title"], row["text"], r.dense_score,
                                    r.keyword_score, r.dense_rank, r.keyword_rank, row["metadata"],
                                    row["text"][start:end], (start, end)))
        hits.append(listed)
    return hits


def dense_hits(snapshot: Snapshot, scores: np.ndarray, ids: np.ndarray,
               keys: np.ndarray | None = None) -> list[list[SearchHit]]:
    """SearchHits for a dense search's scores and row ids, with their best passages' KEYS (padding ids, -1, end a
    query's list)."""
    keys = np.full(ids.shape, -1, np.int64) if keys is None else keys
    found = []
    for query_scores, query_ids, query_keys in zip(scores, ids, keys):
        ranked = []
        for score, rowid, key in zip(query_scores.tolist(), query_ids.tolist(), query_keys.tolist()):
            if rowid < 0:
                break
            ranked.append(Ranked(rowid, score, dense_score=score, dense_rank=len(ranked) + 1, passage=key))
        found.append(ranked)
    return ranked_hits(snapshot, found)


def at_least(found: list[list[SearchHit]], min_score: float | None) -> list[list[SearchHit]]:
    """FOUND without the hits whose dense score (cosine in the space searched) is below MIN_SCORE: "no good match"
    is an empty list. Hybrid hits are held to their dense side: the fused score has no fixed scale."""
    if min_score is None:
        return found
    return [[replace(hit, rank=rank) for rank, hit in enumerate(
        (hit for hit in hits if hit.dense_score is not None and hit.dense_score >= min_score), start=1)]
        for hits in found]


def cut(found: list[list[SearchHit]], options: SearchOptions) -> list[list[SearchHit]]:
    """What OPTIONS ask of a search's answer: its first k hits, held to min_score (a batch searched with the
    largest k of its requests hands each request its own)."""
    return at_least([hits[: options.k] for hits in found], options.min_score)


def search_record(query_id: str | None, query: str, hits: Sequence[SearchHit], mode: str | None = None,
                  include: Collection[str] = HIT_PARTS) -> dict:
    """The one JSON shape of a query's results, for `retriever search --json` (one line per query) and the
    server: {"query_id", "query", "mode", "results": [{"rank", "doc_id", "score", "dense_score", "keyword_score",
    "dense_rank", "keyword_rank", "title", "text", "metadata", "passage", "span", "page", "length"}]}; a side that was
    not searched has null scores and ranks, a document without metadata null metadata; "passage" is where the
    document matched (its best passage's text), "span" its [start, end] in "text", "page" the page it starts on
    (null where the document records no pages) and "length" the text's length in characters. INCLUDE: which of
    HIT_PARTS ("text", the whole document's text, and "metadata") the results carry; the others are left out."""
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(float(value), 6) + 0.0  # + 0.0: never -0.0
    dropped = [part for part in HIT_PARTS if part not in include]
    results = []
    for h in hits:
        result = {"rank": h.rank, "doc_id": h.doc_id, "score": rounded(h.score), "dense_score": rounded(h.dense_score),
                  "keyword_score": rounded(h.keyword_score), "dense_rank": h.dense_rank,
                  "keyword_rank": h.keyword_rank, "title": h.title, "text": h.text, "metadata": h.metadata,
                  "passage": h.passage, "span": list(h.span), "page": h.page, "length": len(h.text)}
        for part in dropped:
            del result[part]
        results.append(result)
    return {"query_id": query_id, "query": query, "mode": mode, "results": results}
