"""Choosing where tensors live: `auto` means CUDA when present, else CPU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from retriever.errors import RetrieverError, UnavailableError, param

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")


def cpu_only_machine() -> bool:
    """Whether this machine surely has no CUDA device, told without importing torch (a second of a one-off
    search's time): a Mac, or Linux with no NVIDIA device node. Unsure elsewhere (False): torch then decides."""
    if sys.platform == "darwin":
        return True
    return sys.platform.startswith("linux") and not any(Path("/dev").glob("nvidia[0-9]*"))


def resolve_device(device: str | None = "auto") -> torch.device:
    import torch

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
