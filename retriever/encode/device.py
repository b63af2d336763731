"""Choosing where tensors live: `auto` means CUDA when present, else CPU."""

from __future__ import annotations

import torch

from retriever.errors import RetrieverError, UnavailableError, param

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str | None = "auto") -> torch.device:
    device = (device or "auto").lower()
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UnavailableError(f"device '{device}' was asked for but CUDA is not available on this machine; use "
                               f"{param('device', 'cpu')}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise RetrieverError(f"unknown device '{device}'; choose one of {', '.join(DEVICES)}",
                             parameter="device") from None
