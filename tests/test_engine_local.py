"""The local build engine: its stages overlapped give the same index as one after the other."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pytest

import retriever.index as index_module
from retriever.engines.local import LocalEngine
from retriever.index import Index
from tests.test_passages import WINDOW, corpus

# Written at build time, or naming the build's own folder: everything else is the same bytes.
_OF_THE_MOMENT = {"manifest.json"}


def files_of(folder: Path) -> dict[str, str]:
    """Every file under FOLDER (relative path -> sha256), but those that record when they were written."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name not in _OF_THE_MOMENT}


def test_the_keyword_index_written_while_encoding_gives_the_same_files_byte_for_byte(tiny_bert, tmp_path,
                                                                                     monkeypatch):
    built = {}
    for overlap, in_process in ((True, False), (True, True), (False, None)):  # a thread, a process, after
        monkeypatch.setattr(index_module, "LocalEngine",
                            functools.partial(LocalEngine, overlap=overlap, keywords_in_process=in_process))
        home = tmp_path / f"{overlap}-{in_process}"
        summary = Index.build(corpus(longs=3, shorts=60), "same", home, model=str(tiny_bert), max_length=WINDOW,
                              device="cpu", index_type="flat")
        assert summary.passages > summary.documents  # long documents were cut: both keyword indexes written
        built[overlap, in_process] = files_of(Path(summary.folder))
    assert built[True, False] == built[True, True] == built[False, None]
    assert any("keywords" in name for name in built[False, None]) and any("passage" in name
                                                                         for name in built[False, None])


MARKER = "RETRIEVER_TEST_KEYWORDS_DONE"


def slow_structures(folder, structures):
    """build_structures, still writing when the encoder fails; then it leaves the id of the process it ran in."""
    import os
    import time

    from retriever.store.segment import build_structures

    time.sleep(0.5)
    build_structures(folder, structures)
    Path(os.environ[MARKER]).write_text(str(os.getpid()))


def test_a_keyword_index_written_in_a_process_of_its_own_is_waited_for_by_a_failed_build(tiny_bert, tmp_path,
                                                                                          monkeypatch):
    import os

    import retriever.engines.local as local_module

    def fail(self, writer, encoder):
        raise RuntimeError("the encoder broke")

    done = tmp_path / "done"
    monkeypatch.setenv(MARKER, str(done))
    monkeypatch.setattr(index_module, "LocalEngine", functools.partial(LocalEngine, keywords_in_process=True))
    monkeypatch.setattr(LocalEngine, "encode", fail)
    monkeypatch.setattr(local_module, "build_structures", slow_structures)  # the worker imports it by name
    with pytest.raises(RuntimeError, match="the encoder broke"):
        Index.build(corpus(longs=0, shorts=30), "broken", tmp_path / "indexes", model=str(tiny_bert),
                    max_length=WINDOW, device="cpu")
    assert done.is_file()  # finished before the build returned: nothing writes into its folder after
    assert int(done.read_text()) != os.getpid()  # on another core, not holding this interpreter's lock


@pytest.mark.parametrize("device_type, apart", [("cuda", True), ("cpu", False)])
def test_by_default_the_keyword_index_is_written_apart_where_the_encoder_runs_on_a_gpu(tiny_bert, tmp_path,
                                                                                       monkeypatch, device_type,
                                                                                       apart):
    import os

    import torch

    import retriever.engines.local as local_module

    done = tmp_path / "done"
    monkeypatch.setenv(MARKER, str(done))
    monkeypatch.setattr(local_module, "resolve_device", lambda device: torch.device(device_type))
    monkeypatch.setattr(local_module, "surely_cpu", lambda device: False)  # a machine that may have a GPU
    monkeypatch.setattr(local_module, "build_structures", slow_structures)
    Index.build(corpus(longs=0, shorts=30), "notes", tmp_path / "indexes", model=str(tiny_bert), max_length=WINDOW,
                device="auto", calibrator="none")
    assert (int(done.read_text()) != os.getpid()) is apart


@pytest.mark.parametrize("apart_from, given, apart", [
    (30, True, True),  # vectors given for as many documents as the threshold: a process
    (31, True, False),  # for fewer: a thread
    (1, False, False),  # texts encoded on the CPU, however many: a thread (the encoder takes every core)
])
def test_a_build_from_vectors_writes_the_keyword_index_apart_from_enough_documents(tiny_bert, tmp_path, monkeypatch,
                                                                                    apart_from, given, apart):
    import os

    import numpy as np

    import retriever.engines.local as local_module
    from retriever.encode.encoder import Encoder

    done = tmp_path / "done"
    monkeypatch.setenv(MARKER, str(done))
    monkeypatch.setattr(local_module, "KEYWORDS_APART_FROM", apart_from)
    monkeypatch.setattr(local_module, "build_structures", slow_structures)
    documents = corpus(longs=0, shorts=30)
    vectors = Encoder(str(tiny_bert), device="cpu", max_length=WINDOW).encode([document.text for document in documents])
    Index.build(documents, "notes", tmp_path / "indexes", vectors=np.asarray(vectors, np.float32) if given else None,
                model=str(tiny_bert), max_length=WINDOW, device="cpu", calibrator="none")
    assert (int(done.read_text()) != os.getpid()) is apart


@pytest.mark.parametrize("longs, calibrator, streamed", [
    (0, "none", True),  # every chunk's vectors indexed as encoded
    (0, "whitening", True),  # a calibrator given fitted: the same
    (2, "none", False),  # a document cut into passages: the segment is keyed by passage, indexed after
])
def test_the_vector_index_built_while_encoding_gives_the_same_files_byte_for_byte(tiny_bert, tmp_path, monkeypatch,
                                                                                  longs, calibrator, streamed):
    import numpy as np

    from retriever.calibration import make_calibrator
    from retriever.engines.stages import IndexWhileEncoding

    finished = []
    finish = IndexWhileEncoding.finish

    def spied(self, rows, spec):
        finished.append(finish(self, rows, spec))
        return finished[-1]

    monkeypatch.setattr(IndexWhileEncoding, "finish", spied)
    if calibrator == "whitening":
        from retriever.encode.encoder import Encoder

        dim = Encoder(str(tiny_bert), device="cpu").dim
        calibrator = make_calibrator("whitening").fit(np.random.default_rng(0).normal(size=(200, dim)))
    built = {}
    for during in (True, False):
        monkeypatch.setattr(index_module, "LocalEngine", functools.partial(LocalEngine, index_during_encoding=during))
        summary = Index.build(corpus(longs=longs, shorts=70), "same", tmp_path / str(during), model=str(tiny_bert),
                              max_length=WINDOW, device="cpu", calibrator=calibrator, index_type="flat",
                              chunk_rows=16)  # five chunks: the long documents, last, come in the fifth
        built[during] = files_of(Path(summary.folder))
        assert summary.open().search("short note", k=3)
    assert finished == [streamed]  # offered once, and taken unless a document was cut
    assert built[True] == built[False]
    assert not [name for name in built[True] if name.endswith(".partial")]


def test_the_encoding_bar_moves_with_each_batch_and_ends_at_the_documents(tiny_bert, tmp_path, monkeypatch):
    """A corpus smaller than a chunk: the bar counts documents and moves as each batch is encoded (it sat at 0%
    until the whole chunk was done), passages counted as their share of their chunk's documents."""
    import contextlib

    import retriever.engines.stages as stages

    steps: list[float] = []

    @contextlib.contextmanager
    def recorded(description, total=None, **options):
        yield steps.append if description == "Encoding" else (lambda n: None)

    monkeypatch.setattr(stages, "progress_bar", recorded)
    documents = corpus(longs=3, shorts=60)
    summary = Index.build(documents, "bar", tmp_path, model=str(tiny_bert), max_length=WINDOW, device="cpu",
                          index_type="flat", batch_size=8, progress=True)
    assert summary.passages > summary.documents == len(documents)
    reached = [sum(steps[: number + 1]) for number in range(len(steps))]
    assert steps[0] == 0  # nothing encoded before (a fresh build)
    assert len([step for step in steps if step > 0]) > summary.passages // 8 - 1  # a step a batch, about
    assert all(0 < done < len(documents) for done in reached[1:-2])
    assert reached[-1] == pytest.approx(len(documents))
