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


# Test files run first, in this order (the rest as collected): the slowest, so that a parallel run (`make test`: a
# file to each worker, in this order) does not end on one of them, and the file of tests that start Ray long before
# the other file that starts one (`exclusive_ray`).
SLOWEST_FILES_FIRST = ("test_engine_ray.py", "test_index_crash.py", "test_auto_calibrator.py", "test_cli_encode.py",
                       "test_search_page.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = SLOWEST_FILES_FIRST
    items.sort(key=lambda item: first.index(item.path.name) if item.path.name in first else len(first))


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


@pytest.fixture(scope="module")
def exclusive_ray():
    """The machine's Ray to one test module at a time: every test that starts a Ray cluster asks for this. Workers
    of a parallel run (`make test` runs pytest-xdist's, a test file to each) take turns through a lock file, since a
    second cluster on the machine is found by one that starts after it (`ray.init` joins it) and a test that kills
    Ray's encode actors finds them by name. A wait counts toward the waiting test's timeout (pytest-timeout times
    fixtures too): `SLOWEST_FILES_FIRST` starts the long file of Ray tests first, well before the other. The session
    folders the module's clusters leave in the temporary folder (/tmp/ray/session_*) are removed when it is done;
    those there before are left alone."""
    import fcntl
    import shutil
    import tempfile

    root = Path(tempfile.gettempdir()) / "ray"
    # One lock per user: another user's file in the shared temporary folder may not be writable.
    with open(Path(tempfile.gettempdir()) / f"retriever-tests-ray-{os.getuid()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = set(root.glob("session_2*"))
        try:
            yield
        finally:
            for folder in set(root.glob("session_2*")) - before:
                shutil.rmtree(folder, ignore_errors=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


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
