"""Index administration through the library: too few documents for a calibrator, the writer lock (a build
refuses, other writes wait), listing and removing indexes."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import sqlite3
import threading
import time

import pytest

from retriever.calibration import make_calibrator, too_few_to_fit
from retriever.calibration.flow import FlowCalibrator
from retriever.errors import ConflictError, RetrieverError
from retriever.index import Index
from retriever.versions.catalog import describe_indexes
from retriever.versions.folder import remove_index
from retriever.versions.layout import LOCK, NUMBERS, VERSIONS
from tests.helpers import DOCS, sentences, write_jsonl


def test_minimum_vectors_per_calibrator():
    assert make_calibrator("none").min_fit_rows(384) == 0
    assert make_calibrator("sn").min_fit_rows(384) == 2
    assert make_calibrator("whitening").min_fit_rows(384) == 2  # below dim + 1 it shrinks (Ledoit-Wolf)
    assert make_calibrator("natsv-5").min_fit_rows(384) == 6
    assert make_calibrator("flow").min_fit_rows(384) == 385
    assert too_few_to_fit(make_calibrator("flow"), 385, 384) is None
    assert too_few_to_fit(make_calibrator("flow"), 3, 384) == (
        "too few to fit the flow (it needs at least 385 for 384 dimensions)")
    assert too_few_to_fit(make_calibrator("natsv-5"), 5, 384) == (
        "too few to fit calibrator 'natsv-5' (it needs at least 6 to find 5 directions)")


def test_a_corpus_too_small_for_the_flow_builds_uncalibrated_and_says_so(tmp_path, tiny_bert, monkeypatch):
    one = tmp_path / "one.txt"
    one.write_text("The only document there is.\n", encoding="utf-8")
    monkeypatch.setattr(FlowCalibrator, "fit", lambda *a, **k: pytest.fail("fitted the flow on one vector"))
    summary = Index.build(one, "one", tmp_path, model=str(tiny_bert), calibrator="flow", device="cpu")
    monkeypatch.undo()
    warning = ("warning: only 1 document: too few to fit the flow (it needs at least 33 for 32 dimensions); built "
               "without calibration (calibrator none); once the index holds more documents run: retriever refit "
               f"--name one --index-dir {tmp_path} --calibrator flow")
    assert summary.notes == [warning]
    index = Index.open("one", tmp_path, device="cpu")
    assert index.snapshot.manifest.calibrator == {"name": "none"}
    assert index.snapshot.manifest.calibrator_fallback == {
        "asked": "flow", "reason": "only 1 document: too few to fit the flow (it needs at least 33 for 32 dimensions)"}
    hits = index.search("the only document", k=5)
    assert [hit.doc_id for hit in hits] == ["one.txt:1"]

    # refit is an explicit request: refused while too small, done (and the fallback forgotten) once big enough
    with pytest.raises(RetrieverError, match=r"^index 'one' holds only 1 document: too few to fit the flow "
                                             r"\(it needs at least 33 for 32 dimensions\)$"):
        index.refit("flow")
    index.add(write_jsonl(tmp_path / "more.jsonl", sentences(40)))
    Index.open("one", tmp_path, device="cpu").refit("flow")
    refitted = Index.open("one", tmp_path, device="cpu")
    assert refitted.snapshot.manifest.calibrator["name"] == "flow" and refitted.snapshot.manifest.calibrator_fallback is None
    assert refitted.search("The only document there is.", k=1)[0].doc_id == "one.txt:1"


def test_enough_documents_but_a_fit_sample_too_small_is_refused(tmp_path, tiny_bert):
    corpus = write_jsonl(tmp_path / "c.jsonl", sentences(40))
    with pytest.raises(RetrieverError, match=r"^fit_sample=10 is too few to fit the flow \(it needs at least 33 "):
        Index.build(corpus, "c", tmp_path, model=str(tiny_bert), calibrator="flow", fit_sample=10, device="cpu")
    summary = Index.build(corpus, "c", tmp_path, model=str(tiny_bert), calibrator="flow", device="cpu")
    assert summary.notes == [] and Index.open("c", tmp_path).snapshot.manifest.calibrator["name"] == "flow"


@pytest.fixture()
def held_lock(tmp_path):
    """NAME's writer lock held by "another process" (an open file description of this one), pid 4242."""
    versions = tmp_path / VERSIONS / "busy"
    versions.mkdir(parents=True)
    with open(versions / LOCK, "w") as lock:
        lock.write("4242\n")
        lock.flush()
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield lock


def test_a_build_refuses_at_once_while_another_process_writes_the_index(tmp_path, tiny_bert, held_lock,
                                                                         monkeypatch):
    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder

    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    for encoder in (Encoder, QueryKitEncoder):  # neither the model nor its kit
        monkeypatch.setattr(encoder, "__init__", lambda *a, **k: pytest.fail("loaded the model before refusing"))
    started = time.perf_counter()
    with pytest.raises(RetrieverError) as refused:
        Index.build(corpus, "busy", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
    assert time.perf_counter() - started < 5
    assert str(refused.value) == ("index 'busy' is being written by another retriever process (pid 4242); wait for "
                                  "it to finish, or build under another name")  # the CLI says --name
    assert not (tmp_path / "busy").exists() and os.listdir(tmp_path / VERSIONS / "busy") == [LOCK]
    with pytest.raises(RetrieverError, match=r"being written by another retriever process \(pid 4242\); wait for "
                                             "it to finish, then remove it"):
        remove_index(tmp_path, "busy")


def test_a_build_that_another_build_beat_to_the_name_refuses_rather_than_replacing_it(tmp_path, tiny_bert,
                                                                                     monkeypatch):
    """The name is checked again once the lock is held: the build that held it may have made the index."""
    from retriever.versions import folder

    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    original = folder.writer_lock

    def beaten(*args, **kwargs):  # another build of the name finishes while this one waits for the lock
        monkeypatch.setattr(folder, "writer_lock", original)
        Index.build(corpus, "race", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
        return original(*args, **kwargs)

    monkeypatch.setattr(folder, "writer_lock", beaten)
    with pytest.raises(ConflictError, match="index 'race' exists"):
        Index.build(corpus, "race", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
    assert len(Index.versions("race", tmp_path)) == 1


def test_other_writes_wait_for_the_lock_and_record_their_pid(tmp_path, tiny_bert):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    Index.build(corpus, "busy", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
    lock_path = tmp_path / VERSIONS / "busy" / LOCK
    assert lock_path.read_text() == f"{os.getpid()}\n"  # the last writer's
    index = Index.open("busy", tmp_path, device="cpu")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        writer = threading.Thread(target=index.delete, args=(["dog"],))
        writer.start()
        writer.join(1.0)
        assert writer.is_alive()  # waiting its turn, not refused
    writer.join(30)
    assert not writer.is_alive() and len(Index.open("busy", tmp_path)) == len(DOCS) - 1


def test_describe_and_remove_indexes(tmp_path, tiny_bert):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    Index.build(corpus, "first", tmp_path, model=str(tiny_bert), calibrator="sn", device="cpu")
    Index.build(corpus, "second", tmp_path, model=str(tiny_bert), calibrator="flow", device="cpu")  # falls back
    Index.open("first", tmp_path).delete(["dog"])  # written last: listed first
    (tmp_path / "my notes").mkdir()  # not an index name: never listed
    (tmp_path / "my notes" / "manifest.json").write_text("{}")
    records = describe_indexes(tmp_path)
    assert [r["name"] for r in records] == ["first", "second"]
    assert {k: records[0][k] for k in ("documents", "model", "calibrator", "index_type")} == {
        "documents": len(DOCS) - 1, "model": str(tiny_bert), "calibrator": "sn", "index_type": "flat"}
    assert records[1]["calibrator"] == "none" and records[1]["calibrator_asked"] == "flow"
    assert records[0]["written"].endswith("+00:00") and records[0]["folder"].startswith(str(tmp_path / VERSIONS))

    remove_index(tmp_path, "first")
    assert not (tmp_path / "first").exists() and not (tmp_path / VERSIONS / "first").exists()
    assert [r["name"] for r in describe_indexes(tmp_path)] == ["second"]
    with pytest.raises(RetrieverError, match=f"^no index named 'first' in {tmp_path}$"):
        remove_index(tmp_path, "first")
    (tmp_path / "mine").mkdir()
    with pytest.raises(RetrieverError, match="plain folder"):
        remove_index(tmp_path, "mine")
    assert (tmp_path / "mine").is_dir()
    Index.build(corpus, "first", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")  # the name is free
    assert Index.open("first", tmp_path).search(DOCS["dog"], k=1)[0].doc_id == "dog"


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def faiss_no_space(*args, **kwargs):  # how faiss reports it: strerror inside a RuntimeError
    raise RuntimeError("Error in void faiss::FileIOWriter::operator()(const void*, size_t, size_t) at "
                       "impl/io.cpp:120: Error: 'ret == nitems' failed: write error: No space left on device")


def sqlite_no_space(*args, **kwargs):
    raise sqlite3.OperationalError("database or disk is full")


@pytest.mark.parametrize("write, target, failure", [
    ("refit", "retriever.store.vectors:VectorStore.save", no_space),
    ("refit", "retriever.store.vectors:VectorStore.save", faiss_no_space),
    ("build", "retriever.store.arrays:NpyAppender.flush", no_space),
    ("build", "retriever.store.documents:DocumentTable.insert", sqlite_no_space),
    ("add", "retriever.store.segment:RawWriter.append", no_space),
])
def test_a_full_disk_is_one_line_and_the_previous_version_stays(tmp_path, tiny_bert, monkeypatch, write, target,
                                                                failure):
    import importlib

    corpus = write_jsonl(tmp_path / "c.jsonl", sentences(40))
    Index.build(corpus, "full", tmp_path, model=str(tiny_bert), calibrator="whitening", device="cpu")
    before = (tmp_path / "full").resolve()
    module, _, attribute = target.partition(":")
    owner_name, name = attribute.split(".")
    monkeypatch.setattr(getattr(importlib.import_module(module), owner_name), name, failure)
    index = Index.open("full", tmp_path, device="cpu")
    attempts = {
        "refit": lambda: index.refit(),
        "build": lambda: Index.build(corpus, "full", tmp_path, model=str(tiny_bert), calibrator="whitening",
                                     device="cpu", replace=True),
        "add": lambda: index.add(write_jsonl(tmp_path / "more.jsonl", sentences(3, start=100))),
    }
    with pytest.raises(RetrieverError) as refused:
        attempts[write]()
    assert re.fullmatch(r"index 'full' was not written: the disk is full \((No space left on device|database or "
                        r"disk is full)\); the previous version is intact; free some space and run it again",
                        str(refused.value)), str(refused.value)
    assert (tmp_path / "full").resolve() == before  # and no partial folder is left taking space
    assert sorted(os.listdir(tmp_path / VERSIONS / "full")) == sorted([before.name, LOCK, NUMBERS])
    if write == "build":  # a new name: nothing of it is left
        with pytest.raises(RetrieverError, match="the disk is full .*; no index was made;"):
            Index.build(corpus, "new", tmp_path, model=str(tiny_bert), calibrator="whitening", device="cpu")
        assert not (tmp_path / "new").exists() and not (tmp_path / VERSIONS / "new").exists()


def test_failed_and_killed_writers_leave_nothing_behind(tmp_path, tiny_bert, held_lock):
    duplicates = tmp_path / "dup.jsonl"
    duplicates.write_text('{"_id": "a", "text": "one"}\n{"_id": "a", "text": "two"}\n', encoding="utf-8")
    with pytest.raises(RetrieverError, match="duplicate ids"):
        Index.build(duplicates, "broken", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
    assert not (tmp_path / "broken").exists() and not (tmp_path / VERSIONS / "broken").exists()

    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    Index.build(corpus, "kept", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
    # What kills leave: a temporary link never swapped in, and a folder holding only a lock.
    stray = tmp_path / ".kept.20260101T000000000000-abcdef.link"
    stray.symlink_to(".versions/kept/20260101T000000000000-abcdef")
    (tmp_path / VERSIONS / "ghost").mkdir()
    (tmp_path / VERSIONS / "ghost" / LOCK).write_text("999999\n")
    busy_stray = tmp_path / ".busy.20260101T000000000000-abcdef.link"
    busy_stray.symlink_to(".versions/busy/20260101T000000000000-abcdef")
    assert [record["name"] for record in describe_indexes(tmp_path)] == ["kept"]  # `retriever list`
    assert stray.is_symlink() and (tmp_path / VERSIONS / "ghost").exists()  # reading deletes nothing
    assert len(Index.open("kept", tmp_path)) == len(DOCS)
    Index.open("kept", tmp_path).delete(["dog"])  # a write tidies: its own name's leftovers and the others'
    assert not stray.is_symlink() and not (tmp_path / VERSIONS / "ghost").exists()
    assert busy_stray.is_symlink() and (tmp_path / VERSIONS / "busy" / LOCK).is_file()  # its writer is at work


def test_add_with_upsert_replaces_the_documents_whose_ids_are_taken(tmp_path, tiny_bert):
    from retriever import Document, Index
    from retriever.errors import ConflictError

    def notes(ids, about):
        return [Document(doc_id, f"A note about {about} number {doc_id}.", None, "mem", n + 1)
                for n, doc_id in enumerate(ids)]

    Index.build(notes(["a", "b", "c"], "cats"), "notes", tmp_path, model=str(tiny_bert), calibrator="none")
    index = Index.open("notes", tmp_path, device="cpu")
    with pytest.raises(ConflictError, match=r"already in the index: 'b'.*upsert=True"):
        index.add(notes(["b", "d"], "ships"))
    summary = index.add(notes(["b", "d"], "ships"), upsert=True)
    assert summary.changed == 2 and summary.documents == 4
    assert any("replaced 1 document" in note for note in summary.notes)
    after = summary.open()
    assert len(after) == 4 and "ships" in after.document("b")["text"] and "cats" in after.document("a")["text"]
    found = [hit.doc_id for hit in after.search("a note about ships number b", k=4, mode="keyword")]
    assert found.count("b") == 1  # the old document of that id is gone from every search


def test_a_write_says_what_its_merges_did_in_words(tmp_path, tiny_bert):
    """A delete that leaves a segment mostly deleted rewrites it (one segment: not a "merge of 1 segments")."""
    corpus = write_jsonl(tmp_path / "c.jsonl", sentences(10))
    Index.build(corpus, "m", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu")
    summary = Index.open("m", tmp_path, device="cpu").delete([f"d{i}" for i in range(4)])
    assert summary.notes == ["rewrote 1 segment without its deleted documents"]


def test_list_says_why_auto_kept_the_raw_vectors_when_it_could_not_check():
    from retriever.versions.catalog import calibrator_label

    record = {"name": "auto", "decision": {"chosen": {"name": "none"}, "reason": (
        "only 20 pseudo-queries could be made from the corpus (its documents are too short or too few; at least 50 "
        "are needed to tell calibrators apart): raw vectors kept")}}
    assert calibrator_label(record) == "auto: none (only 20 pseudo-queries could be made from the corpus)"


def test_a_fallback_s_hint_is_plain_text_in_the_note_and_the_manifest(tmp_path, tiny_bert):
    corpus = write_jsonl(tmp_path / "few.jsonl", sentences(20))
    summary = Index.build(corpus, "few", tmp_path, model=str(tiny_bert), calibrator="flow", device="cpu")
    reason = Index.open("few", tmp_path, device="cpu").snapshot.manifest.calibrator_fallback["reason"]
    assert reason.endswith("try --calibrator flow-16") and "\x00" not in reason
    assert "try --calibrator flow-16;" in summary.notes[0] and "\x00" not in summary.notes[0]
