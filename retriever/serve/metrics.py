"""What the server does, in Prometheus' text format (`GET /metrics`, through prometheus-client).

Each app has its own registry (several apps in one process, as in the tests, never mix counts):
- `retriever_requests_total{endpoint, method, status}`: requests answered, by route template (`/search`,
  `/indexes/{name}/documents`; `unmatched` for paths no route takes, so label values stay few);
- `retriever_request_seconds{endpoint}`: their latency;
- `retriever_search_batch_queries`: queries per encoder call of the micro-batcher (how much batching happens);
- `retriever_index_version{index, version}`: 1 for the version each index serves (a new commit swaps the label);
- `retriever_index_documents{index}`: its live documents;
- `retriever_writer_wait_seconds{index}`: how long each write waited for the index's writer lock.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from retriever.versions import folder as version_folder

# Latency buckets from a cached search (~1 ms) to a large write (a minute).
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("retriever_requests", "requests answered", ("endpoint", "method", "status"),
                                registry=self.registry)
        self.latency = Histogram("retriever_request_seconds", "request latency", ("endpoint",), buckets=SECONDS,
                                 registry=self.registry)
        self.batch = Histogram("retriever_search_batch_queries", "queries per encoder call of the micro-batcher",
                               buckets=BATCH, registry=self.registry)
        self.version = Gauge("retriever_index_version", "1 for the version each index serves", ("index", "version"),
                             registry=self.registry)
        self.documents = Gauge("retriever_index_documents", "live documents of the served version", ("index",),
                               registry=self.registry)
        self.writer_wait = Histogram("retriever_writer_wait_seconds", "time a write waited for the writer lock",
                                     ("index",), buckets=SECONDS, registry=self.registry)
        self._served: dict[str, str] = {}

    def serving(self, name: str, version: int, documents: int) -> None:
        """Index NAME now serves VERSION (its number)."""
        version = str(version)
        previous = self._served.get(name)
        if previous != version:
            if previous is not None:
                self.version.remove(name, previous)
            self.version.labels(name, version).set(1)
            self._served[name] = version
        self.documents.labels(name).set(documents)

    def forget(self, name: str) -> None:
        """Index NAME is no longer served (removed)."""
        previous = self._served.pop(name, None)
        if previous is not None:
            self.version.remove(name, previous)
            self.documents.remove(name)

    def observe_lock_wait(self, name: str, seconds: float) -> None:
        self.writer_wait.labels(name).observe(seconds)

    def start(self) -> None:
        version_folder.LOCK_WAIT_OBSERVERS.append(self.observe_lock_wait)

    def stop(self) -> None:
        if self.observe_lock_wait in version_folder.LOCK_WAIT_OBSERVERS:
            version_folder.LOCK_WAIT_OBSERVERS.remove(self.observe_lock_wait)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class RequestMetrics:
    """ASGI middleware counting and timing every HTTP request by the route that answered it."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(endpoint, scope.get("method", ""), str(status[0])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
