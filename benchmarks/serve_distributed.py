"""What the distributed server's fan-out adds (issue 30): the same index served by the local server and by
`retriever serve --engine ray --shards 2` (Ray Serve on a local cluster, loopback only), in the same run.

    python benchmarks/serve_distributed.py --work DIR [--queries 300] [--out benchmarks/results/serve_distributed_cpu]

DIR is `benchmarks/scale.py prepare`'s folder: its corpus-10k.jsonl and vectors-10k.npy (10,000 real passages and
their all-MiniLM-L6-v2 vectors). The index is built from those vectors in two segments of 5,000 (a build, then an
add), so each of the two shards holds one. Queries are real questions (QNLI dev), one at a time over a kept-alive
connection, GET /search k=10, in dense and in hybrid mode (the default), alternating servers query by query so
neither gets a warmer machine: p50, p90, p99 per server and mode, and the fan-out's added p50 (distributed minus
local). Every answer's top-10 is compared between the two servers.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.scale import qnli_questions  # noqa: E402

NAME = "dist10k"
MODES = ("dense", "hybrid")


def prepare(work: Path) -> Path:
    from retriever.index import Index

    index_dir = work / "serve-distributed"
    if (index_dir / NAME).exists():
        return index_dir
    lines = (work / "corpus-10k.jsonl").read_text().splitlines(keepends=True)
    vectors = np.load(work / "vectors-10k.npy")
    half = len(lines) // 2
    (work / "dist-a.jsonl").write_text("".join(lines[:half]))
    (work / "dist-b.jsonl").write_text("".join(lines[half:]))
    index = Index.build(work / "dist-a.jsonl", NAME, index_dir, vectors=vectors[:half], device="cpu",
                        replace=True).open()
    index.add(work / "dist-b.jsonl", vectors=vectors[half:])
    return index_dir


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(port: int, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"no server on 127.0.0.1:{port}")


def top10(connection: http.client.HTTPConnection, query: str, mode: str) -> tuple[float, list[str]]:
    started = time.perf_counter()
    connection.request("GET", "/search?" + urlencode({"q": query, "k": 10, "mode": mode}))
    response = connection.getresponse()
    body = response.read()
    seconds = time.perf_counter() - started
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {body[:200]!r}")
    return seconds, [hit["doc_id"] for hit in json.loads(body)["queries"][0]["results"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/serve_distributed_cpu")
    args = parser.parse_args()

    import uvicorn

    from retriever.serve.access import AccessPolicy
    from retriever.serve.app import create_app
    from retriever.serve.run import serve_on_ray

    index_dir = prepare(args.work)
    queries = qnli_questions(args.queries + 20)
    access = AccessPolicy.create(["127.0.0.1"])
    local_port, ray_port = free_port(), free_port()
    local = uvicorn.Server(uvicorn.Config(create_app(index_dir, device="cpu", preload=True, access=access),
                                          host="127.0.0.1", port=local_port, log_level="warning"))
    threading.Thread(target=local.run, daemon=True).start()
    stop = threading.Event()
    distributed = threading.Thread(target=serve_on_ray, args=(index_dir, "127.0.0.1", ray_port, "cpu", 64, "auto",
                                                              access, 2, 1, None, stop), daemon=True)
    started = time.perf_counter()
    distributed.start()
    wait_for(local_port)
    wait_for(ray_port)
    start_seconds = time.perf_counter() - started
    servers = {"local": http.client.HTTPConnection("127.0.0.1", local_port, timeout=60),
               "ray, 2 shards": http.client.HTTPConnection("127.0.0.1", ray_port, timeout=60)}
    times = {(server, mode): [] for server in servers for mode in MODES}
    differing = {mode: 0 for mode in MODES}
    try:
        for number, query in enumerate(queries):
            for mode in MODES:
                found = {}
                for server, connection in servers.items():
                    seconds, found[server] = top10(connection, query, mode)
                    if number >= 20:  # warm-up
                        times[(server, mode)].append(seconds)
                if number >= 20 and len({tuple(ids) for ids in found.values()}) > 1:
                    differing[mode] += 1
    finally:
        stop.set()
        distributed.join(timeout=60)
        local.should_exit = True

    def figures(values: list[float]) -> dict:
        return {f"p{p}_ms": round(float(np.percentile(values, p)) * 1e3, 2) for p in (50, 90, 99)}

    report = {"benchmark": "serve_distributed",
              "command": " ".join(["python", "benchmarks/serve_distributed.py", *sys.argv[1:]]),
              "machine": f"{platform.machine()}, Python {platform.python_version()}, "
                         f"{__import__('os').cpu_count()} CPUs",
              "documents": 10_000, "segments": 2, "queries": args.queries,
              "distributed_start_seconds": round(start_seconds, 1),
              "latency": {f"{server} / {mode}": figures(values) for (server, mode), values in times.items()},
              "queries_whose_top10_differ": differing}
    for mode in MODES:
        report[f"fan_out_added_p50_ms_{mode}"] = round(report["latency"][f"ray, 2 shards / {mode}"]["p50_ms"]
                                                       - report["latency"][f"local / {mode}"]["p50_ms"], 2)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [f"# The distributed server's fan-out ({report['documents']:,} passages in 2 segments, "
             f"{args.queries} questions one at a time)", "", f"{report['machine']}. `{report['command']}`", "",
             "| server | mode | p50 ms | p90 ms | p99 ms |", "|---|---|---:|---:|---:|"]
    for (server, mode) in times:
        fig = report["latency"][f"{server} / {mode}"]
        lines.append(f"| {server} | {mode} | {fig['p50_ms']} | {fig['p90_ms']} | {fig['p99_ms']} |")
    lines += ["", "Added by the fan-out at p50: " + ", ".join(
        f"{mode} {report[f'fan_out_added_p50_ms_{mode}']} ms" for mode in MODES) + ". Queries whose top-10 differ "
        "between the servers: " + ", ".join(f"{mode} {count}" for mode, count in differing.items()) +
        f". The distributed server took {report['distributed_start_seconds']} s to start (cluster, deployments, "
        "model)."]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
