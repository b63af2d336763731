"""The encoder on ONNX Runtime gives PyTorch's vectors, for every pooling, any batch shape."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.encode.encoder import Encoder
from retriever.errors import RetrieverError
from retriever.encode.runtimes import resolve_runtime

TEXTS = ["A man is playing a guitar.", "Short.", "The committee discussed the budget for the new harbour at length.",
         "A dog runs through the grass chasing a ball that bounces over the fence and into the neighbour's garden."]


@pytest.mark.parametrize("pooling, layers", [("last-avg", None), ("cls", None), ("first-last-avg", None),
                                             ("last2-avg", None), (None, "0,2")])
def test_onnx_runtime_matches_torch_for_every_pooling(tiny_bert, pooling, layers):
    torch_encoder = Encoder(str(tiny_bert), pooling, layers, device="cpu", batch_size=3, runtime="torch")
    onnx_encoder = Encoder(str(tiny_bert), pooling, layers, device="cpu", batch_size=3, runtime="onnx")
    assert onnx_encoder.runtime == "onnx" and torch_encoder.runtime == "torch"
    expected = torch_encoder.encode(TEXTS)
    np.testing.assert_allclose(onnx_encoder.encode(TEXTS), expected, atol=1e-5)
    # One at a time (other sequence lengths and batch sizes than the export's example) too.
    np.testing.assert_allclose(np.vstack([onnx_encoder.encode([text]) for text in TEXTS]), expected, atol=1e-5)


def test_the_real_model_matches_on_onnx_runtime(minilm_encoder):
    onnx_encoder = Encoder(device="cpu", runtime="onnx")
    np.testing.assert_allclose(onnx_encoder.encode(TEXTS), minilm_encoder.encode(TEXTS), atol=1e-5)


def test_runtime_choice():
    assert resolve_runtime("auto", "cpu") == "onnx"  # onnxruntime is a dependency
    assert resolve_runtime("auto", "cuda") == "torch" and resolve_runtime("torch", "cpu") == "torch"
    with pytest.raises(RetrieverError, match="unknown runtime 'tpu'"):
        resolve_runtime("tpu", "cpu")
    with pytest.raises(RetrieverError, match="runs on the CPU"):
        resolve_runtime("onnx", "cuda")


def test_onnx_runtime_refuses_half_precision(tiny_bert):
    with pytest.raises(RetrieverError, match="fp32"):
        Encoder(str(tiny_bert), device="cpu", dtype="bf16", runtime="onnx")
    assert Encoder(str(tiny_bert), device="cpu", dtype="bf16", runtime="auto").runtime == "torch"


def test_the_python_api_searches_with_onnx_runtime_by_default_and_pytorch_when_asked(tiny_bert, tmp_path,
                                                                                      monkeypatch):
    from retriever import Document, Index
    from retriever.encode.onnx_runtime import OnnxForward
    from retriever.encode.query_kit import QueryKitEncoder

    notes = [Document(f"n{i}", f"Note {i} about {word}.", None, "mem", i + 1)
             for i, word in enumerate(["cats", "ships", "rain", "bread", "music", "trains"] * 4)]
    Index.build(notes, "notes", tmp_path, model=str(tiny_bert), calibrator="none")
    torch_index = Index.open("notes", tmp_path, device="cpu", runtime="torch")
    onnx_index = Index.open("notes", tmp_path, device="cpu")
    queries = ["a note about rain", "bread and music"]
    calls, forward, kit = [], OnnxForward.__call__, QueryKitEncoder.encode
    monkeypatch.setattr(OnnxForward, "__call__", lambda self, *args: calls.append(1) or forward(self, *args))
    # Where an earlier encoder kept its graph and kit, the query is encoded from the kit: ONNX Runtime too.
    monkeypatch.setattr(QueryKitEncoder, "encode", lambda self, *args, **kw: calls.append(1) or kit(self, *args, **kw))
    expected = torch_index.search(queries, k=5, mode="dense")
    assert not calls  # PyTorch's forward pass
    got = onnx_index.search(queries, k=5, mode="dense")
    assert calls  # ONNX Runtime's
    assert [[hit.doc_id for hit in hits] for hits in got] == [[hit.doc_id for hit in hits] for hits in expected]


def test_the_exported_graph_is_kept_once_per_model_and_made_anew_when_damaged(tiny_bert, onnx_graphs, monkeypatch):
    """A one-off search must not pay the export: the graph is kept under a digest of the weights, read back by the
    next encoder (no export), a damaged entry is exported again, and other weights are another entry."""
    import torch

    from retriever.encode import onnx_runtime

    monkeypatch.setenv("RETRIEVER_ONNX_CACHE", str(onnx_graphs / "own"))
    exports, export = [], onnx_runtime._export
    monkeypatch.setattr(onnx_runtime, "_export", lambda *args: exports.append(1) or export(*args))
    first = Encoder(str(tiny_bert), device="cpu", runtime="onnx")
    kept = list((onnx_graphs / "own").glob("*.onnx"))
    assert len(exports) == 1 and len(kept) == 1 and not list((onnx_graphs / "own").glob(".graph-*"))
    expected = first.encode(TEXTS)
    np.testing.assert_allclose(Encoder(str(tiny_bert), device="cpu", runtime="onnx").encode(TEXTS), expected)
    assert len(exports) == 1
    kept[0].write_bytes(kept[0].read_bytes()[:100])  # cut short
    np.testing.assert_allclose(Encoder(str(tiny_bert), device="cpu", runtime="onnx").encode(TEXTS), expected)
    assert len(exports) == 2
    changed = Encoder(str(tiny_bert), device="cpu", runtime="torch")
    with torch.no_grad():
        changed.model.embeddings.word_embeddings.weight.mul_(1.5)
    other = onnx_runtime.OnnxForward(changed.model, changed.pooling, changed.num_hidden_layers,
                                     changed._input_names)
    assert len(exports) == 3 and len(list((onnx_graphs / "own").glob("*.onnx"))) == 2
    tokens = changed.tokenize(TEXTS[:1]).batches[0]
    np.testing.assert_allclose(other(tokens.attention_mask, tokens.inputs), changed.encode(TEXTS[:1]), atol=1e-5)


def test_an_unwritable_cache_folder_still_gives_the_graph(tiny_bert, tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("RETRIEVER_ONNX_CACHE", str(blocked / "onnx"))
    encoder = Encoder(str(tiny_bert), device="cpu", runtime="onnx")
    assert encoder.encode(TEXTS).shape == (len(TEXTS), encoder.dim)


def _kept_operators(folder) -> set[str]:
    import onnx

    (graph,) = folder.glob("*.onnx")
    return {node.op_type for node in onnx.load(str(graph)).graph.node}


def test_the_kept_graph_runs_fused_attention_and_keeps_torch_s_vectors(tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("RETRIEVER_ONNX_CACHE", str(tmp_path / "graphs"))
    torch_encoder = Encoder(str(tiny_bert), device="cpu", runtime="torch")
    onnx_encoder = Encoder(str(tiny_bert), device="cpu", batch_size=3, runtime="onnx")
    assert {"Attention", "SkipLayerNormalization"} <= _kept_operators(tmp_path / "graphs")
    np.testing.assert_allclose(onnx_encoder.encode(TEXTS), torch_encoder.encode(TEXTS), atol=1e-5)
    # The export switched the model's attention to its plain form for the tracer only.
    assert torch_encoder.model.config._attn_implementation == onnx_encoder.model.config._attn_implementation


def test_a_fused_graph_that_disagrees_is_not_kept(tiny_bert, tmp_path, monkeypatch):
    from retriever.encode import onnx_runtime

    monkeypatch.setenv("RETRIEVER_ONNX_CACHE", str(tmp_path / "graphs"))
    monkeypatch.setattr(onnx_runtime, "_FUSED_AGREEMENT", 1.5)  # no cosine reaches it: every fused graph disagrees
    onnx_encoder = Encoder(str(tiny_bert), device="cpu", runtime="onnx")
    assert "Attention" not in _kept_operators(tmp_path / "graphs")
    expected = Encoder(str(tiny_bert), device="cpu", runtime="torch").encode(TEXTS)
    np.testing.assert_allclose(onnx_encoder.encode(TEXTS), expected, atol=1e-5)


def test_a_model_whose_plain_attention_does_not_trace_exports_as_it_is_and_one_that_does_not_trace_is_refused(
        tiny_bert, tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("RETRIEVER_ONNX_CACHE", str(tmp_path / "graphs"))
    export, calls = torch.onnx.export, []

    def first_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("an attention the tracer cannot follow")
        return export(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", first_fails)
    encoder = Encoder(str(tiny_bert), device="cpu", runtime="onnx")
    assert len(calls) == 2 and "Attention" not in _kept_operators(tmp_path / "graphs")
    expected = Encoder(str(tiny_bert), device="cpu", runtime="torch").encode(TEXTS)
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, atol=1e-5)

    def never(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("no tracing this")

    monkeypatch.setattr(torch.onnx, "export", never)
    monkeypatch.setenv("RETRIEVER_ONNX_CACHE", str(tmp_path / "other"))
    with pytest.raises(RetrieverError, match=r"^this model cannot run on ONNX Runtime \(RuntimeError: no tracing "
                                             r"this\); use runtime='torch'$"):
        Encoder(str(tiny_bert), device="cpu", runtime="onnx")
    # The refusal is kept: the model is not traced again (until the libraries or the model change).
    traced = len(calls)
    with pytest.raises(RetrieverError, match=r"^this model cannot run on ONNX Runtime \(RuntimeError: no tracing "
                                             r"this\); use runtime='torch'$"):
        Encoder(str(tiny_bert), device="cpu", runtime="onnx")
    # The default takes the faster runtime where it can run: a model ONNX Runtime cannot take is encoded by PyTorch.
    fallback = Encoder(str(tiny_bert), device="cpu")
    assert len(calls) == traced
    assert fallback.runtime == "torch" and fallback.batch_size == 64  # PyTorch's batch size, not ONNX Runtime's
    np.testing.assert_allclose(fallback.encode(TEXTS), expected, atol=1e-6)


def test_ctrl_c_while_onnx_runtime_loads_is_an_interrupt_not_a_missing_runtime(monkeypatch):
    """From a CLI QA run: a Ctrl-C arriving while ONNX Runtime's compiled module loaded came out of the load as an
    ImportError ("import numpy failed"), read as "no ONNX Runtime", and a `build --replace` went on to replace."""
    import builtins
    import os
    import signal
    import sys
    import time

    from retriever.encode.onnx_runtime import onnx_runtime_available

    real_import = builtins.__import__

    def interrupted_load(name, *args, **kwargs):
        if name == "onnxruntime":  # the user's Ctrl-C lands inside the compiled module's load, which turns it
            try:  # into an ImportError, as pybind11 does
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
            except KeyboardInterrupt:
                pass
            raise ImportError("import numpy failed")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "onnxruntime", raising=False)
    monkeypatch.setattr(builtins, "__import__", interrupted_load)
    with pytest.raises(KeyboardInterrupt):
        onnx_runtime_available()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
