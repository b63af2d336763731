"""The encoder's forward pass and pooling on ONNX Runtime: same weights, same float32, same numbers.

On a CPU most of a short query's time through PyTorch is framework overhead around small matrix products; the same
graph on ONNX Runtime has less of it (benchmarks/results/query_runtime.md, serve_load.md). It is what `auto` takes
on a CPU (`retriever.encode.runtimes`): the server, `Index.open` and the CLI's query files encode with it; results
agree with PyTorch to ~1e-6 (tests/test_onnx_runtime.py), so an index built with PyTorch is searched with ONNX
Runtime, and the other way round, through the same encode path.

The model is exported with the pooling inside the graph (the session maps token arrays straight to sentence
vectors), once per machine: the graph is kept in a cache folder (`onnx_cache_dir`) under a digest of everything it
is made from (the weights themselves, the model's config, the pooling, the torch, onnx and ONNX Runtime versions),
so a changed model or library is a new entry, never a stale one, and a one-off search does not pay the export's
seconds. Where the folder cannot be written, the graph is exported in memory each time. The kept graph has each
layer's attention, layer norms and GELU fused into ONNX Runtime's own kernels where its optimizer knows the
architecture (BERT and its kin) and the fused graph's vectors agree with the plain one's; else the plain graph. A
model the exporter cannot trace leaves its refusal under the same digest, so it is not traced again on every load.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from retriever.errors import RetrieverError, UnavailableError, param
from retriever.encode.pooling import Pooling, pool
from retriever.encode.query_kit import load_onnxruntime, onnx_cache_dir, session_options


# Part of each graph's digest, so a change to how graphs are made is a new entry. Where graphs are kept:
# `query_kit.onnx_cache_dir` ($RETRIEVER_ONNX_CACHE, else retriever/onnx in the user's cache folder).
_OPSET, _GRAPH_FORMAT = 17, 2
# A fused graph is kept only where its vectors agree with the plain graph's to this cosine on a probe batch.
_FUSED_AGREEMENT = 0.99999


def onnx_runtime_available() -> bool:
    try:
        load_onnxruntime()
    except ImportError:
        return False
    return True


class _Pooled(torch.nn.Module):
    """Token arrays -> pooled sentence vectors: what gets exported."""

    def __init__(self, model: torch.nn.Module, pooling: Pooling, num_hidden_layers: int, input_names: list[str]):
        super().__init__()
        self.model, self.pooling, self.num_hidden_layers = model, pooling, num_hidden_layers
        self.input_names = input_names

    def forward(self, attention_mask: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        outputs = self.model(**dict(zip(self.input_names, inputs)), attention_mask=attention_mask,
                             output_hidden_states=self.pooling.needs_hidden_states, return_dict=True)
        return pool(self.pooling, outputs, attention_mask, self.num_hidden_layers)


class OnnxForward:
    """The `onnx` runtime (`retriever.encode.runtimes`): an ONNX Runtime session computing `pool(model(...))` for int64
    token arrays."""

    name: ClassVar[str] = "onnx"

    @staticmethod
    def refusal(device: str, dtype: str) -> RetrieverError | None:
        if not device.startswith("cpu"):
            return RetrieverError(f"the onnx runtime runs on the CPU; use {param('runtime', 'torch')} on a GPU")
        if dtype != "fp32":
            return RetrieverError(f"the onnx runtime computes in fp32; use {param('runtime', 'torch')} for bf16 or "
                                  "fp16")
        if not onnx_runtime_available():
            return UnavailableError("the onnx runtime needs onnxruntime: pip install onnxruntime", parameter="runtime")
        return None

    def __init__(self, model: torch.nn.Module, pooling: Pooling, num_hidden_layers: int, input_names: list[str],
                 device: torch.device | None = None, threads: int | None = None):
        import onnxruntime

        self.input_names = list(input_names)
        wrapper = _Pooled(model, pooling, num_hidden_layers, self.input_names).eval()
        options = session_options(threads or torch.get_num_threads())
        cached = onnx_cache_dir() / f"{_graph_digest(wrapper, pooling, num_hidden_layers, self.input_names)}.onnx"
        self.session = None
        self.graph_path: Path | None = None  # the kept graph this session runs (None: exported in memory only)
        if cached.is_file():
            try:
                self.session = onnxruntime.InferenceSession(str(cached), options, providers=["CPUExecutionProvider"])
                self.graph_path = cached
            except Exception:  # noqa: BLE001 - a damaged entry (a full disk, a crash mid-copy): made anew below
                cached.unlink(missing_ok=True)
        if self.session is None:
            # A model the exporter could not trace with these libraries is not traced again on every load (auto
            # falls back to PyTorch each time): the refusal is kept beside where its graph would be.
            refused = cached.with_suffix(".refused")
            if refused.is_file():
                raise _refusal(refused.read_text(encoding="utf-8").strip())
            try:
                graph = _export(wrapper, model, self.input_names)
            except _ExportFailed as failure:
                _keep(refused, failure.detail.encode("utf-8"))
                raise _refusal(failure.detail) from None
            _keep(cached, graph)
            self.session = onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
            self.graph_path = cached if cached.is_file() else None

    def __call__(self, attention_mask: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feed = {"attention_mask": attention_mask, **{name: inputs[name] for name in self.input_names}}
        return self.session.run(["vectors"], feed)[0]


def _export(wrapper: _Pooled, model: torch.nn.Module, input_names: list[str]) -> bytes:
    """WRAPPER (MODEL with its pooling) as an ONNX graph taking int64 token arrays of any batch and length, its
    attention fused where ONNX Runtime can (`_fused`); `_ExportFailed` where the exporter cannot trace it."""
    example = torch.ones((1, 4), dtype=torch.int64)
    names = ["attention_mask", *input_names]
    # PyTorch's fused attention (`sdpa`) exports as a pattern ONNX Runtime's optimizer does not recognise, the plain
    # one as one it fuses: exported with the plain one where the model has it, else (or where that fails) as it is.
    switchable = (getattr(model, "set_attn_implementation", None) is not None
                  and getattr(model.config, "_attn_implementation", None) not in (None, "eager"))
    for plain_attention in ((True, False) if switchable else (False,)):
        buffer = io.BytesIO()
        try:
            with warnings.catch_warnings(), (_eager_attention(model) if plain_attention else nullcontext()):
                warnings.simplefilter("ignore")  # the tracer's notes on Python branches the example input takes
                torch.onnx.export(wrapper, (example, *[example] * len(input_names)), buffer,
                                  input_names=names, output_names=["vectors"], opset_version=_OPSET, dynamo=False,
                                  dynamic_axes={name: {0: "batch", 1: "tokens"} for name in names})
            return _fused(buffer.getvalue(), model.config, input_names)
        except Exception as error:  # noqa: BLE001 - an architecture the exporter cannot trace
            failure = error
        finally:
            model.eval()  # the exporter restores the wrapper's mode recursively; the model must stay in eval
    raise _ExportFailed(f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}")


class _ExportFailed(Exception):
    """The exporter could not trace the model; DETAIL says how (its error's type and first line)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def _refusal(detail: str) -> RetrieverError:
    """The error for a model the exporter could not trace (DETAIL: how)."""
    return RetrieverError(f"this model cannot run on ONNX Runtime ({detail}); use {param('runtime', 'torch')}")


@contextmanager
def _eager_attention(model: torch.nn.Module):
    """MODEL's attention written out as plain products while it is exported, then as it was."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _fused(graph: bytes, config, input_names: list[str]) -> bytes:
    """GRAPH with each layer's attention, layer norms and GELU fused into ONNX Runtime's own kernels (its
    transformer optimizer: one kernel where the plain graph runs a dozen small ones, so a short query spends less
    time between them); GRAPH itself where the optimizer fails or its vectors do not agree with GRAPH's on a
    probe batch of padded sentences (`_FUSED_AGREEMENT`)."""
    import onnx
    import onnxruntime
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimized = optimize_model(onnx.load_from_string(graph), model_type="bert",
                                       num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
                                       hidden_size=int(getattr(config, "hidden_size", 0) or 0), opt_level=0)
        fused = optimized.model.SerializeToString()
        probe = _probe_batch(config, input_names)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        plain, candidate = (onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
                            .run(["vectors"], probe)[0] for model in (graph, fused))
    except Exception:  # noqa: BLE001 - an architecture the optimizer does not know: the plain graph serves
        return graph
    cosines = (plain * candidate).sum(1) / np.maximum(
        np.linalg.norm(plain, axis=1) * np.linalg.norm(candidate, axis=1), 1e-12)
    return fused if bool(np.all(cosines >= _FUSED_AGREEMENT)) else graph


def _probe_batch(config, input_names: list[str]) -> dict[str, np.ndarray]:
    """Three sentences of 5, 17 and 40 token ids (fixed, drawn from the vocabulary past its first 1,000: special
    and unused entries), padded to one batch as the encoder pads them."""
    vocabulary = int(getattr(config, "vocab_size", 0) or 0)
    low = min(1000, max(vocabulary // 2, 1))
    lengths = (5, 17, 40)
    ids = np.zeros((len(lengths), max(lengths)), np.int64)
    mask = np.zeros_like(ids)
    generator = np.random.default_rng(0)
    for row, length in enumerate(lengths):
        ids[row, :length] = generator.integers(low, max(vocabulary, low + 1), length)
        mask[row, :length] = 1
    return {"attention_mask": mask,
            **{name: (ids if name == "input_ids" else np.zeros_like(ids)) for name in input_names}}


def _graph_digest(wrapper: _Pooled, pooling: Pooling, num_hidden_layers: int, input_names: list[str]) -> str:
    """A digest of everything the exported graph is made from."""
    import onnx
    import onnxruntime

    digest = hashlib.sha256()
    described = (_GRAPH_FORMAT, _OPSET, torch.__version__, onnx.__version__, onnxruntime.__version__, pooling.mode,
                 pooling.layers, num_hidden_layers, tuple(input_names), wrapper.model.config.to_json_string())
    digest.update(repr(described).encode())
    for name, tensor in wrapper.model.state_dict().items():
        digest.update(name.encode())
        digest.update(repr((tuple(tensor.shape), str(tensor.dtype))).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:40]


def _keep(path: Path, graph: bytes) -> None:
    """GRAPH saved at PATH, whole or not at all (written beside it, then renamed); nothing where it cannot be."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".graph-", suffix=".tmp")
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(graph)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
