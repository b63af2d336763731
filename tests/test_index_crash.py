"""Crash safety and resuming: a write killed at any stage loses nothing, a killed build resumes from any step
without re-encoding what it finished, and readers during writes see one version or the other, never a mix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from retriever.index import Index
from retriever.versions.integrity import read_manifest
from retriever.versions.layout import BUILD_STATE, VERSIONS
from tests.helpers import sentences, with_long, write_corpus, write_jsonl

# One process imports the library once, then forks a child for each write; the child SIGKILLs itself at a chosen
# moment: when the Nth call of a function starts ("before") or returns ("after"). Deterministic, unlike killing
# from outside at a guessed time; and forking skips the seconds of start-up and imports a fresh process would pay
# per kill. The parent never runs a model or a search, so no thread pool is forked half-started.
FORKING_WRITER = textwrap.dedent(
    """
    import importlib, json, os, signal, sys, traceback
    from retriever.index import Index
    from transformers import AutoModel, AutoTokenizer  # imported now, once, for every child
    import transformers.models.bert.modeling_bert  # the test model's code: its import costs seconds, lazily

    def write(target, call, when, operation, index_dir, argument, model):
        module_name, _, attribute = target.partition(":")
        owner = importlib.import_module(module_name)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original, calls = getattr(owner, name), [0]

        def dying(*args, **kwargs):
            calls[0] += 1
            if calls[0] == int(call) and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            result = original(*args, **kwargs)
            if calls[0] == int(call) and when == "after":
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(owner, name, dying)
        if operation == "build":
            Index.build(argument, "crash", index_dir, model=model, calibrator="whitening", device="cpu", chunk_rows=10,
                        replace=True)
        else:
            index = Index.open("crash", index_dir, device="cpu")
            if operation == "add":
                index.add(argument, chunk_rows=10)
            elif operation == "delete":
                index.delete(argument.split(","))
            elif operation == "sync":
                index.sync()
            else:
                index.compact()

    for line in sys.stdin:
        request = json.loads(line)
        child = os.fork()
        if child == 0:
            log = os.open(request.pop("log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = 0
            try:
                write(**request)
                print("finished")  # never reached: the child dies first
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(child, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    """
)


@pytest.fixture(scope="module")
def dying_write(tmp_path_factory):
    """run(target, call, when, operation, index_dir, argument, model): one write in a forked child that kills
    itself at the chosen moment; asserts it died there (SIGKILL, not an error or the end of the write)."""
    writer = subprocess.Popen([sys.executable, "-c", FORKING_WRITER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    logs = tmp_path_factory.mktemp("dying-writes")

    def run(target, call, when, operation, index_dir, argument, model) -> None:
        log = logs / f"{len(list(logs.iterdir()))}.log"
        writer.stdin.write(json.dumps({"target": target, "call": call, "when": when, "operation": operation,
                                       "index_dir": str(index_dir), "argument": str(argument), "model": str(model),
                                       "log": str(log)}) + "\n")
        writer.stdin.flush()
        code = int(writer.stdout.readline())
        assert code == -9, log.read_text()  # killed where intended

    yield run
    writer.stdin.close()
    writer.wait(timeout=60)


# (operation, what to patch, which call, before or after it): one moment in each stage of each write.
MOMENTS = {
    "build while reading": ("build", "retriever.store.documents:DocumentTable.insert", 2, "after"),
    "build while encoding": ("build", "retriever.store.arrays:NpyAppender.flush", 2, "after"),
    "build while fitting": ("build", "retriever.engines.base:fit", 1, "before"),
    "build while writing the segment": ("build", "retriever.store.segment:RawWriter.append", 1, "after"),
    "build while indexing keywords": ("build", "retriever.store.keywords:KeywordIndex.build", 1, "before"),
    "build between rename and link swap": ("build", "retriever.versions.folder:PartialVersion._link", 1, "before"),
    "build with its new link beside the old": ("build", "retriever.versions.folder:_swap", 1, "before"),
    "add while writing its segment": ("add", "retriever.store.segment:RawWriter.append", 1, "after"),
    "add while indexing its keywords": ("add", "retriever.store.keywords:KeywordIndex.build", 1, "before"),
    "add with its keywords indexed": ("add", "retriever.store.keywords:KeywordIndex.build", 1, "after"),
    "add before its manifest": ("add", "retriever.versions.writer:write_manifest", 1, "before"),
    "delete before its manifest": ("delete", "retriever.versions.writer:write_manifest", 1, "before"),
    "delete between rename and link swap": ("delete", "retriever.versions.folder:PartialVersion._link", 1, "before"),
    "delete with its new link beside the old": ("delete", "retriever.versions.folder:_swap", 1, "before"),
    "compact after merging": ("compact", "retriever.store.vectors:VectorStore.merged", 1, "after"),
    "compact while indexing keywords": ("compact", "retriever.store.keywords:KeywordIndex.build", 1, "before"),
    "compact before its manifest": ("compact", "retriever.versions.writer:write_manifest", 1, "before"),
}


@pytest.fixture(scope="module")
def built_crash_index(tmp_path_factory, tiny_bert):
    """An index of two segments with a deletion, so every write has something to keep; four long documents of the
    first are cut into passages. Made once: each test writes to its own copy."""
    folder = tmp_path_factory.mktemp("crash-index")
    index_dir = folder / "indexes"
    Index.build(with_metadata(folder / "base.jsonl", with_long(sentences(40))), "crash", index_dir,
                model=str(tiny_bert), calibrator="whitening", device="cpu")
    Index.open("crash", index_dir, device="cpu").add(with_metadata(folder / "more.jsonl", sentences(5, start=40)))
    Index.open("crash", index_dir, device="cpu").delete(["d3"])
    return index_dir


@pytest.fixture()
def crash_index(built_crash_index, tmp_path):
    """A copy of the built index of its own (the index's link is relative, so the copy is whole)."""
    return Path(shutil.copytree(built_crash_index, tmp_path / "indexes", symlinks=True))


def with_metadata(path, docs: dict[str, str]):
    """DOCS as BEIR records whose metadata (the document's number, and whether it is even) every write keeps."""
    records = [{"_id": doc_id, "text": text, "metadata": {"number": int(doc_id[1:]), "even": int(doc_id[1:]) % 2 == 0}}
               for doc_id, text in docs.items()]
    return write_corpus(path, records)


def snapshot(index_dir):
    index = Index.open("crash", index_dir, device="cpu")
    index.snapshot.verify()  # every file re-hashed against the manifest
    queries = list(sentences(45).values())[::4]
    filtered = index.search(queries, k=5, mode="dense", where={"even": True, "number": {"$lt": 30}})
    assert all(hit.metadata["even"] and hit.metadata["number"] < 30 for hits in filtered for hit in hits)
    return (len(index), *(index.search(queries, k=5, mode=mode) for mode in ("dense", "keyword", "hybrid")),
            filtered, index.snapshot.manifest.metadata_fields)


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_write_killed_at_any_stage_loses_nothing(crash_index, tmp_path, tiny_bert, dying_write, moment):
    operation, target, call, when = MOMENTS[moment]
    argument = {
        "build": write_jsonl(tmp_path / "other.jsonl", sentences(50, start=100)),
        "add": write_jsonl(tmp_path / "extra.jsonl", sentences(25, start=200)),
        "delete": "d1,d2,d40",
        "compact": "-",
    }[operation]
    before = snapshot(crash_index)
    previous = (crash_index / "crash").resolve().name
    dying_write(target, call, when, operation, crash_index, argument, tiny_bert)
    assert snapshot(crash_index) == before  # the link still points at the complete previous version
    # The next writer clears what the killed one left (partial folders, a renamed but never linked version, a
    # link never swapped in), but for a killed build's record of what it encoded, kept for its re-run.
    Index.open("crash", crash_index, device="cpu").add(write_jsonl(tmp_path / "after.jsonl", sentences(2, 300)))
    versions = crash_index / VERSIONS / "crash"
    current = (crash_index / "crash").resolve().name
    partial = [folder for folder in versions.iterdir() if folder.name.endswith(".partial")]
    assert all(operation == "build" and (folder / BUILD_STATE).is_file() for folder in partial)
    assert sorted(folder.name for folder in versions.iterdir() if folder.is_dir() and folder not in partial) == \
        sorted([previous, current])
    numbers = [read_manifest(versions / folder, "crash").version for folder in (previous, current)]
    assert numbers[1] > numbers[0] > 0  # versions are numbered, never ordered by their folders' names
    assert [path.name for path in crash_index.iterdir() if path.name != VERSIONS] == ["crash"]
    assert len(Index.open("crash", crash_index, device="cpu")) == before[0] + 2
    assert snapshot(crash_index)[-1] == ["even", "number"]  # the merges and copies kept every document's metadata


# What to patch to kill a build at each of its steps, in order (50 documents in chunks of 10: the build state is
# saved once the documents are read, then once per encoded chunk; each chunk flushes its vectors, then its
# passages).
BUILD_STEPS = {
    "reading, a chunk in": ("retriever.store.documents:DocumentTable.insert", 2, "after"),
    "read, not yet on record": ("retriever.engines.local:ingest", 1, "after"),
    "read and on record": ("retriever.engines.stages:BuildState.save", 1, "after"),
    "encoding, a chunk flushed but not on record": ("retriever.store.arrays:NpyAppender.flush", 2, "after"),
    "encoded and on record": ("retriever.engines.stages:BuildState.save", 6, "after"),
    "fitting": ("retriever.engines.base:fit", 1, "before"),
    "training the index": ("retriever.engines.base:train_index", 1, "after"),
    "calibrator saved": ("retriever.engines.base:save_fitted", 1, "after"),
    "writing the segment": ("retriever.store.segment:RawWriter.append", 1, "after"),
    "indexing keywords": ("retriever.store.keywords:KeywordIndex.build", 1, "before"),
    "keywords indexed": ("retriever.store.keywords:KeywordIndex.build", 1, "after"),
    "segment written, encoded vectors deleted": ("retriever.engines.base:fit_summary", 1, "before"),
    "manifest written": ("retriever.versions.writer:write_manifest", 1, "after"),
    "committing, build state gone": ("retriever.versions.folder:_fsync_tree", 1, "before"),
    "renamed, not linked": ("retriever.versions.folder:PartialVersion._link", 1, "before"),
    "linked beside, not swapped": ("retriever.versions.folder:_swap", 1, "before"),
    "swapped, not tidied": ("retriever.versions.folder:PartialVersion._after_commit", 1, "before"),
}


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory, tiny_bert):
    """The index a build of 50 documents (five cut into passages) makes when nothing interrupts it, and its
    corpus."""
    folder = tmp_path_factory.mktemp("fresh")
    corpus = write_jsonl(folder / "big.jsonl", with_long(sentences(50)))
    Index.build(corpus, "fresh", folder / "indexes", model=str(tiny_bert), calibrator="whitening", device="cpu",
                chunk_rows=10)
    return corpus, Index.open("fresh", folder / "indexes", device="cpu")


@pytest.mark.parametrize("step", list(BUILD_STEPS))
def test_a_build_killed_at_any_step_finishes_when_run_again(tmp_path, tiny_bert, dying_write, fresh_build, step):
    corpus, fresh = fresh_build
    index_dir = tmp_path / "indexes"
    dying_write(*BUILD_STEPS[step], "build", index_dir, corpus, tiny_bert)
    summary = Index.build(corpus, "crash", index_dir, model=str(tiny_bert), calibrator="whitening", device="cpu",
                          chunk_rows=10, replace=True)  # a build killed after its swap made the index: replaced
    resumed = Index.open("crash", index_dir, device="cpu")
    resumed.snapshot.verify()
    assert summary.documents == len(resumed) == 50
    np.testing.assert_allclose(resumed.snapshot.segments[0].vectors.stored_vectors(),
                               fresh.snapshot.segments[0].vectors.stored_vectors(), atol=1e-6)
    queries = list(sentences(50).values())[::7]
    assert resumed.search(queries, k=5, mode="keyword") == fresh.search(queries, k=5, mode="keyword")
    assert not list((index_dir / VERSIONS / "crash").glob("*.partial"))
    assert [path.name for path in index_dir.iterdir() if path.name != VERSIONS] == ["crash"]


@pytest.fixture()
def encoded_texts(monkeypatch) -> list[str]:
    """Every text encoded from now on, in order: by the model, or from its kit (`encode.query_kit`: a build on the
    CPU encodes from the kit an earlier build of the same encoder left)."""
    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder

    texts: list[str] = []

    def counting(original):
        def encode_tokenized(self, tokenized, *args, **kwargs):
            texts.extend(tokenized.texts)
            return original(self, tokenized, *args, **kwargs)
        return encode_tokenized

    for encoder in (Encoder, QueryKitEncoder):
        monkeypatch.setattr(encoder, "encode_tokenized", counting(encoder.encode_tokenized))
    return texts


def kill_build_after_three_chunks(dying_write, index_dir, corpus, model) -> None:
    """A build in chunks of 10 killed once its third chunk's vectors and passages are flushed, before it records them
    (the state is saved once the documents are read, then after each chunk): 20 documents are on record as encoded.
    (Not counted in flushes: the keyword thread flushes its postings meanwhile.)"""
    dying_write("retriever.engines.stages:BuildState.save", 4, "before", "build", index_dir, corpus, model)


def test_a_killed_build_resumes_without_reencoding_what_it_finished(tmp_path, tiny_bert, encoded_texts,
                                                                   dying_write):
    index_dir = tmp_path / "indexes"
    docs = sentences(50)
    corpus = write_jsonl(tmp_path / "big.jsonl", docs)
    kill_build_after_three_chunks(dying_write, index_dir, corpus, tiny_bert)
    summary = Index.build(corpus, "crash", index_dir, model=str(tiny_bert), calibrator="whitening", device="cpu",
                          chunk_rows=10)
    assert encoded_texts == list(docs.values())[20:]  # only what the killed build had not finished
    assert summary.notes == ["resumed a killed build: 20 of 50 documents were already encoded"]
    resumed = Index.open("crash", index_dir, device="cpu")
    encoded_texts.clear()
    Index.build(corpus, "fresh", index_dir, model=str(tiny_bert), calibrator="whitening", device="cpu",
                chunk_rows=10)
    assert len(encoded_texts) == 50  # nothing left to resume: a whole build
    fresh = Index.open("fresh", index_dir, device="cpu")
    np.testing.assert_allclose(resumed.snapshot.segments[0].vectors.stored_vectors(),
                               fresh.snapshot.segments[0].vectors.stored_vectors(), atol=1e-6)
    assert [h.doc_id for h in resumed.search(docs["d7"], k=5)] == [h.doc_id for h in fresh.search(docs["d7"], k=5)]


def test_another_write_between_a_killed_build_and_its_re_run_keeps_what_it_encoded(tmp_path, tiny_bert,
                                                                                    encoded_texts, dying_write):
    """A delete (or a sync) on the index while a killed --replace build waited for its re-run removed the build's
    partial folder, and so all its encoding, without a word."""
    index_dir = tmp_path / "indexes"
    Index.build([{"_id": "old", "text": "the version the build replaces"}, {"_id": "older", "text": "and another"}],
                "crash", index_dir, model=str(tiny_bert), calibrator="none", device="cpu")
    docs = sentences(50)
    corpus = write_jsonl(tmp_path / "big.jsonl", docs)
    kill_build_after_three_chunks(dying_write, index_dir, corpus, tiny_bert)
    Index.open("crash", index_dir, device="cpu").delete("older")
    assert len(list((index_dir / VERSIONS / "crash").glob("*.partial"))) == 1
    encoded_texts.clear()
    summary = Index.build(corpus, "crash", index_dir, model=str(tiny_bert), calibrator="whitening", device="cpu",
                          chunk_rows=10, replace=True)
    assert encoded_texts == list(docs.values())[20:]
    assert summary.notes == ["resumed a killed build: 20 of 50 documents were already encoded"]
    assert not list((index_dir / VERSIONS / "crash").glob("*.partial"))


def test_a_killed_build_of_a_folder_leaves_nothing_for_other_writes_to_keep(tmp_path, tiny_bert, dying_write):
    """A folder's build is read and encoded again by its re-run, never resumed: it records no build state, so the
    next write removes what it left (a kept one would have waited for a re-run that never takes it over)."""
    index_dir, notes = tmp_path / "indexes", tmp_path / "notes"
    notes.mkdir()
    for number, text in enumerate(sentences(30).values()):
        (notes / f"note{number:02d}.md").write_text(f"# Note {number}\n\n{text}\n")
    Index.build(notes, "crash", index_dir, model=str(tiny_bert), calibrator="none", device="cpu")
    dying_write("retriever.store.arrays:NpyAppender.flush", 1, "after", "build", index_dir, notes, tiny_bert)
    assert [not (folder / BUILD_STATE).exists() for folder in (index_dir / VERSIONS / "crash").glob("*.partial")] == [
        True]
    (notes / "note00.md").write_text("# Note 0\n\nA changed note about tides.\n")
    assert Index.open("crash", index_dir, device="cpu").sync().changed == 1  # a write: it tidies
    assert not list((index_dir / VERSIONS / "crash").glob("*.partial"))


def test_a_killed_build_is_not_resumed_for_another_corpus_or_when_told_not_to(tmp_path, tiny_bert, encoded_texts,
                                                                              dying_write):
    index_dir = tmp_path / "indexes"
    corpus = write_jsonl(tmp_path / "big.jsonl", sentences(50))
    for change in ("resume=False", "another corpus"):
        kill_build_after_three_chunks(dying_write, index_dir, corpus, tiny_bert)
        encoded_texts.clear()
        if change == "resume=False":
            summary = Index.build(corpus, "crash", index_dir, model=str(tiny_bert), calibrator="whitening",
                                  device="cpu", chunk_rows=10, resume=False, replace=True)
        else:
            other = write_jsonl(tmp_path / "big.jsonl", sentences(50, start=1))  # same path, new content
            summary = Index.build(other, "crash", index_dir, model=str(tiny_bert), calibrator="whitening",
                                  device="cpu", chunk_rows=10, replace=True)
        assert len(encoded_texts) == 50 and not summary.notes
        assert not list((index_dir / VERSIONS / "crash").glob("*.partial"))


READER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    from retriever.index import Index
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher
    index_dir, ready, stop = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    opened, end = 0, time.monotonic() + 60
    while not stop.exists() and time.monotonic() < end:
        index = Index.open("swap", index_dir, device="cpu")
        searcher = Searcher(index.snapshot)
        live = [doc_id for segment in index.snapshot.segments for rowid, doc_id in
                zip(segment.documents.rowids(), segment.documents.doc_ids()) if rowid not in set(index.snapshot.tombstones)]
        assert len(live) == len(set(live)) == len(index) == index.snapshot.manifest.documents, (len(live), len(index))
        assert len({doc_id[0] for doc_id in live}) == 1, "documents of two builds in one version"
        for segment in index.snapshot.segments:
            assert sorted(segment.vectors.ids()) == segment.documents.rowids().tolist() == list(segment.rowids)
        plan = searcher.plan(SearchOptions(k=len(index), mode="dense"))
        hits = searcher.dense.top(np.eye(1, index.snapshot.manifest.dim, dtype=np.float32), plan.dense)[1][0]
        assert sorted(hits[hits >= 0].tolist()) == sorted(set(np.concatenate([s.rowids for s in index.snapshot.segments]))
                                                         - set(index.snapshot.tombstones.tolist()))
        opened += 1
        ready.touch()
    print(opened)
    """
)


def test_readers_during_writes_see_one_version_never_a_mix(tmp_path, tiny_bert):
    index_dir = tmp_path / "indexes"
    corpora = [write_jsonl(tmp_path / "a.jsonl", {f"a{i}": f"alpha text {i}" for i in range(300)}),
               write_jsonl(tmp_path / "b.jsonl", {f"b{i}": f"beta text number {i}" for i in range(500)})]
    Index.build(corpora[0], "swap", index_dir, model=str(tiny_bert), calibrator="none", device="cpu")
    # The reader opens and checks version after version until the writer, after two rounds of its four writes
    # (begun once the reader has opened its first), tells it to stop.
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER_SCRIPT, index_dir, ready, stop],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    while not ready.exists() and reader.poll() is None and time.monotonic() - started < 60:
        time.sleep(0.05)  # the reader has opened its first version: every write below overlaps its reading
    writes = 0
    while reader.poll() is None and writes < 8:
        cycle = writes % 4
        if cycle == 0:
            Index.build(corpora[(writes // 4) % 2], "swap", index_dir, model=str(tiny_bert), calibrator="none",
                        device="cpu", replace=True)
        index = Index.open("swap", index_dir, device="cpu")
        prefix = index.snapshot.segments[0].documents.doc_ids()[0][0]
        if cycle == 1:
            extra = {f"{prefix}x{writes}-{i}": f"extra {prefix} text {writes} {i}" for i in range(20)}
            index.add(write_jsonl(tmp_path / f"extra{writes}.jsonl", extra))
        elif cycle == 2:
            index.delete([f"{prefix}{i}" for i in range(writes, writes + 30)])
        elif cycle == 3:
            index.compact()
        writes += 1
    stop.touch()
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    assert writes == 8 and int(out) >= 10


# A sync killed at each step of its one write: the index is the old state, whole; the next sync makes the new one.
SYNC_MOMENTS = {
    "sync while writing its segment": ("retriever.store.segment:RawWriter.append", 1, "after"),
    "sync while indexing keywords": ("retriever.store.keywords:KeywordIndex.build", 1, "before"),
    "sync before its manifest": ("retriever.versions.writer:write_manifest", 1, "before"),
    "sync between rename and link swap": ("retriever.versions.folder:PartialVersion._link", 1, "before"),
    "sync with its new link beside the old": ("retriever.versions.folder:_swap", 1, "before"),
}


@pytest.mark.parametrize("moment", list(SYNC_MOMENTS))
def test_a_sync_killed_at_any_stage_leaves_the_old_state_and_the_next_sync_the_new(tmp_path, tiny_bert, dying_write,
                                                                                   moment):
    folder, index_dir = tmp_path / "notes", tmp_path / "indexes"
    folder.mkdir()
    for number, text in enumerate(list(sentences(12).values())):
        (folder / f"note{number:02d}.md").write_text(f"# Note {number}\n\n{text}\n")
    Index.build(folder, "crash", index_dir, model=str(tiny_bert), calibrator="none", device="cpu")

    def state():
        index = Index.open("crash", index_dir, device="cpu")
        index.snapshot.verify()
        return {row["doc_id"]: row["text"] for segment in index.snapshot.segments
                for row in index.snapshot.rows(segment.rowids[index.snapshot.live_documents(segment)],
                                               ("doc_id", "text")).values()}

    before = state()
    (folder / "note00.md").write_text("# Note 0\n\nRewritten: the tide tables for the northern harbour.\n")
    (folder / "note01.md").unlink()
    (folder / "note99.md").write_text("# Note 99\n\nA new note on migrating geese.\n")
    target, call, when = SYNC_MOMENTS[moment]
    dying_write(target, call, when, "sync", index_dir, "-", tiny_bert)
    assert state() == before
    Index.open("crash", index_dir, device="cpu").sync()
    after = state()
    assert set(after) == set(before) - {"note01.md"} | {"note99.md"} and "tide tables" in after["note00.md"]
