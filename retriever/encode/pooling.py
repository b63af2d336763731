"""Pooling token states into one sentence vector.

Every mode is a masked mean over non-padding tokens ([CLS] and [SEP] included, as sentence-transformers does)
of the average of some hidden layers, except `cls`. Averaging layers first and then pooling equals pooling each
layer and averaging, since both are linear.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from retriever.errors import RetrieverError, param

if TYPE_CHECKING:  # torch loads where tensors are pooled: reading a pooling setting (a build from vectors) needs none
    import torch

POOLING_MODES = ("cls", "last-avg", "last2-avg", "first-last-avg")


@dataclass(frozen=True)
class Pooling:
    """Which hidden states to average, in Hugging Face's `hidden_states` numbering (0 = embedding output)."""

    mode: str  # one of POOLING_MODES, or "layers" for an explicit list
    layers: tuple[int, ...] | None = None

    @classmethod
    def parse(cls, mode: str | None = "last-avg", layers: str | list[int] | tuple[int, ...] | None = None) -> Pooling:
        if layers is not None and len(layers) > 0:
            if isinstance(layers, str):
                try:
                    layers = [int(part) for part in layers.split(",") if part.strip()]
                except ValueError:
                    raise RetrieverError(f"{param('layers')} must be comma-separated integers like 0,4 "
                                         f"(got '{layers}')") from None
            if not layers:
                raise RetrieverError(f"{param('layers')} needs at least one layer index, e.g. {param('layers', '0,4')}")
            return cls("layers", tuple(int(layer) for layer in layers))
        mode = mode or "last-avg"
        if mode not in POOLING_MODES:
            raise RetrieverError(f"unknown pooling '{mode}'; choose one of {', '.join(POOLING_MODES)} or pass "
                                 f"{param('layers')}", parameter="pooling")
        return cls(mode)

    @property
    def needs_hidden_states(self) -> bool:
        return self.mode not in ("cls", "last-avg")

    def layer_indices(self, num_hidden_layers: int) -> tuple[int, ...]:
        """Absolute indices into `hidden_states` (length num_hidden_layers + 1)."""
        count = num_hidden_layers + 1
        if self.mode == "layers":
            for layer in self.layers:
                if not -count <= layer < count:
                    raise RetrieverError(f"layer {layer} does not exist: this model has hidden_states 0..{count - 1}",
                                         parameter="layers")
            return tuple(layer % count for layer in self.layers)
        if self.mode == "last2-avg":
            return (count - 2, count - 1)
        if self.mode == "first-last-avg":
            # What the BERT-flow code calls "last2avg": first transformer layer and last layer.
            return (1, count - 1)
        return (count - 1,)

    def describe(self) -> str:
        return f"layers {','.join(map(str, self.layers))}" if self.mode == "layers" else self.mode


def masked_mean(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over the tokens where attention_mask is 1. states (b, t, d), mask (b, t) -> (b, d) in float32."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    summed = (states * mask).sum(dim=1, dtype=torch.float32)
    return summed / attention_mask.sum(dim=1, keepdim=True).clamp(min=1).to(torch.float32)


def pool(pooling: Pooling, outputs, attention_mask: torch.Tensor, num_hidden_layers: int) -> torch.Tensor:
    """Sentence vectors (b, d) float32 from a transformers model output."""
    import torch

    if pooling.mode == "cls":
        return outputs.last_hidden_state[:, 0].float()
    if not pooling.needs_hidden_states:
        return masked_mean(outputs.last_hidden_state, attention_mask)
    layers = [outputs.hidden_states[index] for index in pooling.layer_indices(num_hidden_layers)]
    states = layers[0] if len(layers) == 1 else torch.stack(layers).float().mean(dim=0)
    return masked_mean(states, attention_mask)
