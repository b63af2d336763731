"""Load with one hostile client among 16 (issue 25): do the well-behaved clients notice it?

    python benchmarks/hostile_load.py --work DIR [--documents 20000] [--seconds 60] [--vectors VECTORS.npy]

The index holds DOCUMENTS real passages of ../shared/data/passages, built once into DIR with the default model
(all-MiniLM-L6-v2, max_length 256) as `benchmarks/serve_load.py` builds its index (hnsw). The server is the real
CLI (`retriever serve`, 127.0.0.1 only). Two phases on the same server, each SECONDS long, with a writer POSTing
10 new passages every 10 s (serve_load's `run_phase`):

  baseline:  16 clients sending single-query GET /search (k=10) back to back;
  hostile:   15 of them, and one client sending, back to back, what the probe of issue 25 found harmful: lone
             surrogates in queries, ids and documents, 256 queries x k=1000, a 1 MB query, invalid and wrongly
             typed JSON, a foreign Host header on a delete (DNS rebinding), bytes that are not HTTP, and a 256 KiB
             header.

Reported: the well-behaved clients' failures (target 0 in both phases), their q/s and latency in the hostile phase
as a ratio of the baseline's, every hostile request's answer by status (target: no 5xx, no dropped answer), and
that the server still answers after. Results go to OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.scale import qnli_questions  # noqa: E402
from benchmarks.serve_load import Server, current_version, prepare, request, run_phase, save_report  # noqa: E402

NAME = "hostile"
CLIENTS = 16
MAX_HOSTILE_REQUESTS = 50_000  # a bound even if the server answered impossibly fast


def hostile_requests(name: str) -> list[tuple[str, bytes]]:
    """(what, the raw HTTP request) for each harmful request; each is sent on its own connection."""

    def post(path: str, body: str | bytes, host: str = "127.0.0.1") -> bytes:
        data = body.encode() if isinstance(body, str) else body
        return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data

    def method(verb: str, path: str, host: str = "127.0.0.1", extra: bytes = b"") -> bytes:
        return f"{verb} {path} HTTP/1.1\r\nHost: {host}\r\n".encode() + extra + b"Connection: close\r\n\r\n"

    return [
        ("lone surrogate in a query", post("/search", f'{{"queries": ["a \\ud800 b"], "index": "{name}"}}')),
        ("lone surrogate among good queries", post(
            "/search", f'{{"queries": ["what is a river", "x \\udfff"], "index": "{name}"}}')),
        ("lone surrogate in a query id", post(
            "/search", f'{{"queries": [{{"id": "\\ud800", "text": "a"}}], "index": "{name}"}}')),
        ("256 queries x k=1000", post("/search", json.dumps({"queries": ["river"] * 256, "k": 1000, "index": name}))),
        ("a 1 MB query", post("/search", json.dumps({"queries": ["word " * 200_000], "index": name}))),
        ("k=true", post("/search", f'{{"queries": ["river"], "k": true, "index": "{name}"}}')),
        ("invalid JSON", post("/search", '{"queries": ["river"')),
        ("100,000-deep JSON", post("/search", "[" * 100_000 + "]" * 100_000)),
        ("lone surrogate in a document", post(
            f"/indexes/{name}/documents", '{"documents": [{"_id": "\\ud800", "text": "bad"}]}')),
        ("undecodable bytes in a document id", method("GET", f"/indexes/{name}/documents/%ED%A0%80%FF")),
        ("delete through a rebound Host", method("DELETE", f"/indexes/{name}/documents/some-id",
                                                 host="rebind.attacker.example")),
        ("not HTTP", b"\x16\x03\x01\x02\x00 definitely not http\r\n\r\n"),
        ("a 256 KiB header", method("GET", "/health", extra=b"X-Big: " + b"a" * 256 * 1024 + b"\r\n")),
    ]


def send_raw(port: int, payload: bytes) -> int | None:
    """The status the server answered PAYLOAD with, or None when no answer came."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
            connection.sendall(payload)
            answer = b""
            while b"\r\n" not in answer:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                answer += chunk
    except OSError:
        return None
    parts = answer.split(b" ", 2)
    return int(parts[1]) if len(parts) > 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else None


def hostile_client(port: int, name: str, seconds: float) -> dict:
    answers: dict[str, Counter] = {what: Counter() for what, _ in hostile_requests(name)}
    stop_at, sent = time.monotonic() + seconds, 0
    cycle = hostile_requests(name)
    while time.monotonic() < stop_at and sent < MAX_HOSTILE_REQUESTS:
        what, payload = cycle[sent % len(cycle)]
        status = send_raw(port, payload)
        answers[what]["no answer" if status is None else str(status)] += 1
        sent += 1
    return {"requests": sent, "answers": {what: dict(counts) for what, counts in answers.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="where the index is built (kept for reruns)")
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--vectors", type=Path, help="the passages' vectors (row i = passage i), to skip encoding")
    parser.add_argument("--seconds", type=float, default=60.0, help="per phase")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "hostile_load")
    args = parser.parse_args()

    index_dir = prepare(args.work, args.vectors, documents=args.documents, name=NAME)
    queries = qnli_questions(2000)
    writes = [json.loads(line) for line in open(args.work / "writes.jsonl", encoding="utf-8")]
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "index": {"name": NAME, "documents": args.documents, "model": "all-MiniLM-L6-v2", "max_length": 256},
        "settings": {"seconds_per_phase": args.seconds, "clients": CLIENTS, "k": 10},
    }
    server = Server(index_dir, max_batch=64)
    try:
        request(server.port, "GET", "/search?q=warm+up&index=" + NAME)
        print(f"baseline: {CLIENTS} clients for {args.seconds:.0f} s", file=sys.stderr)
        report["baseline"] = run_phase(server.port, queries, CLIENTS, args.seconds, writes,
                                       current_version(index_dir, NAME), name=NAME)
        print(f"hostile: {CLIENTS - 1} clients and a hostile one for {args.seconds:.0f} s", file=sys.stderr)
        hostile: dict = {}
        attacker = threading.Thread(target=lambda: hostile.update(hostile_client(server.port, NAME, args.seconds)))
        attacker.start()
        report["hostile"] = run_phase(server.port, queries, CLIENTS - 1, args.seconds, writes[100:],
                                      current_version(index_dir, NAME), name=NAME)
        attacker.join()
        report["hostile"]["attacker"] = hostile
        status, _ = request(server.port, "GET", "/search?q=river&index=" + NAME)
        report["alive_after"] = status == 200
    finally:
        server.stop()
    report["checks"] = checks(report)
    save_report(args.out, report, markdown(report))


def checks(report: dict) -> dict:
    base, hostile = report["baseline"], report["hostile"]
    answers = hostile["attacker"]["answers"]
    server_errors = sum(count for counts in answers.values() for status, count in counts.items()
                        if status == "no answer" or status.startswith("5"))
    return {
        "innocent_failures": base["failed"] + hostile["failed"],
        "innocent_failures_target_met": base["failed"] + hostile["failed"] == 0,
        "hostile_requests": hostile["attacker"]["requests"],
        "hostile_5xx_or_unanswered": server_errors,
        "qps_per_client_hostile_over_baseline": round((hostile["qps"] / (CLIENTS - 1)) / (base["qps"] / CLIENTS), 2),
        "p50_hostile_over_baseline": round(hostile["latency_ms"]["p50"] / base["latency_ms"]["p50"], 2),
        "p99_hostile_over_baseline": round(hostile["latency_ms"]["p99"] / base["latency_ms"]["p99"], 2),
        "every_response_from_one_committed_version": all(
            phase["responses_from_one_committed_version"] == phase["answered"] and not phase["version_went_backwards"]
            for phase in (base, hostile)),
        "alive_after": report["alive_after"],
    }


def markdown(report: dict) -> str:
    check, index = report["checks"], report["index"]
    lines = [
        "# Serving with a hostile client among 16",
        "",
        f"`retriever serve` on {report['machine']['cpus']} CPUs, {index['documents']:,} real passages "
        f"({index['model']}, max_length {index['max_length']}); each phase {report['settings']['seconds_per_phase']:.0f} s "
        "over 127.0.0.1 while a writer POSTs 10 documents every 10 s. Generated by `benchmarks/hostile_load.py`.",
        "",
        "| phase | well-behaved clients | their q/s | p50 ms | p99 ms | their failures | writes committed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, phase in (("baseline", report["baseline"]), ("one hostile client", report["hostile"])):
        lines.append(f"| {label} | {phase['clients']} | {phase['qps']:,.1f} | {phase['latency_ms']['p50']:.1f} | "
                     f"{phase['latency_ms']['p99']:.1f} | {phase['failed']} | "
                     f"{sum(1 for w in phase['writes'] if w['status'] == 201)}/{len(phase['writes'])} |")
    lines += ["", "The hostile client's requests, by the status they got:", "", "| request | answers |", "|---|---|"]
    for what, counts in report["hostile"]["attacker"]["answers"].items():
        lines.append(f"| {what} | {', '.join(f'{status}: {count:,}' for status, count in sorted(counts.items()))} |")
    lines += [
        "",
        f"- Failures of the well-behaved clients: **{check['innocent_failures']}** (target 0).",
        f"- Hostile requests: {check['hostile_requests']:,}; answered 5xx or not at all: "
        f"**{check['hostile_5xx_or_unanswered']}** (target 0). Server alive after: {check['alive_after']}.",
        f"- Per well-behaved client, q/s with the hostile client / without: {check['qps_per_client_hostile_over_baseline']}; "
        f"p50 {check['p50_hostile_over_baseline']}x, p99 {check['p99_hostile_over_baseline']}x. The hostile client "
        "sends back to back, unthrottled, from the same cores as the server and the other clients, and several of "
        "its requests cost the server a full parse (a 1 MB body, 100,000-deep JSON, a 256 KiB header) before the "
        "refusal: it slows the others down, but fails none of them. Bounding one client's rate is a proxy's job "
        "here; the server bounds what each request may cost.",
        f"- Every response from exactly one committed version: "
        f"**{'yes' if check['every_response_from_one_committed_version'] else 'NO'}**.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
