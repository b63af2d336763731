"""`retriever encode` and `--version` through the installed console script, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from retriever import __version__


def run_cli(*args, **kwargs) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "cli.main", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)


def test_version():
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"retriever {__version__}"


def test_help_lists_the_commands():
    done = run_cli("--help")
    assert done.returncode == 0
    for command in ("encode", "build", "search", "add", "delete", "info", "bench"):
        assert command in done.stdout


def test_encode_writes_vectors_and_settings(tmp_path, tiny_bert):
    corpus = tmp_path / "texts.txt"
    corpus.write_text("A man plays a guitar.\n\n   \nA woman slices an onion.\nDogs run.\n", encoding="utf-8")
    out = tmp_path / "out" / "vectors.npy"
    done = run_cli("encode", corpus, "--out", out, "--model", tiny_bert, "--layers", "0,3", "--max-length", "16")
    assert done.returncode == 0, done.stderr
    vectors = np.load(out)
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32  # blank lines are skipped
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["count"] == 3
    assert record["encoder"]["layers"] == [0, 3] and record["encoder"]["max_length"] == 16


def test_encode_missing_file_is_one_line_and_nonzero(tmp_path):
    done = run_cli("encode", tmp_path / "missing.txt", "--out", tmp_path / "v.npy")
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "missing.txt" in done.stderr
    assert "Traceback" not in done.stderr
