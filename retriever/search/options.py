"""The search parameters, declared once: `SearchOptions`, typed and validated.

The library takes them (`Index.search(queries, options)` or the same names as keywords), the CLI builds them from
its flags and takes their help from here, the server derives its request models from their fields
(`retriever.serve.protocol`) and batches requests by them (`batch_key`), and the query plan reads them
(`retriever.search.plan`). Each field's metadata says what it means and what it accepts, so every shell words
it the same way. Light on purpose: the CLI imports this module for --help.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any

from retriever.defaults import DEFAULT_FUSION, DEFAULT_WEIGHT
from retriever.errors import RetrieverError, param
from retriever.filters import Filter, parse_where

MODES = ("dense", "keyword", "hybrid")
SPACES = ("calibrated", "raw")  # the index's own vectors, or the uncalibrated ones (to compare)
FUSIONS = ("null", "rrf", "zscore", "zscore-union")  # `retriever.search.fusion`'s registry (a test keeps the two equal)
# The most results a query gets: k x queries scores and ids are allocated before anything is found (a k of 10^9
# asked for 7.45 GiB). Ten thousand covers recall@1000 evaluation ten times over.
MAX_K = 10_000
# The widest search a query may ask for. nprobe and ef_search past it only overflow FAISS's integers (a traceback;
# an index has at most 8,192 buckets); rerank scores and ids k x rerank candidates per query, allocated up front
# (10^8 asked for 37 GiB).
MAX_WIDTH = 1_000_000
MAX_RERANK = 1_000
# Whether keyword search leaves out a query's stop words (hybrid search's fusion and weight: `retriever.defaults`).
DEFAULT_STOP_WORDS = False
# Each side's list in hybrid search: at least this many candidates, or k.
HYBRID_CANDIDATES = 100


def _option(default: Any, help: str, kind: type | str, unset: str | None = None, **accepts: Any):
    """A field of SearchOptions: its DEFAULT, what it means (HELP), its KIND (int, float, str, bool, or "filter"),
    what None means for it (UNSET) and what it ACCEPTS (ge, le, choices)."""
    return field(default=default, metadata={"help": help, "kind": kind, "unset": unset, **accepts})


@dataclass(frozen=True)
class SearchOptions:
    """How to search: every parameter of a search but the queries. Checked when made: a bad value is one
    RetrieverError naming the parameter, before anything is searched."""

    k: int = _option(10, "results per query", int, ge=1, le=MAX_K)
    mode: str | None = _option(None, "dense (the calibrated vectors), keyword (BM25) or hybrid (both, fused)", str,
                               "hybrid where the index has a keyword index, else dense", choices=MODES)
    fusion: str | None = _option(None, "hybrid: how the two rankings are fused", str, DEFAULT_FUSION, choices=FUSIONS)
    weight: float | None = _option(None, "hybrid: the dense side's share, 0 to 1", float,
                                   f"the index's own (`info` shows it and why; {DEFAULT_WEIGHT} unless its corpus's "
                                   "check moved it)",
                                   ge=0.0, le=1.0)
    where: Filter | None = _option(
        None, 'only documents this filter selects, e.g. {"year": {"$gte": 2020}} (equality, $ne, $in, $nin, $all, '
        "$gt, $gte, $lt, $lte, $exists, $size, $and, $or on metadata paths such as tags or origin.site, a list "
        "matching by any element, and on doc_id, title, source, text); a filter that selects at least k documents "
        "always gets k hits (in keyword search, k of those holding a query word)", "filter", "none: every document")
    min_score: float | None = _option(
        None, "leave out hits whose dense score (cosine) is below this: a query with no good match gets none "
        "(hybrid hits are held to their dense side; keyword search has no dense score)", float, "none",
        ge=-1.0, le=1.0)
    space: str = _option("calibrated", "raw: rank by the uncalibrated vectors (exact, dense only), to compare with "
                         "the calibrated ranking", str, choices=SPACES)
    stop_words: bool | None = _option(None, "keyword search leaves out a query's English stop words when it has "
                                      "other words", bool, str(DEFAULT_STOP_WORDS).lower())
    nprobe: int | None = _option(None, "ivf/ivfpq: buckets scanned per query", int,
                                 "the index's, set for recall@10 >= 0.95", ge=1, le=MAX_WIDTH)
    ef_search: int | None = _option(None, "hnsw: candidates kept per query", int, "the index's", ge=1,
                                    le=MAX_WIDTH)
    rerank: int | None = _option(None, "ivfpq: re-score k x this many candidates exactly", int, "the index's", ge=1,
                                 le=MAX_RERANK)

    def __post_init__(self) -> None:
        for spec in fields(self):
            value, meta = getattr(self, spec.name), spec.metadata
            if value is None and spec.default is not None:
                raise RetrieverError(f"{param(spec.name)} must be given (it has no unset value)")
            if value is None or meta["kind"] == "filter":
                continue
            if meta["kind"] in (int, float, bool):
                if not _of_kind(value, meta["kind"]):
                    raise RetrieverError(f"{param(spec.name)} must be {_KIND_WORDS[meta['kind']]} (got {value!r})")
                object.__setattr__(self, spec.name, meta["kind"](value))  # a NumPy number, a float given as 1
            if "choices" in meta and value not in meta["choices"]:
                raise RetrieverError(f"unknown {param(spec.name)} {value!r}; known: {', '.join(meta['choices'])}")
        if self.k < 1:
            got = f" (got {self.k})" if self.k > -10**18 else ""  # a number too long to print is not shown
            raise RetrieverError(f"{param('k')} must be at least 1{got}")
        if self.k > MAX_K:
            got = f" (got {self.k:,})" if self.k < 10**18 else ""
            raise RetrieverError(f"{param('k')} is at most {MAX_K:,}{got}")
        if self.weight is not None and not 0.0 <= self.weight <= 1.0:
            raise RetrieverError(f"{param('weight')} is the dense side's share, from 0 to 1 (got {self.weight})")
        if self.min_score is not None and not -1.0 <= self.min_score <= 1.0:
            raise RetrieverError(f"{param('min_score')} is a cosine: between -1 and 1 (got {self.min_score})")
        for name in ("nprobe", "ef_search", "rerank"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise RetrieverError(f"{param(name)} must be at least 1 (got {value})")
            if value is not None and value > described(name)["le"]:  # not shown: it may be too long to print
                raise RetrieverError(f"{param(name)} is at most {described(name)['le']:,}")
        if self.space == "raw" and self.mode not in (None, "dense"):
            raise RetrieverError(f"{param('space', 'raw')} ranks by the uncalibrated vectors: it goes with "
                                 f"{param('mode', 'dense')} only")
        if self.mode == "keyword" and self.min_score is not None:
            raise _keyword_min_score()
        if self.mode in ("dense", "keyword") and (self.fusion is not None or self.weight is not None):
            given = param("fusion") if self.fusion is not None else param("weight")
            raise RetrieverError(f"{given} says how hybrid search fuses its two sides; {param('mode', self.mode)} "
                                 "searches one side: leave it out, or search in hybrid mode")
        object.__setattr__(self, "where", parse_where(self.where))  # a JSON text or object, compiled

    @classmethod
    def of(cls, options: SearchOptions | None = None, **settings: Any) -> SearchOptions:
        """OPTIONS with SETTINGS (SearchOptions' field names) over them; SETTINGS alone make new options. A name
        that is not a search parameter is refused."""
        unknown = sorted(set(settings) - {spec.name for spec in fields(cls)})
        if unknown:
            raise RetrieverError(f"unknown search parameter {param(unknown[0])}; known: "
                                 f"{', '.join(spec.name for spec in fields(cls))}")
        return replace(options, **settings) if options is not None else cls(**settings)

    def resolved(self, index: str, has_keywords: bool, hybrid: dict | None = None) -> SearchOptions:
        """These options for index INDEX: the mode it searches in (dense for the raw space; unset: hybrid where
        HAS_KEYWORDS, else dense), refused where it needs the keyword index the index lacks; for hybrid search,
        the fusion and weight the index records (HYBRID, `Manifest.hybrid`) where these options leave them unset."""
        if self.space == "raw":
            return self if self.mode == "dense" else replace(self, mode="dense", fusion=None, weight=None)
        mode = self.mode or ("hybrid" if has_keywords else "dense")
        if mode == "dense" and self.mode is None:  # the index searches one side: hybrid's settings have no use
            return replace(self, mode=mode, fusion=None, weight=None)
        if mode != "dense" and not has_keywords:
            raise RetrieverError(f"index '{index}' has no keyword index this release reads (it was written before "
                                 f"keyword search, or before documents were scored whole): compacting it adds one, "
                                 f"or search with {param('mode', 'dense')}")
        if mode == "keyword" and self.min_score is not None:
            raise _keyword_min_score()
        if mode == "hybrid" and hybrid is not None and (self.fusion is None or self.weight is None):
            return replace(self, mode=mode, fusion=self.fusion or hybrid["fusion"],
                           weight=float(hybrid["weight"]) if self.weight is None else self.weight)
        return self if mode == self.mode else replace(self, mode=mode)

    @property
    def depth(self) -> int:
        """How long each side's list is: k, or for hybrid search at least HYBRID_CANDIDATES (its fusion reads the
        lists whole, so an answer depends on their length, never on k alone)."""
        return max(self.k, HYBRID_CANDIDATES) if self.mode == "hybrid" else self.k

    def batch_key(self) -> SearchOptions:
        """What requests share one search by (a server's batch): these options, resolved for the index, without
        a dense search's min_score, which each request applies to the shared answer (`results.cut`: the first k of
        a dense list held to a floor are the k best that reach it); a hybrid search keeps it, since its fusion
        takes the k best of the candidates that reach it. k stays: the lists a search reads depend on it (an hnsw
        beam of at least k, k x rerank compressed candidates, a filter's plan, hybrid lists of at least k), so an
        answer never depends on what else was batched with it."""
        return self if self.mode == "hybrid" else replace(self, min_score=None)

    @property
    def fusion_name(self) -> str:
        return self.fusion or DEFAULT_FUSION

    @property
    def dense_weight(self) -> float:
        return DEFAULT_WEIGHT if self.weight is None else float(self.weight)

    @property
    def drops_stop_words(self) -> bool:
        return DEFAULT_STOP_WORDS if self.stop_words is None else self.stop_words


_KIND_WORDS = {int: "a whole number", float: "a number", bool: "true or false"}


def _of_kind(value: Any, kind: type) -> bool:
    if type(value).__name__ in ("bool", "bool_"):  # NumPy's bool too, without importing NumPy (--help)
        return kind is bool
    if kind is int:
        return isinstance(value, numbers.Integral)
    return kind is float and isinstance(value, numbers.Real)


def _keyword_min_score() -> RetrieverError:
    return RetrieverError(f"{param('min_score')} holds hits to their dense score (a cosine); keyword search has "
                          f"none: search with {param('mode', 'dense')} or {param('mode', 'hybrid')}")


def described(name: str) -> dict:
    """What the search parameter NAME is, for a shell's help (the CLI's --help, the API's docs): help (what it
    means), kind, unset (what None means for it: its default in words), and ge, le or choices where it has them."""
    return dict(next(spec.metadata for spec in fields(SearchOptions) if spec.name == name))
