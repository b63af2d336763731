"""An index written by an earlier release opens, searches, verifies and takes writes with today's code.

`tests/fixtures/index-38ad062` was written by commit 38ad062 (before issue 25's store changes and issue 26's
moves): 40 notes built with a random 32-d BERT and the `sn` calibrator, 5 added as a second segment, `d3` deleted
(a tombstone). Its model folder is not in the fixture, so it is searched by its own stored vectors: what a reader
of the files, not the encoder, has to get right."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from retriever.index import Index, verify_index
from retriever.pipeline import l2_normalize

FIXTURE = Path(__file__).parent / "fixtures" / "index-38ad062"


@pytest.fixture()
def old_index(tmp_path) -> Path:
    folder = tmp_path / "indexes"
    shutil.copytree(FIXTURE, folder, symlinks=True)  # writes below must not touch the repository's copy
    return folder


def test_an_index_from_an_earlier_release_opens_verifies_and_searches(old_index):
    manifest, files = verify_index("notes", old_index)
    assert manifest.format_version == 2 and files > 0
    with Index.open("notes", old_index, device="cpu") as index:
        assert len(index) == 44 and [entry.name for entry in index.manifest.segments] == ["000001", "000002"]
        assert index.document("d7")["text"].endswith("on day 7.") and index.document("m2") is not None
        assert index.document("d3") is None  # deleted before the fixture was saved
        raw, rowids = index.raw_vectors()
        assert len(raw) == 44 and raw.shape[1] == 32
        scores, ids = index.search_vectors(l2_normalize(index.calibrate(raw)), k=1)
        assert np.array_equal(ids[:, 0], rowids)  # every stored document is its own nearest neighbour
        assert [hit.doc_id for hit in index.hits(scores[:3], ids[:3])[0]] == [index.document("d0")["doc_id"]]


def test_today_s_writers_continue_an_index_from_an_earlier_release(old_index):
    Index.open("notes", old_index, device="cpu").delete(["d5", "m1"])
    summary = Index.open("notes", old_index, device="cpu").compact()
    assert summary.documents == 42
    verify_index("notes", old_index)
    with Index.open("notes", old_index, device="cpu") as index:
        assert index.document("d5") is None and index.document("d6") is not None and len(index) == 42
