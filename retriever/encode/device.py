"""Choosing where tensors live: `auto` means CUDA when present, else CPU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from retriever.errors import RetrieverError, UnavailableError, param

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")


# Device nodes of a GPU torch may take for CUDA: NVIDIA's, WSL2's GPU bridge, AMD's ROCm, NVIDIA Jetson's.
GPU_DEVICE_NODES = ("nvidia[0-9]*", "dxg", "kfd", "nvhost-*")


def cpu_only_machine() -> bool:
    """Whether this machine surely has no CUDA device, told without importing torch (a second of a one-off
    search's time): a Mac, or Linux with none of GPU_DEVICE_NODES. Unsure elsewhere (False): torch then decides."""
    if sys.platform == "darwin":
        return True
    return sys.platform.startswith("linux") and not any(
        next(Path("/dev").glob(pattern), None) is not None for pattern in GPU_DEVICE_NODES)


def surely_cpu(device: str | None) -> bool:
    """Whether DEVICE (as asked: "auto", "cpu", "cuda", ...) surely resolves to the CPU, told without importing torch:
    the CPU asked for, or auto on a machine with no GPU (`cpu_only_machine`). False where torch must decide."""
    named = str(device or "auto").lower()
    return named == "cpu" or (named == "auto" and cpu_only_machine())


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
