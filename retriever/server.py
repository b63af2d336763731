"""`retriever serve`: the library's search and writes over HTTP (FastAPI + uvicorn), and the search page.

One process holds the model and the open indexes, so a query costs milliseconds instead of a CLI start-up:

- `OpenIndexes` opens each index once and, when a newer version has been committed (by the CLI, another
  process, or this server), opens that one for the requests that follow; a request holds the version it started
  with until it is answered, so every response comes from exactly one version (and says which).
- `SearchBatcher` answers searches on one thread: whatever queries have queued while it worked go through one
  encoder call (one per encoder), then one FAISS search per index version. Under load that is micro-batching for
  free; a lone query waits for nothing.
- Bad input is a JSON error with its status (400 bad value, 401/403 no key or a read-only one, 404 no such index
  or document, 409 an id already there, 413 too large, 421 a Host name not served, 422 malformed request, 503 a
  damaged index or a missing model: that index alone), never a traceback and never a server path; sizes, k and
  the results and bytes of one answer are bounded. One client's bad query never fails another's: queries are
  checked before they are batched, and a batch that fails anyway is retried query by query. Answers are
  rendered off the event loop. Writes take turns with every other writer of the index (the CLI's included), as
  `retriever add` does, and a committed write is reported as committed.
- `retriever.access` checks the Host header (DNS rebinding) and API keys before any of this runs.

Endpoints (the contract clients rely on; answers use `retriever.index.search_record` for each query, the same
JSON as `retriever search --json`): GET /health, GET /indexes, GET /indexes/{name},
GET /search?q=...&k=10&index=NAME&mode=hybrid, POST /search {"queries": [...], "k": 10, "index": NAME, "mode": ...},
GET|DELETE /indexes/{name}/documents/{doc_id},
POST /indexes/{name}/documents {"documents": [BEIR records], "upsert": false}.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import queue
import socket
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Union

import numpy as np

from retriever.access import AccessGuard, AccessPolicy
from retriever.corpus import documents_from_records
from retriever.errors import (
    NO_VALUE,
    ConflictError,
    DamagedIndexError,
    NotFoundError,
    RetrieverError,
    UnavailableError,
    param,
)
from retriever.filters import Filter, FilterError, parse_where
from retriever.metrics import RequestMetrics, ServerMetrics
from retriever.fusion import CANDIDATES
from retriever.index import Index, SearchHit, at_least, check_min_score, search_record
from retriever.text import check_queries, check_text
from retriever.runtimes import resolve_runtime
from retriever.shards import RayShards, ShardServer
from retriever.index_folder import check_name, describe_indexes, list_indexes, resolve_index_dir

try:
    from fastapi import Body, FastAPI, Query, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path
    from pydantic import BaseModel, Field, StrictInt, StrictStr
    from starlette.exceptions import HTTPException
except ImportError as error:  # a dependency of the package; a broken install should still say what to do
    raise UnavailableError(f"serving needs FastAPI, uvicorn and swagger-ui-bundle ({error}); reinstall: "
                           "pip install -e .") from None

log = logging.getLogger("retriever.server")

DOCS_ASSETS = "/docs-assets"  # Swagger UI's files, served from the swagger-ui-bundle package
MAX_K = 1000  # results per query
MAX_QUERIES = 256  # queries per POST /search
MAX_QUERY_CHARS = 10_000  # the encoder keeps at most max_length tokens anyway
MAX_DOCUMENTS = 10_000  # documents per POST /indexes/{name}/documents
MAX_BODY_BYTES = 16 * 2**20
MAX_BATCH_QUERIES = 64  # queries per encoder call in the batcher
MAX_HITS = 10_000  # results per request (queries x k)
MAX_ANSWER_CHARS = 32 * 2**20  # document text in one answer: a few huge documents x many queries stays bounded
STATIC = Path(__file__).with_name("static")
Space = Literal["calibrated", "raw"]
Mode = Literal["dense", "keyword", "hybrid"]
FusionName = Literal["rrf", "zscore", "null"]


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def status_of(error: RetrieverError) -> int:
    if isinstance(error, (DamagedIndexError, UnavailableError)):
        return 503  # the server's data or machine, not the client's request: the other indexes go on
    if isinstance(error, NotFoundError):
        return 404
    if isinstance(error, ConflictError):
        return 409
    if isinstance(error, FilterError):
        return 422  # a well-formed request whose filter cannot be compiled, like any other invalid field
    return 400


class OpenIndexes:
    """Each index opened once, swapped for its newer version when one is committed; one encoder per model.

    Requests hold the version they use (`using`); a replaced version is closed (its files, SQLite connections
    and mapped vectors released) once the last request holding it is answered, so write storms do not pile up
    open descriptors of pruned versions."""

    def __init__(self, index_dir: Path, device: str = "auto", runtime: str = "auto",
                 metrics: ServerMetrics | None = None, remote: RayShards | None = None):
        self.index_dir = index_dir
        self.device = device
        self.runtime = runtime
        self.metrics = metrics
        self.remote = remote  # a distributed server's shards: every version opened searches its vectors there
        self._held: dict[str, Index] = {}
        self._encoders: dict[str, object] = {}
        self._lock = threading.Lock()
        self._holders: dict[int, int] = {}  # id(index) -> requests using it
        self._retired: dict[int, Index] = {}  # replaced versions still in use, closed by their last holder

    def names(self) -> list[str]:
        return list_indexes(self.index_dir)

    def held(self, name: str) -> Index | None:
        """The open version of NAME if it is still the current one (one path resolution), else None."""
        held = self._held.get(check_name(name))
        return held if held is not None and str(held.folder) == os.path.realpath(self.index_dir / name) else None

    def get(self, name: str) -> Index:
        """The current version of NAME, opened now if a newer one was committed since it was last asked for."""
        held = self.held(name)
        if held is not None:
            return held
        with self._lock:  # one opener at a time; the others wait here for the same new version
            if self.held(name) is not None:  # opened by the thread that held the lock before
                return self._held[name]
            try:
                index = Index.open(name, self.index_dir, device=self.device)
            except NotFoundError:  # removed: forget the version held
                self._retire(self._held.pop(name, None))
                if self.metrics is not None:
                    self.metrics.forget(name)
                raise
            key = json.dumps(index.manifest.encoder, sort_keys=True)
            if key not in self._encoders:  # loads the model: once per model for the server's life
                try:
                    self._encoders[key] = index.load_encoder(self.runtime)
                except RetrieverError as error:  # this machine lacks the model: the server's problem, not the request's
                    index.close()
                    raise UnavailableError(str(error), parameter=error.parameter) from None
            index.use_encoder(self._encoders[key])
            if self.remote is not None:
                index.use_remote_segments(self.remote)
            previous = self._held.get(name)
            self._held[name] = index
            self._retire(previous)
            if self.metrics is not None:
                self.metrics.serving(name, index.folder.name, len(index))
            if previous is not None:
                log.info("index '%s': now serving version %s (was %s)", name, index.folder.name, previous.folder.name)
            return index

    def _retire(self, index: Index | None) -> None:
        """Close INDEX now if no request holds it, else when the last one lets go (called under the lock)."""
        if index is None:
            return
        if self._holders.get(id(index), 0) == 0:
            index.close()
        else:
            self._retired[id(index)] = index

    def _hold(self, index: Index) -> bool:
        with self._lock:
            if self._held.get(index.name) is not index and id(index) not in self._retired:
                return False  # replaced (and closed) between the look-up and now: look again
            self._holders[id(index)] = self._holders.get(id(index), 0) + 1
            return True

    def _release(self, index: Index) -> None:
        with self._lock:
            left = self._holders[id(index)] - 1
            if left:
                self._holders[id(index)] = left
                return
            del self._holders[id(index)]
            retired = self._retired.pop(id(index), None)
        if retired is not None:
            retired.close()

    @asynccontextmanager
    async def using(self, name: str | None):
        """NAME's current version (the only index when NAME is empty), held open until the block ends."""
        while True:
            index = await self.current(name)
            if self._hold(index):
                break
        try:
            yield index
        finally:
            self._release(index)

    async def current(self, name: str | None) -> Index:
        """NAME, current version; when none is named, the most recently written index (the CLI's rule for reading,
        `index_folder.pick_index`; the answer names it). An open, when one is needed, runs off the event loop so
        other requests go on meanwhile."""
        if not name:
            names = self.names()
            if not names:
                raise NotFoundError("no index is served yet; build one with: retriever build CORPUS")
            name = names[0]
        return self.held(name) or await run_in_threadpool(self.get, name)

    def close(self) -> None:
        with self._lock:
            for index in [*self._held.values(), *self._retired.values()]:
                index.close()
            self._held.clear()
            self._retired.clear()


@dataclass
class _Job:
    index: Index
    queries: list[str]
    k: int
    options: tuple  # nprobe, ef_search, rerank, mode (resolved), fusion, weight, the filter's key (or None)
    where: Filter | None = None  # the compiled filter the key stands for
    future: Future = field(default_factory=Future)
    raw: np.ndarray | None = None


class SearchBatcher:
    """Answers searches on one thread, batching every query that queued while the previous batch ran."""

    def __init__(self, max_queries: int = MAX_BATCH_QUERIES, metrics: ServerMetrics | None = None):
        self.max_queries = max_queries
        self.metrics = metrics
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="search-batcher", daemon=True)
        self._thread.start()
        self.batches = 0
        self.queries = 0

    def submit(self, index: Index, queries: list[str], k: int, options: tuple, where: Filter | None = None) -> Future:
        job = _Job(index, queries, k, options, where)
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            jobs, count = [job], len(job.queries)
            while count < self.max_queries:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)  # answer what was taken, then stop
                    break
                jobs.append(job)
                count += len(job.queries)
            self.batches += 1
            self.queries += count
            if self.metrics is not None:
                self.metrics.batch.observe(count)
            self._answer(jobs)

    def _answer(self, jobs: list[_Job]) -> None:
        by_encoder: dict[int, list[_Job]] = defaultdict(list)
        for job in jobs:
            by_encoder[id(job.index.encoder)].append(job)
        for group in by_encoder.values():
            self._encode_and_search(group)

    def _encode_and_search(self, group: list[_Job]) -> None:
        """One encoder call for the group (keyword searches need none), then one search per index version and
        settings; a failure of a group of several is retried job by job, so it reaches only the request that
        caused it."""
        encoded = [job for job in group if job.options[3] != "keyword"]
        try:
            raw = group[0].index.encoder.encode([text for job in encoded for text in job.queries]) if encoded else None
        except Exception as error:  # noqa: BLE001 - the thread lives on; only the guilty request gets the error
            if len(group) == 1:
                _fail(group, error)
            else:
                for job in group:
                    self._encode_and_search([job])
            return
        offset = 0
        for job in encoded:
            job.raw = raw[offset : offset + len(job.queries)]
            offset += len(job.queries)
        by_search: dict[tuple, list[_Job]] = defaultdict(list)
        for job in group:
            # A hybrid search's candidate lists grow with k (and its fusion reads them whole): only requests of one
            # list length share a search, so an answer never depends on what else was batched with it.
            depth = max(job.k, CANDIDATES) if job.options[3] == "hybrid" else 0
            by_search[(id(job.index), job.options, depth)].append(job)
        for same in by_search.values():
            try:
                self._search(same)
            except Exception as error:  # noqa: BLE001
                if len(same) == 1 or isinstance(error, UnavailableError):  # the server's failure: no request to blame
                    _fail(same, error)
                    continue
                for job in same:
                    try:
                        self._search([job])
                    except Exception as alone:  # noqa: BLE001
                        _fail([job], alone)

    @staticmethod
    def _search(jobs: list[_Job]) -> None:
        index = jobs[0].index
        k = max(job.k for job in jobs)
        nprobe, ef_search, rerank, mode, fusion, weight, _ = jobs[0].options
        texts = [text for job in jobs for text in job.queries]
        vectors = None if mode == "keyword" else index.calibrate(np.concatenate([job.raw for job in jobs]))
        hits = index.search_encoded(texts, vectors, k, mode, fusion, weight, nprobe, ef_search, rerank,
                                    where=jobs[0].where)
        offset = 0
        for job in jobs:
            job.future.set_result([found[: job.k] for found in hits[offset : offset + len(job.queries)]])
            offset += len(job.queries)


def _fail(jobs: list[_Job], error: Exception) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)


class QueryItem(BaseModel):
    id: Optional[StrictStr] = Field(None, description="echoed back as query_id")
    text: StrictStr


class SearchRequest(BaseModel):
    queries: list[Union[StrictStr, QueryItem]] = Field(..., description=f"at most {MAX_QUERIES}: texts, or "
                                                                       "{id, text}")
    k: StrictInt = Field(10, ge=1, le=MAX_K)  # strict: `true` is not a number of results
    index: Optional[StrictStr] = Field(None, description="the index's name (optional when there is only one)")
    space: Space = Field("calibrated", description="raw: rank by the uncalibrated vectors (exact), to compare")
    mode: Optional[Mode] = Field(None, description="dense, keyword (BM25) or hybrid (both, fused); default: hybrid "
                                                    "where the index has a keyword index, else dense")
    fusion: Optional[FusionName] = Field(None, description="hybrid: how the two rankings are fused")
    weight: Optional[float] = Field(None, ge=0.0, le=1.0, description="hybrid: the dense side's share")
    nprobe: Optional[StrictInt] = Field(None, ge=1)
    ef_search: Optional[StrictInt] = Field(None, ge=1)
    rerank: Optional[StrictInt] = Field(None, ge=1)
    min_score: Optional[float] = Field(None, ge=-1.0, le=1.0, description="leave out hits whose dense score "
                                       "(cosine) is below this: no good match, no hits")
    where: Optional[Union[dict, StrictStr]] = Field(None, description='only documents this filter selects, e.g. '
                                                    '{"year": {"$gte": 2020}} (see the README)')


class AddRequest(BaseModel):
    documents: list[dict] = Field(..., description=f"BEIR records: _id (or id), text, optional title; at most "
                                                   f"{MAX_DOCUMENTS}")
    upsert: bool = Field(False, description="replace documents whose ids are already in the index (else 409)")


class CreateRequest(BaseModel):
    name: StrictStr = Field(..., description="the new index's name")
    documents: list[dict] = Field(..., description=f"BEIR records: _id (or id), text, optional title; at most "
                                                   f"{MAX_DOCUMENTS} (add more with POST /indexes/NAME/documents)")
    calibrator: StrictStr = Field("auto", description="as `retriever build --calibrator`")
    index_type: StrictStr = Field("auto", description="as `retriever build --index-type`")
    replace: bool = Field(False, description="build over an index of that name (else 409); its current version "
                                             "is kept for `retriever rollback`")


def create_app(index_dir: str | Path | None = None, device: str = "auto", preload: bool = False,
               max_batch: int = MAX_BATCH_QUERIES, runtime: str = "auto",
               access: AccessPolicy | None = None, remote: RayShards | None = None) -> FastAPI:
    """The application: INDEX_DIR as `resolve_index_dir` finds it; PRELOAD opens every index (and loads its
    model) at start-up rather than on its first request; RUNTIME runs the encoder on PyTorch or ONNX Runtime
    (auto: ONNX Runtime on CPU when installed, `retriever.onnx_runtime`); ACCESS, the Host names answered and
    the API keys (default: loopback names, no key); REMOTE: the shards of a distributed server
    (`ray_application`), which then search every index's vectors."""
    resolve_runtime(runtime, "cpu")  # validates the name before anything loads
    metrics = ServerMetrics()
    indexes = OpenIndexes(resolve_index_dir(index_dir), device, runtime, metrics, remote)
    private = _private_paths(indexes.index_dir)
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["batcher"] = SearchBatcher(max_batch, metrics)
        metrics.start()
        if preload:
            for name in indexes.names():
                try:
                    opened = indexes.get(name)
                    log.info("index '%s': %s documents, version %s, encoder on %s", name,
                             f"{len(opened):,}", opened.folder.name, opened.encoder.runtime)
                except Exception as error:  # noqa: BLE001 - one bad index must not keep the others from being served
                    log.warning("index '%s' not served: %s", name, _one_line(error))
            log.info("serving %d indexes from %s", len(indexes.names()), indexes.index_dir)
        yield
        metrics.stop()
        state["batcher"].close()
        indexes.close()

    # The API docs from local assets: FastAPI's default /docs loads Swagger UI from a CDN, a blank page offline.
    app = FastAPI(title="retriever", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Search calibrated (BERT-flow) indexes; every answer names the index version it "
                              "comes from.")
    app.state.indexes = indexes
    app.state.server_state = state
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(AccessGuard, policy=access or AccessPolicy())  # before anything is read
    app.add_middleware(RequestMetrics, metrics=metrics)  # outermost: refusals are counted too

    def error(status: int, message: str, **fields) -> JSONResponse:
        return _error(status, _scrub(message, private), **fields)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, problem: ApiError):
        return error(problem.status, str(problem))

    @app.exception_handler(RetrieverError)
    async def retriever_error(request: Request, problem: RetrieverError):
        if isinstance(problem, DamagedIndexError):
            log.error("%s", problem)
        # Parameters spelled as in Python, which are the JSON fields' names (k, nprobe, index, ...).
        return error(status_of(problem), _as_json_reads_it(problem), code=problem.code, parameter=problem.parameter)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, problem: HTTPException):
        return error(problem.status_code, str(problem.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, problem: RequestValidationError):
        problems = problem.errors()
        if any(item.get("type") == "json_invalid" for item in problems):
            return error(400, "the request body is not valid JSON")
        return error(422, "; ".join(_describe(item) for item in problems[:3]))

    @app.exception_handler(OSError)
    async def storage_error(request: Request, problem: OSError):
        # The server's disk, not the request: full, read-only, or not ours to write.
        log.error("%s %s: %s", request.method, request.url.path, problem)
        reason = {errno.ENOSPC: "the disk is full", errno.EROFS: "the index folder is on a read-only file system",
                  errno.EACCES: "the server may not write the index folder",
                  errno.EPERM: "the server may not write the index folder"}.get(problem.errno)
        return error(503, f"{reason or 'a storage error'}; the index is unchanged")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, problem: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error(500, f"internal error ({type(problem).__name__}); the server log has the details")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title="retriever API",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        """Prometheus' text format (`retriever.metrics`); a read like any other under the API keys."""
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/health")
    async def health():
        return {"status": "ok"}  # open to anyone who can reach the server: says nothing about the indexes

    @app.get("/indexes")
    async def all_indexes():
        listed = await run_in_threadpool(describe_indexes, indexes.index_dir)  # `retriever list --json`'s records
        return {"indexes": [_public_record(record, private) for record in listed]}

    @app.get("/indexes/{name}")
    async def one_index(name: str):
        async with indexes.using(name) as index:
            shards = {} if indexes.remote is None else {"shards": indexes.remote.assignment(index)}
            return {**_describe_index(index), "segments": [entry.to_record() for entry in index.manifest.segments],
                    "search_settings": index.spec.search_settings(), "fit": index.manifest.fit, **shards}

    async def run_search(name: str | None, texts: list[str], ids: list[str | None], k: int, space: str,
                         options: tuple, mode: str | None, min_score: float | None = None,
                         where: dict | str | None = None) -> Response:
        check_search(texts, ids, k)
        where = parse_where(where)  # a bad filter is the request's error before anything is opened (422)
        async with indexes.using(name) as index:
            if index.raw_space(space, mode):
                mode = "dense"
                check_min_score(min_score, mode)
                hits = await run_in_threadpool(lambda: index.search(texts, k, space="raw", where=where))
            else:
                mode = index.resolve_mode(mode)
                check_min_score(min_score, mode)
                key = None
                if where is not None:
                    # Requests share a search only with the same filter (its canonical JSON). Its matches are found
                    # here, on a worker thread: the batcher's one thread then finds them remembered.
                    key = json.dumps(where.source, sort_keys=True)
                    await run_in_threadpool(index.matching, where)
                hits = await asyncio.wrap_future(state["batcher"].submit(index, texts, k, (*options[:3], mode,
                                                                                          *options[3:], key), where))
            hits = at_least(hits, min_score)
            # Rendered on a worker thread: a large answer must not stall every other request on the event loop.
            return await run_in_threadpool(render_answer, index, texts, ids, hits, k, space, mode)

    @app.get("/search")
    async def search_get(
        q: str = Query(..., description="the query text"),
        k: int = Query(10, ge=1, le=MAX_K),
        index: Optional[str] = Query(None, description="the index's name (optional when there is only one)"),
        space: Space = Query("calibrated", description="raw: the uncalibrated ranking, to compare"),
        mode: Optional[Mode] = Query(None, description="dense, keyword (BM25) or hybrid (both, fused); default: "
                                                       "hybrid where the index has a keyword index, else dense"),
        fusion: Optional[FusionName] = Query(None, description="hybrid: how the two rankings are fused"),
        weight: Optional[float] = Query(None, ge=0.0, le=1.0, description="hybrid: the dense side's share"),
        nprobe: Optional[int] = Query(None, ge=1),
        ef_search: Optional[int] = Query(None, ge=1),
        rerank: Optional[int] = Query(None, ge=1),
        min_score: Optional[float] = Query(None, ge=-1.0, le=1.0, description="leave out hits whose dense score "
                                           "(cosine) is below this: no good match, no hits"),
        where: Optional[str] = Query(None, description='a JSON filter, e.g. {"year": {"$gte": 2020}}'),
    ):
        return await run_search(index, [q], [None], k, space, (nprobe, ef_search, rerank, fusion, weight), mode,
                                min_score, where)

    @app.post("/search")
    async def search_post(request: SearchRequest):
        texts = [item if isinstance(item, str) else item.text for item in request.queries]
        ids = [None if isinstance(item, str) else item.id for item in request.queries]
        return await run_search(request.index, texts, ids, request.k, request.space,
                                (request.nprobe, request.ef_search, request.rerank, request.fusion, request.weight),
                                request.mode, request.min_score, request.where)

    @app.get("/indexes/{name}/documents/{doc_id:path}")
    async def get_document(name: str, doc_id: str):
        check_text(doc_id, "the document id")
        async with indexes.using(name) as index:
            document = await run_in_threadpool(index.document, doc_id)
            if document is None:
                raise NotFoundError(f"no document '{doc_id}' in index '{name}'")
            return await run_in_threadpool(render, {
                "index": name, "version": index.folder.name,
                "document": {key: document.get(key) for key in ("doc_id", "title", "text", "source", "line",
                                                                "metadata")}})

    @app.post("/indexes", status_code=201)
    async def create_index(request: CreateRequest = Body(...)):
        """Build an index from the documents in the request, with the default model, as `retriever build` does."""
        check_name(request.name)
        if len(request.documents) > MAX_DOCUMENTS:
            raise ApiError(413, f"{len(request.documents):,} documents in one request; at most {MAX_DOCUMENTS:,}: "
                                "create the index with some and add the rest")
        documents = await run_in_threadpool(documents_from_records, request.documents)
        summary = await run_in_threadpool(lambda: Index.build(
            documents, request.name, indexes.index_dir, calibrator=request.calibrator,
            index_type=request.index_type, device=indexes.device, replace=request.replace))
        return JSONResponse({"index": request.name, "version": Path(summary.folder).name,
                             "documents": summary.documents}, status_code=201)

    @app.post("/indexes/{name}/documents", status_code=201)
    async def add_documents(name: str, request: AddRequest = Body(...)):
        if len(request.documents) > MAX_DOCUMENTS:
            raise ApiError(413, f"{len(request.documents):,} documents in one request; at most {MAX_DOCUMENTS:,}")
        documents = await run_in_threadpool(documents_from_records, request.documents)
        async with indexes.using(name) as index:
            summary = await run_in_threadpool(lambda: index.add(documents, upsert=request.upsert))
        # The version the write committed, as written: nothing after the commit may turn it into a failure.
        return JSONResponse({"index": name, "version": Path(summary.folder).name, "added": summary.changed,
                             "documents": summary.documents}, status_code=201)

    @app.delete("/indexes/{name}/documents/{doc_id:path}")
    async def delete_document(name: str, doc_id: str):
        check_text(doc_id, "the document id")
        async with indexes.using(name) as index:
            summary = await run_in_threadpool(index.delete, [doc_id])
        return {"index": name, "version": Path(summary.folder).name, "deleted": summary.changed,
                "documents": summary.documents}

    return app


def check_search(texts: list[str], ids: list[str | None], k: int) -> None:
    """Every query of a request checked on its own, before it can join anyone else's batch."""
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
    check_queries(texts)


def render_answer(index: Index, texts: list[str], ids: list[str | None], hits: list[list[SearchHit]], k: int,
                  space: str, mode: str = "dense") -> Response:
    """The search answer as JSON bytes, refused (413) when the documents' text in it would exceed
    MAX_ANSWER_CHARS (a few very long documents times many queries)."""
    chars = sum(len(hit.text) + len(hit.title or "") for found in hits for hit in found)
    if chars > MAX_ANSWER_CHARS:
        raise ApiError(413, f"the answer would hold {chars / 2**20:.0f} M characters of document text; at most "
                            f"{MAX_ANSWER_CHARS // 2**20} M per request (lower k or send fewer queries at once)")
    return render({"index": index.name, "version": index.folder.name, "space": space, "mode": mode, "k": k,
                   "queries": [search_record(query_id, text, found, mode)
                               for query_id, text, found in zip(ids, texts, hits)]})


def render(payload: dict, status: int = 200) -> Response:
    """JSON bytes, built once (FastAPI's generic encoder would walk every hit again). Text stored before inputs
    were checked may hold lone surrogates: they go out as JSON \\uDXXX escapes instead of failing the answer."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")
    return Response(body, status_code=status, media_type="application/json")


def _as_json_reads_it(problem: RetrieverError) -> str:
    """PROBLEM's message for a client that sends JSON: a suggested setting spelled as the field to send
    ('"replace": true'), a parameter by its field name."""
    return "".join(part if isinstance(part, str) else part.name if part.value is NO_VALUE
                   else f'"{part.name}": {json.dumps(part.value)}' for part in problem.parts)


def _error(status: int, message: str, **fields) -> Response:
    """An error body: DETAIL, the message on one line; STATUS; and FIELDS (a RetrieverError's code, parameter)."""
    body = json.dumps({"detail": " ".join(message.split()), "status": status, **fields})  # ASCII: any text whole
    return Response(body, status_code=status, media_type="application/json")


def _describe(problem: dict) -> str:
    where = ".".join(str(part) for part in problem.get("loc", ()) if part not in ("body", "query"))
    return f"{where}: {problem.get('msg', 'invalid')}" if where else problem.get("msg", "invalid request")


def _describe_index(index: Index) -> dict:
    manifest = index.manifest
    return {"name": index.name, "version": index.folder.name, "documents": manifest.documents,
            "model": _public_model(manifest.encoder["model"]), "dim": manifest.dim,
            "calibrator": manifest.calibrator["name"], "index_type": manifest.index["type"],
            "created": manifest.created, "refitted": manifest.refitted}


def _public_model(model: str) -> str:
    """A model named by a local folder is shown by the folder's name: no server path in any answer."""
    return Path(model).name if os.path.isabs(model) else model


def _public_record(record: dict, private: tuple[str, ...]) -> dict:
    """A `describe_indexes` record without server paths: the version folder's name instead of its path."""
    public = {key: value for key, value in record.items() if key != "folder"}
    public["version"] = Path(record["folder"]).name
    if "model" in public:
        public["model"] = _public_model(public["model"])
    if "problem" in public:
        public["problem"] = _scrub(public["problem"], private)
    return public


def _private_paths(index_dir: Path) -> tuple[str, ...]:
    """Server paths that must not reach a client, longest first: the index home (as given and resolved) and the
    user's home folder."""
    paths = {str(index_dir), os.path.realpath(index_dir), str(Path.home())}
    return tuple(sorted((path for path in paths if len(path) > 1), key=len, reverse=True))


def _scrub(message: str, private: tuple[str, ...]) -> str:
    """MESSAGE with server paths replaced by what they are (the index home, ~)."""
    for path in private:
        message = message.replace(path, "~" if path == str(Path.home()) else "<index home>")
    return message


def _one_line(error: Exception) -> str:
    return str(error) if isinstance(error, RetrieverError) else f"{type(error).__name__}: {error}"


class BodyLimit:
    """Refuses request bodies over LIMIT bytes with 413, whether or not the client declared a length."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _error(413, f"request body over {self.limit // 2**20} MiB")(scope, receive, send)
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise HTTPException(413, f"request body over {self.limit // 2**20} MiB")
            return message

        return await self.app(scope, limited, send)


@contextmanager
def serving_in_thread(app: FastAPI, timeout: float = 60.0) -> Iterator[str]:
    """Run APP with uvicorn on a free 127.0.0.1 port in a background thread (tests, page screenshots, embedding
    in another program); yields the base URL and stops the server on exit."""
    import uvicorn

    from retriever.http_protocol import BoundedHttpProtocol

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=BoundedHttpProtocol))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RetrieverError("the server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        listener.close()


def ray_application(index_dir: str | Path | None, shards: int, replicas: int = 1, device: str = "cpu",
                    runtime: str = "auto", access: AccessPolicy | None = None, max_batch: int = MAX_BATCH_QUERIES,
                    cpus_per_replica: float = 0.5):
    """The distributed server as a Ray Serve application (`retriever.shards`): SHARDS shard deployments of REPLICAS
    replicas each, and the front (this module's app, one replica) whose vectors the shards search."""
    serve = import_serve()
    index_dir = str(resolve_index_dir(index_dir))
    if shards < 1:
        raise RetrieverError(f"{param('shards')} must be at least 1 (got {shards})", parameter="shards")
    if replicas < 1:
        raise RetrieverError(f"{param('replicas')} must be at least 1 (got {replicas})", parameter="replicas")
    shard_deployments = [
        serve.deployment(ShardServer, name=f"shard-{number}", num_replicas=replicas,
                         ray_actor_options={"num_cpus": cpus_per_replica}).bind(index_dir, number, shards, device)
        for number in range(shards)]

    @serve.deployment(name="front", num_replicas=1, ray_actor_options={"num_cpus": cpus_per_replica})
    @serve.ingress()
    class Front:
        def __init__(self, *handles):
            self.api = create_app(index_dir, device=device, preload=True, max_batch=max_batch, runtime=runtime,
                                  access=access, remote=RayShards(handles))

        def __serve_build_asgi_app__(self):
            return self.api

    return Front.bind(*shard_deployments)


def import_serve():
    """Ray Serve, or one line saying how to get it (an optional extra)."""
    try:
        from ray import serve
    except ImportError:
        raise RetrieverError(f"{param('engine', 'ray')} needs Ray Serve: pip install 'retriever[ray]' "
                             "(or 'ray[serve]')") from None
    return serve


def serve(index_dir: str | Path | None = None, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          max_batch: int = MAX_BATCH_QUERIES, access_log: bool = False, runtime: str = "auto",
          access: AccessPolicy | None = None, allow_without_key: bool = False, engine: str = "local",
          shards: int = 2, replicas: int = 1, ray_address: str | None = None) -> None:
    """Run the server until interrupted (the CLI's `retriever serve`). ACCESS: the Host names answered and the
    keys (default: `serving_hosts(host)`, no key); listening beyond loopback without a key is refused unless
    ALLOW_WITHOUT_KEY. ENGINE "ray": the distributed server (`ray_application`) on the Ray cluster at RAY_ADDRESS
    (default: a local one on 127.0.0.1), SHARDS shards of REPLICAS replicas each."""
    import uvicorn

    from retriever.access import check_exposure, serving_hosts
    from retriever.http_protocol import BoundedHttpProtocol

    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    access = access or AccessPolicy.create(serving_hosts(host))
    check_exposure(host, access, allow_without_key)
    if engine == "ray":
        serve_on_ray(index_dir, host, port, device, max_batch, runtime, access, shards, replicas, ray_address)
        return
    if engine != "local":
        raise RetrieverError(f"unknown {param('engine')} {engine!r}; known: local, ray", parameter="engine")
    app = create_app(index_dir, device=device, preload=True, max_batch=max_batch, runtime=runtime, access=access)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=access_log, http=BoundedHttpProtocol)


def serve_on_ray(index_dir: str | Path | None, host: str, port: int, device: str, max_batch: int, runtime: str,
                 access: AccessPolicy, shards: int, replicas: int, ray_address: str | None,
                 until: threading.Event | None = None) -> None:
    """`ray_application` on Ray Serve, HTTP on HOST:PORT, until interrupted (or UNTIL is set)."""
    from retriever.engines.ray_build import ray_cluster

    serve = import_serve()
    application = ray_application(index_dir, shards, replicas, "cpu" if device == "auto" else device, runtime,
                                  access, max_batch)
    with ray_cluster(ray_address):
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(application, name="retriever", route_prefix="/")
            log.info("serving on http://%s:%d with %d shards x %d replicas (Ray Serve)", host, port, shards, replicas)
            (until or threading.Event()).wait()
        except KeyboardInterrupt:
            pass
        finally:
            serve.shutdown()


__all__ = ["create_app", "serve", "serving_in_thread", "OpenIndexes", "SearchBatcher", "SearchHit"]
