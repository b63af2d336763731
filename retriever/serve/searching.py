"""One search as the server runs it, for every surface that answers searches (the HTTP API, the MCP tools): on
the index's current version, held until the answer is made, its queries batched with everyone else's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from fastapi.concurrency import run_in_threadpool

from retriever.errors import RetrieverError
from retriever.files.folder import FOLDER_KEY
from retriever.filters import Filter
from retriever.metadata import field_path
from retriever.search.options import SearchOptions
from retriever.search.results import SearchHit
from retriever.serve.batcher import SearchBatcher
from retriever.serve.open_indexes import OpenIndexes, Served

Answer = TypeVar("Answer")


async def search_and_answer(indexes: OpenIndexes, batcher: SearchBatcher, name: str | None, texts: list[str],
                            options: SearchOptions,
                            answer: Callable[[Served, SearchOptions, list[list[SearchHit]]], Answer]) -> Answer:
    """TEXTS searched with OPTIONS over index NAME (the most recently written when empty), and ANSWER made of the
    hits on a worker thread (a large answer must not stall every other request on the event loop), the version
    searched held open until then."""
    async with indexes.using(name) as served:
        options = served.searcher.resolve(options)
        if options.where is not None:
            check_public_filter(options.where)
        if options.space == "raw":
            hits = await run_in_threadpool(served.index.search, texts, options)
        else:
            if options.where is not None:
                # Its matches are found here, on a worker thread: the batcher's one thread finds them remembered.
                await run_in_threadpool(served.searcher.matches.matches, options.where)
            future = batcher.submit(served, texts, options)
            indexes.hold_until_done(served, future)
            hits = await asyncio.wrap_future(future)
        return await run_in_threadpool(answer, served, options, hits)


def check_public_filter(where: Filter) -> None:
    """Refuse a filter on what holds a server path, which no answer shows and a filter could read out a character
    at a time ({"source": {"$gte": "/home/a"}}): a document's `source` (its corpus file or folder, shown by its
    name), and the `folder` a file was read from (left out of every hit's metadata, `serve.public`)."""
    for key in where.fields:
        if key == "source" or field_path(key) == FOLDER_KEY:
            raise RetrieverError(f"{key}: the server does not filter on it (its values are paths on the server)",
                                 parameter="where")

