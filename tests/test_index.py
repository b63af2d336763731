"""The calibrated index through its Python API: build, search, add, delete, refit, info, and crash safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from retriever.errors import RetrieverError
from retriever.index import Index, l2_normalize
from retriever.index_folder import KEEP_VERSIONS, MANIFEST, VERSIONS

DOCS = {
    "guitar": "A man is playing a guitar on stage.",
    "onion": "A woman slices an onion in the kitchen.",
    "stocks": "Stock markets fell sharply on Monday amid inflation fears.",
    "soccer": "The football team won the championship final.",
    "rain": "Heavy rain caused flooding in the city centre.",
    "dog": "A dog runs through the grass chasing a ball.",
    "cat": "The cat sat on the mat and purred softly.",
    "python": "Python is a programming language that lets you work quickly.",
}


def write_jsonl(path: Path, docs: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in docs.items()), encoding="utf-8")
    return path


@pytest.fixture()
def corpus(tmp_path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", DOCS)


@pytest.fixture()
def tiny_index(tmp_path, corpus, tiny_bert) -> Index:
    Index.build(corpus, "tiny", tmp_path / "indexes", model=str(tiny_bert), calibrator="whitening", device="cpu")
    return Index.open("tiny", tmp_path / "indexes", device="cpu")


def test_each_document_finds_itself_through_the_recorded_encode_path(tiny_index):
    results = tiny_index.search(list(DOCS.values()), k=3)
    assert [hits[0].doc_id for hits in results] == list(DOCS)
    assert all(abs(hits[0].score - 1.0) < 1e-4 for hits in results)
    assert all(len(hits) == 3 and [h.rank for h in hits] == [1, 2, 3] for hits in results)
    # The query path is exactly: recorded encoder -> saved calibrator -> L2 normalization.
    query = "A man is playing a guitar on stage."
    expected = l2_normalize(tiny_index.calibrator.transform(tiny_index.encoder.encode([query])))
    np.testing.assert_allclose(tiny_index.embed([query]), expected, atol=1e-6)


def test_manifest_records_everything_needed_to_reproduce(tiny_index, tiny_bert):
    manifest = tiny_index.manifest
    assert manifest["encoder"] == {"model": str(tiny_bert), "pooling": "last-avg", "layers": None,
                                   "max_length": 512, "dtype": "fp32", "dim": 32}
    assert manifest["calibrator"]["name"] == "whitening"
    assert manifest["documents"] == len(DOCS) and manifest["dim"] == 32 and manifest["index_type"] == "flat"
    assert {"torch", "transformers", "faiss-cpu", "numpy", "retriever"} <= set(manifest["versions"])
    assert {"vectors.faiss", "documents.db", "raw_vectors.npy", "raw_ids.npy"} <= set(manifest["files"])
    assert manifest["created"].endswith("+00:00")


def test_semantic_search_with_the_default_model_and_flow(tmp_path, corpus):
    Index.build(corpus, "real", tmp_path / "indexes", device="cpu")  # defaults: MiniLM, last-avg, flow
    index = Index.open("real", tmp_path / "indexes", device="cpu")
    assert index.manifest["calibrator"]["name"] == "flow"
    top = [hits[0].doc_id for hits in index.search(["someone plays music", "a kitten", "football match"], k=1)]
    assert top == ["guitar", "cat", "soccer"]


def test_add_appends_with_the_saved_calibrator_and_refuses_duplicates(tiny_index, tmp_path):
    before = tiny_index.calibrator.transform(tiny_index.raw_vectors()[0])
    extra = write_jsonl(tmp_path / "extra.jsonl", {"kitten": "A kitten plays with a ball of yarn."})
    summary = tiny_index.add(extra)
    assert summary.documents == len(DOCS) + 1 and summary.changed == 1
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert index.search("A kitten plays with a ball of yarn.", k=1)[0][0].doc_id == "kitten"
    np.testing.assert_allclose(index.calibrator.transform(index.raw_vectors()[0][: len(DOCS)]), before, atol=1e-2)
    clash = write_jsonl(tmp_path / "clash.jsonl", {"fresh": "new text", "dog": "another dog"})
    with pytest.raises(RetrieverError, match="'dog'"):
        index.add(clash)
    assert len(Index.open("tiny", tmp_path / "indexes", device="cpu")) == len(DOCS) + 1  # nothing half-added


def test_delete_removes_from_vectors_and_metadata_together(tiny_index, tmp_path):
    tiny_index.delete(["dog", "cat"])
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert len(index) == index.metadata.count() == len(DOCS) - 2
    found = {hit.doc_id for hits in index.search(list(DOCS.values()), k=len(DOCS)) for hit in hits}
    assert found == set(DOCS) - {"dog", "cat"}
    assert len(index.raw_vectors()[0]) == len(DOCS) - 2
    with pytest.raises(RetrieverError, match="'nope'"):
        index.delete(["python", "nope"])  # all or nothing
    assert len(Index.open("tiny", tmp_path / "indexes", device="cpu")) == len(DOCS) - 2


def test_refit_changes_the_calibrator_without_reencoding(tiny_index, tmp_path, monkeypatch):
    from retriever.encoder import Encoder

    monkeypatch.setattr(Encoder, "encode_counting_truncated", lambda *a, **k: pytest.fail("refit re-encoded"))
    tiny_index.refit("sn")
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert index.manifest["calibrator"]["name"] == "sn" and "refitted" in index.manifest
    raw, ids = index.raw_vectors()
    scores, found = index.vectors.search(l2_normalize(index.calibrator.transform(raw)), 1)
    np.testing.assert_array_equal(found[:, 0], ids)


def test_info_reports_isotropy_before_and_after(tiny_index):
    details = tiny_index.info()
    raw, calibrated = details["isotropy"]["raw"], details["isotropy"]["calibrated"]
    assert details["documents"] == details["vectors"] == len(DOCS)
    # A random BERT's vectors share a direction; whitening removes it.
    assert raw["mean_cosine_random_pairs"] > 0.5
    assert abs(calibrated["mean_cosine_random_pairs"]) < 0.2
    assert calibrated["top_direction_variance_share"] < raw["top_direction_variance_share"]


def test_hnsw_index_type(tmp_path, corpus, tiny_bert):
    Index.build(corpus, "graph", tmp_path, model=str(tiny_bert), calibrator="none", index_type="hnsw", device="cpu")
    index = Index.open("graph", tmp_path, device="cpu")
    assert index.vectors.index_type == "hnsw"
    assert [hits[0].doc_id for hits in index.search(list(DOCS.values()), k=1)] == list(DOCS)


def test_corrupted_files_are_detected_by_checksums(tiny_index, tmp_path):
    vectors = tiny_index.folder / "vectors.faiss"
    data = bytearray(vectors.read_bytes())
    data[len(data) // 2] ^= 0xFF
    vectors.write_bytes(bytes(data))
    with pytest.raises(RetrieverError, match="vectors.faiss does not match its manifest checksum"):
        Index.open("tiny", tmp_path / "indexes", device="cpu")
    (tiny_index.folder / MANIFEST).write_text('{"name": "tiny", "fil')
    with pytest.raises(RetrieverError, match="index 'tiny' is damaged: .* is not valid JSON"):
        Index.open("tiny", tmp_path / "indexes", device="cpu")


def drop(mapping: dict, *path: str) -> dict:
    """A deep copy of a manifest without the key at path."""
    copy = json.loads(json.dumps(mapping))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return copy


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda m: {}, "lists no file checksums"),
        (lambda m: [m], "lists no file checksums"),
        (lambda m: drop(m, "files"), "lists no file checksums"),
        (lambda m: drop(m, "encoder", "model"), "lacks 'encoder.model'"),
        (lambda m: drop(m, "index_type"), "lacks 'index_type'"),
        (lambda m: {**m, "dim": "32"}, "wrong type for 'dim'"),
        (lambda m: {**m, "encoder": "bert"}, "wrong type for 'encoder'"),
        (lambda m: drop(m, "calibrator", "name"), "lacks 'calibrator.name'"),
    ],
)
def test_a_manifest_that_parses_but_is_damaged_is_refused(tiny_index, tmp_path, damage, message):
    # Checksums cannot vouch for the manifest itself, so its shape is checked before anything trusts it.
    manifest = json.loads((tiny_index.folder / MANIFEST).read_text())
    (tiny_index.folder / MANIFEST).write_text(json.dumps(damage(manifest)))
    with pytest.raises(RetrieverError, match=f"index 'tiny' is damaged: .*{message}.*; rebuild the index"):
        Index.open("tiny", tmp_path / "indexes", device="cpu")


def test_missing_index_says_how_to_build_it(tmp_path):
    with pytest.raises(RetrieverError, match=f"retriever build CORPUS --name nowhere --index-dir {tmp_path}$"):
        Index.open("nowhere", tmp_path)


def test_an_opened_index_keeps_its_version_after_later_writes_prune_it(tiny_index, tmp_path):
    query = DOCS["rain"]
    before = tiny_index.search(query, k=3)
    for number in range(KEEP_VERSIONS):
        extra = write_jsonl(tmp_path / f"extra{number}.jsonl", {f"new{number}": f"Brand new document {number}."})
        Index.open("tiny", tmp_path / "indexes", device="cpu").add(extra)
    assert not tiny_index.folder.exists()  # pruned
    assert tiny_index.search(query, k=3) == before
    assert tiny_index.info()["documents"] == len(DOCS) and len(tiny_index.raw_vectors()[0]) == len(DOCS)


def test_txt_documents_from_two_files_keep_apart(tmp_path, tiny_bert):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(f"{DOCS['guitar']}\n\n{DOCS['onion']}\n", encoding="utf-8")
    second.write_text(f"{DOCS['dog']}\n", encoding="utf-8")
    Index.build(first, "lines", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
    Index.open("lines", tmp_path, device="cpu").add(second)  # line 1 again, in another file: no clash
    index = Index.open("lines", tmp_path, device="cpu")
    found = [hits[0].doc_id for hits in index.search([DOCS["guitar"], DOCS["onion"], DOCS["dog"]], k=1)]
    assert found == ["first.txt:1", "first.txt:3", "second.txt:1"]


def test_a_plain_folder_in_the_way_is_refused_before_encoding(tmp_path, corpus, monkeypatch):
    from retriever.encoder import Encoder

    monkeypatch.setattr(Encoder, "__init__", lambda *a, **k: pytest.fail("encoded before refusing"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("the user's own files")
    with pytest.raises(RetrieverError, match="plain folder"):
        Index.build(corpus, "mine", tmp_path)
    assert (tmp_path / "mine" / "notes.md").read_text() == "the user's own files"
    assert not (tmp_path / VERSIONS).exists()


def test_a_failed_build_leaves_the_previous_index_intact(tiny_index, tmp_path, tiny_bert, monkeypatch):
    from retriever.store.vectors import VectorStore

    before = tiny_index.search("A dog runs through the grass chasing a ball.", k=len(DOCS))
    other = write_jsonl(tmp_path / "other.jsonl", {"x": "something else entirely", "y": "and more"})

    def broken_save(self, path):
        Path(path).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(VectorStore, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        Index.build(other, "tiny", tmp_path / "indexes", model=str(tiny_bert), calibrator="whitening", device="cpu")
    monkeypatch.undo()
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")  # checksums verified
    assert index.search("A dog runs through the grass chasing a ball.", k=len(DOCS)) == before
    assert not list((tmp_path / "indexes" / VERSIONS / "tiny").glob("*.partial"))


BUILD_SCRIPT = textwrap.dedent(
    """
    import sys
    from retriever.index import Index
    Index.build(sys.argv[1], "tiny", sys.argv[2], model=sys.argv[3], calibrator="whitening", device="cpu")
    """
)


@pytest.mark.parametrize("moment", ["while encoding", "while writing the new version"])
def test_a_killed_build_leaves_the_previous_index_intact(tiny_index, tmp_path, tiny_bert, moment):
    index_dir = tmp_path / "indexes"
    before = tiny_index.search(list(DOCS.values()), k=2)
    big = tmp_path / "big.txt"
    big.write_text("".join(f"document {i} is about topic {i % 97} and item {i % 13}\n" for i in range(20000)))
    versions = index_dir / VERSIONS / "tiny"
    process = subprocess.Popen([sys.executable, "-c", BUILD_SCRIPT, big, index_dir, tiny_bert],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    if moment == "while encoding":
        time.sleep(3.0)
    else:  # the write phase lasts ~0.1 s for 20k documents: poll for its partial folder
        while not list(versions.glob("*.partial")) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.0005)
    assert process.poll() is None, "the build finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    index = Index.open("tiny", index_dir, device="cpu")  # the link still points at the complete old version
    assert len(index) == len(DOCS) and index.search(list(DOCS.values()), k=2) == before
    # The next writer clears what the killed one left.
    Index.build(tmp_path / "corpus.jsonl", "tiny", index_dir, model=str(tiny_bert), calibrator="whitening", device="cpu")
    assert not list(versions.glob("*.partial"))


READER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from retriever.index import Index
    index_dir, seconds = sys.argv[1], float(sys.argv[2])
    opened, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        index = Index.open("swap", index_dir, device="cpu")  # verifies every checksum against the manifest
        prefixes = {doc_id[0] for doc_id in index.metadata.doc_ids()}
        assert len(prefixes) == 1, prefixes  # all from one build
        assert len(index) == index.metadata.count() == index.manifest["documents"]
        assert set(index.vectors.ids()) == set(index.metadata.rowids())
        opened += 1
    print(opened)
    """
)


def test_searches_during_swaps_see_old_or_new_never_a_mix(tmp_path, tiny_bert):
    index_dir = tmp_path / "indexes"
    corpora = [
        write_jsonl(tmp_path / "a.jsonl", {f"a{i}": f"alpha text {i}" for i in range(300)}),
        write_jsonl(tmp_path / "b.jsonl", {f"b{i}": f"beta text number {i}" for i in range(500)}),
    ]
    Index.build(corpora[0], "swap", index_dir, model=str(tiny_bert), calibrator="none", device="cpu")
    reader = subprocess.Popen([sys.executable, "-c", READER_SCRIPT, index_dir, "8"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    builds = 0
    while reader.poll() is None:
        Index.build(corpora[builds % 2], "swap", index_dir, model=str(tiny_bert), calibrator="none", device="cpu")
        builds += 1
    out, err = reader.communicate()
    assert reader.returncode == 0, err
    assert builds >= 3 and int(out) >= 10
