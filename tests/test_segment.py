"""One segment on its own: raw vectors written block by block (float16 where they fit, float32 where they do
not, ascending row ids only), then opened to search, look up by row id, and stream its raw vectors back."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.corpus import Document
from retriever.errors import RetrieverError
from retriever.numeric import l2_normalize
from retriever.store.documents import DocumentTable
from retriever.store.segment import RawWriter, Segment
from retriever.store.layout import DOCUMENTS, RAW, VECTORS
from retriever.store.vectors import VectorStore
from retriever.store.spec import IndexSpec


def _segment(folder, raw: np.ndarray, first: int = 10) -> Segment:
    folder.mkdir(parents=True)
    rowids = np.arange(first, first + len(raw), dtype=np.int64)
    writer = RawWriter(folder, raw.shape[1])
    for start in range(0, len(raw), 7):  # blocks, as a build writes them
        writer.append(rowids[start : start + 7], raw[start : start + 7])
    writer.close()
    store = VectorStore.create(raw.shape[1], "flat", device="cpu")
    store.add(rowids, l2_normalize(raw))
    store.save(folder / VECTORS)
    table = DocumentTable.create(folder / DOCUMENTS)
    table.insert(rowids, [Document(f"d{r}", f"text {r}", None, "test", int(r)) for r in rowids])
    table.finish()
    table.close()
    return Segment(folder, IndexSpec("flat"), device="cpu")


def test_a_segment_stores_raw_vectors_compactly_and_finds_them_by_row_id(tmp_path):
    raw = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
    segment = _segment(tmp_path / "000001", raw)
    assert len(segment) == 30 and np.load(segment.folder / RAW).dtype == np.float16
    np.testing.assert_allclose(segment.raw_for(np.array([12, 39])), raw[[2, 29]], atol=1e-2)
    assert segment.contains(np.array([9, 10, 39, 40])).tolist() == [False, True, True, False]
    blocks = list(segment.raw_blocks(rows=8))
    assert [len(ids) for ids, _ in blocks] == [8, 8, 8, 6]
    np.testing.assert_allclose(np.concatenate([block for _, block in blocks]), raw, atol=1e-2)
    scores, ids = segment.vectors.search(l2_normalize(raw[[5]]), 1)
    assert ids[0, 0] == 15 and segment.documents.get([15])[0]["doc_id"] == "d15"
    segment.close()
    segment.close()  # twice does nothing


def test_vectors_too_large_for_float16_are_kept_as_float32(tmp_path):
    raw = np.full((4, 3), 10_000.0, dtype=np.float32)  # within float16's range, not within its headroom
    segment = _segment(tmp_path / "000001", raw)
    assert np.load(segment.folder / RAW).dtype == np.float32
    np.testing.assert_array_equal(segment.raw_for(np.array([11])), raw[[1]])


def test_raw_vectors_must_come_in_ascending_row_order(tmp_path):
    writer = RawWriter(tmp_path, 2)
    writer.append(np.array([5, 6]), np.zeros((2, 2), np.float32))
    with pytest.raises(RetrieverError, match="ascending key order"):
        writer.append(np.array([6, 7]), np.zeros((2, 2), np.float32))
