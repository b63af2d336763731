"""A per-segment structure registered once (`store.segment.STRUCTURES`) is carried by every segment of every
version, whichever write made it: a build, an add, an automatic merge, a compaction, a refit, a Ray worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import retriever.store.segment as segment_module
from retriever.index import Index
from retriever.versions.layout import SEGMENTS
from tests.helpers import sentences, write_jsonl


class DocIds:
    """A stand-in for a keyword index: the segment's doc_ids, in row order, as JSON."""

    name = "doc-ids"
    files = ("doc-ids.json",)
    needs_passages = False

    def build(self, folder: Path, documents) -> None:
        ids = [document.doc_id for _, document in documents.documents()]
        (folder / "doc-ids.json").write_text(json.dumps(ids))


@pytest.fixture()
def registered(monkeypatch):
    monkeypatch.setattr(segment_module, "STRUCTURES", [DocIds()])


def carried(index: Index) -> None:
    """Every segment of INDEX has the structure, listed in the manifest, holding exactly its documents."""
    for segment in index.snapshot.segments:
        path = index.snapshot.folder / SEGMENTS / segment.name / "doc-ids.json"
        assert f"{SEGMENTS}/{segment.name}/doc-ids.json" in index.snapshot.manifest.files
        expected = [document.doc_id for _, document in segment.documents.documents()]
        assert json.loads(path.read_text()) == expected


def test_every_write_carries_the_registered_structure(registered, tmp_path, tiny_bert):
    index_dir = tmp_path / "indexes"
    index = Index.build(write_jsonl(tmp_path / "a.jsonl", sentences(30)), "s", index_dir, model=str(tiny_bert),
                        calibrator="whitening", device="cpu").open()
    carried(index)
    index = index.add(write_jsonl(tmp_path / "b.jsonl", sentences(10, start=30))).open()
    assert len(index.snapshot.segments) == 2
    carried(index)
    index = index.delete([f"d{number}" for number in range(30, 34)]).open()  # 40% of the new segment: merged
    assert [len(segment) for segment in index.snapshot.segments] == [30, 6]
    carried(index)
    index = index.refit("sn").open()
    carried(index)
    index = index.delete(["d0"]).open().compact().open()
    assert len(index.snapshot.segments) == 1 and len(index) == 35
    carried(index)
    assert index.snapshot.verify() > 0  # every file, the structure's included, matches the manifest


def test_a_ray_worker_segment_carries_it_too(registered, tmp_path, tiny_bert):
    import numpy as np

    from retriever.calibration import make_calibrator
    from retriever.corpus import iter_corpus
    from retriever.encode.encoder import Encoder
    from retriever.engines.workers import EncodeWorker, document_columns, read_shard, write_segment
    from retriever.versions.layout import CALIBRATOR

    documents = list(iter_corpus(write_jsonl(tmp_path / "c.jsonl", sentences(12))))
    folder, shard_dir = tmp_path / "version", tmp_path / "version" / "shards"
    shard_dir.mkdir(parents=True)
    EncodeWorker(Encoder(str(tiny_bert), device="cpu").config(), str(shard_dir), device="cpu")(
        document_columns(documents, 1))
    calibrator = make_calibrator("sn")
    calibrator.fit(np.asarray(read_shard(shard_dir, 1)[2]))
    calibrator.save(folder / CALIBRATOR)
    assert write_segment(folder, "000001", [1], shard_dir, {"type": "flat"}) == (12, 12)
    assert json.loads((folder / SEGMENTS / "000001" / "doc-ids.json").read_text()) == [d.doc_id for d in documents]
