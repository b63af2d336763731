"""The calibrated index through its Python API: build, search, add, delete, compact, refit, info, verify."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from retriever.calibration import make_calibrator
from retriever.errors import RetrieverError
from retriever.index import Index
from retriever.numeric import l2_normalize
from retriever.versions.folder import KEEP_VERSIONS
from retriever.versions.layout import MANIFEST, VERSIONS
from tests.helpers import DOCS, embed, encoder_of, search_vectors, sentences, vector_hits, write_jsonl


@pytest.fixture()
def corpus(tmp_path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", DOCS)


@pytest.fixture()
def tiny_index(tmp_path, corpus, tiny_bert) -> Index:
    Index.build(corpus, "tiny", tmp_path / "indexes", model=str(tiny_bert), calibrator="whitening", device="cpu")
    return Index.open("tiny", tmp_path / "indexes", device="cpu")


def inode(path: Path) -> int:
    return path.stat().st_ino


def test_each_document_finds_itself_through_the_recorded_encode_path(tiny_index):
    results = tiny_index.search(list(DOCS.values()), k=3, mode="dense")
    assert [hits[0].doc_id for hits in results] == list(DOCS)
    assert all(abs(hits[0].score - 1.0) < 1e-4 for hits in results)
    assert all(len(hits) == 3 and [h.rank for h in hits] == [1, 2, 3] for hits in results)
    # The query path is exactly: recorded encoder -> saved calibrator -> L2 normalization.
    query = "A man is playing a guitar on stage."
    expected = l2_normalize(tiny_index.snapshot.calibrator.transform(encoder_of(tiny_index).encode([query])))
    np.testing.assert_allclose(embed(tiny_index, [query]), expected, atol=1e-6)
    by_text, by_vector = tiny_index.search(query, k=3, mode="dense"), vector_hits(tiny_index, expected, 3)[0]
    assert [hit.doc_id for hit in by_text] == [hit.doc_id for hit in by_vector]
    assert [hit.score for hit in by_text] == pytest.approx([hit.score for hit in by_vector], abs=1e-6)


def test_the_index_is_a_small_api(tiny_index):
    """What a user's `Index` shows: the writes, the reads, the version store's two entry points, and the version
    it reads (`snapshot`); the plumbing lives in the layers below it."""
    names = {name for name in dir(tiny_index) if not name.startswith("_")}
    assert names == {"name", "snapshot", "build", "open", "search", "add", "sync", "delete", "compact", "refit", "document",
                     "documents", "info", "check", "versions", "rollback", "close"}


def test_manifest_records_everything_needed_to_reproduce(tiny_index, tiny_bert):
    manifest = tiny_index.snapshot.manifest.to_record()  # as written to manifest.json
    assert manifest["encoder"] == {"model": str(tiny_bert), "pooling": "last-avg", "layers": None,
                                   "max_length": 512, "dtype": "fp32", "dim": 32}
    assert manifest["calibrator"]["name"] == "whitening"
    assert manifest["fit"] == {"sample": len(DOCS), "of": len(DOCS), "seed": 0}
    assert manifest["documents"] == len(DOCS) and manifest["dim"] == 32 and manifest["index"] == {"type": "flat"}
    assert manifest["segments"] == [{"name": "000001", "rows": len(DOCS), "deleted": 0, "index": "flat",
                                     "fields": []}]
    assert manifest["next_rowid"] == len(DOCS) + 1
    assert {"torch", "transformers", "faiss-cpu", "numpy", "retriever"} <= set(manifest["versions"])
    segment = {f"segments/000001/{name}" for name in ("vectors.faiss", "documents.db", "raw.npy", "rowids.npy")}
    assert segment | {"calibrator/calibrator.json"} <= set(manifest["files"])
    assert all(set(entry) == {"bytes", "sha256"} for entry in manifest["files"].values())
    assert manifest["created"].endswith("+00:00") and len(manifest["checksum"]) == 64


def test_semantic_search_with_the_default_model_and_flow(tmp_path):
    # The flow needs more vectors than MiniLM's 384 dimensions (`FlowCalibrator.min_fit_rows`): add fillers.
    corpus = write_jsonl(tmp_path / "corpus.jsonl", {**DOCS, **sentences(380)})
    Index.build(corpus, "real", tmp_path / "indexes", device="cpu", calibrator="flow")  # MiniLM, last-avg
    index = Index.open("real", tmp_path / "indexes", device="cpu")
    assert index.snapshot.manifest.calibrator["name"] == "flow" and index.snapshot.manifest.calibrator_fallback is None
    top = [hits[0].doc_id for hits in index.search(["someone plays music", "a kitten", "football match"], k=1,
                                                    mode="dense")]
    assert top == ["guitar", "cat", "soccer"]


def test_add_writes_one_segment_and_links_the_rest(tiny_index, tmp_path):
    before = tiny_index.snapshot.calibrator.transform(tiny_index.snapshot.raw_vectors()[0])
    extra = write_jsonl(tmp_path / "extra.jsonl", {"kitten": "A kitten plays with a ball of yarn."})
    summary = tiny_index.add(extra)
    assert summary.documents == len(DOCS) + 1 and summary.changed == 1
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert [entry.name for entry in index.snapshot.manifest.segments] == ["000001", "000002"]
    for relative in tiny_index.snapshot.manifest.files:  # the old version's files, shared, never copied
        assert inode(index.snapshot.folder / relative) == inode(tiny_index.snapshot.folder / relative), relative
    assert index.search("A kitten plays with a ball of yarn.", k=1)[0].doc_id == "kitten"
    np.testing.assert_allclose(index.snapshot.calibrator.transform(index.snapshot.raw_vectors()[0][: len(DOCS)]), before, atol=1e-2)
    clash = write_jsonl(tmp_path / "clash.jsonl", {"fresh": "new text", "dog": "another dog"})
    with pytest.raises(RetrieverError, match=r"clash.jsonl: 1 id is already in the index: 'dog' \(line 2\)"):
        index.add(clash)
    assert len(Index.open("tiny", tmp_path / "indexes", device="cpu")) == len(DOCS) + 1  # nothing half-added


def test_delete_writes_tombstones_and_searches_still_return_k(tiny_index, tmp_path):
    tiny_index.delete(["dog", "cat"])
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert len(index) == len(DOCS) - 2 and len(index.snapshot.tombstones) == 2
    for relative in tiny_index.snapshot.manifest.files:  # nothing rewritten: the segment is shared
        assert inode(index.snapshot.folder / relative) == inode(tiny_index.snapshot.folder / relative)
    results = index.search(list(DOCS.values()), k=len(DOCS) - 2)
    assert all(len(hits) == len(DOCS) - 2 for hits in results)  # exactly k where k documents remain
    assert {hit.doc_id for hits in results for hit in hits} == set(DOCS) - {"dog", "cat"}
    assert len(index.snapshot.raw_vectors()[0]) == len(DOCS) - 2
    assert index.document("dog") is None and index.document("rain")["text"] == DOCS["rain"]
    with pytest.raises(RetrieverError, match="1 id is not in the index: 'nope'"):
        index.delete(["python", "nope"])  # all or nothing
    with pytest.raises(RetrieverError, match="'dog'"):
        index.delete(["dog"])  # already deleted
    assert len(Index.open("tiny", tmp_path / "indexes", device="cpu")) == len(DOCS) - 2
    again = write_jsonl(tmp_path / "again.jsonl", {"dog": "A different dog document."})
    index.add(again)  # a deleted id may come back
    assert Index.open("tiny", tmp_path / "indexes", device="cpu").document("dog")["text"] == "A different dog document."


def test_one_id_string_is_one_id_and_calls_of_the_wrong_kind_are_refused_in_one_line(tmp_path, tiny_bert):
    Index.build([{"_id": name, "text": f"A note about {topic}."} for name, topic in
                 (("a", "apples"), ("b", "bread"), ("ab", "both"))], "ids", tmp_path, model=str(tiny_bert),
                calibrator="none", device="cpu")
    index = Index.open("ids", tmp_path, device="cpu")
    assert [document["doc_id"] for document in index.documents("ab")] == ["ab"]
    assert index.delete("ab").changed == 1  # "ab", not "a" and "b"
    assert sorted(document["doc_id"] for document in Index.open("ids", tmp_path).documents()) == ["a", "b"]
    for call, message in [(lambda: index.search(42), "queries are a string or a list of strings, not int"),
                          (lambda: index.search(b"apples"), "queries are a string or a list of strings, not bytes"),
                          (lambda: index.search(["apples", 3]), "a query is text, not int (query 2 of 2)"),
                          (lambda: index.delete([1]), "document ids are strings; got 1 (int)"),
                          (lambda: index.add({"_id": "c", "text": "cherries"}), "put the one record in a list"),
                          (lambda: index.add([]), "no documents given"),
                          (lambda: index.search("cats \ud800"), "the query holds an invalid character (a lone "
                                                                 "surrogate U+D800 at character 6)"),
                          (lambda: Index.build({"_id": "c", "text": "cherries"}, "one", tmp_path),
                           "build takes a list of records (dicts or Documents), a corpus file or a folder; got a "
                           "dict: put the one record in a list"),
                          (lambda: Index.build(None, "none", tmp_path), "got None"),
                          (lambda: Index.build(7, "seven", tmp_path), "got an int"),
                          (lambda: index.document(5), "a document id is a string; got 5 (int)"),
                          (lambda: index.add(io.StringIO('{"_id": "c", "text": "cherries"}\n')),
                           "got a StringIO: give the file's path")]:
        with pytest.raises(RetrieverError, match=re.escape(message)) as caught:
            call()
        assert "\n" not in str(caught.value)
    # records from a generator are read as a list of them would be
    made = Index.build(({"_id": f"g{i}", "text": f"note {i} about gardens"} for i in range(3)), "made", tmp_path,
                       model=str(tiny_bert), calibrator="none", device="cpu").open()
    assert len(made) == 3 and made.add({"_id": f"h{i}", "text": "hedges"} for i in range(2)).documents == 5


def test_search_after_add_delete_compact_equals_a_fresh_build(tmp_path, tiny_bert):
    """Segments and tombstones are an implementation detail: the answers are those of one fresh index of the
    same documents with the same calibrator."""
    index_dir = tmp_path / "indexes"
    first, second = sentences(60), sentences(40, start=60)
    calibrator = make_calibrator("flow", seed=1)
    Index.build(write_jsonl(tmp_path / "first.jsonl", first), "live", index_dir, model=str(tiny_bert),
                calibrator=calibrator, device="cpu")
    fitted = Index.open("live", index_dir, device="cpu").snapshot.calibrator
    Index.open("live", index_dir, device="cpu").add(write_jsonl(tmp_path / "second.jsonl", second))
    removed = [f"d{i}" for i in range(0, 100, 9)]
    Index.open("live", index_dir, device="cpu").delete(removed)
    remaining = {key: text for key, text in {**first, **second}.items() if key not in removed}
    Index.build(write_jsonl(tmp_path / "fresh.jsonl", remaining), "fresh", index_dir, model=str(tiny_bert),
                calibrator=fitted, device="cpu")
    fresh = Index.open("fresh", index_dir, device="cpu")
    queries = [f"{text} again" for text in list(remaining.values())[::5]] + ["a violin on day 7", "the harbour"]

    def answers(index):
        return {mode: [[(hit.doc_id, hit.score) for hit in hits] for hits in index.search(queries, k=10, mode=mode)]
                for mode in ("dense", "keyword", "hybrid")}

    def same(first: dict, second: dict) -> None:
        for mode in first:
            assert [[doc for doc, _ in hits] for hits in first[mode]] == [[doc for doc, _ in hits] for hits in
                                                                          second[mode]], mode
            assert [[score for _, score in hits] for hits in first[mode]] == [
                pytest.approx([score for _, score in hits], abs=1e-4) for hits in second[mode]]

    live = Index.open("live", index_dir, device="cpu")
    assert len(live.snapshot.segments) == 2 and len(live.snapshot.tombstones) == len(removed)
    same(answers(live), answers(fresh))
    live.compact()
    compacted = Index.open("live", index_dir, device="cpu")
    assert len(compacted.snapshot.segments) == 1 and len(compacted.snapshot.tombstones) == 0 and len(compacted) == len(remaining)
    same(answers(compacted), answers(fresh))
    assert compacted.snapshot.verify() > 0


@pytest.mark.parametrize("index_type", ["hnsw", "ivf", "ivfpq"])
def test_approximate_index_types_through_the_index(tmp_path, tiny_bert, index_type, monkeypatch):
    # hnsw segments under SMALL_SEGMENT_ROWS are flat: 400 documents make a graph, an add of 50 does not.
    monkeypatch.setattr("retriever.store.spec.SMALL_SEGMENT_ROWS", 100)
    docs = sentences(400)
    Index.build(write_jsonl(tmp_path / "c.jsonl", docs), "approx", tmp_path, model=str(tiny_bert),
                calibrator="none", index_type=index_type, device="cpu")
    index = Index.open("approx", tmp_path, device="cpu")
    assert index.snapshot.spec.type == index_type and index.snapshot.manifest.index["type"] == index_type
    texts = list(docs.values())[::20]
    assert [hits[0].doc_id for hits in index.search(texts, k=1)] == list(docs)[::20]
    index.add(write_jsonl(tmp_path / "more.jsonl", sentences(50, start=400)))
    index = Index.open("approx", tmp_path, device="cpu")
    added = "flat" if index_type == "hnsw" else index_type
    assert [segment.vectors.index_type for segment in index.snapshot.segments] == [index_type, added]
    assert index.search(sentences(1, start=420)["d420"], k=1)[0].doc_id == "d420"
    index.delete(["d420"])
    index = Index.open("approx", tmp_path, device="cpu")
    assert [entry.deleted for entry in index.snapshot.manifest.segments] == [0, 1]
    assert "d420" not in [hit.doc_id for hit in index.search(sentences(1, start=420)["d420"], k=5)]
    index.compact()
    compacted = Index.open("approx", tmp_path, device="cpu")
    assert len(compacted) == 449 and [segment.vectors.index_type for segment in compacted.snapshot.segments] == [index_type]


def test_streamed_build_equals_a_one_shot_build(tmp_path, tiny_bert):
    """Chunks of 7 documents, a fit on all of them: the same ids, vectors and top-k as encoding, fitting and
    transforming the whole corpus in one go. On PyTorch, whose masked attention gives a text the same vector in a
    batch of 7 as in one of 50 (ONNX Runtime's fused attention moves its last bits with the padding, and whitening a
    random 32-d model's vectors magnifies those)."""
    from retriever.index import load_encoder

    docs = sentences(50)
    corpus = write_jsonl(tmp_path / "c.jsonl", docs)
    Index.build(corpus, "streamed", tmp_path, model=str(tiny_bert), calibrator="whitening", device="cpu",
                chunk_rows=7, runtime="torch")
    index = Index.open("streamed", tmp_path, device="cpu")
    raw = load_encoder(index.snapshot, runtime="torch").encode(list(docs.values()))
    expected = l2_normalize(make_calibrator("whitening").fit(raw).transform(raw))
    segment = index.snapshot.segments[0]
    assert segment.documents.doc_ids() == list(docs)
    np.testing.assert_allclose(segment.vectors.stored_vectors(), expected, atol=1e-6)
    np.testing.assert_allclose(index.snapshot.raw_vectors()[0], raw, rtol=1e-3, atol=1e-3)  # float16 on disk
    scores, ids = search_vectors(index, expected, 5)
    exact = np.argsort(-(expected @ expected.T), axis=1)[:, :5] + 1
    np.testing.assert_array_equal(ids, exact)


def test_fit_sample_bounds_the_fit_and_changes_nothing_below_it(tmp_path, tiny_bert):
    corpus = write_jsonl(tmp_path / "c.jsonl", sentences(120))
    Index.build(corpus, "all", tmp_path, model=str(tiny_bert), calibrator="whitening", device="cpu")
    Index.build(corpus, "bounded", tmp_path, model=str(tiny_bert), calibrator="whitening", device="cpu",
                fit_sample=120)  # exactly the corpus: the same fit as no bound at all
    Index.build(corpus, "sampled", tmp_path, model=str(tiny_bert), calibrator="whitening", device="cpu",
                fit_sample=40)
    every, bounded, sampled = (Index.open(name, tmp_path, device="cpu") for name in ("all", "bounded", "sampled"))
    raw = every.snapshot.raw_vectors()[0]
    np.testing.assert_array_equal(bounded.snapshot.calibrator.transform(raw), every.snapshot.calibrator.transform(raw))
    assert sampled.snapshot.manifest.fit == {"sample": 40, "of": 120, "seed": 0}
    assert not np.allclose(sampled.snapshot.calibrator.transform(raw), every.snapshot.calibrator.transform(raw), atol=1e-3)


def test_refit_changes_the_calibrator_without_reencoding(tiny_index, tmp_path, monkeypatch):
    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder

    for encoder in (Encoder, QueryKitEncoder):  # neither the model nor its kit
        monkeypatch.setattr(encoder, "encode_tokenized", lambda *a, **k: pytest.fail("refit re-encoded"))
    tiny_index.refit("sn")
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert index.snapshot.manifest.calibrator["name"] == "sn" and index.snapshot.manifest.refitted is not None
    raw, ids = index.snapshot.raw_vectors()
    scores, found = search_vectors(index, l2_normalize(index.snapshot.calibrator.transform(raw)), 1)
    np.testing.assert_array_equal(found[:, 0], ids)
    old, new = tiny_index.snapshot.segments[0].folder, index.snapshot.segments[0].folder
    assert inode(old / "documents.db") == inode(new / "documents.db")  # documents and raw vectors reused


def test_a_refit_that_leaves_the_raw_vectors_keeps_the_hybrid_weight_decided(tmp_path, tiny_bert, monkeypatch):
    """From a QA run: an index whose auto check kept the raw vectors, refitted with `none` (the same vectors), went
    back to the default weight and ranked its hybrid results otherwise."""
    import retriever.index
    from retriever.defaults import DEFAULT_WEIGHT

    decided = {"fusion": "zscore-union", "weight": 0.4, "reason": "decided by a check (here, by hand)"}
    monkeypatch.setattr(retriever.index, "hybrid_check", lambda *args: dict(decided))
    built = Index.build([{"_id": str(i), "text": text} for i, text in enumerate(DOCS)], "kept", tmp_path,
                        model=str(tiny_bert), calibrator="none", device="cpu").open()
    monkeypatch.undo()
    before = built.snapshot.manifest.hybrid
    assert before["weight"] == 0.4
    assert built.refit("none").open().snapshot.manifest.hybrid == before
    assert built.refit("whitening").open().snapshot.manifest.hybrid["weight"] == DEFAULT_WEIGHT  # new vectors


def test_info_reports_isotropy_before_and_after(tiny_index):
    details = tiny_index.info()
    raw, calibrated = details["isotropy"]["raw"], details["isotropy"]["calibrated"]
    assert details["documents"] == details["vectors"] == len(DOCS) and details["deleted"] == 0
    # A random BERT's vectors share a direction; whitening removes it.
    assert raw["mean_cosine"] > 0.5
    assert abs(calibrated["mean_cosine"]) < 0.2
    assert calibrated["top_direction_share"] < raw["top_direction_share"]


def test_an_index_whose_every_document_was_deleted_compacts_and_takes_new_ones(tmp_path, tiny_bert):
    """Compaction of an index with no segment left raised IndexError from inside the merge."""
    index = Index.build([{"_id": "a", "text": "cats and dogs"}, {"_id": "b", "text": "stock market prices"}], "gone",
                        tmp_path, model=str(tiny_bert), calibrator="none", device="cpu").open()
    index.delete(["a", "b"])
    compacted = index.compact()
    assert compacted.documents == 0 and len(index) == 0 and index.search("cats", k=3) == []
    index.add([{"_id": "c", "text": "the orbit of mars"}])
    assert [hit.doc_id for hit in index.search("mars", k=3)] == ["c"] and index.compact().documents == 1


def test_automatic_compaction_bounds_segments_and_drops_heavy_deletions(tmp_path, tiny_bert):
    from retriever.index import MERGE_POLICY

    COMPACT_MAX_SEGMENTS = MERGE_POLICY.max_segments

    Index.build(write_jsonl(tmp_path / "base.jsonl", sentences(30)), "many", tmp_path, model=str(tiny_bert),
                calibrator="none", device="cpu")
    for number in range(COMPACT_MAX_SEGMENTS + 2):
        extra = write_jsonl(tmp_path / f"add{number}.jsonl", sentences(3, start=100 + 3 * number))
        Index.open("many", tmp_path, device="cpu").add(extra)
    index = Index.open("many", tmp_path, device="cpu")
    assert len(index.snapshot.segments) <= COMPACT_MAX_SEGMENTS and len(index) == 30 + 3 * (COMPACT_MAX_SEGMENTS + 2)
    assert index.snapshot.segments[0].name == "000001"  # the big segment is left alone; small ones were merged
    index.delete([f"d{i}" for i in range(10)])  # a third of the first segment
    index = Index.open("many", tmp_path, device="cpu")
    assert index.snapshot.segments[0].name != "000001" and len(index.snapshot.tombstones) == 0  # rewritten without them
    assert len(index) == 30 - 10 + 3 * (COMPACT_MAX_SEGMENTS + 2)


def test_open_checks_sizes_and_verify_rehashes(tiny_index, tmp_path, monkeypatch):
    import retriever.versions.integrity

    with monkeypatch.context() as patched:  # opening never hashes a file
        patched.setattr(retriever.versions.integrity, "sha256_file", lambda path: pytest.fail("open re-hashed"))
        Index.open("tiny", tmp_path / "indexes", device="cpu")
    vectors = tiny_index.snapshot.folder / "segments" / "000001" / "vectors.faiss"
    data = bytearray(vectors.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only a re-hash can tell
    vectors.write_bytes(bytes(data))
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    with pytest.raises(RetrieverError, match="segments/000001/vectors.faiss does not match its manifest checksum"):
        index.snapshot.verify()
    vectors.write_bytes(bytes(data[:-10]))
    with pytest.raises(RetrieverError, match=r"vectors.faiss has \d+ bytes, its manifest says \d+"):
        Index.open("tiny", tmp_path / "indexes", device="cpu")
    (tiny_index.snapshot.folder / MANIFEST).write_text('{"name": "tiny", "fil')
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


def resealed(manifest: dict) -> dict:
    """MANIFEST with a checksum that matches it: damage written by a tool, not by a bit flip."""
    from retriever.versions.manifest import record_checksum

    return {**manifest, "checksum": record_checksum(manifest)} if isinstance(manifest, dict) else manifest


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda m: {}, "lists no files"),
        (lambda m: [m], "lists no files"),
        (lambda m: drop(m, "files"), "lists no files"),
        (lambda m: {**m, "documents": 7}, "does not match its own checksum"),
        (lambda m: resealed(drop(m, "encoder", "model")), "lacks 'encoder.model'"),
        (lambda m: resealed(drop(m, "segments")), "lacks 'segments'"),
        (lambda m: resealed({**m, "dim": "32"}), "wrong type for 'dim'"),
        (lambda m: resealed({**m, "encoder": "bert"}), "wrong type for 'encoder'"),
        (lambda m: resealed(drop(m, "calibrator", "name")), "lacks 'calibrator.name'"),
        (lambda m: resealed({**m, "segments": [3]}), "malformed 'segments'"),
    ],
)
def test_a_manifest_that_parses_but_is_damaged_is_refused(tiny_index, tmp_path, damage, message):
    manifest = json.loads((tiny_index.snapshot.folder / MANIFEST).read_text())
    (tiny_index.snapshot.folder / MANIFEST).write_text(json.dumps(damage(manifest)))
    with pytest.raises(RetrieverError, match=f"index 'tiny' is damaged: .*{message}.*; rebuild the index"):
        Index.open("tiny", tmp_path / "indexes", device="cpu")


def test_an_index_of_the_old_format_says_to_rebuild(tiny_index, tmp_path):
    (tiny_index.snapshot.folder / MANIFEST).write_text(json.dumps({"format_version": 1, "files": {"a": "b"}}))
    with pytest.raises(RetrieverError, match=r"built by an older retriever \(index format 1\); rebuild it"):
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
    Index.open("tiny", tmp_path / "indexes", device="cpu").delete(["rain"])
    assert not tiny_index.snapshot.folder.exists()  # pruned
    assert tiny_index.search(query, k=3) == before
    assert tiny_index.info()["documents"] == len(DOCS) and len(tiny_index.snapshot.raw_vectors()[0]) == len(DOCS)


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
    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder

    for encoder in (Encoder, QueryKitEncoder):  # neither the model nor its kit
        monkeypatch.setattr(encoder, "__init__", lambda *a, **k: pytest.fail("encoded before refusing"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("the user's own files")
    with pytest.raises(RetrieverError, match="plain folder"):
        Index.build(corpus, "mine", tmp_path)
    assert (tmp_path / "mine" / "notes.md").read_text() == "the user's own files"
    assert not (tmp_path / VERSIONS).exists()


def test_duplicate_ids_in_a_corpus_fail_before_the_model_loads(tmp_path, monkeypatch):
    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder

    for encoder in (Encoder, QueryKitEncoder):  # neither the model nor its kit
        monkeypatch.setattr(encoder, "__init__", lambda *a, **k: pytest.fail("loaded the model before refusing"))
    corpus = tmp_path / "dups.jsonl"
    corpus.write_text('{"_id": "a", "text": "x"}\n{"_id": "b", "text": "y"}\n{"_id": "a", "text": "z"}\n')
    with pytest.raises(RetrieverError, match=r"dups.jsonl: duplicate ids: 'a' \(lines 1 and 3\)"):
        Index.build(corpus, "dups", tmp_path)
    assert not (tmp_path / "dups").exists() and not list((tmp_path / VERSIONS / "dups").glob("*.partial"))


def test_a_failed_build_leaves_the_previous_index_intact(tiny_index, tmp_path, tiny_bert, monkeypatch):
    from retriever.store.vectors import VectorStore

    before = tiny_index.search("A dog runs through the grass chasing a ball.", k=len(DOCS))
    other = write_jsonl(tmp_path / "other.jsonl", {"x": "something else entirely", "y": "and more"})

    def broken_save(self, path):
        Path(path).write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(VectorStore, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        Index.build(other, "tiny", tmp_path / "indexes", model=str(tiny_bert), calibrator="whitening", device="cpu",
                    replace=True)
    monkeypatch.undo()
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert index.snapshot.verify() > 0
    assert index.search("A dog runs through the grass chasing a ball.", k=len(DOCS)) == before
    assert not list((tmp_path / "indexes" / VERSIONS / "tiny").glob("*.partial"))


# --- building from precomputed vectors ----------------------------------------------------------------------


def test_build_from_vectors_equals_build_with_encoding(tmp_path, tiny_bert):
    docs = sentences(30)
    corpus = write_jsonl(tmp_path / "c.jsonl", docs)
    Index.build(corpus, "encoded", tmp_path, model=str(tiny_bert), calibrator="whitening", device="cpu")
    encoded = Index.open("encoded", tmp_path, device="cpu")
    shards = tmp_path / "shards"
    shards.mkdir()
    raw = encoder_of(encoded).encode(list(docs.values()))
    np.save(shards / "part-000.npy", raw[:16])
    np.save(shards / "part-001.npy", raw[16:])
    Index.build(corpus, "given", tmp_path, vectors=shards, model=str(tiny_bert), calibrator="whitening",
                device="cpu")
    given = Index.open("given", tmp_path, device="cpu")
    assert given.snapshot.manifest.encoder == encoded.snapshot.manifest.encoder  # queries go through the same path
    np.testing.assert_allclose(given.snapshot.segments[0].vectors.stored_vectors(),
                               encoded.snapshot.segments[0].vectors.stored_vectors(), atol=1e-5)
    assert [h.doc_id for h in given.search(docs["d3"], k=3)] == [h.doc_id for h in encoded.search(docs["d3"], k=3)]


def test_bad_vectors_are_one_line_and_write_nothing(tiny_index, tmp_path, tiny_bert):
    corpus = write_jsonl(tmp_path / "c.jsonl", sentences(10))
    np.save(tmp_path / "short.npy", np.ones((9, 32), np.float32))
    np.save(tmp_path / "wide.npy", np.ones((10, 16), np.float32))
    with_inf = np.ones((10, 32), np.float32)
    with_inf[7, 3] = np.inf
    np.save(tmp_path / "inf.npy", with_inf)
    (tmp_path / "junk.npy").write_bytes(b"\x93NUMPY junk")
    cases = {
        "short.npy": r"short.npy holds 9 vectors for 10 documents in .*c.jsonl; row i must be document i",
        "wide.npy": r"wide.npy holds 16-dimensional vectors; .* gives 32",
        "inf.npy": r"inf.npy: row 7 \(document 8\) has NaN or infinite values",
        "junk.npy": "junk.npy: not a readable .npy file",
        "nothing.npy": "no such file or folder",
    }
    before = tiny_index.search(list(DOCS.values()), k=2)
    versions = sorted((tmp_path / "indexes" / VERSIONS / "tiny").iterdir())
    for name, message in cases.items():
        with pytest.raises(RetrieverError, match=message):
            Index.build(corpus, "tiny", tmp_path / "indexes", vectors=tmp_path / name, model=str(tiny_bert),
                        device="cpu", replace=True)
    assert sorted((tmp_path / "indexes" / VERSIONS / "tiny").iterdir()) == versions  # nothing written
    assert Index.open("tiny", tmp_path / "indexes", device="cpu").search(list(DOCS.values()), k=2) == before


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_close_releases_a_versions_files(tiny_index, tmp_path):
    tiny_index.add(write_jsonl(tmp_path / "extra.jsonl", {"kitten": "A kitten plays with a ball of yarn."}))
    queries = l2_normalize(np.random.default_rng(0).normal(size=(2, tiny_index.snapshot.manifest.dim)))
    baseline = open_descriptors()
    with Index.open("tiny", tmp_path / "indexes", device="cpu") as index:
        assert len(vector_hits(index, queries, 3)[0]) == 3
        assert open_descriptors() >= baseline + 2 * len(index.snapshot.segments)  # a connection and maps per segment
    assert open_descriptors() == baseline
    index.close()  # again: nothing to do
    with pytest.raises(RetrieverError, match="^index 'tiny' was closed; open it again to use it$"):
        index.search("a query", k=3)


def test_threads_reading_and_writing_at_once_never_fail(tmp_path, tiny_bert, monkeypatch):
    """Searches, adds and deletes from a thread pool, as the server runs them. numpy parses .npy headers with
    ast.literal_eval, which some CPython versions cannot run in two threads at once (python/cpython#106905:
    "SystemError: AST constructor recursion depth mismatch"); the parses numpy makes must take turns."""
    import ast
    import sys
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    index_dir = tmp_path / "indexes"
    Index.build(write_jsonl(tmp_path / "base.jsonl", sentences(40)), "busy", index_dir, model=str(tiny_bert),
                calibrator="whitening", device="cpu")
    parsing, overlaps, guard, original = [0], [], threading.Lock(), ast.literal_eval

    def watched(text):
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("numpy"):
            return original(text)
        with guard:
            parsing[0] += 1
            overlaps.append(parsing[0] > 1)
        try:
            time.sleep(0.002)  # widen the window a concurrent parse would fall in
            return original(text)
        finally:
            with guard:
                parsing[0] -= 1

    monkeypatch.setattr(ast, "literal_eval", watched)
    rng = np.random.default_rng(0)

    def add(number: int) -> None:
        docs = {f"new{number}-{i}": f"added text {number} {i}" for i in range(3)}
        np.save(tmp_path / f"new{number}.npy", rng.normal(size=(3, 32)).astype(np.float32))
        Index.open("busy", index_dir, device="cpu").add(write_jsonl(tmp_path / f"new{number}.jsonl", docs),
                                                        vectors=tmp_path / f"new{number}.npy")

    def delete(number: int) -> None:
        Index.open("busy", index_dir, device="cpu").delete([f"d{number}"])

    def search(number: int) -> None:
        with Index.open("busy", index_dir, device="cpu") as index:
            queries = l2_normalize(np.random.default_rng(number).normal(size=(2, index.snapshot.manifest.dim)))
            assert all(len(hits) == 5 for hits in vector_hits(index, queries, 5))
            assert index.document("d39")["text"] == sentences(40)["d39"]

    tasks = [(add, n) for n in range(6)] + [(delete, n) for n in range(6)] + [(search, n) for n in range(24)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for done in [pool.submit(task, number) for task, number in tasks]:
            done.result()  # re-raises what a thread raised
    assert len(overlaps) > 100 and not any(overlaps)
    assert len(Index.open("busy", index_dir, device="cpu")) == 40 + 6 * 3 - 6


def test_a_write_never_fails_after_its_commit(tiny_index, tmp_path, monkeypatch):
    from retriever.versions.folder import PartialVersion

    def failing(self, keep):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(PartialVersion, "_prune", failing)
    with pytest.warns(UserWarning, match="index 'tiny' was written, but tidying up after it failed"):
        summary = tiny_index.delete(["dog"])
    assert summary.documents == len(DOCS) - 1 == len(Index.open("tiny", tmp_path / "indexes", device="cpu"))


def test_a_swap_the_disk_does_not_confirm_is_said_so_and_a_rollback_is_done_all_the_same(tiny_index, tmp_path,
                                                                                          monkeypatch):
    """From a crash QA run: the fsync that makes a commit's link swap survive a power loss failed, and the write
    was reported with a warning about "tidying up"; a rollback in the same case said "error: Input/output error"
    after it had happened."""
    import retriever.versions.folder as version_folder

    home = tmp_path / "indexes"
    original = version_folder._fsync_dir

    def failing_on_the_home(folder):
        if Path(folder) == home:  # the folder holding the index's link: the swap's durability
            raise OSError(5, "Input/output error")
        original(folder)

    monkeypatch.setattr(version_folder, "_fsync_dir", failing_on_the_home)
    with pytest.warns(UserWarning, match=r"index 'tiny' was written and is read as such, but the disk did not "
                                         r"confirm it is saved \(Input/output error\): a power loss now could undo"):
        tiny_index.delete(["dog"])
    with pytest.warns(UserWarning, match="index 'tiny' was rolled back and is read as such, but the disk did not"):
        Index.rollback("tiny", 1, home, device="cpu")
    assert [(v["version"], v["current"]) for v in Index.versions("tiny", home)] == [(2, False), (1, True)]


def test_a_version_never_committed_is_not_kept_nor_rolled_back_to(tiny_index, tmp_path, monkeypatch):
    """From a crash QA run: an add killed after renaming its version into place and before swapping the link left
    a whole version that no reader ever saw; `versions` listed it and a rollback made it current."""
    import retriever.versions.folder as version_folder
    from retriever.errors import NotFoundError

    home = tmp_path / "indexes"

    def killed(link, final):
        raise KeyboardInterrupt  # as a kill between the folder's rename and the link's swap

    monkeypatch.setattr(version_folder, "_point", killed)
    with pytest.raises(KeyboardInterrupt):
        tiny_index.delete(["dog"])
    monkeypatch.undo()
    assert len(list((home / ".versions" / "tiny").iterdir())) >= 2  # the orphan is on disk
    assert [(v["version"], v["current"]) for v in Index.versions("tiny", home)] == [(1, True)]
    with pytest.raises(NotFoundError, match="has no kept version '2'; kept: 1"):
        Index.rollback("tiny", 2, home, device="cpu")


def test_a_disk_with_no_byte_free_is_the_one_line_of_a_full_disk(tiny_index, tmp_path, monkeypatch):
    """From a crash QA run: with nothing free, the version number's record (written before anything else) failed
    as a bare "No space left on device", and left an empty numbers.json.partial behind."""
    import errno

    import retriever.versions.folder as version_folder
    from retriever.errors import UnavailableError

    original_open = open

    def full(path, *args, **kwargs):
        if str(path).endswith("numbers.json.partial"):
            original_open(path, "w").close()  # created, and nothing could be written into it
            raise OSError(errno.ENOSPC, "No space left on device")
        return original_open(path, *args, **kwargs)

    monkeypatch.setattr(version_folder, "open", full, raising=False)
    with pytest.raises(UnavailableError, match="^index 'tiny' was not written: the disk is full .*; the previous "
                                               "version is intact; free some space and run it again$"):
        tiny_index.delete(["dog"])
    monkeypatch.undo()
    assert not list((tmp_path / "indexes" / ".versions" / "tiny").glob("*.partial"))
    assert len(Index.open("tiny", tmp_path / "indexes", device="cpu")) == len(DOCS)
    # a new index where not even its lock file fits: the same line, and no empty folder left for it
    import os

    from retriever.versions.layout import LOCK

    opening = os.open

    def no_room_for_a_lock(path, *args, **kwargs):
        if Path(path).name == LOCK and "fresh" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return opening(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_room_for_a_lock)
    with pytest.raises(UnavailableError, match="^index 'fresh' was not written: the disk is full .*; no index was "
                                               "made; free some space and run it again$"):
        Index.build([{"_id": "a", "text": "one"}], "fresh", tmp_path / "indexes", calibrator="none")
    monkeypatch.undo()
    assert not (tmp_path / "indexes" / ".versions" / "fresh").exists()


def test_every_folder_of_a_new_version_is_fsynced(tiny_index, tmp_path, monkeypatch):
    import retriever.versions.folder as version_folder

    synced, original = [], version_folder._fsync_dir

    def recording(folder):
        parts = Path(folder).parts
        partial = [number for number, part in enumerate(parts) if part.endswith(".partial")]
        if partial:  # inside the version being written: record where, relative to it
            synced.append(str(Path(*parts[partial[0] + 1 :]) if len(parts) > partial[0] + 1 else "."))
        original(folder)

    monkeypatch.setattr(version_folder, "_fsync_dir", recording)
    tiny_index.add(write_jsonl(tmp_path / "extra.jsonl", {"kitten": "A kitten plays with a ball of yarn."}))
    version = (tmp_path / "indexes" / "tiny").resolve()
    folders = {"."} | {str(path.relative_to(version)) for path in version.rglob("*") if path.is_dir()}
    assert folders == {".", "calibrator", "segments", "segments/000001", "segments/000002"}
    assert sorted(synced) == sorted(folders)  # each once, the version's own folder last
    assert synced[-1] == "."


def test_an_open_raced_by_two_writes_opens_the_newer_version(tiny_index, tmp_path, monkeypatch):
    import retriever.versions.snapshot as snapshot_module  # where opening reads the manifest

    original, raced = snapshot_module.read_manifest, []

    def racing(folder, name=None):
        manifest = original(folder, name)
        if not raced:
            raced.append(folder)
            for doc_id in ("dog", "cat"):  # two commits: the second prunes the version this open resolved
                tiny_index.delete([doc_id])
        return manifest

    monkeypatch.setattr(snapshot_module, "read_manifest", racing)
    index = Index.open("tiny", tmp_path / "indexes", device="cpu")
    assert not raced[0].exists() and index.snapshot.folder != raced[0] and len(index) == len(DOCS) - 2


def test_an_index_sees_its_own_writes_and_a_summary_opens_the_version_a_write_made(tmp_path, tiny_bert):
    """The API's contract, as Chroma's, LanceDB's and txtai's: `index.add(...)` then `index.search(...)` finds the
    new document (records as a .jsonl holds them are taken); `summary.open()` is the version a write committed,
    as another object; a search that began before a write finishes on its version."""
    from retriever.corpus import Document

    docs = sentences(30)
    built = Index.build(write_jsonl(tmp_path / "c.jsonl", docs), "snap", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="sn", device="cpu")
    index = built.open()
    before = index.snapshot
    assert len(index) == len(docs) and index.snapshot.folder == Path(built.folder)
    added = index.add([{"_id": "new", "text": "a brand new sentence about lighthouses", "metadata": {"tags": ["x"]}}])
    assert len(index) == len(docs) + 1 and index.document("new")["metadata"] == {"tags": ["x"]}
    assert index.search("a brand new sentence about lighthouses", k=1)[0].doc_id == "new"
    assert len(before) == len(docs) and before.document("new") is None  # the version left is unchanged
    newer = added.open()
    assert len(newer) == len(docs) + 1 and newer.document("new")["text"].startswith("a brand new")
    newest = newer.delete(["d0"]).open()
    assert newest.document("d0") is None and newer.document("d0") is None  # newer followed its own delete
    index.add([Document("other", "another sentence", None, "api", 1)])  # on the current version, not its own
    assert index.document("d0") is None and index.document("other") is not None
    assert newest.compact().open().snapshot.folder == Index.open("snap", tmp_path / "ix", device="cpu").snapshot.folder


def test_build_takes_documents_and_vectors_from_memory(tmp_path, tiny_bert):
    """The Python API builds from what a program holds: Documents and a vector array, no file written."""
    from retriever.corpus import Document
    from retriever.encode.encoder import Encoder

    docs = sentences(40)
    documents = [Document(doc_id, text, None, "api", n) for n, (doc_id, text) in enumerate(docs.items(), start=1)]
    encoder = Encoder(str(tiny_bert), device="cpu")
    vectors = encoder.encode(list(docs.values()))
    from_memory = Index.build(documents, "mem", tmp_path / "ix", vectors=vectors, encoder=encoder, calibrator="sn",
                              device="cpu").open()
    from_file = Index.build(write_jsonl(tmp_path / "c.jsonl", docs), "file", tmp_path / "ix", model=str(tiny_bert),
                            calibrator="sn", device="cpu").open()
    assert from_memory.snapshot.manifest.source is None and len(from_memory) == 40
    query = docs["d17"]
    assert [h.doc_id for h in from_memory.search(query, k=3)] == [h.doc_id for h in from_file.search(query, k=3)]
    for bad, message in ((["not a document"], "not a record .* or a retriever.corpus.Document"),
                         ([{"_id": "x"}], 'record 1: missing "text"'),
                         ([Document("x", " ", None, "api", 1)], "non-empty"),
                         ([Document("x", "a \ud800", None, "api", 1)], "invalid character"),
                         (documents[:2] + documents[:1], "d0")):
        with pytest.raises(RetrieverError, match=message):
            Index.build(bad, "bad", tmp_path / "ix", encoder=encoder, calibrator="none", device="cpu")
    with pytest.raises(RetrieverError, match="2-D floating-point"):
        Index.build(documents, "bad", tmp_path / "ix", vectors=np.arange(40), encoder=encoder, device="cpu")


def test_an_index_of_vectors_from_outside_is_searched_by_query_vectors_and_lists_its_documents(tmp_path):
    from retriever.encode.external import ExternalEncoder

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(6, 8)).astype(np.float32)
    records = [{"_id": f"v{i}", "text": f"note {i} on {'tea' if i % 2 else 'rain'}", "metadata": {"i": i}}
               for i in range(6)]
    summary = Index.build(records, "outside", tmp_path, vectors=vectors, encoder=ExternalEncoder("mine", 8))
    index = summary.open()
    assert index.snapshot.manifest.encoder["model"] == "external:mine"
    assert index.snapshot.manifest.calibrator["name"] == "auto"  # kept raw: no model to make pseudo-queries with
    dense = index.search(None, k=2, mode="dense", vectors=vectors[3])  # one vector: one query's hits
    assert dense[0].doc_id == "v3" and dense[0].score == pytest.approx(1.0, abs=1e-5)
    batch = index.search(None, k=1, mode="dense", vectors=vectors[[1, 4]])
    assert [hits[0].doc_id for hits in batch] == ["v1", "v4"]
    hybrid = index.search("tea", k=3, vectors=vectors[1])
    assert hybrid[0].doc_id == "v1"
    with pytest.raises(RetrieverError, match="hybrid search reads the query texts"):
        index.search(None, k=1, vectors=vectors[0])
    with pytest.raises(RetrieverError, match="search it with query vectors"):
        index.search("tea", k=1)
    with pytest.raises(RetrieverError, match="takes 8-dimensional vectors"):
        index.search(None, k=1, mode="dense", vectors=np.ones(5))
    # from a QA run: each answered the first documents stored, every score 0
    with pytest.raises(RetrieverError, match="row 1 is all zeros: a vector of no direction"):
        index.search(None, k=1, mode="dense", vectors=np.stack([vectors[0], np.zeros(8)]))
    with pytest.raises(RetrieverError, match="row 0 is too large: its length overflows float32"):
        index.search(None, k=1, mode="dense", vectors=np.full(8, 1e30))
    index.add([{"_id": "v1", "text": "note 1 again"}], vectors=vectors[:1], upsert=True)
    assert [row["doc_id"] for row in index.documents()] == ["v0", "v2", "v3", "v4", "v5", "v1"]
    assert [row["doc_id"] for row in index.documents(["v5", "nope", "v0"])] == ["v5", "v0"]
    assert [row["doc_id"] for row in index.documents(where={"i": {"$gte": 4}})] == ["v4", "v5"]
    assert index.documents(["v1"])[0]["text"] == "note 1 again"
