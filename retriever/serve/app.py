"""`retriever serve`: the library's search and writes over HTTP (FastAPI + uvicorn), and the search page.

One process holds the model and the open indexes, so a query costs milliseconds instead of a CLI start-up:

- `OpenIndexes` (`retriever.serve.open_indexes`) opens each index once and, when a newer version has been
  committed (by the CLI, another process, or this server), opens that one for the requests that follow; a request
  holds the version it started with until it is answered, so every response comes from exactly one version (and
  says which, by number).
- `SearchBatcher` (`retriever.serve.batcher`) answers searches on one thread: whatever queries have queued while
  it worked go through one encoder call (one per encoder), then one search per index version and options.
- The requests are `retriever.serve.protocol`'s models, derived from the library's `SearchOptions`.
- Bad input is a JSON error with its status (400 bad value, 401/403 no key or a read-only one, 404 no such index
  or document, 409 an id or a name already there or being made, 413 too large, 421 a Host name not served, 422
  malformed request, 503 a damaged index, a missing model or a full or read-only disk), never a traceback and
  never a server path; sizes, k and the results and bytes of one answer are bounded. A bug is a 500 whose
  traceback goes to the server's log. Answers are rendered off the event loop. Writes take turns with every
  other writer of the index (the CLI's included), as `retriever add` does, and a committed write is reported as
  committed.
- `retriever.serve.access` checks the Host header (DNS rebinding) and API keys before any of this runs.

Endpoints (the contract clients rely on; answers use `retriever.search.results.search_record` for each query, the
same JSON as `retriever search --json`): GET /health, GET /indexes, GET /indexes/{name},
GET /search?q=...&k=10&index=NAME&mode=hybrid, POST /search {"queries": [...], "k": 10, "index": NAME, "mode": ...},
GET|DELETE /indexes/{name}/documents/{doc_id},
POST /indexes/{name}/documents {"documents": [BEIR records], "upsert": false}.
"""

from __future__ import annotations

import errno
import json
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote_to_bytes

from retriever.corpus import documents_from_records
from retriever.errors import (ConflictError, DamagedIndexError, NotFoundError, RetrieverError,
                              UnavailableError, param)
from retriever.filters import FilterError, filter_notes
from retriever.index import Index
from retriever.search.fusion import score_meaning
from retriever.search.options import SearchOptions
from retriever.search.results import SearchHit, search_record
from retriever.serve.access import MCP_PATH, AccessGuard, AccessPolicy
from retriever.serve.batcher import MAX_BATCH_QUERIES, SearchBatcher
from retriever.serve.metrics import RequestMetrics, ServerMetrics
from retriever.serve.open_indexes import OpenIndexes, Served
from retriever.serve.searching import search_and_answer
from retriever.serve.mcp_tools import Catalog, create_mcp_server, http_endpoint
from retriever.serve.public import (PUBLIC_OWN_FIELDS, as_json_reads_it, describe_invalid, private_paths,
                                    public_fields, public_metadata, public_model, public_record, public_source, scrub,
                                    without_folder)
from retriever.serve.protocol import (
    MAX_BODY_BYTES,
    MAX_DOCUMENTS,
    AddRequest,
    ApiError,
    CreateRequest,
    SearchQuery,
    SearchRequest,
    check_answer_chars,
    check_search,
    hit_parts,
    search_options,
)
from retriever.encode.runtimes import resolve_runtime
from retriever.search.dense import RemoteSegments
from retriever.text import check_text, unique_keys
from retriever.versions.catalog import calibrator_label, describe_indexes
from retriever.versions.folder import sweep_leftovers
from retriever.versions.home import check_name, resolve_index_dir

try:
    import fastapi_offline
    from fastapi import Body, Depends, FastAPI, Query, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.exceptions import RequestValidationError
    from fastapi.routing import APIRoute
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from starlette.convertors import PathConvertor, register_url_convertor
    from starlette.exceptions import HTTPException
    from starlette.routing import Route
except ImportError as error:  # a dependency of the package; a broken install should still say what to do
    raise UnavailableError(f"serving needs FastAPI, uvicorn and fastapi-offline ({error}); reinstall: "
                           "pip install -e .") from None

log = logging.getLogger("retriever.serve")


class DocumentIdConvertor(PathConvertor):
    """A document id in a URL path: any text, line breaks too (Starlette's `path` stops at one, and a route's `$`
    matches before a final one: `tail%0A` reached document `tail`)."""

    regex = r"[\s\S]*"


register_url_convertor("document_id", DocumentIdConvertor())

DOCS_ASSETS = "/docs-assets"  # Swagger UI's files, served from the fastapi-offline package (`_docs_assets`)
STATIC = Path(__file__).with_name("static")
DOCS_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")


def _docs_assets() -> Path:
    """The folder of Swagger UI's files that /docs loads (DOCS_FILES): fastapi-offline's copy of Swagger UI 5, which
    reads the OpenAPI 3.1 that FastAPI writes (Swagger UI 4, as swagger-ui-bundle 1.1 shipped it, showed "Unable to
    render this definition" and no operation). fastapi-offline keeps them in its package's static/ folder."""
    folder = Path(fastapi_offline.__file__).with_name("static")
    missing = [name for name in DOCS_FILES if not (folder / name).is_file()]
    if missing:
        raise UnavailableError(f"the API docs' files {missing} are not in {folder}; reinstall: pip install -e .")
    return folder


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


def create_app(index_dir: str | Path | None = None, device: str = "auto", preload: bool = False,
               max_batch: int = MAX_BATCH_QUERIES, runtime: str = "auto",
               access: AccessPolicy | None = None, remote: RemoteSegments | None = None) -> FastAPI:
    """The application: INDEX_DIR as `resolve_index_dir` finds it; PRELOAD opens every index (and loads its
    model) at start-up rather than on its first request; RUNTIME runs the encoder on PyTorch or ONNX Runtime
    (auto: ONNX Runtime on CPU when installed, `retriever.encode.onnx_runtime`); ACCESS, the Host names answered and
    the API keys (default: loopback names, no key); REMOTE: the shards of a distributed server
    (`retriever.serve.run.ray_application`), which then search every index's vectors."""
    resolve_runtime(runtime, "cpu")  # validates the name before anything loads
    metrics = ServerMetrics()
    indexes = OpenIndexes(resolve_index_dir(index_dir), device, runtime, metrics, remote)
    private = private_paths(indexes.index_dir)
    state: dict = {}
    creating: set[str] = set()  # names a request is building now

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # What killed writers left is tidied here and by writes; answering a request never deletes a file.
        sweep_leftovers(indexes.index_dir)
        state["batcher"] = SearchBatcher(max_batch, metrics)
        state["catalog"] = Catalog(indexes, state["batcher"], private)
        metrics.start()
        if preload:
            for name in indexes.names():
                try:
                    opened = indexes.get(name)
                    log.info("index '%s': %s documents, version %d, encoder on %s", name, f"{len(opened.index):,}",
                             opened.snapshot.manifest.version, opened.encoder.runtime)
                except Exception as error:  # noqa: BLE001 - one bad index must not keep the others from being served
                    log.warning("index '%s' not served: %s", name, _one_line(error),
                                exc_info=None if isinstance(error, RetrieverError) else error)  # a bug: its traceback
            served = len(indexes.names())
            log.info("serving %d %s from %s", served, "index" if served == 1 else "indexes", indexes.index_dir)
        async with agent_sessions.run():
            yield
        metrics.stop()
        state["batcher"].close()
        indexes.close()

    # The API docs from local assets: FastAPI's default /docs loads Swagger UI from a CDN, a blank page offline.
    app = FastAPI(title="retriever", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  dependencies=[Depends(refuse_unknown_query)],
                  description="Search calibrated (BERT-flow) indexes; every answer names the index version it "
                              "comes from.")
    app.router.route_class = UniqueKeysRoute
    app.state.indexes = indexes
    app.state.server_state = state
    app.add_middleware(QueryText)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    app.add_middleware(AccessGuard, policy=access or AccessPolicy())  # before anything is read
    app.add_middleware(RequestMetrics, metrics=metrics)  # outermost: refusals are counted too

    def error(status: int, message: str, **fields) -> JSONResponse:
        return _error(status, scrub(message, private), **fields)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, problem: ApiError):
        fields = {"code": "bad_input", "parameter": problem.parameter} if problem.status in (400, 422) else {}
        return error(problem.status, str(problem), **fields)

    @app.exception_handler(RetrieverError)
    async def retriever_error(request: Request, problem: RetrieverError):
        if isinstance(problem, DamagedIndexError):  # with what the parser said, where there is a cause
            log.error("%s", problem, exc_info=problem if problem.__cause__ is not None else None)
        # Parameters spelled as in Python, which are the JSON fields' names (k, nprobe, index, ...).
        return error(status_of(problem), as_json_reads_it(problem), code=problem.code, parameter=problem.parameter)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, problem: HTTPException):
        if problem.status_code == 400 and problem.detail == "There was an error parsing the body":
            # FastAPI's words where the body does not decode (not UTF-8) or its parser gives up (nested too deep,
            # a number too long): say what the body must be, as for any body that is not JSON.
            return error(400, "the request body is not valid JSON: not UTF-8 text, nested too deeply, or holding "
                              "a number too long to read", code="bad_input", parameter=None)
        return error(problem.status_code, str(problem.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, problem: RequestValidationError):
        problems = problem.errors()
        invalid = [item for item in problems if item.get("type") == "json_invalid"]
        if invalid:
            reason = (invalid[0].get("ctx") or {}).get("error", "")
            return error(400, "the request body is not valid JSON" + (f": {reason}" if "given twice" in reason else ""),
                         code="bad_input", parameter=None)
        if problems and tuple(problems[0].get("loc", ())) == ("body",) and "json" not in request.headers.get(
                "content-type", ""):  # a body sent as a form or as text: say what the API reads
            return error(400, "the request body is JSON: send it with the header content-type: application/json",
                         code="bad_input", parameter=None)
        # The shape of every other error: a code, and the field at fault (the first one's top-level name).
        fields = [str(part) for part in problems[0].get("loc", ()) if part not in ("body", "query")] if problems else []
        return error(422, "; ".join(describe_invalid(item) for item in problems[:3]), code="bad_input",
                     parameter=fields[0] if fields else None)

    @app.exception_handler(OSError)
    async def storage_error(request: Request, problem: OSError):
        # The server's disk, not the request: full, read-only, or not ours to write.
        log.error("%s %s: %s", request.method, request.url.path, problem)
        reason = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
                  errno.EROFS: "the index folder is on a read-only file system",
                  errno.EACCES: "the server may not write the index folder",
                  errno.EPERM: "the server may not write the index folder"}.get(problem.errno)
        return error(503, f"{reason or 'a storage error'}; the index is unchanged", code=UnavailableError.code,
                     parameter=None)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, problem: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=problem)
        return error(500, f"internal error ({type(problem).__name__}); the server log has the details")

    # MCP for agents at /mcp: the same indexes, batcher, bounds and keys (`retriever.serve.mcp_tools`).
    agent_endpoint, agent_sessions = http_endpoint(create_mcp_server(lambda: state["catalog"]))
    app.router.routes.append(Route(MCP_PATH, endpoint=agent_endpoint))

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount(DOCS_ASSETS, StaticFiles(directory=_docs_assets()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title="retriever API",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics():
        """Prometheus' text format (`retriever.serve.metrics`); a read like any other under the API keys."""
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/health")
    async def health():
        return {"status": "ok"}  # open to anyone who can reach the server: says nothing about the indexes

    @app.get("/indexes")
    async def all_indexes():
        listed = await run_in_threadpool(describe_indexes, indexes.index_dir)  # `retriever list --json`'s records
        return {"indexes": [public_record(record, private) for record in listed]}

    @app.get("/indexes/{name}")
    async def one_index(name: str):
        async with indexes.using(name) as served:
            snapshot = served.snapshot
            shards = {} if indexes.remote is None else {"shards": indexes.remote.assignment(snapshot)}
            return {**_describe_index(served.index),
                    "segments": [_public_segment(entry.to_record()) for entry in snapshot.manifest.segments],
                    "search_settings": snapshot.spec.search_settings(), "fit": snapshot.manifest.fit, **shards}

    async def run_search(name: str | None, texts: list[str], ids: list[str | None], options: SearchOptions,
                         include: tuple[str, ...]) -> Response:
        if name is not None:
            check_name(name)  # "" is no index, where it searched the default one
        return await search_and_answer(indexes, state["batcher"], name, texts, options,
                                       lambda served, options, hits: render_answer(served, texts, ids, hits, options,
                                                                                   include))

    @app.get("/search")
    async def search_get(query: Annotated[SearchQuery, Query()]):
        check_search([query.q], [None], query.k, "q")  # the API's own bounds, before the options are compiled
        return await run_search(query.index, [query.q], [None], search_options(query), hit_parts(query.include))

    @app.post("/search")
    async def search_post(request: SearchRequest):
        texts = [item if isinstance(item, str) else item.text for item in request.queries]
        ids = [None if isinstance(item, str) else item.id for item in request.queries]
        check_search(texts, ids, request.k, "queries")
        return await run_search(request.index, texts, ids, search_options(request), hit_parts(request.include))

    @app.get("/indexes/{name}/documents/{doc_id:document_id}")
    async def get_document(name: str, doc_id: str):
        check_text(doc_id, "the document id")
        async with indexes.using(name) as served:
            document = await run_in_threadpool(served.index.document, doc_id)
            if document is None:
                raise NotFoundError(f"no document '{doc_id}' in index '{name}'")
            return await run_in_threadpool(render, {
                "index": name, "version": served.snapshot.manifest.version,
                "document": {**{key: document.get(key) for key in ("doc_id", "title", "text", "line")},
                             "source": public_source(document.get("source")),
                             "metadata": public_metadata(document.get("metadata"))}})

    @app.post("/indexes", status_code=201)
    async def create_index(request: CreateRequest = Body(...)):
        """Build an index from the documents in the request, with the default model, as `retriever build` does."""
        check_name(request.name)
        if len(request.documents) > MAX_DOCUMENTS:
            raise ApiError(413, f"{len(request.documents):,} documents in one request; at most {MAX_DOCUMENTS:,}: "
                                "create the index with some and add the rest")
        if request.name in creating:  # checked and taken before any await: no other request slips between
            raise ConflictError(f"index '{request.name}' is being created by another request; wait for it to "
                                f"finish, or choose another {param('name')}")
        creating.add(request.name)
        try:
            documents = await run_in_threadpool(documents_from_records, request.documents)
            summary = await run_in_threadpool(lambda: Index.build(
                documents, request.name, indexes.index_dir, calibrator=request.calibrator,
                index_type=request.index_type, device=indexes.device, replace=request.replace))
        finally:
            creating.discard(request.name)
        return JSONResponse({"index": request.name, "version": summary.version,
                             "documents": summary.documents}, status_code=201)

    @app.post("/indexes/{name}/documents", status_code=201)
    async def add_documents(name: str, request: AddRequest = Body(...)):
        if len(request.documents) > MAX_DOCUMENTS:
            raise ApiError(413, f"{len(request.documents):,} documents in one request; at most {MAX_DOCUMENTS:,}")
        documents = await run_in_threadpool(documents_from_records, request.documents)
        async with indexes.using(name) as served:
            summary = await run_in_threadpool(lambda: served.index.add(documents, upsert=request.upsert))
        # The version the write committed, as written: nothing after the commit may turn it into a failure.
        return JSONResponse({"index": name, "version": summary.version, "added": summary.changed,
                             "documents": summary.documents}, status_code=201)

    @app.post("/indexes/{name}/sync")
    async def sync_index(name: str, allow_empty: Annotated[bool, Query(
            description="delete every file's documents where the folder holds no file now (refused otherwise: a "
                        "drive not mounted looks the same)")] = False):
        """Bring an index built from a folder on this machine in step with it, as `retriever sync` does."""
        async with indexes.using(name) as served:
            folder = served.snapshot.manifest.source
            try:
                result = await run_in_threadpool(lambda: served.index.sync(allow_empty=allow_empty))
            except RetrieverError as problem:  # "built from <server folder>, which is no longer a folder"
                raise type(problem)(without_folder(str(problem), folder), parameter=problem.parameter) from None
        return {"index": name, "version": result.change.version if result.change else
                served.snapshot.manifest.version, "added": result.added, "changed": result.changed,
                "deleted": result.deleted, "unchanged": result.unchanged, "stale": result.stale,
                "notes": [without_folder(note, folder) for note in result.notes],
                "documents": result.change.documents if result.change else served.snapshot.manifest.documents}

    @app.delete("/indexes/{name}/documents/{doc_id:document_id}")
    async def delete_document(name: str, doc_id: str):
        check_text(doc_id, "the document id")
        async with indexes.using(name) as served:
            summary = await run_in_threadpool(served.index.delete, [doc_id])
        return {"index": name, "version": summary.version, "deleted": summary.changed,
                "documents": summary.documents}

    return app


def render_answer(served: Served, texts: list[str], ids: list[str | None], hits: list[list[SearchHit]],
                  options: SearchOptions, include: tuple[str, ...]) -> Response:
    """The search answer as JSON bytes, each hit carrying the parts INCLUDE names; refused (413) when the
    documents' text in it would exceed MAX_ANSWER_CHARS (a few very long documents times many queries)."""
    chars = sum((len(hit.text) if "text" in include else len(hit.passage)) + len(hit.title or "")
                for found in hits for hit in found)
    check_answer_chars(chars, "lower k or send fewer queries at once")
    notes = filter_notes(options.where, public_fields(served.snapshot.manifest.metadata_fields),
                         served.snapshot.field_kinds, own=PUBLIC_OWN_FIELDS)
    return render({"index": served.name, "version": served.snapshot.manifest.version, "space": options.space,
                   "mode": options.mode, "scores": score_meaning(options), "k": options.k, **({"warnings": notes} if notes else {}),
                   "queries": [public_answer(search_record(query_id, text, found, options.mode, include))
                               for query_id, text, found in zip(ids, texts, hits)]})


def public_answer(record: dict) -> dict:
    """A query's `search_record` as a client of the server sees it: metadata without server paths
    (`public.public_metadata`)."""
    for result in record["results"]:
        if "metadata" in result:
            result["metadata"] = public_metadata(result["metadata"])
    return record


def render(payload: dict, status: int = 200) -> Response:
    """JSON bytes, built once (FastAPI's generic encoder would walk every hit again). Text stored before inputs
    were checked may hold lone surrogates: they go out as JSON \\uDXXX escapes instead of failing the answer."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")
    return Response(body, status_code=status, media_type="application/json")


def _error(status: int, message: str, **fields) -> Response:
    """An error body: DETAIL, the message on one line; STATUS; and FIELDS (a RetrieverError's code, parameter)."""
    body = json.dumps({"detail": " ".join(message.split()), "status": status, **fields})  # ASCII: any text whole
    return Response(body, status_code=status, media_type="application/json")


def _describe_index(index: Index) -> dict:
    manifest = index.snapshot.manifest
    return {"name": index.name, "version": manifest.version, "documents": manifest.documents,
            "model": public_model(manifest.encoder["model"]), "dim": manifest.dim,
            "calibrator": calibrator_label(manifest.calibrator), "index_type": manifest.index["type"],
            "created": manifest.created, "refitted": manifest.refitted}


def _public_segment(record: dict) -> dict:
    return {**record, "fields": public_fields(record["fields"])} if record.get("fields") else record


def _one_line(error: Exception) -> str:
    return str(error) if isinstance(error, RetrieverError) else f"{type(error).__name__}: {error}"


class UniqueKeysRequest(Request):
    """A request whose JSON body refuses a key given twice in one object (`text.unique_keys`): read as JSON
    does, the last would silently win."""

    async def json(self):
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=unique_keys)
        return self._json


class UniqueKeysRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route(request: Request):
            return await handler(UniqueKeysRequest(request.scope, request.receive))

        return route


async def refuse_unknown_query(request: Request) -> None:
    """Refuse (422) a query parameter a path does not take, as GET /search refuses one: ignored, `?dry_run=true` on
    a DELETE deleted and `?index=` on a POST /search searched the default index. The page and the API's own docs
    take none either, but a browser's address bar may add some, and a prober's health or metrics request its own
    (a cache-buster, Prometheus' params): they are left alone."""
    route = request.scope.get("route")
    if not request.query_params or route is None or route.path in ("/", "/docs", "/health", "/metrics"):
        return
    taken = {parameter.alias for parameter in route.dependant.query_params}
    if taken:
        return  # its model refuses what it does not know
    name = next(iter(request.query_params))
    raise ApiError(422, f"{name}: Extra inputs are not permitted ({request.method} {route.path_format} takes no "
                        "query parameters)", name)


class QueryText:
    """Refuses (400) a URL path or a query string parameter that is not valid UTF-8, naming it: Starlette would read
    the bad bytes as U+FFFD, and a delete of document `%FF` would remove the document whose id is U+FFFD, where a
    JSON body holding them is refused."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            try:  # the path as sent (servers give it; the decoded one has lost the bad bytes)
                unquote_to_bytes(scope.get("raw_path") or b"").decode("utf-8")
            except UnicodeDecodeError:
                return await _error(400, "the URL path is not valid UTF-8 (percent-encode an id's UTF-8 bytes)",
                                    code="bad_input", parameter=None)(scope, receive, send)
            seen = set()
            for pair in scope.get("query_string", b"").split(b"&"):
                name, _, value = (unquote_to_bytes(part.replace(b"+", b" ")) for part in pair.partition(b"="))
                try:
                    name = name.decode("utf-8")
                except UnicodeDecodeError:
                    return await _error(400, "a query parameter's name is not valid UTF-8", code="bad_input",
                                        parameter=None)(scope, receive, send)
                if name and name in seen:  # one would be silently kept: say which
                    return await _error(422, f"the query parameter '{name}' is given more than once",
                                        code="bad_input", parameter=name)(scope, receive, send)
                seen.add(name)
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError:
                    return await _error(400, f"the query parameter '{name}' is not valid UTF-8", code="bad_input",
                                        parameter=name)(scope, receive, send)
        return await self.app(scope, receive, send)


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
