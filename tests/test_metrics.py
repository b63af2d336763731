"""`GET /metrics`: Prometheus' text format, parsed by the Prometheus client's own parser; what it counts follows
what the server did."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from retriever.index import Index
from retriever.serve.app import create_app
from tests.helpers import build_notes, documents


def scrape(client) -> dict[str, list]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {family.name: family.samples for family in text_string_to_metric_families(response.text)}


def value(samples: list, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_count_requests_batches_versions_and_writer_waits(tmp_path, tiny_bert):
    index_dir = build_notes(tmp_path / "indexes", tiny_bert, 40)
    with TestClient(create_app(index_dir, device="cpu"), base_url="http://127.0.0.1") as client:
        texts = [d["text"] for d in documents(40)[:5]]
        for text in texts:
            assert client.get("/search", params={"q": text, "k": 3}).status_code == 200
        assert client.post("/search", json={"queries": texts, "k": 2}).status_code == 200
        assert client.get("/search", params={"q": "x", "k": 0}).status_code == 422
        assert client.get("/no/such/path").status_code == 404
        first = scrape(client)
        requests = first["retriever_requests"]
        assert value(requests, "retriever_requests_total", endpoint="/search", method="GET", status="200") == 5
        assert value(requests, "retriever_requests_total", endpoint="/search", method="POST", status="200") == 1
        assert value(requests, "retriever_requests_total", endpoint="/search", status="422") == 1
        assert value(requests, "retriever_requests_total", endpoint="unmatched", status="404") == 1
        assert value(first["retriever_request_seconds"], "retriever_request_seconds_count", endpoint="/search") == 7
        batches = first["retriever_search_batch_queries"]
        assert value(batches, "retriever_search_batch_queries_sum") == 10  # every query went through a batch
        served = str(Index.open("notes", index_dir, device="cpu").snapshot.manifest.version)
        assert value(first["retriever_index_version"], "retriever_index_version", index="notes", version=served) == 1
        assert value(first["retriever_index_documents"], "retriever_index_documents", index="notes") == 40

        added = client.post("/indexes/notes/documents", json={"documents": [{"_id": "new", "text": "a new note"}]})
        assert added.status_code == 201
        client.get("/search", params={"q": "a new note", "k": 1})  # the next request serves the new version
        second = scrape(client)
        versions = [s for s in second["retriever_index_version"] if s.labels["index"] == "notes"]
        assert [(s.labels["version"], s.value) for s in versions] == [(str(added.json()["version"]), 1.0)]
        assert value(second["retriever_index_documents"], "retriever_index_documents", index="notes") == 41
        assert value(second["retriever_writer_wait_seconds"], "retriever_writer_wait_seconds_count", index="notes") == 1
