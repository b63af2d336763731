import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.store.vectors import VectorStore, train_template
from retriever.store.spec import IndexSpec, choose_spec, default_nlist


def normalized(rng, n, dim):
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    # Clustered, like real embeddings: IVF buckets then mean something.
    centers = normalized(rng, 50, 64)
    vectors = centers[rng.integers(0, 50, 5000)] + 0.35 * normalized(rng, 5000, 64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = rng.permutation(np.arange(100, 100 + 3 * len(vectors), 3))  # sparse, shuffled: ids are not positions
    queries = centers[rng.integers(0, 50, 100)] + 0.35 * normalized(rng, 100, 64)
    return ids, vectors.astype(np.float32), (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)


def brute_force(ids, vectors, queries, k):
    scores = queries @ vectors.T
    order = np.argsort(-scores, axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


def recall(found, expected):
    return np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, expected)])


def store_with(data, index_type="flat", **kwargs):
    ids, vectors, _ = data
    spec = IndexSpec(type=index_type, **kwargs).for_dim(vectors.shape[1])
    store = VectorStore.create(vectors.shape[1], spec, train_template(spec, vectors), device="cpu")
    store.add(ids, vectors)
    return store


@pytest.fixture(scope="module")
def stores(data):
    """One store of each type, built once (hnsw and the IVF trainings are the slow part)."""
    return {kind: store_with(data, kind) for kind in ("flat", "hnsw", "ivf", "ivfpq")}


def test_flat_search_is_exact(data, stores):
    ids, vectors, queries = data
    scores, found = stores["flat"].search(queries, 10)
    expected_scores, expected_ids = brute_force(ids, vectors, queries, 10)
    assert found.dtype == np.int64 and scores.dtype == np.float32 and found.shape == (100, 10)
    np.testing.assert_array_equal(found, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
    store = stores["flat"]
    assert (store.ntotal, store.dim, store.index_type, store.backend) == (5000, 64, "flat", "faiss-cpu")


@pytest.mark.parametrize("kind", ["hnsw", "ivf", "ivfpq"])
def test_approximate_types_find_the_exact_neighbours_at_their_defaults(data, stores, kind):
    ids, vectors, queries = data
    _, expected = brute_force(ids, vectors, queries, 10)
    _, found = stores[kind].search(queries, 10 if kind != "ivfpq" else 100)
    if kind == "ivfpq":  # codes are approximate: the exact top 10 must be among its top 100 (the index re-ranks)
        assert np.mean([len(set(e) & set(f)) / 10 for e, f in zip(expected, found)]) >= 0.95
    else:
        assert recall(found, expected) >= 0.95
    assert set(np.unique(found)) <= set(ids)


def test_ivf_scans_more_buckets_with_a_larger_nprobe(data, stores):
    ids, vectors, queries = data
    _, expected = brute_force(ids, vectors, queries, 10)
    narrow = recall(stores["ivf"].search(queries, 10, nprobe=1)[1], expected)
    wide = recall(stores["ivf"].search(queries, 10, nprobe=stores["ivf"].spec.nlist)[1], expected)
    assert wide == 1.0 and narrow < wide  # every bucket scanned is exact search


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq"])
def test_excluded_ids_never_come_back_and_k_others_take_their_place(data, stores, kind):
    ids, vectors, queries = data
    store = stores[kind]
    _, before = store.search(queries, 5)
    excluded = np.unique(before[before >= 0])
    scores, after = store.search(queries, 10, exclude=excluded, nprobe=store.spec.nlist)
    assert not np.isin(after, excluded).any()
    assert (after >= 0).all()  # still 10 hits per query
    if kind == "flat":
        keep = ~np.isin(ids, excluded)
        np.testing.assert_array_equal(after, brute_force(ids[keep], vectors[keep], queries, 10)[1])


def test_single_query_and_padding_when_fewer_than_k():
    rng = np.random.default_rng(1)
    vectors = normalized(rng, 3, 8)
    for index_type in ("flat", "hnsw"):
        store = VectorStore.create(8, index_type, device="cpu")
        store.add(np.array([5, 6, 7]), vectors)
        scores, found = store.search(vectors[1], 5)  # a 1-d query is one query
        assert found.shape == (1, 5)
        assert found[0, 0] == 6 and sorted(found[0, :3]) == [5, 6, 7]
        assert list(found[0, 3:]) == [-1, -1] and np.isneginf(scores[0, 3:]).all()
        _, found = store.search(vectors[1], 5, exclude=np.array([6]))
        assert sorted(found[0, :2]) == [5, 7] and list(found[0, 2:]) == [-1, -1, -1]


def test_an_ivf_index_of_a_few_vectors_trains_without_faiss_warning(capfd):
    """From a CLI QA run: a 25-document ivf build printed FAISS's "WARNING clustering 25 points to 1 centroids"."""
    vectors = normalized(np.random.default_rng(2), 25, 8)
    spec = choose_spec(25, 8, "ivf")
    template = train_template(spec, vectors)
    assert template is not None and "WARNING" not in capfd.readouterr().err


@pytest.mark.parametrize("opq", [False, True])
def test_an_ivfpq_index_of_a_few_thousand_vectors_trains_without_faiss_warnings(capfd, opq):
    """From a QA run: ivfpq on 3,000 documents printed FAISS's clustering warning 96 times (each part's 256 codes),
    with --opq 400 times; the codes train as before, and a store of them finds a vector's own row."""
    vectors = normalized(np.random.default_rng(3), 3000, 32)
    spec = IndexSpec.from_dict({"type": "ivfpq", "opq": opq}).for_dim(32)
    template = train_template(spec, vectors)
    assert template.is_trained and "WARNING" not in capfd.readouterr().err
    store = VectorStore(template, spec, device="cpu")
    store.add(np.arange(3000), vectors)
    assert store.search(vectors[:50], 1)[1][:, 0].tolist() == list(range(50))


def test_a_vector_index_that_does_not_fit_on_disk_is_an_os_error_and_nothing_on_stderr(tmp_path, capfd,
                                                                                       monkeypatch):
    """From a crash QA run: with a few KiB free, FAISS's own file printed "file ... close error: No space left on
    device" with no line end, glued to the command's error line."""
    import errno
    import io

    import retriever.store.vectors as vectors_module

    store = VectorStore.create(8, "flat", device="cpu")
    store.add(np.arange(500), normalized(np.random.default_rng(3), 500, 8))

    class FullDisk(io.RawIOBase):
        def __init__(self, *args, **kwargs):
            self.written = 0

        def writable(self):
            return True

        def write(self, data):
            self.written += len(data)
            if self.written > 4096:
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(data)

        def fileno(self):
            raise AssertionError("not reached")

    monkeypatch.setattr(vectors_module, "open", FullDisk, raising=False)
    with pytest.raises(OSError) as raised:
        store.save(tmp_path / "vectors.faiss")
    assert raised.value.errno == errno.ENOSPC and capfd.readouterr().err == ""


def test_hnsw_returns_k_results_even_beyond_ef_search(data):
    ids, vectors, queries = data
    store = VectorStore.create(64, "hnsw", ef_search=16, device="cpu")
    store.add(ids[:1000], vectors[:1000])
    _, found = store.search(queries[:3], 200)
    assert (found >= 0).all() and all(len(set(row)) == 200 for row in found)


def test_empty_store_returns_only_padding():
    scores, found = VectorStore.create(4, device="cpu").search(np.eye(4, dtype=np.float32), 2)
    assert (found == -1).all() and np.isneginf(scores).all()


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq"])
def test_save_load_roundtrip(tmp_path, data, stores, kind):
    _, _, queries = data
    store = stores[kind]
    path = tmp_path / "vectors.faiss"
    store.save(path)
    assert not (tmp_path / "vectors.faiss.partial").exists()
    loaded = VectorStore.load(path, store.spec, device="cpu")
    assert (loaded.ntotal, loaded.dim, loaded.index_type) == (store.ntotal, store.dim, kind)
    assert sorted(loaded.ids()) == sorted(store.ids())
    for got, expected in zip(loaded.search(queries, 10), store.search(queries, 10)):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kind", ["ivf", "ivfpq"])
def test_mapped_ivf_lists_are_read_by_the_search_without_prefetching_threads(tmp_path, data, stores, kind):
    import faiss

    _, _, queries = data
    path = tmp_path / "vectors.faiss"
    stores[kind].save(path)
    loaded = VectorStore.load(path, stores[kind].spec, device="cpu")
    lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(loaded._index).invlists)
    # mapped, not read: FAISS would start prefetching threads for every search of such lists
    assert isinstance(lists, faiss.OnDiskInvertedLists) and lists.prefetch_nthread == 0
    read = VectorStore.load(path, stores[kind].spec, device="cpu", mmap=False)
    for mapped, whole in zip(loaded.search(queries, 10), read.search(queries, 10)):
        np.testing.assert_array_equal(mapped, whole)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq"])
def test_merged_keeps_every_vector_but_the_excluded(data, kind):
    ids, vectors, queries = data
    spec = IndexSpec(type=kind).for_dim(64)
    template = train_template(spec, vectors)
    parts = []
    for part in np.array_split(np.arange(len(ids)), 3):
        store = VectorStore.create(64, spec, template, device="cpu")
        store.add(ids[part], vectors[part])
        parts.append(store)
    whole = VectorStore.create(64, spec, template, device="cpu")
    whole.add(ids, vectors)
    dropped = np.sort(ids[::7])
    merged = VectorStore.merged(parts, [dropped] * len(parts), spec, template)
    assert sorted(merged.ids()) == sorted(set(ids) - set(dropped))
    expected = whole.search(queries, 10, exclude=dropped)
    if kind in ("flat", "ivf", "ivfpq"):  # same vectors or codes in the same buckets: the same answers
        np.testing.assert_array_equal(merged.search(queries, 10)[1], expected[1])
    else:
        assert recall(merged.search(queries, 10)[1], expected[1]) >= 0.95
    assert parts[0].ntotal == len(np.array_split(np.arange(len(ids)), 3)[0])  # sources untouched


def test_torch_backend_equals_faiss_flat(data):
    ids, vectors, queries = data
    faiss_store = store_with(data)
    torch_store = VectorStore.create(64, "flat", device="cpu", backend="torch")
    torch_store.add(ids, vectors)
    torch_store._get_searcher().chunk_bytes = 7 * len(ids) * 4  # force several chunks of 7 queries
    assert torch_store.backend == "torch-cpu"
    faiss_scores, faiss_ids = faiss_store.search(queries, 10)
    torch_scores, torch_ids = torch_store.search(queries, 10)
    np.testing.assert_array_equal(torch_ids, faiss_ids)
    np.testing.assert_allclose(torch_scores, faiss_scores, atol=1e-5)
    excluded = np.sort(faiss_ids[:, 0])
    np.testing.assert_array_equal(torch_store.search(queries, 10, exclude=excluded)[1],
                                  faiss_store.search(queries, 10, exclude=excluded)[1])


def test_torch_backend_filters_as_faiss_does(data):
    """A narrow filter (its rows gathered) and a wide one (the rest masked) return what faiss' selector does,
    ids not in the index are ignored, and a filter with fewer matches than k pads the row."""
    ids, vectors, queries = data
    faiss_store = store_with(data)
    torch_store = VectorStore.create(64, "flat", device="cpu", backend="torch")
    order = np.random.default_rng(3).permutation(len(ids))  # ids not in insertion order
    torch_store.add(ids[order], vectors[order])
    for share in (0.05, 0.8):
        include = np.sort(np.concatenate([ids[: int(share * len(ids))], [ids.max() + 5]]))
        for _ in range(2):  # the second search reuses the selection made for the same array
            np.testing.assert_array_equal(torch_store.search(queries, 10, include=include)[1],
                                          faiss_store.search(queries, 10, include=include)[1])
    scores, found = torch_store.search(queries[:1], 10, include=np.sort(ids[:3]))
    assert sorted(found[0, :3]) == sorted(ids[:3]) and (found[0, 3:] == -1).all() and np.isneginf(scores[0, 3:]).all()


def test_torch_backend_pads_when_fewer_than_k():
    store = VectorStore.create(4, backend="torch", device="cpu")
    store.add(np.array([3, 9]), np.eye(4, dtype=np.float32)[:2])
    scores, found = store.search(np.eye(4, dtype=np.float32)[1], 3)
    assert found.tolist() == [[9, 3, -1]] and scores[0, 0] == pytest.approx(1) and np.isneginf(scores[0, 2])


def test_shape_and_value_errors():
    store = VectorStore.create(4, device="cpu")
    eye = np.eye(4, dtype=np.float32)
    with pytest.raises(RetrieverError, match=r"shape \(2, 3\); this index holds 4-dimensional vectors"):
        store.add(np.array([1, 2]), np.ones((2, 3), np.float32))
    with pytest.raises(RetrieverError, match=r"queries have shape \(1, 5\)"):
        store.search(np.ones((1, 5), np.float32), 1)
    with pytest.raises(RetrieverError, match="got 4 vectors but ids of shape"):
        store.add(np.array([1, 2]), eye)
    with pytest.raises(RetrieverError, match="repeat within the batch"):
        store.add(np.array([1, 2, 2, 3]), eye)
    with pytest.raises(RetrieverError, match="non-negative"):
        store.add(np.array([-1, 2, 3, 4]), eye)
    with pytest.raises(RetrieverError, match="row 1 has norm 2.0000"):
        store.add(np.arange(4), eye * np.array([[1], [2], [1], [1]], np.float32))
    with pytest.raises(RetrieverError, match="NaN"):
        store.add(np.arange(4), np.full((4, 4), np.nan, np.float32))
    store.add(np.arange(4), eye)
    with pytest.raises(RetrieverError, match=r"2 vector ids already in the index, e.g. \[2, 3\]"):
        store.add(np.array([2, 3]), eye[:2])
    with pytest.raises(RetrieverError, match="k must be at least 1"):
        store.search(eye, 0)
    assert store.ntotal == 4  # nothing half-added by the refused calls


def test_ids_in_any_order_across_batches():
    store = VectorStore.create(4, device="cpu")
    eye = np.eye(4, dtype=np.float32)
    store.add(np.array([10, 11]), eye[:2])
    store.add(np.array([5]), eye[2:3])  # below the largest id, yet new
    with pytest.raises(RetrieverError, match=r"1 vector ids already in the index, e.g. \[11\]"):
        store.add(np.array([12, 11]), eye[:2])
    store.add(np.array([12]), eye[3:])
    assert store.ids().tolist() == [10, 11, 5, 12]
    assert store.search(eye[2], 1)[1].tolist() == [[5]]


def test_auto_chooses_by_corpus_size_and_memory():
    big_memory, small_memory = 64 * 2**30, 4 * 2**30
    assert choose_spec(20_000, 384, memory=big_memory).type == "flat"  # exact while a scan is as fast as a walk
    assert choose_spec(50_000, 768, memory=big_memory).type == "hnsw"  # the graph from the measured crossover on
    graph = choose_spec(1_000_000, 384, memory=big_memory)  # 1.8 GB of vectors and graph in 64 GB
    assert graph.type == "hnsw" and graph.search_ef >= 64 and graph.to_dict()["type"] == "hnsw"
    pq = choose_spec(1_000_000, 384, memory=small_memory)  # would take more than a quarter of 4 GB
    assert pq.type == "ivfpq" and pq.pq_m == 96 and pq.bytes_per_vector(384) == 104
    assert pq.nlist == default_nlist(1_000_000) == 1024 and 8 <= pq.search_nprobe <= 1024
    assert "nprobe" not in pq.to_dict()  # not pinned: the library's default applies at search time
    assert IndexSpec(type="ivf", nprobe=5).to_dict() == {"type": "ivf", "nlist": 1024, "nprobe": 5}
    assert choose_spec(10, 384, "ivf").type == "ivf"


def test_bad_arguments_and_files(tmp_path):
    with pytest.raises(RetrieverError, match="unknown index type 'ivfflat'"):
        VectorStore.create(4, index_type="ivfflat")
    with pytest.raises(RetrieverError, match="unknown index type 'annoy'"):
        choose_spec(10, 4, "annoy")
    with pytest.raises(RetrieverError, match="unknown search backend 'numpy'"):
        VectorStore.create(4, backend="numpy")
    with pytest.raises(RetrieverError, match="starts from its index's trained template"):
        VectorStore.create(4, "ivf")
    with pytest.raises(RetrieverError, match="nprobe must be at least 1"):
        IndexSpec(type="ivf", nprobe=-2)
    with pytest.raises(RetrieverError, match="no vector index there"):
        VectorStore.load(tmp_path / "missing.faiss")
    garbage = tmp_path / "garbage.faiss"
    garbage.write_bytes(b"not an index at all")
    with pytest.raises(RetrieverError, match="not a readable faiss index"):
        VectorStore.load(garbage)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf", "ivfpq"])
def test_vectors_of_ids_are_the_stored_vectors_a_search_scores(data, stores, kind):
    ids, vectors, queries = data
    wanted = ids[[7, 3, 4000, 7]]  # any order, repeats allowed
    found = stores[kind].vectors_of(wanted)
    if kind == "ivfpq":
        assert found is None  # compressed codes: the caller uses the raw vectors
        return
    np.testing.assert_array_equal(found, vectors[[7, 3, 4000, 7]])  # ivf: its codes are the vectors
    scores, top = stores[kind].search(queries[:1], 1)
    assert float(stores[kind].vectors_of(top[0])[0] @ queries[0]) == pytest.approx(float(scores[0, 0]), abs=1e-6)


@pytest.mark.parametrize("kind", ["ivf", "ivfpq"])
def test_ivf_answers_a_query_alone_as_in_a_batch(data, stores, kind):
    # A query alone is searched bucket-parallel, a batch query-parallel: the answers must not depend on it.
    _, _, queries = data
    scores, ids = stores[kind].search(queries[:16], 10)
    for row in range(16):
        alone_scores, alone_ids = stores[kind].search(queries[row : row + 1], 10)
        np.testing.assert_array_equal(alone_ids[0], ids[row])
        np.testing.assert_array_equal(alone_scores[0], scores[row])
