import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.store.vectors import VectorStore


def normalized(rng, n, dim):
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    vectors = normalized(rng, 5000, 64)
    ids = rng.permutation(np.arange(100, 100 + 3 * len(vectors), 3))  # sparse, shuffled: ids are not positions
    return ids, vectors, normalized(rng, 100, 64)


def brute_force(ids, vectors, queries, k):
    scores = queries @ vectors.T
    order = np.argsort(-scores, axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


def store_with(data, **kwargs):
    ids, vectors, _ = data
    store = VectorStore.create(vectors.shape[1], device="cpu", **kwargs)
    store.add(ids, vectors)
    return store


def test_flat_search_is_exact(data):
    ids, vectors, queries = data
    store = store_with(data)
    scores, found = store.search(queries, 10)
    expected_scores, expected_ids = brute_force(ids, vectors, queries, 10)
    assert found.dtype == np.int64 and scores.dtype == np.float32 and found.shape == (100, 10)
    np.testing.assert_array_equal(found, expected_ids)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
    assert (store.ntotal, store.dim, store.index_type, store.backend) == (5000, 64, "flat", "faiss-cpu")


@pytest.fixture(scope="module")
def hnsw(data):
    """Built once (the slow part); tests that change the store build their own."""
    return store_with(data, index_type="hnsw", hnsw_m=32, ef_search=128)


def test_hnsw_recall_against_flat(data, hnsw):
    _, _, queries = data
    _, exact = store_with(data).search(queries, 10)
    _, approximate = hnsw.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, approximate)])
    assert recall >= 0.95
    assert hnsw.index_type == "hnsw" and hnsw.ef_search == 128


def test_hnsw_returns_k_results_even_beyond_ef_search(data):
    ids, vectors, queries = data
    store = VectorStore.create(64, index_type="hnsw", ef_search=16, device="cpu")
    store.add(ids[:1000], vectors[:1000])
    _, found = store.search(queries[:3], 200)
    assert (found >= 0).all() and all(len(set(row)) == 200 for row in found)


def test_single_query_and_padding_when_fewer_than_k():
    rng = np.random.default_rng(1)
    vectors = normalized(rng, 3, 8)
    for index_type in ("flat", "hnsw"):
        store = VectorStore.create(8, index_type=index_type, device="cpu")
        store.add(np.array([5, 6, 7]), vectors)
        scores, found = store.search(vectors[1], 5)  # a 1-d query is one query
        assert found.shape == (1, 5)
        assert found[0, 0] == 6 and sorted(found[0, :3]) == [5, 6, 7]
        assert list(found[0, 3:]) == [-1, -1] and np.isneginf(scores[0, 3:]).all()


def test_empty_store_returns_only_padding():
    scores, found = VectorStore.create(4, device="cpu").search(np.eye(4, dtype=np.float32), 2)
    assert (found == -1).all() and np.isneginf(scores).all()


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_removed_ids_never_come_back(data, index_type):
    ids, vectors, queries = data
    store = store_with(data, index_type=index_type)
    # Remove the current top hits of every query, so removal is actually exercised by the searches.
    _, before = store.search(queries, 5)
    removed = np.unique(before)
    assert store.remove(np.concatenate([removed, [10**9]])) == len(removed)  # an unknown id is ignored
    assert store.ntotal == len(ids) - len(removed)
    assert set(store.ids().tolist()) == set(ids.tolist()) - set(removed.tolist())
    _, after = store.search(queries, 10)
    assert not np.isin(after, removed).any()
    keep = ~np.isin(ids, removed)
    _, expected = brute_force(ids[keep], vectors[keep], queries, 10)
    if index_type == "flat":
        np.testing.assert_array_equal(after, expected)
    else:
        assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(after, expected)]) >= 0.95
        assert store.ef_search == 128  # the rebuilt graph keeps its settings


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_save_load_roundtrip(tmp_path, data, hnsw, index_type):
    _, _, queries = data
    store = hnsw if index_type == "hnsw" else store_with(data)
    path = tmp_path / "vectors.faiss"
    store.save(path)
    assert not (tmp_path / "vectors.faiss.partial").exists()
    loaded = VectorStore.load(path, device="cpu")
    assert (loaded.ntotal, loaded.dim, loaded.index_type) == (store.ntotal, store.dim, index_type)
    np.testing.assert_array_equal(loaded.ids(), store.ids())
    for got, expected in zip(loaded.search(queries, 10), store.search(queries, 10)):
        np.testing.assert_array_equal(got, expected)
    assert loaded.ef_search == store.ef_search


def test_torch_backend_equals_faiss_flat(data):
    ids, vectors, queries = data
    faiss_store = store_with(data)
    torch_store = store_with(data, backend="torch")
    torch_store._get_searcher().chunk_bytes = 7 * len(ids) * 4  # force several chunks of 7 queries
    assert torch_store.backend == "torch-cpu"
    faiss_scores, faiss_ids = faiss_store.search(queries, 10)
    torch_scores, torch_ids = torch_store.search(queries, 10)
    np.testing.assert_array_equal(torch_ids, faiss_ids)
    np.testing.assert_allclose(torch_scores, faiss_scores, atol=1e-5)
    # After a removal the searcher is rebuilt from the updated index.
    removed = faiss_ids[:, 0]
    faiss_store.remove(removed)
    torch_store.remove(removed)
    np.testing.assert_array_equal(torch_store.search(queries, 10)[1], faiss_store.search(queries, 10)[1])


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


def test_bad_arguments_and_files(tmp_path):
    with pytest.raises(RetrieverError, match="unknown index type 'ivf'"):
        VectorStore.create(4, index_type="ivf")
    with pytest.raises(RetrieverError, match="unknown search backend 'numpy'"):
        VectorStore.create(4, backend="numpy")
    with pytest.raises(RetrieverError, match="ef_search applies to hnsw indexes only"):
        VectorStore.create(4, device="cpu").ef_search = 10
    with pytest.raises(RetrieverError, match="no vector index there"):
        VectorStore.load(tmp_path / "missing.faiss")
    garbage = tmp_path / "garbage.faiss"
    garbage.write_bytes(b"not an index at all")
    with pytest.raises(RetrieverError, match="not a readable faiss index"):
        VectorStore.load(garbage)
