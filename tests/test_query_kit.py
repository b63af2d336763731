"""Queries encoded from a kept kit (`retriever.encode.query_kit`): the vectors of the encoder that left it, with
neither torch nor transformers imported, and never a kit kept for another model's files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from retriever.encode.encoder import Encoder
from retriever.encode.query_kit import KITS, QueryKitEncoder, kit_key, onnx_cache_dir, spin_is_bounded

TEXTS = ["how do I read a file", "the quick brown fox jumps over the lazy dog " * 20, "ünïcödé ✓", "a"]


def _record(model: Path, max_length: int = 32) -> dict:
    return {"model": str(model), "pooling": "last-avg", "layers": None, "max_length": max_length, "dtype": "fp32"}


def _full_encoder(record: dict) -> Encoder:
    encoder = Encoder.from_config(record, device="cpu", runtime="onnx")
    encoder.keep_query_kit(record)
    return encoder


def test_a_kit_encodes_as_the_encoder_that_left_it(tiny_bert, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    record = _record(model)
    expected = _full_encoder(record).encode(TEXTS)  # long text cut at 32 tokens, as the full encoder cuts it
    kit = QueryKitEncoder.open(record)
    assert kit is not None and kit.dim == expected.shape[1]
    assert np.allclose(kit.encode(TEXTS), expected, atol=1e-6)
    assert np.allclose(kit.encode(TEXTS[::-1]), expected[::-1], atol=1e-6)  # rows in the order given
    # Another process encodes from the kit alone: no torch, no transformers.
    script = ("import json, sys; from retriever.encode.query_kit import QueryKitEncoder; "
              f"kit = QueryKitEncoder.open(json.loads({json.dumps(json.dumps(record))})); "
              "vector = kit.encode(['how do I read a file'])[0]; "
              "print(json.dumps([vector.tolist(), 'torch' in sys.modules, 'transformers' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RETRIEVER_ONNX_CACHE": str(onnx_cache_dir())},
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    vector, torch_loaded, transformers_loaded = json.loads(done.stdout)
    assert np.allclose(vector, expected[0], atol=1e-6) and not torch_loaded and not transformers_loaded


def test_a_kit_is_never_used_for_other_model_files_or_settings_and_a_damaged_one_is_skipped(tiny_bert, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    record = _record(model)
    _full_encoder(record)
    assert QueryKitEncoder.open(record) is not None
    assert QueryKitEncoder.open(_record(model, max_length=16)) is None  # another encoder record: another key
    config = model / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the model's files changed
    assert kit_key(record) is not None and QueryKitEncoder.open(record) is None
    _full_encoder(record)  # the changed model leaves its own kit
    assert QueryKitEncoder.open(record) is not None
    # Other weights copied over the file with its size and modification time kept (cp -p, rsync -a, an archive):
    weights = next(path for path in model.iterdir() if path.suffix in (".safetensors", ".bin"))
    stat, data = weights.stat(), bytearray(weights.read_bytes())
    data[-64:] = bytes(64)
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert QueryKitEncoder.open(record) is None
    _full_encoder(record)
    kit_file = onnx_cache_dir() / KITS / f"{kit_key(record)}.json"
    assert QueryKitEncoder.open(record) is not None
    kit_file.write_text(kit_file.read_text()[:100])  # cut short
    assert QueryKitEncoder.open(record) is None
    assert QueryKitEncoder.open({**record, "model": str(tmp_path / "no-such-model")}) is None


def test_a_kit_encodes_from_many_threads_at_once(tiny_bert, tmp_path):
    """Index.search may run in many threads at once: each gets its own texts' vectors, long and short mixed."""
    from concurrent.futures import ThreadPoolExecutor

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    record = _record(model)
    expected = _full_encoder(record).encode(TEXTS)
    kit = QueryKitEncoder.open(record)
    # Long texts keep the tokenizer busy (it lets go of the GIL meanwhile) while other threads would reset it.
    long = [" ".join(f"word{i} and more words" for i in range(400))] * 16
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda number: kit.encode(TEXTS if number % 2 else long), range(24)))
    assert all(np.allclose(got, expected, atol=1e-6) for got in results[1::2])


def test_a_scripts_queries_spin_within_a_run_and_a_servers_sleep_with_the_same_vectors(tiny_bert, tmp_path,
                                                                                         monkeypatch):
    """Queries asked one at a time (Index.search) keep ONNX Runtime's workers spinning between a run's operators and
    stopping at its end; a server's kit, encoding concurrent batches beside its HTTP loop, lets idle workers sleep;
    both give the same vectors."""
    from retriever.index import Index

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    Index.build([{"_id": "a", "text": "a note"}], "notes", tmp_path / "indexes", model=str(model),
                calibrator="none", device="cpu")
    opened = []  # the kits Index.search opens
    open_kit = QueryKitEncoder.open.__func__

    def opening(cls, record, spin_within_runs=False):
        opened.append(open_kit(cls, record, spin_within_runs))
        return opened[-1]
    monkeypatch.setattr(QueryKitEncoder, "open", classmethod(opening))
    with Index.open("notes", tmp_path / "indexes", device="cpu") as index:
        record = index.snapshot.manifest.encoder
        _full_encoder(record)
        assert index.search("a note", k=1)[0].doc_id == "a"
        (scripts,) = opened  # what Index.search encoded with, once the kit was kept
        assert isinstance(scripts, QueryKitEncoder)
        servers = open_kit(QueryKitEncoder, record)  # as the server opens it (retriever.serve.open_indexes)

        def entry(kit, key):
            return kit.session.get_session_options().get_session_config_entry(key)

        bounded = spin_is_bounded()  # an older ONNX Runtime would ignore the bound: its kit sleeps
        assert entry(scripts, "session.intra_op.allow_spinning") == ("1" if bounded else "0")
        if bounded:
            assert entry(scripts, "session.force_spinning_stop") == "1"
            assert entry(scripts, "session.intra_op.spin_duration_us") == "50"
        assert entry(servers, "session.intra_op.allow_spinning") == "0"
        assert np.array_equal(scripts.encode(TEXTS), servers.encode(TEXTS))


def test_a_server_answers_searches_and_writes_from_the_kit_without_loading_the_model(tiny_bert, tmp_path,
                                                                                   monkeypatch):
    """`retriever serve` and `retriever mcp` start without loading the model where its kit is kept; writes encode
    from the kit too (`index.load_encoder`), and both answer as the full encoder does."""
    from fastapi.testclient import TestClient

    from retriever.index import Index
    from retriever.serve.app import create_app

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    notes = [{"_id": f"n{i}", "text": f"Note {i} about {word}."} for i, word in enumerate(["cats", "rain", "bread"] * 4)]
    Index.build(notes, "notes", tmp_path / "indexes", model=str(model), calibrator="none", device="cpu")
    with Index.open("notes", tmp_path / "indexes", device="cpu", runtime="torch") as index:
        expected = [hit.doc_id for hit in index.search("bread", k=3, mode="dense")]
    record = Index.open("notes", tmp_path / "indexes").snapshot.manifest.encoder
    _full_encoder(record)  # a kit kept, as on a used machine
    loads, init = [], Encoder.__init__
    monkeypatch.setattr(Encoder, "__init__", lambda self, *args, **kw: init(self, *args, **kw) or loads.append(1))
    kits, kit_init = [], QueryKitEncoder.__init__
    monkeypatch.setattr(QueryKitEncoder, "__init__",
                        lambda self, *args, **kw: kit_init(self, *args, **kw) or kits.append(1))
    with TestClient(create_app(tmp_path / "indexes", device="cpu", preload=True), base_url="http://127.0.0.1") as client:
        found = client.get("/search", params={"q": "bread", "k": 3, "mode": "dense"}).json()["queries"][0]["results"]
        assert [hit["doc_id"] for hit in found] == expected and loads == []
        for number in (1, 2):
            added = client.post("/indexes/notes/documents",
                                json={"documents": [{"_id": f"new{number}", "text": f"fresh bread number {number}"}]})
            assert added.status_code == 201, added.text
        assert loads == [] and kits == [1]  # neither write loaded the model; they encode with the queries' kit
    # The written vectors are the model's (raw.npy keeps them as float16).
    stored, _ = Index.open("notes", tmp_path / "indexes", device="cpu").snapshot.raw_vectors()
    full = _full_encoder(record)
    for number in (1, 2):
        vector = full.encode([f"fresh bread number {number}"])[0].astype(np.float16).astype(np.float32)
        assert any(np.array_equal(vector, row) for row in stored)


def test_a_build_on_the_cpu_leaves_the_kit_its_first_search_encodes_with(tiny_bert, tmp_path, monkeypatch):
    import pytest

    from retriever.corpus import Document
    from retriever.index import Index

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    documents = [Document(f"d{number}", text, None, "notes", number + 1) for number, text in enumerate(TEXTS)]
    Index.build(documents, "kit", tmp_path / "indexes", model=str(model), max_length=32, device="cpu",
                calibrator="none")
    index = Index.open("kit", tmp_path / "indexes", device="cpu")
    assert QueryKitEncoder.open(index.snapshot.manifest.encoder) is not None
    with monkeypatch.context() as patch:  # the kit encodes the query: no model is loaded
        patch.setattr(Encoder, "__init__", lambda *args, **kwargs: pytest.fail("the search loaded the model"))
        assert index.search(["how do I read a file"], k=1)[0][0].doc_id == "d0"
    # Built on PyTorch, the build leaves no kit: a kit is written only where the graph it names is kept.
    Index.build(documents, "torch", tmp_path / "other", model=str(model), max_length=16, device="cpu",
                calibrator="none", runtime="torch")
    assert QueryKitEncoder.open(Index.open("torch", tmp_path / "other").snapshot.manifest.encoder) is None


def test_a_build_from_vectors_encodes_its_texts_from_the_kit_and_loads_no_model(tiny_bert, tmp_path, monkeypatch):
    import pytest

    from retriever.encode.model_card import DeferredEncoder, kit_opener
    from retriever.index import Index

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    record = {**_record(model), "dim": 32}
    texts = TEXTS * 3
    full = _full_encoder(record)
    deferred = DeferredEncoder(record, lambda: pytest.fail("the model was loaded"),
                               kit=lambda: QueryKitEncoder.open(record))
    for chunk in (16384, 5):  # one chunk; chunks of 5 (the same batches either way: the same chunks)
        monkeypatch.setattr("retriever.encode.encoder.TOKENIZE_CHUNK", chunk)
        monkeypatch.setattr("retriever.encode.query_kit.TOKENIZE_CHUNK", chunk)
        expected, cut = full.encode_counting_truncated(texts)
        vectors, truncated = deferred.encode_counting_truncated(texts)
        assert np.array_equal(vectors, expected) and truncated == cut == 3 and not deferred.loaded
    # The kit is the recorded encoder or none: another vector size or read is not served from it.
    for other in ({**record, "dim": 16}, {**record, "max_length": 16}):
        assert kit_opener(other, "cpu", "auto", None)() is None
    assert kit_opener(record, "cpu", "auto", None)() is not None
    assert kit_opener(record, "cpu", "auto", 0) is None  # a batch size of 0 goes to the encoder, which refuses it
    # A build from vectors with a kit kept: its pseudo-queries and the hybrid check's queries come from the kit.
    documents = [{"id": f"d{number}", "text": f"note {number} on {topic}. It tells how {topic} works in practice, "
                  f"and why {topic} matters to anyone who cares about {number % 7}."}
                 for number, topic in enumerate(["tea", "rain", "ships", "maps", "bees"] * 24)]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps(document) + "\n" for document in documents))
    np.save(tmp_path / "vectors.npy", _full_encoder(record).encode([d["text"] for d in documents]))
    with monkeypatch.context() as patch:
        patch.setattr(Encoder, "__init__", lambda *args, **kwargs: pytest.fail("the build loaded the model"))
        summary = Index.build(corpus, "kit", tmp_path / "indexes", vectors=tmp_path / "vectors.npy",
                              model=str(model), max_length=32, device="cpu")
    manifest = json.loads((Path(summary.folder) / "manifest.json").read_text())
    assert manifest["calibrator"]["decision"]["check"]["pseudo_queries"] >= 50
    # Asked for another batch size than the kit's, the build loads the model (other batches, other last bits).
    loads = []
    original = Encoder.__init__
    monkeypatch.setattr(Encoder, "__init__", lambda self, *args, **kwargs: (loads.append(1),
                                                                            original(self, *args, **kwargs))[1])
    Index.build(corpus, "batch", tmp_path / "indexes", vectors=tmp_path / "vectors.npy", model=str(model),
                max_length=32, device="cpu", batch_size=5)
    assert loads == [1]
    assert QueryKitEncoder.open(record).settings.batch_size == 32  # and left the default encoder's kit as it was


def test_a_build_of_texts_on_the_cpu_encodes_from_the_kit_with_the_vectors_and_passages_of_the_model(tiny_bert,
                                                                                                      tmp_path,
                                                                                                      monkeypatch):
    import pytest

    from retriever.index import Index
    from tests.helpers import long_text, search_vectors, sentences, with_long

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    docs = with_long(sentences(40), every=8)  # every 8th document longer than the 32 tokens read: cut
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"_id": key, "text": text}) + "\n" for key, text in docs.items()))
    settings = dict(model=str(model), max_length=32, device="cpu", calibrator="none")
    Index.build(corpus, "first", tmp_path / "indexes", **settings)  # loads the model, leaves the kit
    with monkeypatch.context() as patch:
        patch.setattr(Encoder, "__init__", lambda *args, **kwargs: pytest.fail("the build loaded the model"))
        Index.build(corpus, "kit", tmp_path / "indexes", **settings)
    first, kit = (Index.open(name, tmp_path / "indexes", device="cpu") for name in ("first", "kit"))
    assert first.snapshot.segments[0].split and len(first) == len(kit) == 40
    probes = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    probes /= np.linalg.norm(probes, axis=1, keepdims=True)
    # Every passage vector the same to the last bit, and every passage the same span.
    for a, b in zip(search_vectors(first, probes, k=80), search_vectors(kit, probes, k=80)):
        assert np.array_equal(a, b)
    hits = [index.search([long_text(7)[:200]], k=3)[0] for index in (first, kit)]
    assert [(h.doc_id, h.score, h.passage, h.span) for h in hits[0]] == \
        [(h.doc_id, h.score, h.passage, h.span) for h in hits[1]]


def test_retriever_encode_on_the_cpu_encodes_from_the_kit_with_the_models_vectors(tiny_bert, tmp_path, cli,
                                                                                 monkeypatch):
    import pytest

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    corpus = tmp_path / "texts.txt"
    corpus.write_text("".join(f"{text}\n" for text in TEXTS))
    args = ("--model", model, "--max-length", 32, "--device", "cpu")
    assert cli("encode", corpus, "--out", tmp_path / "first.npy", *args).returncode == 0  # no kit yet: the model
    _full_encoder(_record(model))  # a kit kept, as a build or a search on the CPU keeps one
    with monkeypatch.context() as patch:
        patch.setattr(Encoder, "__init__", lambda *a, **k: pytest.fail("encode loaded the model"))
        done = cli("encode", corpus, "--out", tmp_path / "kit.npy", *args)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp_path / "kit.npy"), np.load(tmp_path / "first.npy"))
    assert json.loads((tmp_path / "kit.json").read_text())["encoder"] == \
        json.loads((tmp_path / "first.json").read_text())["encoder"]
