"""Shared fixtures: the real embedded model, a tiny random BERT, and the shared benchmark data."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def index_home(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own empty index home ($RETRIEVER_HOME, inherited by subprocesses): no test reads or
    writes the user's real one."""
    home = tmp_path_factory.mktemp("retriever-home")
    monkeypatch.setenv("RETRIEVER_HOME", str(home))
    return home


@pytest.fixture(autouse=True, scope="session")
def onnx_graphs(tmp_path_factory) -> Path:
    """The session's exported ONNX graphs ($RETRIEVER_ONNX_CACHE): shared by its tests, never the user's."""
    folder = tmp_path_factory.mktemp("onnx-graphs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RETRIEVER_ONNX_CACHE", str(folder))
        yield folder


@pytest.fixture(autouse=True, scope="session")
def ray_sessions_removed():
    """The session folders the Ray tests' clusters leave in the temporary folder (/tmp/ray/session_*) are removed
    when the run ends; those of other Ray processes on the machine, there before, are left alone."""
    import shutil
    import tempfile

    root = Path(tempfile.gettempdir()) / "ray"
    before = set(root.glob("session_2*"))
    yield
    for folder in set(root.glob("session_2*")) - before:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The benchmark files beside the checkout (../shared/data), or $RETRIEVER_DATA."""
    path = Path(os.environ.get("RETRIEVER_DATA", REPO.parent / "shared" / "data"))
    assert path.is_dir(), f"benchmark data not found at {path}; set RETRIEVER_DATA"
    return path


@pytest.fixture(scope="session")
def minilm_encoder():
    from retriever.encode.encoder import Encoder

    return Encoder(device="cpu")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A randomly initialised 3-layer BERT saved as a local folder, with the real MiniLM tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from retriever.encode.models import default_model_path

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-bert")
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=37
    )
    BertModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture()
def cli(capsys, monkeypatch):
    """Run the `retriever` console-script entry point in this process (no interpreter start-up per call)."""
    from cli.main import main

    def run(*args) -> CliResult:
        capsys.readouterr()  # drop anything printed before
        monkeypatch.setattr(sys, "argv", ["retriever", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
