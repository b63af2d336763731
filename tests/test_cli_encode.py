"""`retriever encode` and `--version` through the installed console script, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from retriever import __version__
from tests.helpers import assert_one_line_error


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


def test_encode_runs_on_either_runtime_with_the_same_vectors(tmp_path, tiny_bert):
    """On a CPU the default (auto) encodes on ONNX Runtime, as builds do; --runtime torch keeps PyTorch; the two
    agree to float rounding, and a runtime that cannot run here is one line."""
    corpus = tmp_path / "texts.txt"
    corpus.write_text("A man plays a guitar.\nA woman slices an onion.\nDogs run in the park all day long.\n")
    vectors = {}
    for runtime in ("auto", "torch"):
        out = tmp_path / f"{runtime}.npy"
        done = run_cli("encode", corpus, "--out", out, "--model", tiny_bert, "--device", "cpu", "--runtime", runtime)
        assert done.returncode == 0, done.stderr
        vectors[runtime] = np.load(out)
    np.testing.assert_allclose(vectors["auto"], vectors["torch"], atol=1e-5)
    done = run_cli("encode", corpus, "--out", tmp_path / "bf16.npy", "--model", tiny_bert, "--device", "cpu",
                   "--dtype", "bf16", "--runtime", "onnx")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "error: the onnx runtime computes in fp32; use --runtime torch for bf16 or fp16"


def test_encode_missing_file_is_one_line_and_nonzero(tmp_path):
    done = run_cli("encode", tmp_path / "missing.txt", "--out", tmp_path / "v.npy")
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "missing.txt" in done.stderr
    assert "Traceback" not in done.stderr


def test_encode_streams_title_and_text_and_resumes_after_a_kill(tmp_path, tiny_bert):
    """What `encode` writes is what `build` encodes (title and text), so its output feeds `build --vectors`; a
    killed run resumes from its last finished chunk."""
    from retriever.corpus import read_corpus
    from retriever.encode.encoder import Encoder

    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": f"Title {i}", "text": f"text number {i}"}) + "\n"
                              for i in range(40)))
    out = tmp_path / "vectors.npy"
    script = (  # encodes in chunks of 8 and dies once the third chunk is on disk, before it is on record
        "import os, signal\n"
        "from retriever.encode.encoder import Encoder\n"
        "from retriever.engines.stages import encode_corpus\n"
        "from retriever.store.arrays import NpyAppender\n"
        "flush, calls = NpyAppender.flush, [0]\n"
        "def dying(self):\n"
        "    flush(self); calls[0] += 1\n"
        "    if calls[0] == 3: os.kill(os.getpid(), signal.SIGKILL)\n"
        "NpyAppender.flush = dying\n"
        f"encode_corpus({str(corpus)!r}, {str(out)!r}, Encoder({str(tiny_bert)!r}, device='cpu'), chunk_rows=8)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["complete"] is False and record["rows"] == 16  # two chunks of 8 on record
    done = run_cli("encode", corpus, "--out", out, "--model", tiny_bert)
    assert done.returncode == 0, done.stderr
    assert "resuming: 16 of 40 documents were encoded by an interrupted run" in done.stderr
    expected = Encoder(str(tiny_bert), device="cpu").encode([f"Title {i} text number {i}" for i in range(40)])
    np.testing.assert_allclose(np.load(out), expected, atol=1e-5)
    assert json.loads(out.with_suffix(".json").read_text())["complete"] is True
    assert len(read_corpus(corpus)) == 40


def test_an_undecodable_argument_byte_is_one_line():
    """A real process: the kernel hands over bytes, Python decodes argv with surrogateescape, `$'\\xff'` arrives as
    U+DCFF; refused before any command runs, naming the byte."""
    done = subprocess.run([sys.executable, "-m", "cli.main", "search", b"caf\xe9 au lait"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr == ("error: command-line argument 2 (caf\\xe9 au lait) is not valid UTF-8 (byte 0xe9 at "
                           "character 4)\n")


def test_encode_refuses_a_max_length_past_the_model_positions(tmp_path, tiny_bert, cli):
    corpus = tmp_path / "texts.txt"
    corpus.write_text("word " * 3000 + "\n", encoding="utf-8")
    done = cli("encode", corpus, "--out", tmp_path / "v.npy", "--model", tiny_bert, "--max-length", "1000000000")
    assert done.returncode == 1 and done.stderr == (
        f"error: --max-length 1,000,000,000 is more than model '{tiny_bert}' takes: at most 512 tokens\n")
    assert not (tmp_path / "v.npy").exists()


def test_a_copied_corpus_with_a_new_modification_time_still_resumes(tmp_path, tiny_bert):
    """Resuming keys on the corpus's bytes, not its modification time (a restored backup, a copy)."""
    import os

    from retriever.encode.encoder import Encoder
    from retriever.engines.stages import encode_corpus

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"Sentence number {i} about things.\n" for i in range(30)))
    out = tmp_path / "vectors.npy"
    encoder = Encoder(str(tiny_bert), device="cpu")
    encode_corpus(corpus, out, encoder, chunk_rows=10)
    record = json.loads(out.with_suffix(".json").read_text())
    record.update(complete=False, rows=20)  # as a run killed after two chunks leaves it
    out.with_suffix(".json").write_text(json.dumps(record))
    os.utime(corpus, (1, 1))
    assert encode_corpus(corpus, out, encoder, chunk_rows=10).resumed_from == 20
    corpus.write_text(corpus.read_text().replace("number 5", "number 6"))  # other bytes: a fresh run
    record.update(complete=False, rows=20)
    out.with_suffix(".json").write_text(json.dumps(record))
    assert encode_corpus(corpus, out, encoder, chunk_rows=10).resumed_from == 0


def test_a_build_from_vectors_encoded_otherwise_is_refused_naming_the_options(tmp_path, tiny_bert, cli):
    """From a CLI QA run: vectors `encode` wrote with --pooling cls --max-length 16 were taken by a default build,
    which then encoded its queries with last-avg at the model's length, ranking them poorly without a word."""
    corpus = tmp_path / "texts.txt"
    corpus.write_text("A man plays a guitar.\nA woman slices an onion.\nDogs run in the park.\n", encoding="utf-8")
    out = tmp_path / "vectors.npy"
    assert cli("encode", corpus, "--out", out, "--model", tiny_bert, "--pooling", "cls",
               "--max-length", "16").returncode == 0
    home = tmp_path / "home"
    refused = cli("build", corpus, "--vectors", out, "--model", tiny_bert, "--calibrator", "none", "--index-dir", home)
    assert refused.returncode == 1 and json.loads(cli("list", "--index-dir", home, "--json").stdout)["indexes"] == []
    assert refused.stderr.strip() == (
        f"error: {out} was encoded with pooling cls, max_length 16 (vectors.json), and this build encodes its "
        "queries with pooling last-avg, max_length 512: build with --pooling cls --max-length 16, or encode the "
        "corpus again")
    built = cli("build", corpus, "--vectors", out, "--model", tiny_bert, "--calibrator", "none", "--index-dir", home,
                "--name", "cls", "--pooling", "cls", "--max-length", "16")
    assert built.returncode == 0, built.stderr
    # and an add from them to an index of other settings (from the review: only a build refused them)
    assert cli("build", corpus, "--model", tiny_bert, "--calibrator", "none", "--index-dir", home,
               "--name", "plain").returncode == 0
    added = cli("add", corpus, "--name", "plain", "--vectors", out, "--upsert", "--index-dir", home)
    assert added.returncode == 1 and added.stderr.strip().endswith(
        "and this index encodes its queries with pooling last-avg, max_length 512: encode them again as it does "
        "(retriever encode --pooling last-avg --max-length 512)")


def test_an_output_that_cannot_be_written_is_one_line_naming_it(tmp_path, tiny_bert, cli, monkeypatch):
    """From a QA run: a folder where the record goes said "Is a directory: w.json.partial" (a file of ours) after
    encoding everything; a file where a folder should be said "File exists"; a full disk named no file."""
    import errno

    from retriever.store.arrays import NpyAppender

    corpus = tmp_path / "texts.txt"
    corpus.write_text("one text\nanother text\n")
    (tmp_path / "w.json").mkdir()
    for out, said in ((tmp_path / "w.npy", f"{tmp_path / 'w.npy'}: its record w.json is a folder"),
                      (corpus / "x.npy", f"{corpus / 'x.npy'}: {corpus} is a file, not a folder")):
        assert_one_line_error(cli("encode", corpus, "--out", out, "--model", tiny_bert), said)
        assert not out.exists()

    def full(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(NpyAppender, "flush", full)
    out = tmp_path / "v.npy"
    done = cli("encode", corpus, "--out", out, "--model", tiny_bert)  # after the progress bar, one line
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        f"error: writing {out} failed (No space left on device); 0 of 2 documents are encoded: re-run the same command "
        "to resume")
