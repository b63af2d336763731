"""Distributed search (retriever.serve.shards, `retriever serve --engine ray`): segments assigned to shards, a front
whose answers equal the local server's, a failing shard answered by a fast 503, and the whole on Ray Serve."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from retriever.index import Index
from retriever.versions.manifest import SegmentEntry
from retriever.serve.app import create_app
from retriever.errors import RetrieverError
from retriever.search.plan import DensePlan
from retriever.search.top_lists import segment_top_lists
from retriever.serve.shards import SHARD_TIMEOUT_S, VERSIONS_HELD, RayShards, ShardServer, assign_segments
from tests.helpers import build_notes, documents, embed, write_corpus

QUERIES = [record["text"] for record in documents(120)[::4]]  # 30 queries


class InProcessCall:
    """What a Ray Serve handle's `.remote()` returns, for a shard run in this process."""

    def __init__(self, function, *args, fail: Exception | None = None):
        self._function, self._args, self._fail = function, args, fail

    def result(self, timeout_s: float | None = None):
        if self._fail is not None:
            raise self._fail
        return self._function(*self._args)

    def cancel(self) -> None:
        pass


class InProcessHandle:
    """A shard deployment's handle, its methods called in this process (FAIL: every call raises it)."""

    def __init__(self, shard: ShardServer, fail: Exception | None = None):
        self.shard, self.fail = shard, fail
        self.calls = 0

    def __getattr__(self, method: str):
        handle = self

        class Method:
            @staticmethod
            def remote(*args):
                handle.calls += 1
                return InProcessCall(getattr(handle.shard, method), *args, fail=handle.fail)
        return Method


@pytest.fixture()
def index_dir(tmp_path, tiny_bert) -> Path:
    """The notes index in three segments (a build and two adds), with one deletion."""
    folder = build_notes(tmp_path / "indexes", tiny_bert, 120)
    index = Index.open("notes", folder, device="cpu")
    for part in range(2):
        extra = [{"_id": f"x{part}-{i}", "text": f"Extra note {i} of batch {part} about sailing and storms."}
                 for i in range(15)]
        index = index.add(write_corpus(tmp_path / f"extra{part}.jsonl", extra)).open()
    index.delete(["d3"])
    assert len(Index.open("notes", folder, device="cpu").snapshot.segments) == 3
    return folder


def results(client: TestClient, params: dict) -> list[list[tuple[str, float]]]:
    answer = client.post("/search", json={"queries": QUERIES, "k": 10, **params})
    assert answer.status_code == 200, answer.text
    return [[(hit["doc_id"], round(hit["score"], 4)) for hit in record["results"]] for record in answer.json()["queries"]]


def test_segments_are_assigned_largest_first_to_the_least_loaded_shard():
    entries = [SegmentEntry("a", 100), SegmentEntry("b", 60), SegmentEntry("c", 50), SegmentEntry("d", 10)]
    assert assign_segments(entries, 2) == {"a": 0, "b": 1, "c": 1, "d": 0}
    assert assign_segments(list(reversed(entries)), 2) == assign_segments(entries, 2)  # order-free
    assert set(assign_segments(entries, 8).values()) == {0, 1, 2, 3}  # more shards than segments: some hold none


def test_two_shards_answer_exactly_as_the_local_server_in_every_mode(index_dir):
    handles = [InProcessHandle(ShardServer(str(index_dir), number, 2)) for number in range(2)]
    with TestClient(create_app(index_dir, device="cpu", runtime="torch"), base_url="http://127.0.0.1") as local, \
            TestClient(create_app(index_dir, device="cpu", runtime="torch", remote=RayShards(handles)),
                       base_url="http://127.0.0.1") as sharded:
        for params in ({"mode": "dense"}, {"mode": "hybrid"}, {"mode": "keyword"}, {},
                       {"mode": "dense", "where": {"title": {"$ne": "note 5"}}}):
            assert results(sharded, params) == results(local, params), params
        info = sharded.get("/indexes/notes").json()
        assert sorted(info["shards"].values()) == [0, 0, 1] or sorted(info["shards"].values()) == [0, 1, 1]
        assert set(info["shards"]) == {segment["name"] for segment in info["segments"]}
    assert all(handle.calls for handle in handles)  # both shards searched


def test_a_failing_shard_fails_the_request_with_a_503_never_a_partial_answer(index_dir):
    handles = [InProcessHandle(ShardServer(str(index_dir), 0, 2)),
               InProcessHandle(ShardServer(str(index_dir), 1, 2), fail=TimeoutError("no answer in 10 s"))]
    with TestClient(create_app(index_dir, device="cpu", runtime="torch", remote=RayShards(handles)),
                    base_url="http://127.0.0.1") as sharded:
        started = time.perf_counter()
        answer = sharded.get("/search", params={"q": QUERIES[0], "mode": "dense"})
        assert answer.status_code == 503 and time.perf_counter() - started < 5
        assert "shard 1 did not answer (TimeoutError: no answer in 10 s); nothing was merged" in answer.json()["detail"]
        handles[1].fail = None  # the replica replaced: service resumes
        assert sharded.get("/search", params={"q": QUERIES[0], "mode": "dense"}).status_code == 200


class ShardTaskError(Exception):
    """What Ray hands back where a shard's own code raised: that exception as its `cause`."""

    def __init__(self, cause: Exception):
        super().__init__(f"the task raised {cause!r}")
        self.cause = cause


def test_an_error_a_shard_raises_reaches_the_front_as_it_was_raised(index_dir):
    """Only a shard that does not answer is 'did not answer': damage it finds is the index's 503, and a bug in it
    the front's 500, never a retry-later."""
    from retriever.errors import DamagedIndexError

    handles = [InProcessHandle(ShardServer(str(index_dir), 0, 2)),
               InProcessHandle(ShardServer(str(index_dir), 1, 2), fail=ShardTaskError(ZeroDivisionError("a bug")))]
    with TestClient(create_app(index_dir, device="cpu", runtime="torch", remote=RayShards(handles)),
                    base_url="http://127.0.0.1", raise_server_exceptions=False) as sharded:
        answer = sharded.get("/search", params={"q": QUERIES[0], "mode": "dense"})
        assert answer.status_code == 500 and "ZeroDivisionError" in answer.json()["detail"]
        damage = DamagedIndexError("index 'notes' is damaged: segments/000002 cannot be read (x); rebuild the index")
        handles[1].fail = ShardTaskError(damage)
        answer = sharded.get("/search", params={"q": QUERIES[0], "mode": "dense"})
        assert answer.status_code == 503 and answer.json()["code"] == "damaged"
        assert answer.json()["detail"].startswith("index 'notes' is damaged: segments/000002 cannot be read")


def test_a_shard_searches_the_version_it_is_asked_for(index_dir, tmp_path):
    """A write committed meanwhile does not change what a shard answers for the version the front names."""
    before = Index.open("notes", index_dir, device="cpu")
    shard = ShardServer(str(index_dir), 0, 1)
    query = embed(before, [QUERIES[1]])
    version = str(before.snapshot.folder)
    first = shard.top_lists("notes", version, query, DensePlan(5), None)
    before.add(write_corpus(tmp_path / "more.jsonl", [{"_id": "new", "text": QUERIES[1]}]))  # `before` moves on
    again = shard.top_lists("notes", version, query, DensePlan(5), None)
    assert [found[2].tolist() for found in again] == [found[2].tolist() for found in first]


def test_a_version_a_call_still_reads_is_closed_only_once_that_call_is_done(index_dir, tmp_path):
    """A shard keeps its VERSIONS_HELD most recent versions open; one pushed out while a call still searches it
    stays open until that call is answered."""
    shard = ShardServer(str(index_dir), 0, 1)
    index = Index.open("notes", index_dir, device="cpu")
    query = embed(index, [QUERIES[1]])
    with shard.holding("notes", str(index.snapshot.folder)) as (held, mine):  # a call in flight
        for number in range(VERSIONS_HELD):
            extra = write_corpus(tmp_path / f"new{number}.jsonl", [{"_id": f"new{number}", "text": QUERIES[0]}])
            index = index.add(extra).open()
            shard.top_lists("notes", str(index.snapshot.folder), query, DensePlan(5), None)  # pushes the first out
        found = segment_top_lists(held, mine, query, DensePlan(5))  # still readable: the call holds it
        assert found and all((ids >= 0).all() for _, _, ids, _ in found)
    with pytest.raises(RetrieverError, match="was closed"):
        held.segments  # closed once the call let go


# ------------------------------------------------------------------------------------------------ on Ray Serve

@pytest.mark.timeout(420)
@pytest.mark.usefixtures("exclusive_ray")
def test_ray_serve_two_shards_match_the_local_server_hold_the_keys_and_survive_a_killed_replica(index_dir):
    """The distributed server on a local Ray cluster (loopback only): the same top-10 as the local server for 30
    queries; the API keys hold; /metrics parses; a shard replica killed under a bounded load gives 503s and no
    hang, and service resumes once Ray Serve has replaced it."""
    import socket

    import httpx
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    from retriever.serve.access import AccessPolicy
    from retriever.serve.run import serve_on_ray

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    access = AccessPolicy.create(["127.0.0.1"], api_key="write-key-0123456789", read_only_api_key="read-key-0123456789")
    stop = threading.Event()
    server = threading.Thread(target=serve_on_ray, args=(index_dir, "127.0.0.1", port, "cpu", 64, "torch", access,
                                                         2, 1, None, stop), daemon=True)
    server.start()
    base = f"http://127.0.0.1:{port}"
    read = {"Authorization": "Bearer read-key-0123456789"}
    try:
        deadline = time.monotonic() + 180
        while True:  # the cluster, the deployments and the front's model start
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and server.is_alive(), "the distributed server did not start"
            time.sleep(1)
        with TestClient(create_app(index_dir, device="cpu", runtime="torch"), base_url="http://127.0.0.1") as local:
            for params in ({"mode": "dense"}, {}):
                answer = httpx.post(f"{base}/search", json={"queries": QUERIES, "k": 10, **params}, headers=read,
                                    timeout=60)
                assert answer.status_code == 200, answer.text
                distributed = [[hit["doc_id"] for hit in record["results"]] for record in answer.json()["queries"]]
                assert distributed == [[doc for doc, _ in found] for found in results(local, params)]
        assert httpx.get(f"{base}/search", params={"q": "storm"}, timeout=10).status_code == 401
        assert httpx.post(f"{base}/indexes/notes/documents", json={"documents": [{"_id": "z", "text": "z"}]},
                          headers=read, timeout=10).status_code == 403
        metrics = httpx.get(f"{base}/metrics", headers=read, timeout=10)
        names = {family.name for family in text_string_to_metric_families(metrics.text)}
        assert "retriever_requests" in names or "retriever_requests_total" in names, sorted(names)[:20]

        # A shard replica killed under load: every answer is 200 or 503, none hangs, and service resumes.
        shard_actor = next(actor for actor in ray.util.list_named_actors(all_namespaces=True)
                           if "shard-1" in actor["name"] and "REPLICA" in actor["name"].upper())
        codes: list[int] = []
        times: list[float] = []

        def one(number: int) -> None:
            started = time.perf_counter()
            try:
                code = httpx.get(f"{base}/search", params={"q": QUERIES[number % 30], "mode": "dense"}, headers=read,
                                 timeout=30).status_code
            except httpx.TimeoutException:
                code = -1
            codes.append(code)
            times.append(time.perf_counter() - started)

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(one, number) for number in range(20)]
            ray.kill(ray.get_actor(shard_actor["name"], namespace=shard_actor["namespace"]), no_restart=True)
            futures += [pool.submit(one, number) for number in range(20, 80)]
            for future in futures:
                future.result()
        assert set(codes) <= {200, 503}, codes  # never a hang, never a 500 or a partial answer
        assert max(times) < 2 * SHARD_TIMEOUT_S + 3  # a dead shard fails the request fast: no waiting it out
        deadline = time.monotonic() + 120
        while httpx.get(f"{base}/search", params={"q": QUERIES[0], "mode": "dense"}, headers=read,
                        timeout=30).status_code != 200:
            assert time.monotonic() < deadline, "service did not resume after the replica was replaced"
            time.sleep(1)
    finally:
        stop.set()
        server.join(timeout=60)
    assert not server.is_alive()


def test_serve_s_distributed_options_are_checked_in_one_line(cli):
    for given in (["--ray-address", "127.0.0.1:6379"], ["--shards", "2"], ["--replicas", "3"]):  # not ignored
        result = cli("serve", *given)
        assert result.returncode == 1 and result.stderr.strip() == (
            "error: --ray-address, --shards and --replicas are for --engine ray")
    result = cli("serve", "--engine", "ray", "--shards", "0")
    assert result.returncode == 2 and "--shards" in result.stderr
    result = cli("serve", "--engine", "ray", "--host", "0.0.0.0")  # beyond loopback without a key: refused first
    assert result.returncode == 1 and "key" in result.stderr and "Traceback" not in result.stderr
