"""The encoder's forward pass and pooling on ONNX Runtime: same weights, same float32, same numbers.

On a CPU a single short query through PyTorch costs ~14 ms with MiniLM on the 2-core machine, most of it in
framework overhead around small matrix products; the same graph on ONNX Runtime takes ~5 ms (3x), and batches of
16 are ~20% faster too (measured, see benchmarks/results/serve_load.md). The server uses it on CPU when
`onnxruntime` is installed; results agree with PyTorch to ~1e-6 (tests/test_onnx_runtime.py), so an index built
with PyTorch is searched with ONNX Runtime, and the other way round, through the same encode path.

The model is exported once per process, in memory (a few seconds for MiniLM; no files to go stale), with the
pooling inside the graph: the session maps token arrays straight to sentence vectors.
"""

from __future__ import annotations

import io
import warnings
from typing import ClassVar

import numpy as np
import torch

from retriever.errors import RetrieverError, UnavailableError, param
from retriever.encode.pooling import Pooling, pool


def onnx_runtime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
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
        example = torch.ones((1, 4), dtype=torch.int64)
        names = ["attention_mask", *self.input_names]
        buffer = io.BytesIO()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the tracer's notes on Python branches the example input takes
                torch.onnx.export(wrapper, (example, *[example] * len(self.input_names)), buffer,
                                  input_names=names, output_names=["vectors"], opset_version=17, dynamo=False,
                                  dynamic_axes={name: {0: "batch", 1: "tokens"} for name in names})
        except Exception as error:  # noqa: BLE001 - an architecture the exporter cannot trace
            raise RetrieverError(f"this model cannot run on ONNX Runtime ({type(error).__name__}: "
                                 f"{str(error).splitlines()[0] if str(error) else ''}); use "
                                 f"{param('runtime', 'torch')}") from None
        finally:
            model.eval()  # the exporter restores the wrapper's mode recursively; the model must stay in eval
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        # Idle workers sleep instead of spinning: on a few cores a spinning pool takes the CPU that the server's
        # HTTP loop and the next batch need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])

    def __call__(self, attention_mask: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray:
        feed = {"attention_mask": attention_mask, **{name: inputs[name] for name in self.input_names}}
        return self.session.run(["vectors"], feed)[0]
