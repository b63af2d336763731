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
from tests.helpers import search_vectors, vector_hits
from retriever.numeric import l2_normalize

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
        assert len(index) == 44 and [entry.name for entry in index.snapshot.manifest.segments] == ["000001", "000002"]
        assert index.document("d7")["text"].endswith("on day 7.") and index.document("m2") is not None
        assert index.document("d3") is None  # deleted before the fixture was saved
        raw, rowids = index.snapshot.raw_vectors()
        assert len(raw) == 44 and raw.shape[1] == 32
        scores, ids = search_vectors(index, l2_normalize(index.snapshot.calibrate(raw)), 1)
        assert np.array_equal(ids[:, 0], rowids)  # every stored document is its own nearest neighbour
        hits = vector_hits(index, l2_normalize(index.snapshot.calibrate(raw[:3])), 1)
        assert [hit.doc_id for hit in hits[0]] == [index.document("d0")["doc_id"]]


def test_today_s_writers_continue_an_index_from_an_earlier_release(old_index):
    Index.open("notes", old_index, device="cpu").delete(["d5", "m1"])
    summary = Index.open("notes", old_index, device="cpu").compact()
    assert summary.documents == 42
    verify_index("notes", old_index)
    with Index.open("notes", old_index, device="cpu") as index:
        assert index.document("d5") is None and index.document("d6") is not None and len(index) == 42


def test_an_index_from_before_keyword_search_searches_dense_and_compaction_adds_its_keyword_index(old_index):
    from retriever.errors import RetrieverError

    with Index.open("notes", old_index, device="cpu") as index:
        assert index.info()["default_mode"] == "dense"  # the default where segments have no keyword index
        with pytest.raises(RetrieverError, match="index 'notes' has no keyword index .* compacting it adds one"):
            index.search("day 7", mode="keyword")
    Index.open("notes", old_index, device="cpu").refit("sn")  # a refit links what the segments have
    Index.open("notes", old_index, device="cpu").compact()
    verify_index("notes", old_index)
    with Index.open("notes", old_index, device="cpu") as index:
        assert index.info()["default_mode"] == "hybrid"
        hits = index.search("day 7", k=3, mode="keyword")  # no model needed for keywords
        assert hits[0].doc_id == "d7" and hits[0].keyword_rank == 1 and hits[0].dense_score is None


def test_an_index_from_before_metadata_filters_on_its_own_fields_and_takes_documents_with_metadata(old_index):
    """Its document tables have no metadata column: they read as documents without metadata, a filter on metadata
    selects nothing, one on the document's own fields works, and a write adds documents that have some."""
    from retriever.corpus import Document

    with Index.open("notes", old_index, device="cpu") as index:
        assert index.document("d7")["metadata"] is None and index.snapshot.manifest.metadata_fields == []
        raw, _ = index.snapshot.raw_vectors()
        queries = l2_normalize(index.snapshot.calibrate(raw[:2]))
        assert search_vectors(index, queries, 5, where={"lang": "en"})[1].max() == -1
        found = search_vectors(index, queries, 5, where={"doc_id": {"$in": ["d1", "m2"]}})
        wanted = {index.snapshot.live_rowids(["d1", "m2"])[doc][0] for doc in ("d1", "m2")}
        assert [set(row[row >= 0].tolist()) for row in found[1]] == [wanted, wanted]
        extra = np.random.default_rng(0).standard_normal((1, raw.shape[1])).astype(np.float32)
        added = index.add([Document("tagged", "a note with metadata", None, "new.jsonl", 1, {"lang": "en"})],
                          vectors=extra)
    with added.open() as index:
        assert index.snapshot.manifest.metadata_fields == ["lang"]
        assert [int(rowid) for rowid in index.snapshot.matching(_where({"lang": "en"}))] == [index.snapshot.manifest.next_rowid - 1]
        assert index.document("tagged")["metadata"] == {"lang": "en"}
    verify_index("notes", old_index)


PASSAGES_FIXTURE = Path(__file__).parent / "fixtures" / "index-772c492"


def test_an_index_whose_keywords_scored_passages_alone_searches_dense_until_compaction_writes_them_anew(tmp_path):
    """`tests/fixtures/index-772c492` was written by commit 772c492 (before issue 54) from 384-d vectors given per
    passage: 20 notes and 3 pages of 6 passages, its keyword index a unit per passage. Today's keyword side scores
    documents whole: such a segment reads as one without a keyword index until compaction writes both anew."""
    from retriever.errors import RetrieverError

    folder = tmp_path / "indexes"
    shutil.copytree(PASSAGES_FIXTURE, folder, symlinks=True)
    verify_index("pages", folder)
    with Index.open("pages", folder, device="cpu") as index:
        assert index.snapshot.segments[0].split and index.snapshot.segments[0].keywords_stale
        assert index.info()["default_mode"] == "dense"
        with pytest.raises(RetrieverError, match="has no keyword index this release reads .* compacting it adds one"):
            index.search("violin harbour", mode="keyword")
        raw, rowids = index.snapshot.raw_vectors()
        before = search_vectors(index, l2_normalize(index.snapshot.calibrate(raw[:5])), 3)
    Index.open("pages", folder, device="cpu").compact()
    verify_index("pages", folder)
    with Index.open("pages", folder, device="cpu") as index:
        segment = index.snapshot.segments[0]
        assert segment.passage_keywords is not None and index.info()["default_mode"] == "hybrid"
        hits = index.search("part 5 of page 2", k=3, mode="keyword")
        assert hits[0].doc_id == "page2" and hits[0].passage.startswith("Part 5 of page 2")
        np.testing.assert_array_equal(search_vectors(index, l2_normalize(index.snapshot.calibrate(raw[:5])), 3)[1],
                                      before[1])


UNIT_PER_PASSAGE_FIXTURE = Path(__file__).parent / "fixtures" / "index-bc24e85"


def test_an_index_whose_passage_keywords_hold_every_passage_searches_as_one_written_today(tmp_path):
    """`tests/fixtures/index-bc24e85` is the 772c492 fixture compacted by commit bc24e85: its keyword index of
    passages has a unit per passage, the 20 notes' included; today's has units for the 3 cut pages' passages alone.
    Both rank and score alike, and say where a hit matched alike."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(UNIT_PER_PASSAGE_FIXTURE, old, symlinks=True)
    shutil.copytree(UNIT_PER_PASSAGE_FIXTURE, new, symlinks=True)
    verify_index("pages", old)
    Index.open("pages", new, device="cpu").compact()
    with Index.open("pages", old, device="cpu") as before, Index.open("pages", new, device="cpu") as today:
        written, rewritten = before.snapshot.segments[0], today.snapshot.segments[0]
        assert written.passage_keywords.documents == len(written.keys) == 38
        assert rewritten.passage_keywords.documents == 18  # 3 pages of 6 passages
        for query in ("part 5 of page 2", "violin harbour", "note 7", "page 1 part 3 harbour"):
            for mode in ("keyword", "hybrid"):
                one, other = before.search(query, k=8, mode=mode), today.search(query, k=8, mode=mode)
                assert [(hit.doc_id, hit.passage, hit.span) for hit in one] == \
                    [(hit.doc_id, hit.passage, hit.span) for hit in other]
                np.testing.assert_allclose([hit.score for hit in one], [hit.score for hit in other], rtol=1e-6)


def _where(clause: dict):
    from retriever.filters import parse_where

    return parse_where(clause)
