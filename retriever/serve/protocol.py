"""The HTTP API's requests: their models, derived from the library's declarations, and the API's own bounds.

The search parameters are `retriever.search.options.SearchOptions`' fields: each becomes a field of the POST body
(`SearchRequest`, strict JSON types) and of the GET query (`SearchQuery`, parsed from strings), with its meaning,
its choices and its bounds from the field's metadata, so a parameter added to the library reaches the API, its
docs and its validation at once. What the API bounds further (results per query, queries per request, the size of
an answer) is declared here, under names of their own.
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, create_model

from retriever.search.options import SearchOptions
from retriever.search.results import HIT_PARTS
from retriever.text import check_queries, check_text

HTTP_MAX_K = 1000  # results per query over HTTP (the library allows `options.MAX_K`)
MAX_QUERIES = 256  # queries per POST /search
MAX_QUERY_CHARS = 10_000  # the encoder keeps at most max_length tokens anyway
MAX_DOCUMENTS = 10_000  # documents per POST /indexes/{name}/documents
MAX_BODY_BYTES = 16 * 2**20
MAX_HITS = 10_000  # results per request (queries x k)
MAX_ANSWER_CHARS = 32 * 2**20  # document text in one answer: a few huge documents x many queries stays bounded


class ApiError(Exception):
    """A request the API refuses with STATUS, for a reason that is the API's own (a bound), not the library's."""

    def __init__(self, status: int, message: str, parameter: str | None = None):
        super().__init__(message)
        self.status, self.parameter = status, parameter


def _search_fields(strict: bool) -> dict[str, Any]:
    """SearchOptions' fields as pydantic fields: STRICT for JSON (`true` is not a number of results), else as a
    query string's values are parsed."""
    found: dict[str, Any] = {}
    for spec in fields(SearchOptions):
        meta = spec.metadata
        kind = meta["kind"]
        if kind == "filter":
            annotation: Any = Union[dict, StrictStr] if strict else str
        elif "choices" in meta:
            annotation = Literal[tuple(meta["choices"])]
        else:
            annotation = {int: StrictInt if strict else int, float: float, bool: StrictBool if strict else bool,
                          str: StrictStr if strict else str}[kind]
        limits = {key: meta[key] for key in ("ge", "le") if key in meta}
        if spec.name == "k":
            limits["le"] = HTTP_MAX_K
        if kind is float:  # "nan" would be told it is not "less than or equal to 1"
            limits["allow_inf_nan"] = False
        default = spec.default if spec.default is not MISSING else ...
        if default is None:
            annotation = Optional[annotation]
        words = f"{meta['help']}; default: {meta['unset']}" if meta["unset"] else meta["help"]
        found[spec.name] = (annotation, Field(default, description=words, **limits))
    return found


# A field the API does not know is refused (422 naming it), never ignored: a misspelt filter (`wehre`) would
# otherwise answer unfiltered, a misspelt `upsrt` refuse as a conflict.
_STRICT = ConfigDict(extra="forbid")


class QueryItem(BaseModel):
    model_config = _STRICT
    id: Optional[StrictStr] = Field(None, description="echoed back as query_id")
    text: StrictStr


_INDEX = (Optional[StrictStr], Field(None, description="the index's name (optional when there is only one)"))
# What a hit carries over HTTP unless asked for more: where it matched (passage, span, page), its title, scores and
# metadata, and its text's length; not the whole text, which for a long document runs to tens of thousands of
# characters per hit (GET /indexes/{name}/documents/{id} gives it, as does include=text).
DEFAULT_INCLUDE = ("metadata",)
_INCLUDE_WORDS = (f"what each hit carries besides where it matched: any of {', '.join(HIT_PARTS)} (text: the whole "
                  "document's text)")
SearchRequest = create_model(
    "SearchRequest", __config__=_STRICT,
    queries=(list[Union[StrictStr, QueryItem]], Field(..., description=f"at most {MAX_QUERIES}: texts, or {{id, text}}")),
    index=_INDEX, include=(list[Literal[HIT_PARTS]], Field(list(DEFAULT_INCLUDE), description=_INCLUDE_WORDS)),
    **_search_fields(strict=True))
SearchQuery = create_model(
    "SearchQuery", __config__=_STRICT, q=(str, Field(..., description="the query text")),
    index=(Optional[str], _INDEX[1]),
    include=(str, Field(",".join(DEFAULT_INCLUDE), description=_INCLUDE_WORDS + ", comma-separated")),
    **_search_fields(strict=False))


def hit_parts(include: str | list[str]) -> tuple[str, ...]:
    """A request's INCLUDE as the parts each hit carries: a GET's comma-separated words checked here (a POST's
    list is checked by its model)."""
    if isinstance(include, list):
        return tuple(include)
    parts = tuple(part.strip() for part in include.split(",") if part.strip())
    unknown = [part for part in parts if part not in HIT_PARTS]
    if unknown:
        raise ApiError(422, f"include: unknown part '{unknown[0]}'; known: {', '.join(HIT_PARTS)}", "include")
    return parts


def search_options(request: BaseModel) -> SearchOptions:
    """The SearchOptions a SearchRequest or SearchQuery asks for (checked again by the library: one declaration)."""
    return SearchOptions(**{spec.name: getattr(request, spec.name) for spec in fields(SearchOptions)})


class AddRequest(BaseModel):
    model_config = _STRICT
    documents: list[dict] = Field(..., description=f"BEIR records: _id (or id), text, optional title; at most "
                                                   f"{MAX_DOCUMENTS}")
    upsert: StrictBool = Field(False, description="replace documents whose ids are already in the index (else 409)")


class CreateRequest(BaseModel):
    model_config = _STRICT
    name: StrictStr = Field(..., description="the new index's name")
    documents: list[dict] = Field(..., description=f"BEIR records: _id (or id), text, optional title; at most "
                                                   f"{MAX_DOCUMENTS} (add more with POST /indexes/NAME/documents)")
    calibrator: StrictStr = Field("auto", description="as `retriever build --calibrator`")
    index_type: StrictStr = Field("auto", description="as `retriever build --index-type`")
    replace: StrictBool = Field(False, description="build over an index of that name (else 409); its current version "
                                             "is kept for `retriever rollback`")


def check_answer_chars(chars: int, advice: str) -> None:
    """Refuse (413) an answer that would hold CHARS characters of document text, over MAX_ANSWER_CHARS (a few very
    long documents times many queries), saying what to do (ADVICE)."""
    if chars > MAX_ANSWER_CHARS:
        raise ApiError(413, f"the answer would hold {chars / 2**20:.0f} M characters of document text; at most "
                            f"{MAX_ANSWER_CHARS // 2**20} M per request ({advice})")


def check_search(texts: list[str], ids: list[str | None], k: int, field: str) -> None:
    """Every query of a request checked on its own, before it can join anyone else's batch; FIELD: the request's
    field that holds them (an answer names it as the parameter at fault)."""
    if len(texts) > MAX_QUERIES:
        raise ApiError(413, f"{len(texts)} queries in one request; at most {MAX_QUERIES}")
    if len(texts) * k > MAX_HITS:
        raise ApiError(422, f"{len(texts)} queries x k={k} asks for {len(texts) * k:,} results; at most "
                            f"{MAX_HITS:,} per request (lower k or split the queries)")
    for number, (text, query_id) in enumerate(zip(texts, ids), start=1):
        which = "the query" if len(texts) == 1 else f"query {number}"
        if len(text) > MAX_QUERY_CHARS:
            raise ApiError(413, f"{which} has {len(text):,} characters; at most {MAX_QUERY_CHARS:,}")
        check_text(text, which)
        if query_id is not None:
            check_text(query_id, f"the id of {which}")
    check_queries(texts, field)
