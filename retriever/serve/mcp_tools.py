"""The indexes as tools for AI agents, over the Model Context Protocol (the official SDK, `mcp`).

Three tools, none of which writes: `search`, `get_document` and `list_indexes`. They are served over stdio by
`retriever mcp` (what desktop and editor hosts launch: `serve_stdio`) and over streamable HTTP at `/mcp` by
`retriever serve` (`http_endpoint`), where the server's Host check, API keys and body limit stand in front of them
as of every other path (a read-only key may call them all: none writes). Both transports answer from the server's
own parts: the open indexes, the search batcher, the HTTP API's bounds (`serve.protocol.check_search`) and its
answers without server paths (`serve.public`), so nothing the HTTP API refuses is allowed here.

Answers are sized for a model's context: a hit carries where its document matched (the passage and its span), not
the whole document, unless asked (`include_text`); `get_document` gives a window of the document around a span, or
its start, with the offsets to ask for more. A refusal is a tool error (`is_error`) whose text is the one line the
CLI and the HTTP API give, with the tool's argument names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, StrictBool, StrictInt, ValidationError

from retriever.errors import NotFoundError, RetrieverError, UnavailableError
from retriever.filters import filter_notes
from retriever.search.fusion import score_meaning
from retriever.search.options import MODES, SearchOptions
from retriever.search.results import SearchHit
from retriever.serve.batcher import SearchBatcher
from retriever.serve.open_indexes import OpenIndexes, Served
from retriever.serve.protocol import HTTP_MAX_K, ApiError, check_answer_chars, check_search
from retriever.serve.public import (PUBLIC_OWN_FIELDS, as_json_reads_it, describe_invalid, one_line, private_paths,
                                    public_fields, public_metadata, public_record, scrub)
from retriever.serve.searching import search_and_answer
from retriever.text import check_text, did_you_mean
from retriever.versions.catalog import default_index, describe_indexes
from retriever.versions.home import check_name, resolve_index_dir

try:
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage
    from mcp_types import ErrorData, JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from mcp_types import ToolAnnotations
except ImportError as error:  # a dependency of the package; a broken install should still say what to do
    raise UnavailableError(f"the MCP server needs the MCP SDK ({error}); reinstall: pip install -e .") from None

# A window of a document: this much on each side of the span asked about, and at most this much in all.
CONTEXT_CHARS = 1_000
WINDOW_CHARS = 10_000
MAX_WINDOW_CHARS = 100_000
# The tools' arguments that the library names otherwise (its messages then name the argument the agent sent).
ARGUMENT_NAMES = {"where": "filter"}
READ_ONLY = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)
INSTRUCTIONS = (
    "Search the user's retriever indexes (calibrated dense vectors and BM25, fused). Start with `search`: each hit "
    "carries the passage where its document matched and that passage's span; call `get_document` with the hit's "
    "id and span for the text around it. `list_indexes` says which indexes exist and what each holds; `search` "
    "takes the default index (list_indexes marks it) unless `index` names another.")


@dataclass(frozen=True)
class Catalog:
    """What the tools answer from: the open INDEXES, the search BATCHER, and the PRIVATE paths no answer shows."""

    indexes: OpenIndexes
    batcher: SearchBatcher
    private: tuple[str, ...]


class Hit(BaseModel):
    rank: int
    id: str = Field(description="the document's id (for get_document)")
    title: str | None
    score: float = Field(description="what the search ranked by (the answer's `scores` says what it is)")
    passage: str = Field(description="where the document matched: its best passage (the whole text of a short "
                                     "document)")
    span: list[int] = Field(description="[start, end]: the passage's character offsets in the document's text")
    path: str | None = Field(None, description="the file the document was read from (an index built from a folder)")
    page: int | None = Field(None, description="the page the passage starts on (a PDF)")
    metadata: dict | None = None
    text: str | None = Field(None, description="the whole document's text: only with include_text")


class SearchAnswer(BaseModel):
    index: str
    version: int = Field(description="the index version that answered")
    mode: str
    scores: str = Field(description="what a hit's score is in this answer")
    hits: list[Hit]
    warnings: list[str] = Field(default_factory=list, description="a filter naming fields no document has, or "
                                                                  "comparing values of another kind")


class DocumentWindow(BaseModel):
    index: str
    version: int
    id: str
    title: str | None
    path: str | None
    metadata: dict | None
    text: str = Field(description="the document's text from start to end")
    start: int
    end: int
    length: int = Field(description="the whole text's length in characters: ask from `end` on for what follows")


class IndexSummary(BaseModel):
    name: str
    default: bool = Field(description="searched when no index is named: the most recently written that "
                                      "encodes its own queries")
    version: int | None = None
    documents: int | None = None
    passages: int | None = Field(None, description="vectors searched: a document cut into passages has several")
    model: str | None = None
    calibrator: str | None = None
    fields: list[str] = Field(default_factory=list, description="metadata paths a filter may use")
    written: str | None = Field(None, description="when its current version was written (ISO 8601, UTC)")
    problem: str | None = Field(None, description="why the index cannot be searched, where it cannot")


class IndexList(BaseModel):
    indexes: list[IndexSummary]


PARSE_ERROR, INVALID_REQUEST = -32700, -32600  # JSON-RPC's codes: not JSON it can read; JSON, but no message
# Names agents give these arguments elsewhere (the library's and the HTTP API's filter is `where`).
ARGUMENT_ALIASES = {"where": "filter", "top_k": "k", "limit": "k", "n": "k", "q": "query", "text": "query"}


class RetrieverMCP(MCPServer):
    """The SDK's server, its argument errors worded as the HTTP API words them: one line naming the argument
    ("k: Input should be less than or equal to 1000"), where pydantic's own message runs to several lines with a
    link. An argument a tool does not take is refused, as the HTTP API refuses it (the SDK drops it: a filter sent
    as `where` answered unfiltered), and the tools' schemas say so."""

    async def run_stdio_async(self) -> None:
        """The SDK's stdio transport, with an answer to a line it cannot parse: it passes on the parse error, which
        its server drops, so an agent host that sent a lone surrogate or JSON nested too deeply waited forever for
        the reply. A JSON-RPC parse error (-32700) answers it, to the request's id where Python's parser reads one.
        Once the host closes stdin, the requests it sent before are answered (for up to ANSWER_AFTER_CLOSE_SECONDS)
        before the session ends: the SDK cancels whatever is still running at the end of its input, so requests
        piped in and then closed got some of their answers."""
        async with stdio_server() as (read_stream, write_stream):
            relay_send, relay_receive = anyio.create_memory_object_stream(16)
            answers = _Answers(write_stream)

            async def relay() -> None:
                async with relay_send:
                    async for item in read_stream:
                        if not isinstance(item, Exception):
                            answers.asked(item)
                            await relay_send.send(item)
                        elif (answer := parse_error(item)) is not None:
                            await write_stream.send(SessionMessage(answer))
                    with anyio.move_on_after(ANSWER_AFTER_CLOSE_SECONDS):
                        await answers.all_answered()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(relay)
                await self._lowlevel_server.run(relay_receive, answers,
                                                self._lowlevel_server.create_initialization_options())
                tasks.cancel_scope.cancel()

    async def list_tools(self):
        return [tool.model_copy(update={"input_schema": {**tool.input_schema, "additionalProperties": False}})
                for tool in await super().list_tools()]

    async def call_tool(self, name, arguments, context=None):
        schema = next((tool.input_schema for tool in await super().list_tools() if tool.name == name), None)
        if schema is not None and isinstance(arguments, dict):
            known = list(schema.get("properties", {}))
            unknown = [key for key in arguments if key not in known]
            if unknown:
                key = unknown[0]
                meant = (f" (did you mean '{ARGUMENT_ALIASES[key]}'?)" if ARGUMENT_ALIASES.get(key) in known
                         else did_you_mean(str(key), known))
                raise ToolError(f"Error executing tool {name}: {key}: Extra inputs are not permitted{meant}; "
                                f"{name} takes {', '.join(known) or 'no arguments'}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            if not isinstance(error.__cause__, ValidationError):
                raise
            clauses = "; ".join(describe_invalid(problem) for problem in error.__cause__.errors()[:3])
            raise ToolError(f"Error executing tool {name}: {clauses}") from error.__cause__


# After the host closes stdin, its requests still running are answered for at most this long.
ANSWER_AFTER_CLOSE_SECONDS = 60.0


class _Answers:
    """The stdio transport's write stream, keeping count of the host's requests not yet answered."""

    def __init__(self, stream):
        self._stream = stream
        self._waiting: set = set()

    def asked(self, item) -> None:
        message = item.message
        if isinstance(message, JSONRPCRequest):
            self._waiting.add(message.id)
        elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
            self._waiting.discard((message.params or {}).get("requestId"))  # cancelled: the SDK answers nothing

    async def all_answered(self) -> None:
        while self._waiting:
            await anyio.sleep(0.02)

    async def send(self, item) -> None:
        # Counted as answered once the transport's writer has taken it: counted before, the session could end
        # while an answer was still being handed over, and it was lost (a test's run answered 3 of 5).
        await self._stream.send(item)
        if isinstance(item.message, (JSONRPCResponse, JSONRPCError)):
            self._waiting.discard(item.message.id)

    async def __aenter__(self):
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._stream.__aexit__(*exc)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def parse_error(error: Exception) -> JSONRPCError | None:
    """The JSON-RPC answer to a line the transport could not parse (ERROR: pydantic's, which holds the line): a
    parse error, or JSON that is no message an invalid request, to the request's id where Python's own parser reads
    one (it takes lone surrogates). None for a blank line, and for a response (JSON-RPC answers none)."""
    request, reason, code = None, one_line(str(error))[:200], PARSE_ERROR
    if isinstance(error, ValidationError) and error.errors():
        first = error.errors()[0]
        reason = one_line(str(first.get("msg", reason)))[:200]
        if first.get("type") == "json_invalid":  # the line itself: read by Python's parser where it can
            line = str(first.get("input", ""))
            if not line.strip():
                return None
            try:
                request = json.loads(line)
            except (ValueError, RecursionError):
                pass
        else:  # JSON, but no JSON-RPC message: the object a message's own field is missing from
            code, reason = INVALID_REQUEST, f"not a JSON-RPC message ({reason})"
            request = next((problem["input"] for problem in error.errors() if len(problem.get("loc", ())) == 2
                            and isinstance(problem.get("input"), dict)), None)
    request_id = request.get("id") if isinstance(request, dict) else None
    if isinstance(request, dict) and "method" not in request and ("result" in request or "error" in request):
        return None  # a client's (malformed) response
    if not (isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool))):
        request_id = None
    words = "Parse error" if code == PARSE_ERROR else "Invalid Request"
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=f"{words}: {reason}"))


def create_mcp_server(catalog: Callable[[], Catalog]) -> MCPServer:
    """The MCP server whose tools answer from CATALOG() (the running server's parts, made when it starts)."""
    server = RetrieverMCP(name="retriever", instructions=INSTRUCTIONS, log_level="WARNING")

    @server.tool(annotations=READ_ONLY)
    async def search(
        query: Annotated[str, Field(description="what to look for, in words")],
        index: Annotated[str | None, Field(description="the index to search; default: the default index "
                                                       "(list_indexes marks it)")] = None,
        k: Annotated[StrictInt, Field(ge=1, le=HTTP_MAX_K, description="how many hits")] = 10,
        mode: Annotated[Literal[MODES] | None, Field(  # type: ignore[valid-type]
            description="dense (meaning), keyword (BM25, exact words) or hybrid (both fused); default: hybrid "
                        "where the index has a keyword index")] = None,
        # Any JSON value is taken, so that the library words a filter of the wrong kind ("must be a JSON object
        # ..., got a list") where pydantic would list the branches of a union it tried.
        filter: Annotated[Any, Field(description=SearchOptions.__dataclass_fields__["where"].metadata["help"],
                                     json_schema_extra={"type": ["object", "string", "null"]})] = None,
        include_text: Annotated[StrictBool, Field(description="also return each hit's whole document text (long "
                                                        "documents run to tens of thousands of characters)")] = False,
    ) -> SearchAnswer:
        """Search an index: the k documents that best answer QUERY, each with the passage where it matched."""
        parts = catalog()
        with refusals_as_tool_errors(parts):
            if index is not None:
                check_name(index)  # "" is no index (the HTTP API's empty name, the default, is not an argument here)
            check_search([query], [None], k, "query")
            options = SearchOptions(k=k, mode=mode, where=filter)
            return await search_and_answer(parts.indexes, parts.batcher, index, [query], options,
                                           lambda served, options, hits: search_answer(served, options, hits[0],
                                                                                       include_text))

    @server.tool(annotations=READ_ONLY)
    async def get_document(
        id: Annotated[str, Field(description="the document's id, as a hit gives it")],
        index: Annotated[str | None, Field(description="the index it is in; default: the default index")] = None,
        start: Annotated[StrictInt | None, Field(ge=0, description="the start of the part wanted (a hit's span[0], or "
                                                             "an answer's end to read on); default: the "
                                                             "document's start")] = None,
        end: Annotated[StrictInt | None, Field(ge=0, description="the end of the part wanted (a hit's span[1]); "
                                                           "without it, what follows start")] = None,
        context: Annotated[StrictInt, Field(ge=0, le=MAX_WINDOW_CHARS, description="characters of text to add on each "
                                                                             "side of start..end (a span)")
                           ] = CONTEXT_CHARS,
        max_chars: Annotated[StrictInt, Field(ge=1, le=MAX_WINDOW_CHARS, description="the most characters "
                                                                               "returned")] = WINDOW_CHARS,
    ) -> DocumentWindow:
        """A stored document: the text around START..END (a hit's span), what follows START alone (an answer's
        end: the next part), or from its start; at most MAX_CHARS of it, with the offsets to ask for the rest."""
        parts = catalog()
        with refusals_as_tool_errors(parts):
            if index is not None:
                check_name(index)
            check_text(id, "the document id")
            async with parts.indexes.using(index) as served:
                document = await run_in_threadpool(served.index.document, id)
                if document is None:
                    raise NotFoundError(f"no document '{id}' in index '{served.name}'")
                return document_window(served, document, start, end, context, max_chars)

    @server.tool(annotations=READ_ONLY)
    async def list_indexes() -> IndexList:
        """The indexes there are: for each, its documents, model, calibrator and the metadata fields a filter
        may use, and whether it is the one searched when none is named."""
        parts = catalog()
        with refusals_as_tool_errors(parts):
            records = await run_in_threadpool(describe_indexes, parts.indexes.index_dir)
            default = await run_in_threadpool(default_index, parts.indexes.index_dir)
            return IndexList(indexes=[index_summary(public_record(record, parts.private),
                                                    default=record["name"] == default) for record in records])

    return server


class refusals_as_tool_errors:
    """A refusal inside a tool as the tool's error: the library's one line, with the tool's argument names and no
    server path; a bound of the HTTP API's, as the API words it. Anything else is a bug: the SDK logs it and the
    agent reads only that the tool failed."""

    def __init__(self, parts: Catalog):
        self.private = parts.private

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, RetrieverError):
            raise ToolError(one_line(scrub(as_json_reads_it(error, ARGUMENT_NAMES), self.private))) from None
        if isinstance(error, ApiError):
            raise ToolError(one_line(str(error))) from None
        return False


def search_answer(served: Served, options: SearchOptions, hits: list[SearchHit], include_text: bool) -> SearchAnswer:
    if include_text:  # the HTTP API's bound on one answer
        check_answer_chars(sum(len(hit.text) + len(hit.title or "") for hit in hits),
                           "lower k, or leave include_text off")
    snapshot = served.snapshot
    notes = filter_notes(options.where, public_fields(snapshot.manifest.metadata_fields), snapshot.field_kinds,
                         own=PUBLIC_OWN_FIELDS)
    return SearchAnswer(index=served.name, version=snapshot.manifest.version, mode=options.mode,
                        scores=score_meaning(options), warnings=notes,
                        hits=[Hit(rank=hit.rank, id=hit.doc_id, title=hit.title, score=round(float(hit.score), 6) + 0.0,
                                  passage=hit.passage, span=list(hit.span), path=_path(hit.metadata), page=hit.page,
                                  metadata=public_metadata(hit.metadata), text=hit.text if include_text else None)
                              for hit in hits])


def document_window(served: Served, document: dict, start: int | None, end: int | None, context: int,
                    max_chars: int) -> DocumentWindow:
    """DOCUMENT's text around a span, START - CONTEXT to END + CONTEXT, at most MAX_CHARS of it, centred on
    START..END when that must be cut; without END (or at START), what follows START (a window's end: paging on),
    MAX_CHARS of it; without START, the document's first MAX_CHARS."""
    text = document["text"]
    if start is not None and start > len(text):
        raise RetrieverError(f"start {start} is past the document's end (it has {len(text):,} characters)",
                             parameter="start")
    if start is None:
        if end is not None:
            raise RetrieverError("end needs start", parameter="start")
        low, high = 0, min(len(text), max_chars)
    elif end is None or end == start:
        low, high = start, min(len(text), start + max_chars)
    else:
        if end < start:
            raise RetrieverError(f"end {end} is before start {start}", parameter="end")
        low, high = max(0, start - context), min(len(text), end + context)
        if high - low > max_chars:  # keep the middle of what was asked for
            middle = (start + min(end, len(text))) // 2
            low = max(0, min(middle - max_chars // 2, len(text) - max_chars))
            high = low + max_chars
    return DocumentWindow(index=served.name, version=served.snapshot.manifest.version, id=document["doc_id"],
                          title=document.get("title"), path=_path(document.get("metadata")),
                          metadata=public_metadata(document.get("metadata")), text=text[low:high], start=low, end=high,
                          length=len(text))


def index_summary(record: dict, default: bool) -> IndexSummary:
    return IndexSummary(default=default, **{key: record.get(key) for key in (
        "name", "version", "documents", "passages", "model", "calibrator", "written", "problem")},
        fields=record.get("fields") or [])


def _path(metadata: dict | None) -> str | None:
    """The file a document was read from (`retriever.files`: its path within the folder built)."""
    path = (metadata or {}).get("path")
    return path if isinstance(path, str) else None


def http_endpoint(server: MCPServer) -> tuple[StreamableHTTPASGIApp, StreamableHTTPSessionManager]:
    """SERVER's streamable HTTP endpoint, to route at /mcp of the HTTP server, and its session manager, to run for
    the server's life. Stateless, answered as JSON: any request may reach any worker. The SDK's own Host check is
    off: the server's (`serve.access`) stands in front of every path, with the names the server was told to
    answer."""
    server.streamable_http_app(stateless_http=True, json_response=True,
                               transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    return StreamableHTTPASGIApp(server.session_manager), server.session_manager


def serve_stdio(index_dir: str | Path | None = None, device: str = "auto", runtime: str = "auto") -> None:
    """`retriever mcp`: the tools over stdin and stdout for one agent host, until it closes them. Opens nothing
    until asked; never writes an index."""
    indexes = OpenIndexes(resolve_index_dir(index_dir), device, runtime)
    batcher = SearchBatcher()
    parts = Catalog(indexes, batcher, private_paths(indexes.index_dir))
    try:
        create_mcp_server(lambda: parts).run("stdio")
    finally:
        batcher.close()
        indexes.close()

