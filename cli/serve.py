"""`retriever serve`: option parsing around `retriever.serve.run.serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import options
from retriever.errors import RetrieverError


def serve(
    host: Annotated[str, typer.Option("--host", help="address to bind; the default answers this machine only")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port", min=1, max=65535)] = 8000,
    device: options.Device = "auto",
    max_batch: Annotated[int, typer.Option(
        "--max-batch", min=1, help="at most this many queued queries go through one encoder call")] = 64,
    access_log: Annotated[bool, typer.Option("--access-log", help="log every request")] = False,
    runtime: options.Runtime = "auto",
    index_dir: options.IndexDir = None,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", help="require Authorization: Bearer KEY on every request but the page, /health and /docs "
        "(read and write); also $RETRIEVER_API_KEY [default: none: no key on 127.0.0.1]")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option(
        "--api-key-file", help="read the read-write key from the first line of this file (keeps it out of ps) [default: none]")] = None,
    read_only_api_key: Annotated[Optional[str], typer.Option(
        "--read-only-api-key", help="a key that may search and read only (writes answer 403); also "
        "$RETRIEVER_READ_ONLY_API_KEY [default: none]")] = None,
    read_only_api_key_file: Annotated[Optional[Path], typer.Option(
        "--read-only-api-key-file", help="read the read-only key from the first line of this file [default: none]")] = None,
    allowed_host: Annotated[Optional[list[str]], typer.Option(
        "--allowed-host", help="a Host name to answer besides the bound address and loopback names (repeatable; "
        "*.example.org for a domain); other names get 421, which stops DNS rebinding [default: none: the bound "
        "address and loopback names; any name when bound to 0.0.0.0 with a key]")] = None,
    no_key: Annotated[bool, typer.Option(
        "--no-key", help="serve on a non-loopback address without an API key (anyone who reaches it may read and "
        "write)")] = False,
    engine: Annotated[str, typer.Option(
        "--engine", **options.choice(("local", "ray")),
        help="local: one process; ray: shards on Ray Serve, each searching a share of every index's segments, "
        "behind a front that encodes and merges (same API and answers)")] = "local",
    shards: Annotated[Optional[int], typer.Option("--shards", min=1, help="ray: how many shards [default: 2]")] = None,
    replicas: Annotated[Optional[int], typer.Option(
        "--replicas", min=1, help="ray: replicas per shard [default: 1]")] = None,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", help="ray: 'auto' or HOST:PORT of a running cluster [default: start one on 127.0.0.1]")] = None,
) -> None:
    """Serve every index over HTTP: a JSON API (docs at /docs) and a search page at /.

    The model loads once and each index opens once; a version committed later (by the CLI or the API) is picked
    up by the next request, and every answer names the version it comes from. Ctrl-C stops the server.

    Beyond 127.0.0.1 the server needs an API key (--api-key, --api-key-file or $RETRIEVER_API_KEY); a read-only
    key may be given besides. Requests naming another Host than the server's are refused."""
    import os

    from retriever.serve.access import API_KEY_ENV, READ_ONLY_API_KEY_ENV, AccessPolicy, resolve_key, serving_hosts

    access = AccessPolicy.create(
        serving_hosts(host, allowed_host or ()),
        api_key=resolve_key(api_key, api_key_file, API_KEY_ENV, "--api-key"),
        read_only_api_key=resolve_key(read_only_api_key, read_only_api_key_file, READ_ONLY_API_KEY_ENV,
                                      "--read-only-api-key"))

    # Before torch and FAISS load: idle OpenMP workers then sleep instead of spinning. On a few cores spinning
    # workers take the CPU the HTTP loop needs between batches (measured: p90 518 ms -> 51 ms at 1 client).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from retriever.serve.run import serve as run

    if engine == "local" and any(value is not None for value in (ray_address, shards, replicas)):
        raise RetrieverError("--ray-address, --shards and --replicas are for --engine ray")
    run(index_dir, host=host, port=port, device=device, max_batch=max_batch, access_log=access_log, runtime=runtime,
        access=access, allow_without_key=no_key, engine=engine, shards=2 if shards is None else shards,
        replicas=1 if replicas is None else replicas, ray_address=ray_address)


def mcp(
    device: options.Device = "auto",
    runtime: options.Runtime = "auto",
    index_dir: options.IndexDir = None,
) -> None:
    """Serve the indexes to an AI agent over MCP (the Model Context Protocol) on stdin and stdout.

    What an agent host (an editor, a desktop assistant, an agent framework) launches: it gets three tools, search,
    get_document and list_indexes, none of which writes. Each index opens on its first search; a version committed
    later is picked up by the next call. `retriever serve` answers the same tools over HTTP at /mcp, behind its
    API keys. Ends when the host closes stdin, once the requests it sent before are answered."""
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `serve`: an idle server must not spin the cores
    from retriever.serve.mcp_tools import serve_stdio

    serve_stdio(index_dir, device=device, runtime=runtime)
