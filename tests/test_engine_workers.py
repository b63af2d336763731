"""The distributed build's stages as plain Python (no Ray): pieces, reading, encoding into shards, segments,
and the worker plan that never gives every CPU to the encode actors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from retriever.corpus import iter_corpus
from retriever.encode.encoder import Encoder
from retriever.engines.ray_build import RayOptions, check_ids_across, plan_workers, segment_groups
from retriever.engines.workers import (
    EncodeWorker,
    column_documents,
    corpus_files,
    count_stage,
    document_columns,
    read_shard,
    read_stage,
    split_file,
    write_segment,
)
from retriever.errors import RetrieverError


def write_jsonl(path: Path, count: int, blank_every: int = 0, bom: bool = False) -> Path:
    lines = []
    for number in range(count):
        lines.append(json.dumps({"_id": f"d{number}", "title": f"T {number}", "text": f"text of document {number} é"}))
        if blank_every and number % blank_every == 0:
            lines.append("   ")
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def pieces_documents(pieces: list[dict], first_rowid: int = 1) -> list:
    """What the read stage yields for PIECES, numbered from FIRST_ROWID on, as (rowid, Document)."""
    out = []
    for piece in pieces:
        batch = {key: np.array([value]) for key, value in piece.items()}
        batch["first_rowid"] = np.array([first_rowid])
        for columns in read_stage(batch, batch_rows=7):
            out.extend(zip(columns["rowid"].tolist(), column_documents(columns)))
        first_rowid += piece["documents"]
    return out


def test_split_file_pieces_read_back_exactly_as_the_whole_file(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", 100, blank_every=9, bom=True)
    pieces = split_file(corpus, piece_documents=16)
    assert [p["documents"] for p in pieces] == [16] * 6 + [4]
    assert pieces[0]["start"] == 0 and all(p["start"] > 0 for p in pieces[1:])
    expected = list(iter_corpus(corpus))
    got = pieces_documents(pieces)
    assert [rowid for rowid, _ in got] == list(range(1, 101))
    assert [d for _, d in got] == expected  # ids, texts, titles and line numbers of the whole file


def test_txt_pieces_keep_file_line_ids(tmp_path):
    corpus = tmp_path / "notes.txt"
    corpus.write_text("".join(f"line {n}\n" if n % 5 else "\n" for n in range(1, 60)), encoding="utf-8")
    pieces = split_file(corpus, piece_documents=10)
    assert [d for _, d in pieces_documents(pieces)] == list(iter_corpus(corpus))


def test_unsplittable_files_are_one_piece(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", 50)
    packed = tmp_path / "c.jsonl.gz"
    packed.write_bytes(gzip.compress(corpus.read_bytes()))
    table = tmp_path / "c.csv"
    table.write_text("id,text\n" + "".join(f'{n},"row\n{n}"\n' for n in range(30)), encoding="utf-8")
    assert [p["documents"] for p in split_file(packed, piece_documents=8)] == [50]
    assert [p["documents"] for p in split_file(table, piece_documents=8)] == [30]
    assert [d for _, d in pieces_documents(split_file(table, piece_documents=8))] == list(iter_corpus(table))


def test_a_bad_line_fails_the_count_stage_with_its_line_number(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", 40)
    lines = corpus.read_text(encoding="utf-8").splitlines()
    lines[33] = '{"_id": "x", "text": '
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(RetrieverError, match=r"c.jsonl line 34: not valid JSON"):
        split_file(corpus, piece_documents=8)


def test_count_stage_lists_every_files_pieces(tmp_path):
    first, second = write_jsonl(tmp_path / "a.jsonl", 20), write_jsonl(tmp_path / "b.jsonl", 5)
    counted = count_stage({"file": np.array([0, 1]), "path": np.array([str(first), str(second)], dtype=object)},
                          piece_documents=8)
    assert counted["file"].tolist() == [0, 0, 0, 1]
    assert counted["documents"].tolist() == [8, 8, 4, 5]


def test_corpus_files_of_a_folder_in_name_order(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    for name in ("b.jsonl", "a.txt", ".hidden"):
        (folder / name).write_text("x\n")
    assert [p.name for p in corpus_files(folder)] == ["a.txt", "b.jsonl"]
    (folder / "notes.md").write_text("x")
    with pytest.raises(RetrieverError, match="unsupported format '.md'"):
        corpus_files(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RetrieverError, match="empty folder"):
        corpus_files(empty)


def test_encode_worker_writes_shards_that_match_the_local_encoder(tmp_path, tiny_bert):
    encoder = Encoder(str(tiny_bert), device="cpu")
    documents = list(iter_corpus(write_jsonl(tmp_path / "c.jsonl", 30)))
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    worker = EncodeWorker(encoder.config(), str(shard_dir), device="cpu", threads=1)
    # One batch holding the end of one piece (rows 1-10) and the start of another (rows 21-40): two shards.
    batch = {key: np.concatenate([a, b]) for (key, a), b in zip(
        document_columns(documents[:10], 1).items(), document_columns(documents[10:30], 21).values())}
    summary = worker(batch)
    assert summary["shard"].tolist() == [1, 21] and summary["rows"].tolist() == [10, 20]
    rowids, shard_documents, vectors, passages = read_shard(shard_dir, 21)
    assert rowids.tolist() == list(range(21, 41)) and shard_documents == documents[10:30] and passages is None
    expected = encoder.encode([f"{d.title} {d.text}" for d in documents[10:30]])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


def test_encode_worker_says_which_node_lacks_the_model_or_the_folder(tmp_path, tiny_bert):
    config = Encoder(str(tiny_bert), device="cpu").config()
    with pytest.raises(RetrieverError, match="must be on storage every Ray node sees"):
        EncodeWorker(config, str(tmp_path / "not-there"))
    (tmp_path / "shards").mkdir()
    with pytest.raises(RetrieverError, match=r"^on \S+: .*no-such-model"):
        EncodeWorker({**config, "model": str(tmp_path / "no-such-model")}, str(tmp_path / "shards"))


def test_write_segment_builds_a_searchable_segment(tmp_path, tiny_bert):
    from retriever.calibration import make_calibrator
    from retriever.index import CALIBRATOR, SEGMENTS
    from retriever.store.segment import Segment
    from retriever.store.spec import IndexSpec

    encoder = Encoder(str(tiny_bert), device="cpu")
    documents = list(iter_corpus(write_jsonl(tmp_path / "c.jsonl", 60)))
    folder, shard_dir = tmp_path / "version", tmp_path / "version" / "shards"
    shard_dir.mkdir(parents=True)
    worker = EncodeWorker(encoder.config(), str(shard_dir), device="cpu")
    worker(document_columns(documents[:25], 1))
    worker(document_columns(documents[25:], 26))
    calibrator = make_calibrator("whitening")
    calibrator.fit(np.concatenate([read_shard(shard_dir, 1)[2], read_shard(shard_dir, 26)[2]]))
    calibrator.save(folder / CALIBRATOR)
    assert write_segment(folder, "seg-000001", [1, 26], shard_dir, {"type": "flat"}) == (60, 60)
    segment = Segment(folder / SEGMENTS / "seg-000001", IndexSpec(type="flat"), device="cpu")
    assert segment.rowids.tolist() == list(range(1, 61))
    assert segment.documents.get([26])[0]["doc_id"] == "d25"
    np.testing.assert_allclose(np.linalg.norm(segment.vectors.stored_vectors(), axis=1), 1.0, atol=1e-5)

    # The same documents again in a second segment: each is fine alone, the check across segments refuses.
    worker(document_columns(documents[:5], 61))
    write_segment(folder, "seg-000002", [61], shard_dir, {"type": "flat"})
    with pytest.raises(RetrieverError, match=r"duplicate ids: 'd0' \(.*c.jsonl line 1 and .*c.jsonl line 1\)"):
        check_ids_across(folder, ["seg-000001", "seg-000002"])


def test_worker_plan_leaves_a_cpu_for_the_read_stage():
    # A local cluster is started with the machine's CPUs + 1: 2 cores -> 3.
    assert plan_workers(RayOptions(), 3, 0, local=True) == plan_workers(RayOptions(workers=1), 3, 0, True)
    one = plan_workers(RayOptions(), 3, 0, local=True)
    assert (one.workers, one.cpus) == (1, 2)
    two = plan_workers(RayOptions(workers=2), 3, 0, local=True)
    assert (two.workers, two.cpus) == (2, 1)
    for plan in (one, two):
        assert plan.workers * plan.cpus < 3  # never every CPU
    with pytest.raises(RetrieverError, match="at most 2 workers fit"):
        plan_workers(RayOptions(workers=3), 3, 0, local=True)
    with pytest.raises(RetrieverError, match="the read stage need 2"):
        plan_workers(RayOptions(), 1, 0, local=False)
    cluster = plan_workers(RayOptions(), 33, 0, local=False)
    assert (cluster.workers, cluster.cpus) == (32, 1)


def test_worker_plan_gives_each_actor_a_gpu_where_there_are_any():
    plan = plan_workers(RayOptions(), 17, 4, local=False)
    assert (plan.workers, plan.gpus) == (4, 1) and plan.workers * plan.cpus < 17
    assert plan_workers(RayOptions(gpus_per_worker=0.5), 17, 1, local=True).workers == 2
    assert plan_workers(RayOptions(gpus_per_worker=0), 17, 4, local=True).gpus == 0
    with pytest.raises(RetrieverError, match="the Ray cluster has 0 GPUs"):
        plan_workers(RayOptions(gpus_per_worker=1), 17, 0, local=True)
    with pytest.raises(RetrieverError, match="needs 3 GPUs"):
        plan_workers(RayOptions(workers=3, gpus_per_worker=1), 17, 2, local=True)


def test_segment_groups_are_consecutive_and_balanced():
    shards = [(1 + 10_000 * n, 10_000) for n in range(25)]
    groups = segment_groups(shards, workers=4)
    assert len(groups) == 4 and [s for g in groups for s in g] == shards
    assert max(sum(r for _, r in g) for g in groups) - min(sum(r for _, r in g) for g in groups) <= 40_000
    assert len(segment_groups(shards[:2], workers=4)) == 1  # 20,000 rows: one segment
