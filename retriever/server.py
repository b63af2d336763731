"""`retriever serve`: the library's search and writes over HTTP (FastAPI + uvicorn), and the search page.

One process holds the model and the open indexes, so a query costs milliseconds instead of a CLI start-up:

- `OpenIndexes` opens each index once and, when a newer version has been committed (by the CLI, another
  process, or this server), opens that one for the requests that follow; a request holds the version it started
  with until it is answered, so every response comes from exactly one version (and says which).
- `SearchBatcher` answers searches on one thread: whatever queries have queued while it worked go through one
  encoder call (one per encoder), then one FAISS search per index version. Under load that is micro-batching for
  free; a lone query waits for nothing.
- Bad input is a JSON error with its status (400 bad value, 404 no such index or document, 409 an id already
  there, 413 too large, 422 malformed request), never a traceback; sizes and k are bounded. Writes take turns
  with every other writer of the index (the CLI's included), as `retriever add` does.

Endpoints (the contract clients rely on; answers use `retriever.index.search_record` for each query, the same
JSON as `retriever search --json`): GET /health, GET /indexes, GET /indexes/{name},
GET /search?q=...&k=10&index=NAME, POST /search {"queries": [...], "k": 10, "index": NAME},
GET|DELETE /indexes/{name}/documents/{doc_id}, POST /indexes/{name}/documents {"documents": [BEIR records]}.
"""

from __future__ import annotations

import asyncio
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

from retriever.corpus import documents_from_records
from retriever.errors import ConflictError, NotFoundError, RetrieverError
from retriever.index import Index, SearchHit, search_record
from retriever.onnx_runtime import resolve_runtime
from retriever.index_folder import check_name, describe_indexes, list_indexes, resolve_index_dir

try:
    from fastapi import Body, FastAPI, Query, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse
    from pydantic import BaseModel, Field
    from starlette.exceptions import HTTPException
except ImportError as error:  # a dependency of the package; a broken install should still say what to do
    raise RetrieverError(f"serving needs FastAPI and uvicorn ({error}); reinstall: pip install -e .") from None

log = logging.getLogger("retriever.server")

MAX_K = 1000  # results per query
MAX_QUERIES = 256  # queries per POST /search
MAX_QUERY_CHARS = 10_000  # the encoder keeps at most max_length tokens anyway
MAX_DOCUMENTS = 10_000  # documents per POST /indexes/{name}/documents
MAX_BODY_BYTES = 16 * 2**20
MAX_BATCH_QUERIES = 64  # queries per encoder call in the batcher
STATIC = Path(__file__).with_name("static")
Space = Literal["calibrated", "raw"]


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def status_of(error: RetrieverError) -> int:
    if isinstance(error, NotFoundError):
        return 404
    if isinstance(error, ConflictError):
        return 409
    return 400


class OpenIndexes:
    """Each index opened once, swapped for its newer version when one is committed; one encoder per model."""

    def __init__(self, index_dir: Path, device: str = "auto", runtime: str = "auto"):
        self.index_dir = index_dir
        self.device = device
        self.runtime = runtime
        self._held: dict[str, Index] = {}
        self._encoders: dict[str, object] = {}
        self._lock = threading.Lock()

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
            held = self._held.get(name)
            try:
                index = Index.open(name, self.index_dir, device=self.device)
            except NotFoundError:  # removed: forget the version held
                self._held.pop(name, None)
                raise
            key = json.dumps(index.manifest["encoder"], sort_keys=True)
            if key in self._encoders:
                index._encoder = self._encoders[key]
            else:  # loads the model: once per model for the server's life
                try:
                    self._encoders[key] = index._encoder = index.load_encoder(self.runtime)
                except RetrieverError as error:  # this machine lacks the model: the server's problem, not the request's
                    raise ApiError(503, str(error)) from None
            self._held[name] = index
            if held is not None:
                log.info("index '%s': now serving version %s (was %s)", name, index.folder.name, held.folder.name)
            return index

    async def current(self, name: str | None) -> Index:
        """NAME (or the only index when none is named), current version; an open, when one is needed, runs off
        the event loop so other requests go on meanwhile."""
        if not name:
            names = self.names()
            if not names:
                raise NotFoundError(f"no index in {self.index_dir}; build one with: retriever build CORPUS")
            if len(names) > 1:
                raise ApiError(400, f"{len(names)} indexes ({', '.join(names)}); say which with index=NAME")
            name = names[0]
        return self.held(name) or await run_in_threadpool(self.get, name)


@dataclass
class _Job:
    index: Index
    queries: list[str]
    k: int
    options: tuple  # nprobe, ef_search, rerank
    future: Future = field(default_factory=Future)
    raw: np.ndarray | None = None


class SearchBatcher:
    """Answers searches on one thread, batching every query that queued while the previous batch ran."""

    def __init__(self, max_queries: int = MAX_BATCH_QUERIES):
        self.max_queries = max_queries
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="search-batcher", daemon=True)
        self._thread.start()
        self.batches = 0
        self.queries = 0

    def submit(self, index: Index, queries: list[str], k: int, options: tuple) -> Future:
        job = _Job(index, queries, k, options)
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
            self._answer(jobs)

    def _answer(self, jobs: list[_Job]) -> None:
        by_encoder: dict[int, list[_Job]] = defaultdict(list)
        for job in jobs:
            by_encoder[id(job.index.encoder)].append(job)
        for group in by_encoder.values():
            try:
                raw = group[0].index.encoder.encode([text for job in group for text in job.queries])
            except Exception as error:  # noqa: BLE001 - each waiting request gets the error, the thread lives on
                _fail(group, error)
                continue
            offset = 0
            for job in group:
                job.raw = raw[offset : offset + len(job.queries)]
                offset += len(job.queries)
            by_search: dict[tuple, list[_Job]] = defaultdict(list)
            for job in group:
                by_search[(id(job.index), job.options)].append(job)
            for same in by_search.values():
                try:
                    self._search(same)
                except Exception as error:  # noqa: BLE001
                    _fail(same, error)

    @staticmethod
    def _search(jobs: list[_Job]) -> None:
        index = jobs[0].index
        k = max(job.k for job in jobs)
        scores, ids = index.search_vectors(index.calibrate(np.concatenate([job.raw for job in jobs])), k,
                                           *jobs[0].options)
        hits = index.hits(scores, ids)
        offset = 0
        for job in jobs:
            job.future.set_result([found[: job.k] for found in hits[offset : offset + len(job.queries)]])
            offset += len(job.queries)


def _fail(jobs: list[_Job], error: Exception) -> None:
    for job in jobs:
        if not job.future.done():
            job.future.set_exception(error)


class QueryItem(BaseModel):
    id: Optional[str] = Field(None, description="echoed back as query_id")
    text: str


class SearchRequest(BaseModel):
    queries: list[Union[str, QueryItem]] = Field(..., description=f"at most {MAX_QUERIES}: texts, or {{id, text}}")
    k: int = Field(10, ge=1, le=MAX_K)
    index: Optional[str] = Field(None, description="the index's name (optional when there is only one)")
    space: Space = Field("calibrated", description="raw: rank by the uncalibrated vectors (exact), to compare")
    nprobe: Optional[int] = Field(None, ge=1)
    ef_search: Optional[int] = Field(None, ge=1)
    rerank: Optional[int] = Field(None, ge=1)


class AddRequest(BaseModel):
    documents: list[dict] = Field(..., description=f"BEIR records: _id (or id), text, optional title; at most "
                                                   f"{MAX_DOCUMENTS}")


def create_app(index_dir: str | Path | None = None, device: str = "auto", preload: bool = False,
               max_batch: int = MAX_BATCH_QUERIES, runtime: str = "auto") -> FastAPI:
    """The application: INDEX_DIR as `resolve_index_dir` finds it; PRELOAD opens every index (and loads its
    model) at start-up rather than on its first request; RUNTIME runs the encoder on PyTorch or ONNX Runtime
    (auto: ONNX Runtime on CPU when installed, `retriever.onnx_runtime`)."""
    resolve_runtime(runtime, "cpu")  # validates the name before anything loads
    indexes = OpenIndexes(resolve_index_dir(index_dir), device, runtime)
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["batcher"] = SearchBatcher(max_batch)
        if preload:
            for name in indexes.names():
                try:
                    opened = indexes.get(name)
                    log.info("index '%s': %s documents, version %s, encoder on %s", name,
                             f"{len(opened):,}", opened.folder.name, opened.encoder.runtime)
                except (RetrieverError, ApiError) as error:  # one bad index must not keep the others from being served
                    log.warning("index '%s' not served: %s", name, error)
            log.info("serving %d indexes from %s", len(indexes.names()), indexes.index_dir)
        yield
        state["batcher"].close()

    app = FastAPI(title="retriever", version="1", lifespan=lifespan,
                  description="Search calibrated (BERT-flow) indexes; every answer names the index version it "
                              "comes from.")
    app.state.indexes = indexes
    app.state.server_state = state
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return _error(error.status, str(error))

    @app.exception_handler(RetrieverError)
    async def retriever_error(request: Request, error: RetrieverError):
        return _error(status_of(error), str(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        return _error(error.status_code, str(error.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        problems = error.errors()
        if any(problem.get("type") == "json_invalid" for problem in problems):
            return _error(400, "the request body is not valid JSON")
        return _error(422, "; ".join(_describe(problem) for problem in problems[:3]))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error(500, f"internal error ({type(error).__name__}); the server log has the details")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/health")
    async def health():
        return {"status": "ok", "index_dir": str(indexes.index_dir), "indexes": len(indexes.names())}

    @app.get("/indexes")
    async def all_indexes():
        listed = describe_indexes(indexes.index_dir)  # what `retriever list --json` shows, plus the version
        return {"index_dir": str(indexes.index_dir),
                "indexes": [{**record, "version": Path(record["folder"]).name} for record in listed]}

    @app.get("/indexes/{name}")
    async def one_index(name: str):
        index = await indexes.current(name)
        return {**_describe_index(index), "segments": index.manifest["segments"],
                "search_settings": index.spec.search_settings(), "fit": index.manifest.get("fit")}

    async def run_search(index: Index, texts: list[str], ids: list[str | None], k: int, space: str,
                         options: tuple) -> JSONResponse:
        from retriever.index import check_queries

        if len(texts) > MAX_QUERIES:
            raise ApiError(413, f"{len(texts)} queries in one request; at most {MAX_QUERIES}")
        if any(len(text) > MAX_QUERY_CHARS for text in texts):
            raise ApiError(413, f"a query longer than {MAX_QUERY_CHARS:,} characters")
        check_queries(texts)
        if space == "raw":
            hits = await run_in_threadpool(lambda: index.search_raw(index.encoder.encode(texts), k))
        else:
            hits = await asyncio.wrap_future(state["batcher"].submit(index, texts, k, options))
        # A JSONResponse as is: FastAPI's generic encoder would walk every hit again to re-encode plain JSON.
        return JSONResponse({"index": index.name, "version": index.folder.name, "space": space, "k": k,
                             "queries": [search_record(query_id, text, found)
                                         for query_id, text, found in zip(ids, texts, hits)]})

    @app.get("/search")
    async def search_get(
        q: str = Query(..., description="the query text"),
        k: int = Query(10, ge=1, le=MAX_K),
        index: Optional[str] = Query(None, description="the index's name (optional when there is only one)"),
        space: Space = Query("calibrated", description="raw: the uncalibrated ranking, to compare"),
        nprobe: Optional[int] = Query(None, ge=1),
        ef_search: Optional[int] = Query(None, ge=1),
        rerank: Optional[int] = Query(None, ge=1),
    ):
        opened = await indexes.current(index)
        return await run_search(opened, [q], [None], k, space, (nprobe, ef_search, rerank))

    @app.post("/search")
    async def search_post(request: SearchRequest):
        opened = await indexes.current(request.index)
        texts = [item if isinstance(item, str) else item.text for item in request.queries]
        ids = [None if isinstance(item, str) else item.id for item in request.queries]
        return await run_search(opened, texts, ids, request.k, request.space,
                                (request.nprobe, request.ef_search, request.rerank))

    @app.get("/indexes/{name}/documents/{doc_id:path}")
    async def get_document(name: str, doc_id: str):
        index = await indexes.current(name)
        document = await run_in_threadpool(index.document, doc_id)
        if document is None:
            raise NotFoundError(f"no document '{doc_id}' in index '{name}'")
        return {"index": name, "version": index.folder.name,
                "document": {key: document.get(key) for key in ("doc_id", "title", "text", "source", "line")}}

    @app.post("/indexes/{name}/documents", status_code=201)
    async def add_documents(name: str, request: AddRequest = Body(...)):
        if len(request.documents) > MAX_DOCUMENTS:
            raise ApiError(413, f"{len(request.documents):,} documents in one request; at most {MAX_DOCUMENTS:,}")
        documents = documents_from_records(request.documents)
        index = await indexes.current(name)
        summary = await run_in_threadpool(index.add, documents)
        current = await run_in_threadpool(indexes.get, name)  # opened now: the writer reads its own write
        return {"index": name, "version": current.folder.name, "added": summary.changed,
                "documents": summary.documents}

    @app.delete("/indexes/{name}/documents/{doc_id:path}")
    async def delete_document(name: str, doc_id: str):
        index = await indexes.current(name)
        summary = await run_in_threadpool(index.delete, [doc_id])
        current = await run_in_threadpool(indexes.get, name)
        return {"index": name, "version": current.folder.name, "deleted": summary.changed,
                "documents": summary.documents}

    return app


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": " ".join(message.split()), "status": status}, status_code=status)


def _describe(problem: dict) -> str:
    where = ".".join(str(part) for part in problem.get("loc", ()) if part not in ("body", "query"))
    return f"{where}: {problem.get('msg', 'invalid')}" if where else problem.get("msg", "invalid request")


def _describe_index(index: Index) -> dict:
    manifest = index.manifest
    return {"name": index.name, "version": index.folder.name, "documents": manifest["documents"],
            "model": manifest["encoder"]["model"], "dim": manifest["dim"], "calibrator": manifest["calibrator"]["name"],
            "index_type": manifest["index"]["type"], "created": manifest["created"],
            "refitted": manifest.get("refitted"), "folder": str(index.folder)}


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

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
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


def serve(index_dir: str | Path | None = None, host: str = "127.0.0.1", port: int = 8000, device: str = "auto",
          max_batch: int = MAX_BATCH_QUERIES, access_log: bool = False, runtime: str = "auto") -> None:
    """Run the server until interrupted (the CLI's `retriever serve`)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    app = create_app(index_dir, device=device, preload=True, max_batch=max_batch, runtime=runtime)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=access_log)


__all__ = ["create_app", "serve", "serving_in_thread", "OpenIndexes", "SearchBatcher", "SearchHit"]
