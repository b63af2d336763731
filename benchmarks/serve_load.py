"""Load on `retriever serve`: concurrent single-query clients while a writer commits, on loopback only.

    python benchmarks/serve_load.py --work DIR [--vectors VECTORS.npy] [--seconds 60] [--clients 1,4,16] [--mode dense]

The index holds 100,000 real passages of ../shared/data/passages (every 10.9th, as `benchmarks/scale.py`'s
encode-build-100k), built once into DIR with the default model (all-MiniLM-L6-v2, max_length 256) as an `hnsw` index
(see INDEX_TYPE). With `--vectors` (the passages' vectors from `retriever encode passages.jsonl.gz`,
row i = passage i) the build takes their rows instead of encoding (same encoder, same numbers, minutes instead
of an hour on 2 cores). Queries are 2,000 real questions (QNLI dev), each sent once per phase in turn.

The server is the real CLI (`retriever serve`) in its own process on 127.0.0.1. Each phase runs N clients, each
sending one GET /search (k=10) after the other over a kept-alive connection, for SECONDS (and at most
MAX_REQUESTS), while a writer POSTs 10 new passages every 10 s. Reported per phase: queries/s, latency p50/p90/
p99/max, failed requests (non-200 or no answer), the versions seen, and whether every response came from exactly
one version that the writer (or the build) committed, with no client ever seeing an older version after a newer.

Baselines measured in the same run: the CLI per query (`retriever search ... --json`, a fresh process each, as an
application calling the CLI would), the same server with micro-batching off (`--max-batch 1`) at the largest
client count, and with the encoder on PyTorch (`--runtime torch`) at one client. Results go to OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.scale import PASSAGES, write_jsonl, qnli_questions  # noqa: E402  (same data, same queries)

NAME = "p100k"
DOCUMENTS = 100_000
MAX_LENGTH = 256
# hnsw, not what `auto` takes at 100k (flat): an exact scan of 100,000 x 384 floats costs ~14 ms a query on
# these cores, all of the 15 ms budget, while the graph answers in ~2 ms at recall@10 0.95 (benchmarks/scale.py).
INDEX_TYPE = "hnsw"
WRITE_EVERY_S = 10.0
WRITE_DOCUMENTS = 10
MAX_REQUESTS = 200_000  # per phase: a bound even if the server answered impossibly fast
TARGETS = {"p50_ms_1_client": 15.0, "qps_16_clients": 150.0, "failed": 0}


def prepare(work: Path, vectors_path: Path | None, documents: int = DOCUMENTS, name: str = NAME) -> Path:
    """The index of DOCUMENTS passages (built once) and the writer's passages; returns the index folder."""
    from retriever.index import Index
    from retriever.versions.home import list_indexes

    index_dir = work / "indexes"
    writes = work / "writes.jsonl"
    if name in list_indexes(index_dir) and writes.is_file():
        return index_dir
    work.mkdir(parents=True, exist_ok=True)
    records = [json.loads(line) for line in gzip.open(PASSAGES, "rt", encoding="utf-8")]
    rows = np.linspace(0, len(records) - 1, documents).astype(int)
    corpus = work / f"corpus-{name}.jsonl"
    write_jsonl(corpus, (records[i] for i in rows))
    # Passages between the sampled ones, under new ids: what the writer adds, 10 per commit.
    write_jsonl(writes, ({**records[i + 5], "_id": records[i + 5]["_id"] + "+added"} for i in rows[::97][:1000]))
    vectors = None
    if vectors_path is not None:
        matrix = np.load(vectors_path, mmap_mode="r")
        if len(matrix) != len(records):
            raise SystemExit(f"{vectors_path} has {len(matrix)} rows for {len(records)} passages")
        vectors = work / f"vectors-{name}.npy"
        np.save(vectors, np.asarray(matrix[rows], dtype=np.float32))
    started = time.perf_counter()
    summary = Index.build(corpus, name, index_dir, vectors=vectors, max_length=MAX_LENGTH, index_type=INDEX_TYPE,
                          device="cpu", progress=True, replace=True)
    print(f"built {name}: {summary.documents:,} documents in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return index_dir


class Server:
    """`retriever serve` in its own process on a free loopback port."""

    def __init__(self, index_dir: Path, max_batch: int, runtime: str = "auto"):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        command = [str(Path(sys.executable).with_name("retriever")), "serve", "--host", "127.0.0.1",
                   "--port", str(self.port), "--index-dir", str(index_dir), "--device", "cpu",
                   "--max-batch", str(max_batch), "--runtime", runtime]
        self.log = open(index_dir.parent / f"server-batch{max_batch}-{runtime}.log", "w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:
            try:
                status, _ = request(self.port, "GET", "/health")
                if status == 200:
                    break
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start; see {self.log.name}")
            time.sleep(0.25)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def request(port: int, method: str, path: str, body: dict | None = None, connection=None):
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"content-type": "application/json"} if body is not None else {}
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        if own:
            connection.close()


def run_phase(port: int, queries: list[str], clients: int, seconds: float, writes: list[dict],
              initial_version: int, name: str = NAME, mode: str | None = None) -> dict:
    """CLIENTS sequential clients for SECONDS while the writer commits every WRITE_EVERY_S; see the docstring."""
    results: list[list[tuple[float, float, int]]] = [[] for _ in range(clients)]  # (start, latency, version)
    failures: list[str] = []
    committed = [initial_version]
    write_log: list[dict] = []
    started = time.monotonic()
    stop_at = started + seconds
    run_tag = f"{time.time():.0f}"
    lock = threading.Lock()
    sent = [0]

    def client(number: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        turn = number
        while time.monotonic() < stop_at:
            with lock:
                if sent[0] >= MAX_REQUESTS:
                    return
                sent[0] += 1
            query = queries[turn % len(queries)]
            turn += clients
            path = "/search?" + urlencode({"q": query, "k": 10, "index": name, **({"mode": mode} if mode else {})})
            begin = time.perf_counter()
            try:
                status, body = request(port, "GET", path, connection=connection)
            except (OSError, http.client.HTTPException) as error:
                failures.append(f"{type(error).__name__}: {error}")
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                continue
            latency = time.perf_counter() - begin
            if status != 200:
                failures.append(f"{status}: {body[:200]!r}")
                continue
            answer = json.loads(body)
            hits = answer["queries"][0]["results"] if len(answer.get("queries", [])) == 1 else None
            if not isinstance(answer.get("version"), int) or hits is None or not 1 <= len(hits) <= 10:
                failures.append(f"malformed answer: {body[:200]!r}")
                continue
            results[number].append((begin, latency, answer["version"]))
        connection.close()

    def writer() -> None:
        batch = 0
        while True:
            due = started + WRITE_EVERY_S * (batch + 1)
            if due >= stop_at:
                return
            time.sleep(max(0.0, due - time.monotonic()))
            # Ids unique to this run: the index is kept between runs, and an id already there is refused (409).
            documents = [{**record, "_id": f"{record['_id']}@{run_tag}"}
                         for record in writes[batch * WRITE_DOCUMENTS : (batch + 1) * WRITE_DOCUMENTS]]
            begin = time.perf_counter()
            status, body = request(port, "POST", f"/indexes/{name}/documents", {"documents": documents})
            entry = {"at_s": round(time.monotonic() - started, 2), "status": status,
                     "seconds": round(time.perf_counter() - begin, 3)}
            if status == 201:
                entry["version"] = json.loads(body)["version"]
                committed.append(entry["version"])
            else:
                entry["error"] = body[:200].decode(errors="replace")
            write_log.append(entry)
            batch += 1

    threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
    threads.append(threading.Thread(target=writer))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started

    latencies = sorted(latency for mine in results for _, latency, _ in mine)
    seen = sorted({version for mine in results for _, _, version in mine})
    # A client's requests are sequential: a later one must never come from an older version.
    backwards = sum(1 for mine in results for (_, _, a), (_, _, b) in zip(mine, mine[1:]) if b < a)
    unknown = [version for version in seen if version not in committed]
    answered = len(latencies)
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": answered + len(failures),
        "answered": answered,
        "failed": len(failures),
        "failures": failures[:10],
        "qps": round(answered / elapsed, 1),
        "latency_ms": {name: round(1000 * value, 2) for name, value in (
            ("p50", _percentile(latencies, 50)), ("p90", _percentile(latencies, 90)),
            ("p99", _percentile(latencies, 99)), ("max", latencies[-1] if latencies else float("nan")),
            ("mean", statistics.fmean(latencies) if latencies else float("nan")))},
        "writes": write_log,
        "versions_committed": len(committed),
        "versions_seen": len(seen),
        "responses_from_one_committed_version": answered if not unknown else 0,
        "unknown_versions": unknown,
        "version_went_backwards": backwards,
    }


def _percentile(values: list[float], percent: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), percent))


def cli_per_query(index_dir: Path, queries: list[str], runs: int) -> dict:
    """Wall time of `retriever search "..." --json`, a fresh process per query."""
    command = [str(Path(sys.executable).with_name("retriever")), "search", "--name", NAME, "--index-dir",
               str(index_dir), "--device", "cpu", "-k", "10", "--json"]
    times = []
    for query in queries[:runs]:
        begin = time.perf_counter()
        subprocess.run([*command[:2], query, *command[2:]], check=True, capture_output=True)
        times.append(time.perf_counter() - begin)
    return {"runs": runs, "seconds": [round(t, 3) for t in times], "median_ms": round(1000 * statistics.median(times), 1)}


DEFAULT_MODE = "the index's default"  # no mode sent: what a client naming none gets


def current_version(index_dir: Path, name: str = NAME) -> int:
    """The version number NAME serves now (what each answer's `version` names)."""
    from retriever.index import Index

    with Index.open(name, index_dir, device="cpu") as index:
        return index.snapshot.manifest.version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="where the 100k index is built (kept for reruns)")
    parser.add_argument("--vectors", type=Path, help="the passages' vectors (row i = passage i), to skip encoding")
    parser.add_argument("--seconds", type=float, default=60.0, help="per phase")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--mode", choices=("dense", "keyword", "hybrid"), default=None,
                        help="each search's mode (default: the index's own, as a client that names none gets)")
    parser.add_argument("--cli-runs", type=int, default=5, help="CLI invocations for the per-query baseline")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "serve_load")
    args = parser.parse_args()

    index_dir = prepare(args.work, args.vectors)
    queries = qnli_questions(2000)
    writes = [json.loads(line) for line in open(args.work / "writes.jsonl", encoding="utf-8")]
    client_counts = [int(count) for count in args.clients.split(",")]
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "index": {"name": NAME, "documents": DOCUMENTS, "model": "all-MiniLM-L6-v2", "max_length": MAX_LENGTH},
        "settings": {"seconds_per_phase": args.seconds, "k": 10, "mode": args.mode or DEFAULT_MODE,
                     "write_every_s": WRITE_EVERY_S,
                     "documents_per_write": WRITE_DOCUMENTS, "queries": len(queries)},
        "phases": [],
    }
    from retriever.index import Index

    with Index.open(NAME, index_dir, device="cpu") as index:
        spec = index.snapshot.manifest.index
    report["index"]["type"] = spec["type"]

    def write_offset() -> int:  # each phase adds passages not added before
        return sum(len(phase["writes"]) for phase in report["phases"] + report.get("baselines", {}).get("phases", []))

    # The server as shipped (ONNX Runtime on CPU, batches of up to 64), then the baselines: micro-batching off at
    # the most clients, and the encoder on PyTorch at one client.
    configurations = ((64, "auto", client_counts), (1, "auto", [max(client_counts)]), (64, "torch", [1]))
    for max_batch, runtime, counts in configurations:
        server = Server(index_dir, max_batch, runtime)
        try:
            request(server.port, "GET", "/search?" + urlencode({"q": "warm up", "index": NAME}))
            for clients in counts:
                print(f"max_batch {max_batch}, runtime {runtime}: {clients} clients for {args.seconds:.0f} s",
                      file=sys.stderr)
                offset = write_offset() * WRITE_DOCUMENTS
                phase = run_phase(server.port, queries, clients, args.seconds, writes[offset:],
                                  current_version(index_dir), mode=args.mode)
                phase["max_batch"], phase["runtime"] = max_batch, runtime
                if (max_batch, runtime) == (64, "auto"):
                    report["phases"].append(phase)
                else:
                    report.setdefault("baselines", {}).setdefault("phases", []).append(phase)
                print(json.dumps({k: phase[k] for k in ("clients", "qps", "latency_ms", "failed", "versions_seen")}),
                      file=sys.stderr)
        finally:
            server.stop()
    report.setdefault("baselines", {})["cli_per_query"] = cli_per_query(index_dir, queries, args.cli_runs)
    report["checks"] = checks(report)
    save_report(args.out, report, markdown(report))


def save_report(out: Path, report: dict, table: str) -> None:
    """OUT.json and OUT.md, and the table on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table)


def checks(report: dict) -> dict:
    phases = {phase["clients"]: phase for phase in report["phases"]}
    one, most = phases.get(1), phases[max(phases)]
    unbatched = next(p for p in report["baselines"]["phases"] if p["max_batch"] == 1)
    on_torch = next(p for p in report["baselines"]["phases"] if p["runtime"] == "torch")
    cli = report["baselines"]["cli_per_query"]["median_ms"]
    return {
        "failed_requests": sum(phase["failed"] for phase in report["phases"] + report["baselines"]["phases"]),
        "p50_ms_1_client": one["latency_ms"]["p50"] if one else None,
        "p50_1_client_target_met": bool(one and one["latency_ms"]["p50"] <= TARGETS["p50_ms_1_client"]),
        f"qps_{most['clients']}_clients": most["qps"],
        "qps_target_met": most["qps"] >= TARGETS["qps_16_clients"],
        "every_response_from_one_committed_version": all(
            phase["responses_from_one_committed_version"] == phase["answered"] and not phase["version_went_backwards"]
            for phase in report["phases"] + report["baselines"]["phases"]),
        "micro_batching_speedup": round(most["qps"] / unbatched["qps"], 2),
        "cli_per_query_over_server_p50": round(cli / one["latency_ms"]["p50"], 1) if one else None,
        "torch_p50_over_onnx_p50_1_client": round(on_torch["latency_ms"]["p50"] / one["latency_ms"]["p50"], 2)
        if one else None,
    }


def markdown(report: dict) -> str:
    index = report["index"]
    lines = [
        "# Serving under load",
        "",
        f"`retriever serve` on {report['machine']['cpus']} CPUs, index `{index['name']}`: {index['documents']:,} real "
        f"passages, {index['model']} (max_length {index['max_length']}), index type `{index['type']}`. Clients send "
        f"single-query GET /search (k=10, mode: {report['settings'].get('mode', DEFAULT_MODE)}) back to back over "
        f"127.0.0.1 for {report['settings']['seconds_per_phase']:.0f} s "
        f"per phase while a writer POSTs {report['settings']['documents_per_write']} documents every "
        f"{report['settings']['write_every_s']:.0f} s.",
        "",
        "| clients | max batch | encoder runtime | q/s | p50 ms | p90 ms | p99 ms | max ms | failed | writes | versions seen | one committed version |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for phase in report["phases"] + report["baselines"]["phases"]:
        latency = phase["latency_ms"]
        ok = phase["responses_from_one_committed_version"] == phase["answered"] and not phase["version_went_backwards"]
        runtime = "onnx (auto)" if phase["runtime"] == "auto" else phase["runtime"]
        lines.append(f"| {phase['clients']} | {phase['max_batch']} | {runtime} | {phase['qps']:,.1f} | {latency['p50']:.1f} | "
                     f"{latency['p90']:.1f} | {latency['p99']:.1f} | {latency['max']:.1f} | {phase['failed']} | "
                     f"{sum(1 for w in phase['writes'] if w['status'] == 201)}/{len(phase['writes'])} | "
                     f"{phase['versions_seen']} | {'all ' + format(phase['answered'], ',') if ok else 'NO'} |")
    check = report["checks"]
    cli = report["baselines"]["cli_per_query"]
    lines += [
        "",
        f"- Failed requests: **{check['failed_requests']}** (target 0).",
        f"- p50 at 1 client: **{check['p50_ms_1_client']} ms** (target <= {TARGETS['p50_ms_1_client']:.0f} ms); "
        f"the CLI per query (a fresh process each, median of {cli['runs']}) takes {cli['median_ms']:,.0f} ms, "
        f"{check['cli_per_query_over_server_p50']}x the server's p50.",
        f"- q/s at {max(p['clients'] for p in report['phases'])} clients: "
        f"**{report['phases'][-1]['qps']:,.1f}** (target >= {TARGETS['qps_16_clients']:.0f}); micro-batching off "
        f"(`--max-batch 1`) gives {next(p for p in report['baselines']['phases'] if p['max_batch'] == 1)['qps']:,.1f}: batching is "
        f"{check['micro_batching_speedup']}x.",
        f"- The encoder on PyTorch instead of ONNX Runtime (`--runtime torch`): p50 at 1 client "
        f"{next(p for p in report['baselines']['phases'] if p['runtime'] == 'torch')['latency_ms']['p50']:.1f} ms, "
        f"{check['torch_p50_over_onnx_p50_1_client']}x the ONNX Runtime p50.",
        f"- Every response from exactly one committed version, never older than the client's previous one: "
        f"**{'yes' if check['every_response_from_one_committed_version'] else 'NO'}**.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
