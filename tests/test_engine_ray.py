"""`--engine ray` end to end on real Ray clusters, loopback only: a local cluster of this machine and a simulated
three-node cluster (`ray.cluster_utils.Cluster`). Each test runs under a timeout: a hung cluster fails the test
instead of the suite."""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray engine's tests need the extra: pip install 'retriever[ray]'")

from retriever.engines.ray_build import RayOptions, loopback_only, ray_cluster  # noqa: E402
from retriever.errors import RetrieverError  # noqa: E402
from retriever.index import Index  # noqa: E402

pytestmark = pytest.mark.usefixtures("exclusive_ray")

QUERIES = ["how do I compress a file", "the meaning of a word", "a verse about the lord", "kernel memory",
           "package for python development"]


@pytest.fixture(scope="module")
def passages(shared_data, tmp_path_factory) -> Path:
    """1,200 real passages (every 900th of ../shared/data/passages), one BEIR .jsonl file, each with metadata (a
    number and a bucket of 7) that every engine must keep."""
    path = tmp_path_factory.mktemp("passages") / "passages.jsonl"
    with gzip.open(shared_data / "passages" / "passages.jsonl.gz", "rt", encoding="utf-8") as source:
        lines = [line for number, line in enumerate(source) if number % 900 == 0][:1200]
    records = [{**json.loads(line), "metadata": {"n": number, "bucket": number % 7}} for number, line in enumerate(lines)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model(tiny_bert) -> str:
    """The model every build here encodes with: the tiny random BERT. What these tests compare is the engines'
    encode path, segments and search, which any model exercises alike; the default model took half a minute to
    encode the passages, each build again (the default model's config rebuilt by an encode worker:
    tests/test_engine_workers.py)."""
    return str(tiny_bert)


# Calibrator none in the comparisons: the two engines' raw vectors differ by ~1e-7 (their batches pad differently),
# and a fitted calibrator does not keep that small: the flow's Adam steps turn it into ~1e-3, whitening swaps its
# near-null directions. What is compared is the encode path, the segments and the search over them. (On these
# passages the neighbouring scores of a query's top 10 differ by 3e-5 or more, far above that noise.)
@pytest.fixture(scope="module")
def local_index(passages, model, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("local-home")
    Index.build(passages, "local", home, model=model, calibrator="none")
    return home


def listening_addresses() -> set[str]:
    """IPv4 and IPv6 addresses with a TCP socket in LISTEN state on this machine (from /proc/net)."""
    found = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            raw = bytes.fromhex(fields[1].split(":")[0])
            words = struct.unpack("<" + "I" * (len(raw) // 4), raw)
            found.add(socket.inet_ntop(family, struct.pack(">" + "I" * len(words), *words)) + ":" +
                      str(int(fields[1].split(":")[1], 16)))
    return found


def assert_loopback(addresses: set[str]) -> None:
    assert addresses, "the cluster should listen somewhere"
    assert all(address.startswith(("127.0.0.1:", "::ffff:127.0.0.1:", "::1:")) for address in addresses), addresses


def calibrated_by_rowid(index: Index) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([segment.vectors.ids() for segment in index.snapshot.segments])
    vectors = np.concatenate([segment.vectors.stored_vectors() for segment in index.snapshot.segments])
    order = np.argsort(ids)
    return ids[order], vectors[order]


def assert_same_index(built: Index, reference: Index) -> None:
    ids, vectors = calibrated_by_rowid(built)
    reference_ids, reference_vectors = calibrated_by_rowid(reference)
    assert np.array_equal(ids, reference_ids)
    np.testing.assert_allclose(vectors, reference_vectors, atol=1e-5)
    for got, expected in zip(built.search(QUERIES, k=10, mode="dense"), reference.search(QUERIES, k=10, mode="dense")):
        assert [hit.doc_id for hit in got] == [hit.doc_id for hit in expected]
    # The workers' segments carry the same keyword index: keyword search ranks and scores alike.
    assert all(segment.keywords is not None for segment in built.snapshot.segments)
    assert built.search(QUERIES, k=10, mode="keyword") == reference.search(QUERIES, k=10, mode="keyword")
    # ... and the same metadata: filtered searches agree, and every hit has its document's own.
    filtered = built.search(QUERIES, k=10, mode="dense", where={"bucket": 3})
    expected = reference.search(QUERIES, k=10, mode="dense", where={"bucket": 3})
    assert [[(hit.doc_id, hit.metadata) for hit in hits] for hits in filtered] == \
        [[(hit.doc_id, hit.metadata) for hit in hits] for hits in expected]
    assert all(hit.metadata["bucket"] == 3 and hit.metadata["n"] % 7 == 3 for hits in filtered for hit in hits)


@dataclass
class LocalCluster:
    started: bool  # what `ray_cluster` yielded: a cluster it started
    listening: set[str]  # addresses it began to listen on
    resources: dict


@pytest.fixture(scope="class")
def local_cluster(tmp_path_factory):
    """One local cluster, as `ray_cluster(None)` (what `retriever build --engine ray` does) starts it, for the tests
    of TestInOneLocalCluster: starting and stopping one costs several seconds. It runs under an index home of its
    own ($RETRIEVER_HOME reaches the processes Ray starts), and is stopped when the class is done."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RETRIEVER_HOME", str(tmp_path_factory.mktemp("cluster-home")))
        before = listening_addresses()
        with ray_cluster(None) as started:
            yield LocalCluster(started, listening_addresses() - before, ray.cluster_resources())
    assert not ray.is_initialized()  # ...and the cluster ray_cluster started is stopped


@pytest.mark.timeout(300)
class TestInOneLocalCluster:
    """Builds, and a failing encode stage, in a cluster already running in this process: a build uses it and
    leaves it running. (Builds that start and stop their own cluster: the failure and worker-death tests below.)
    The failing encode stage comes last: nothing runs after it on that cluster."""

    def test_local_cluster_build_equals_the_local_engine_and_binds_loopback_only(self, local_cluster, passages,
                                                                                  model, local_index, tmp_path):
        assert local_cluster.started
        assert_loopback(local_cluster.listening)
        resources = local_cluster.resources
        assert resources["CPU"] == (os.cpu_count() or 1) + 1
        context = ray.data.DataContext.get_current()
        settings = context.enable_progress_bars, logging.getLogger("ray.data").level
        summary = Index.build(passages, "ray", tmp_path, model=model, engine="ray", calibrator="none",
                              ray_options=RayOptions(workers=2, batch_rows=200))
        assert ray.is_initialized()  # a cluster it did not start is left running
        # ...and so are the caller's Ray Data settings (the build quiets Ray Data only while it runs)
        assert (context.enable_progress_bars, logging.getLogger("ray.data").level) == settings
        built = Index.open("ray", tmp_path, device="cpu")
        assert summary.documents == len(built) == 1200
        assert built.snapshot.manifest.engine["workers"] == 2
        assert built.snapshot.manifest.engine["workers"] * built.snapshot.manifest.engine["cpus_per_worker"] < resources["CPU"]
        assert_same_index(built, Index.open("local", local_index, device="cpu"))

        # An ordinary version: add, delete and compact work on it unchanged.
        extra = tmp_path / "extra.jsonl"
        extra.write_text(json.dumps({"_id": "new-1", "text": "a brand new document about gzip compression"}) + "\n")
        built.add(extra)
        Index.open("ray", tmp_path).delete([built.search("gzip", k=1)[0].doc_id])
        Index.open("ray", tmp_path).compact()
        assert len(Index.open("ray", tmp_path)) == 1200

    def test_a_folder_of_files_builds_on_ray_as_on_the_local_engine_and_syncs(self, local_cluster, model, tmp_path):
        from tests.files_folder import LAST_SENTENCES, make_folder

        folder = make_folder(tmp_path / "mine")
        ray_built = Index.build(folder, "ray", tmp_path / "ray-home", model=model, engine="ray", calibrator="none",
                                ray_options=RayOptions(batch_rows=100))
        assert "skipped reports/broken.pdf: a damaged PDF" in "\n".join(ray_built.notes)
        local_built = Index.build(folder, "local", tmp_path / "local-home", model=model, calibrator="none")
        with Index.open("ray", tmp_path / "ray-home") as on_ray, Index.open("local", tmp_path / "local-home") as local:
            for doc_id in LAST_SENTENCES:
                one, other = on_ray.document(doc_id), local.document(doc_id)
                assert (one["title"], one["text"], one["metadata"]) == (other["title"], other["text"],
                                                                         other["metadata"]), doc_id
            assert len(on_ray) == len(local) == ray_built.documents == local_built.documents == len(LAST_SENTENCES)
            assert on_ray.snapshot.manifest.folder == local.snapshot.manifest.folder
            assert not list((tmp_path / "ray-home").rglob("folder-documents.jsonl"))
            (folder / "journal.txt").unlink()
            assert on_ray.sync().deleted == 1  # the folder a Ray build read syncs like any other

    def test_the_driver_fits_auto_with_the_same_pseudo_queries_and_the_fit_queries(self, local_cluster, passages,
                                                                                       model, tmp_path):
        small = tmp_path / "small.jsonl"
        small.write_text("".join(passages.read_text(encoding="utf-8").splitlines(keepends=True)[:400]),
                         encoding="utf-8")
        summary = Index.build(small, "fq", tmp_path, model=model, engine="ray", calibrator="auto",
                              fit_queries=QUERIES * 4, ray_options=RayOptions(batch_rows=100))
        built = Index.open("fq", tmp_path, device="cpu")
        assert summary.documents == 400
        assert built.snapshot.manifest.fit["queries"] == 20 and built.snapshot.manifest.fit["queries_from"] == "given"
        assert built.snapshot.manifest.calibrator["name"] == "auto" and built.snapshot.calibrator.fitted
        assert [hit.doc_id for hit in built.search("kernel memory", k=3)]
        # the driver read the sampled documents' texts from the corpus file: the pseudo-queries any build makes of
        # them
        from collections import Counter

        from retriever.corpus import read_corpus
        from retriever.calibration.pseudo_queries import sample_pseudo_queries

        documents = read_corpus(small)
        made, _ = sample_pseudo_queries(400, lambda rows: [(documents[i].title, documents[i].text) for i in rows],
                                        np.random.default_rng(built.snapshot.calibrator.seed), built.snapshot.calibrator.seed)
        check = built.snapshot.manifest.calibrator["decision"]["check"]
        read = check["pseudo_queries"]  # the first of them, as many as the check's rounds needed
        assert check["planned"] == len(made) > 300 and read in (250, len(made)) and check["pool"] == 400
        assert check["kinds"] == dict(sorted(Counter(query.kind for query in made[:read]).items()))

    @pytest.mark.timeout(180)
    def test_a_model_missing_on_a_node_fails_the_encode_stage_in_one_line(self, local_cluster, tmp_path, tiny_bert):
        """What a node without the model does: the actor's constructor fails there, the driver gets one line."""
        from retriever.encode.encoder import Encoder
        from retriever.engines.ray_build import run_iter
        from retriever.engines.workers import EncodeWorker

        config = {**Encoder(str(tiny_bert), device="cpu").config(), "model": str(tmp_path / "only-on-the-driver")}
        (tmp_path / "shards").mkdir()
        with ray_cluster(None):
            dataset = ray.data.from_items([{"rowid": 1, "doc_id": "a", "title": "", "text": "x", "source": "s",
                                            "line": 1}]).map_batches(
                EncodeWorker, fn_constructor_kwargs={"config": config, "shard_dir": str(tmp_path / "shards")},
                compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1)
            with pytest.raises(RetrieverError, match=r"^on \S+: .*only-on-the-driver"):
                list(run_iter(lambda: dataset.iter_batches(batch_size=None)))


@pytest.mark.timeout(300)
def test_a_three_node_cluster_builds_the_same_index(passages, model, local_index, tmp_path):
    from ray.cluster_utils import Cluster

    before = listening_addresses()
    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1",
                                                                 "include_dashboard": False})
    try:
        with loopback_only():
            for _ in range(2):
                cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        assert_loopback(listening_addresses() - before)
        summary = Index.build(passages, "ray3", tmp_path, model=model, engine="ray", calibrator="none",
                              ray_options=RayOptions(address=cluster.address, batch_rows=150))
        assert not ray.is_initialized()
    finally:
        ray.shutdown()
        cluster.shutdown()
    built = Index.open("ray3", tmp_path, device="cpu")
    assert summary.documents == 1200
    assert built.snapshot.manifest.engine["workers"] == 2  # 3 CPUs, one left to the read stage
    assert_same_index(built, Index.open("local", local_index, device="cpu"))


@pytest.mark.timeout(240)
def test_a_failed_ray_build_is_one_line_and_keeps_the_previous_index(passages, model, tmp_path):
    Index.build(passages, "kept", tmp_path, model=model, calibrator="none")
    current = (tmp_path / "kept").resolve()
    bad = tmp_path / "bad.jsonl"
    lines = passages.read_text(encoding="utf-8").splitlines()
    lines[1000] = '{"_id": "broken", "text": "no closing brace"'
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(RetrieverError, match=r"^\S*bad.jsonl line 1001: not valid JSON"):
        Index.build(bad, "kept", tmp_path, model=model, engine="ray", ray_options=RayOptions(batch_rows=300),
                    replace=True)
    assert not ray.is_initialized()
    assert (tmp_path / "kept").resolve() == current and len(Index.open("kept", tmp_path)) == 1200
    assert not list((tmp_path / ".versions" / "kept").glob("*.partial"))  # the failed build's folder is gone


@pytest.mark.timeout(120)
def test_an_unreachable_cluster_is_one_line(passages, cli):
    result = cli("build", str(passages), "--name", "x", "--engine", "ray", "--ray-address", "127.0.0.1:9")
    assert result.returncode == 1
    assert result.stderr.strip().startswith("error: cannot reach a Ray cluster at 127.0.0.1:9")
    assert len(result.stderr.strip().splitlines()) == 1
    result = cli("build", str(passages), "--name", "x", "--workers", "2")
    assert result.returncode != 0 and "are for --engine ray" in result.stderr


def encode_actor_pids() -> set[int]:
    """Processes of this machine that are Ray's encode actors (Ray names an actor's process after its class)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if command.startswith(b"ray::MapWorker(MapBatches(EncodeWorker))"):
                found.add(int(entry.name))
    return found


class ActorKiller:
    """Kills encode actors (SIGKILL, as the out-of-memory killer or a lost node does) while a build runs, from a
    thread: the first AFTER_SHARDS shards written, then up to TIMES actors in all, each as soon as it appears."""

    def __init__(self, partial_glob: str, root: Path, after_shards: int, times: int):
        import threading

        self.root, self.pattern, self.after_shards, self.times = root, partial_glob, after_shards, times
        self.killed: list[tuple[int, int]] = []  # (pid, shards written when it was killed)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def shards(self) -> int:
        return len(list(self.root.glob(self.pattern)))

    def run(self) -> None:
        import signal
        import time

        while not self.stop.is_set() and len(self.killed) < self.times:
            written = self.shards()
            if written >= self.after_shards:
                for pid in encode_actor_pids() - {pid for pid, _ in self.killed}:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    self.killed.append((pid, written))
                    break
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_build_is_restarted_and_the_build_is_the_same(passages, model, local_index, tmp_path):
    # Batches of 100: 12 shards. The tiny model encodes one in a fraction of a second, so more, smaller batches keep
    # the build going long enough (over 2 s) for the kill to land with batches still to encode.
    with ActorKiller(".versions/killed/*.partial/shards/*.npy", tmp_path, after_shards=1, times=1) as killer:
        summary = Index.build(passages, "killed", tmp_path, model=model, engine="ray", calibrator="none",
                              ray_options=RayOptions(batch_rows=100))
    assert len(killer.killed) == 1 and 1 <= killer.killed[0][1] < 12  # killed with batches still to encode
    assert summary.documents == 1200
    assert_same_index(Index.open("killed", tmp_path, device="cpu"), Index.open("local", local_index, device="cpu"))


# Loaded by every Python process Ray starts (it starts them with the driver's environment): once
# retriever.engines.workers is imported there, each batch an encode actor takes waits SLOW_BATCH seconds first. A
# build of 12 batches then lasts long enough for the killer to kill an actor as often as it means to however
# loaded the machine is, instead of racing a build that may finish first.
SLOW_BATCH = 0.5
SLOW_WORKERS = f"""
import importlib.abc, importlib.util, sys, time

class _Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "retriever.engines.workers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loaded = spec.loader.exec_module

        def exec_module(module):
            loaded(module)
            encode = module.EncodeWorker.__call__

            def slow(worker, batch):
                time.sleep({SLOW_BATCH})
                return encode(worker, batch)
            module.EncodeWorker.__call__ = slow
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Slow())
"""


# Loaded like SLOW_WORKERS: every encode actor, and every restart of one, notes its pid in the file
# RETRIEVER_TEST_DEATHS names and kills itself (SIGKILL, as the out-of-memory killer does) as it takes its first
# batch. The actors then die as often as Ray restarts them, whatever the machine's load: no killer races the build.
DYING_WORKERS = SLOW_WORKERS.replace(f"time.sleep({SLOW_BATCH})", """import os, signal
                with open(os.environ["RETRIEVER_TEST_DEATHS"], "a") as deaths:
                    deaths.write(f"{os.getpid()}\\n")
                os.kill(os.getpid(), signal.SIGKILL)""")


@pytest.mark.timeout(300)
def test_a_worker_that_keeps_dying_fails_the_build_in_one_line_and_keeps_the_previous_index(passages, model,
                                                                                            tmp_path, monkeypatch):
    import retriever.engines.ray_build as ray_build

    # One restart instead of the default's three: the same path to the same failure, two worker starts sooner.
    monkeypatch.setattr(ray_build, "WORKER_RESTARTS", 1)
    WORKER_RESTARTS = 1
    Index.build(passages, "kept", tmp_path, model=model, calibrator="none")
    current = (tmp_path / "kept").resolve()
    (tmp_path / "dying").mkdir()
    (tmp_path / "dying" / "sitecustomize.py").write_text(DYING_WORKERS)
    deaths = tmp_path / "deaths.txt"
    monkeypatch.setenv("RETRIEVER_TEST_DEATHS", str(deaths))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "dying"),
                                                                   os.environ.get("PYTHONPATH")])))
    with pytest.raises(RetrieverError, match=f"^an encode worker died {WORKER_RESTARTS + 1} times") as failure:
        Index.build(passages, "kept", tmp_path, model=model, engine="ray", calibrator="none",
                    ray_options=RayOptions(batch_rows=100), replace=True)
    assert len(set(deaths.read_text().split())) >= WORKER_RESTARTS + 1  # each a process of its own, killed
    assert "\n" not in str(failure.value) and "previous index is unchanged" in str(failure.value)
    assert not ray.is_initialized()
    assert (tmp_path / "kept").resolve() == current and len(Index.open("kept", tmp_path)) == 1200
    assert not list((tmp_path / ".versions" / "kept").glob("*.partial"))
