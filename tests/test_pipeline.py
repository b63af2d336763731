"""The build's stages on their own: chunking, what a calibrator is fitted on, calibrated blocks with their row
ids, a segment's vectors written from them, and the arrays a build may take from memory."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.calibration import make_calibrator
from retriever.errors import RetrieverError
from retriever.engines.stages import (
    IndexWhileEncoding,
    calibrated_blocks,
    chunked,
    fitted_query_count,
    with_queries,
    write_segment_vectors,
)
from retriever.numeric import l2_normalize, l2_normalize_in_place
from retriever.store.arrays import ArraySource, VectorSource, vector_source
from retriever.store.layout import RAW, ROWIDS
from retriever.store.spec import IndexSpec

RNG = np.random.default_rng(0)


def test_chunks_keep_order_and_the_last_one_is_short():
    assert list(chunked(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunked([], 3)) == []


def test_unit_vectors_and_a_zero_vector_stays_zero():
    unit = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(unit, [[0.6, 0.8], [0.0, 0.0]])
    # a calibrator's fresh float32 output is scaled where it lies; anything else comes back as a new float32 array
    owned = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    assert l2_normalize_in_place(owned) is owned and np.array_equal(owned, unit)
    given = np.array([[3.0, 4.0]])
    assert l2_normalize_in_place(given).dtype == np.float32 and given.tolist() == [[3.0, 4.0]]


def test_the_fit_sample_adds_at_most_fit_sample_queries():
    sample, queries = RNG.normal(size=(10, 4)), RNG.normal(size=(50, 4))
    assert with_queries(sample, None, 20, 0) is sample
    fitted = with_queries(sample, queries, 20, 0)
    assert fitted.shape == (30, 4) and fitted_query_count(queries, 20) == 20
    np.testing.assert_array_equal(with_queries(sample, queries, 20, 0), fitted)  # seeded: the same rows again
    assert with_queries(sample, queries, None, 0).shape == (60, 4) and fitted_query_count(None, 20) == 0


def test_calibrated_blocks_number_rows_and_write_a_searchable_segment(tmp_path):
    raw = RNG.normal(size=(70, 6)).astype(np.float32)
    calibrator = make_calibrator("sn").fit(raw)
    source = vector_source(raw)
    assert isinstance(source, ArraySource) and (source.rows, source.dim) == (70, 6)
    blocks = list(calibrated_blocks(source, calibrator, first_rowid=101))
    assert blocks[0][0][0] == 101 and blocks[-1][0][-1] == 170
    store = write_segment_vectors(tmp_path, blocks, 6, 6, IndexSpec("flat"), None)
    assert store.ntotal == 70 and np.load(tmp_path / ROWIDS).tolist() == list(range(101, 171))
    np.testing.assert_allclose(np.load(tmp_path / RAW).astype(np.float32), raw, atol=1e-2)
    _, ids = store.search(l2_normalize(calibrator.transform(raw[[33]])), 1)
    assert ids[0, 0] == 134


def test_vectors_from_memory_are_checked_like_vectors_from_a_file(tmp_path):
    bad = RNG.normal(size=(5, 3)).astype(np.float32)
    bad[3, 1] = np.nan
    with pytest.raises(RetrieverError, match="row 3 .document 4. has NaN"):
        list(ArraySource(bad).blocks())
    with pytest.raises(RetrieverError, match="2-D floating-point"):
        ArraySource(np.arange(6))
    np.save(tmp_path / "v.npy", bad)
    with pytest.raises(RetrieverError, match="document 4. has NaN"):
        list(VectorSource(tmp_path / "v.npy").blocks())


@pytest.mark.parametrize("loud_row", [20_000, 70_000])  # in the raw store's first block, and after it
def test_vectors_indexed_while_encoding_are_written_as_stage_4_after_encoding_would_write_them(tmp_path, loud_row):
    """The raw store's precision is decided on its first block as stage 4 reads it, not on the first chunk the
    encoder hands over: a value too large for float16 at row 20,000 stores float32 either way."""
    from retriever.store.arrays import NpyAppender

    rows, dim = 80_000, 4
    vectors = RNG.normal(size=(rows, dim)).astype(np.float32)
    vectors[loud_row, 0] = 5000.0  # times float16's headroom, past its largest value
    encoded = tmp_path / "encoded.npy"
    with NpyAppender(encoded, dim, "float32") as appender:
        appender.append(vectors)
    calibrator = make_calibrator("none").fit(np.empty((0, dim), np.float32))
    after, during = tmp_path / "after", tmp_path / "during"
    after.mkdir(), during.mkdir()
    write_segment_vectors(after, calibrated_blocks(VectorSource(encoded), calibrator, 1), dim, dim, IndexSpec("flat"),
                          None)
    streamed = IndexWhileEncoding(during, calibrator, dim, dim, IndexSpec("flat"))
    for start in range(0, rows, 16_384):
        streamed.add(vectors[start : start + 16_384], len(vectors[start : start + 16_384]))
    assert streamed.finish(rows, IndexSpec("flat"))
    for name in (RAW, ROWIDS):
        assert (during / name).read_bytes() == (after / name).read_bytes()
    assert np.load(during / RAW).dtype == (np.float32 if loud_row < 65_536 else np.float16)


@pytest.mark.parametrize("ending", ["a cut document", "a vector that is not finite"])
def test_an_index_abandoned_while_encoding_leaves_nothing_behind(tmp_path, ending):
    """A chunk holding a cut document (more vectors than documents) ends it, chunks still queued or not; so does
    one holding a NaN, for stage 4 to name its row."""
    import time

    dim = 4
    calibrator = make_calibrator("none").fit(np.empty((0, dim), np.float32))
    streamed = IndexWhileEncoding(tmp_path, calibrator, dim, dim, IndexSpec("flat"))
    slow = streamed._add

    def add_slowly(keys, vectors):
        time.sleep(0.2)
        slow(keys, vectors)

    streamed._add = add_slowly
    for _ in range(3):
        streamed.add(RNG.normal(size=(10, dim)).astype(np.float32), 10)
    if ending == "a cut document":
        streamed.add(RNG.normal(size=(12, dim)).astype(np.float32), 10)  # a document cut in three
    else:
        streamed.add(np.full((10, dim), np.nan, np.float32), 10)
    streamed.add(RNG.normal(size=(10, dim)).astype(np.float32), 10)  # handed over after it: not indexed
    assert not streamed.finish(50, IndexSpec("flat")) and streamed.abandoned
    assert not list(tmp_path.iterdir())
