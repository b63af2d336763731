"""Where an encoder's forward pass runs: a registry of runtimes, each a small class that maps padded token arrays
to pooled sentence vectors, and says where it cannot run.

- ``torch``: PyTorch, on any device and precision.
- ``onnx`` (`retriever.encode.onnx_runtime`): the same graph exported to ONNX Runtime; float32 on the CPU only, with
  less overhead per call (the server's choice for single queries).

``auto`` takes the first of `AUTO_ORDER` that can run on the device and precision asked for. A new runtime is a
class with `name`, `refusal` and the call below, added to `RUNTIMES`; `Encoder` does not change.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import numpy as np
import torch

from retriever.errors import RetrieverError
from retriever.encode.onnx_runtime import OnnxForward
from retriever.encode.pooling import Pooling, pool


class Forward(Protocol):
    """A runtime: built once per encoder, then called per batch."""

    name: ClassVar[str]

    @staticmethod
    def refusal(device: str, dtype: str) -> RetrieverError | None:
        """Why this runtime cannot run on DEVICE in DTYPE (an error to raise when it was asked for), or None."""

    def __init__(self, model: torch.nn.Module, pooling: Pooling, num_hidden_layers: int, input_names: list[str],
                 device: torch.device):
        ...

    def __call__(self, attention_mask: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray | torch.Tensor:
        """Pooled float32 vectors (batch, dim) for int64 token arrays (batch, tokens): a NumPy array, or a tensor
        left on the GPU (the caller copies a chunk's batches back at once)."""


class TorchForward:
    """The model's forward pass and pooling in PyTorch, under inference mode."""

    name: ClassVar[str] = "torch"

    @staticmethod
    def refusal(device: str, dtype: str) -> RetrieverError | None:
        return None

    def __init__(self, model: torch.nn.Module, pooling: Pooling, num_hidden_layers: int, input_names: list[str],
                 device: torch.device):
        self.model, self.pooling, self.num_hidden_layers, self.device = model, pooling, num_hidden_layers, device

    def __call__(self, attention_mask: np.ndarray, inputs: dict[str, np.ndarray]) -> np.ndarray | torch.Tensor:
        tensors = {name: self._to_device(array) for name, array in inputs.items()}
        mask = self._to_device(attention_mask)
        with torch.inference_mode():
            outputs = self.model(**tensors, attention_mask=mask, output_hidden_states=self.pooling.needs_hidden_states)
            vectors = pool(self.pooling, outputs, mask, self.num_hidden_layers)
        # On a GPU the vectors stay there: the caller gathers a chunk's batches and waits for the device once.
        return vectors.cpu().numpy() if self.device.type == "cpu" else vectors

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":  # from page-locked memory the copy runs without holding up the CPU
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)


RUNTIMES: dict[str, type[Forward]] = {runtime.name: runtime for runtime in (TorchForward, OnnxForward)}
AUTO_ORDER = ("onnx", "torch")  # the faster first, where it can run
RUNTIME_CHOICES = ("auto", *RUNTIMES)


def resolve_runtime(runtime: str, device: str, dtype: str = "fp32") -> str:
    """The runtime's name for RUNTIME on DEVICE in DTYPE: auto picks the first of AUTO_ORDER that can run there; a
    named one that cannot is refused with its reason."""
    if runtime == "auto":
        return next(name for name in AUTO_ORDER if RUNTIMES[name].refusal(device, dtype) is None)
    if runtime not in RUNTIMES:
        raise RetrieverError(f"unknown runtime '{runtime}'; choose one of {', '.join(RUNTIME_CHOICES)}",
                             parameter="runtime")
    refusal = RUNTIMES[runtime].refusal(device, dtype)
    if refusal is not None:
        raise refusal
    return runtime
