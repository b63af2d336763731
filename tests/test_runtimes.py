"""The runtime registry: a runtime added to it is what the encoder runs on, without the encoder changing, and
one that cannot run where it is asked to is refused with its own reason."""

from __future__ import annotations

import numpy as np
import pytest

import retriever.encode.runtimes as runtimes
from retriever.encode.encoder import Encoder
from retriever.errors import RetrieverError


class Halved(runtimes.TorchForward):
    """PyTorch's vectors, halved: a runtime anyone could register."""

    name = "halved"
    calls = 0

    @staticmethod
    def refusal(device: str, dtype: str) -> RetrieverError | None:
        return RetrieverError("halved runs in fp32 only") if dtype != "fp32" else None

    def __call__(self, attention_mask, inputs):
        Halved.calls += 1
        return super().__call__(attention_mask, inputs) / 2


def test_a_registered_runtime_is_what_the_encoder_runs_on(tiny_bert, monkeypatch):
    monkeypatch.setitem(runtimes.RUNTIMES, "halved", Halved)
    texts = ["a first sentence", "and another, longer one than the first"]
    expected = Encoder(str(tiny_bert), device="cpu", runtime="torch").encode(texts)
    halved = Encoder(str(tiny_bert), device="cpu", runtime="halved")
    assert halved.runtime == "halved"
    np.testing.assert_allclose(halved.encode(texts), expected / 2, atol=1e-6)
    assert Halved.calls == 1
    with pytest.raises(RetrieverError, match="halved runs in fp32 only"):
        Encoder(str(tiny_bert), device="cpu", dtype="bf16", runtime="halved")


def test_auto_takes_the_first_runtime_that_can_run_there():
    assert runtimes.resolve_runtime("auto", "cpu", "fp32") == "onnx"  # onnxruntime is a dependency
    assert runtimes.resolve_runtime("auto", "cpu", "bf16") == "torch"
    assert runtimes.resolve_runtime("auto", "cuda:0", "fp16") == "torch"
