"""What several test modules share: small corpora, how to write them, and how to read a one-line error (CLI
or HTTP). Fixtures live in conftest.py; these are plain values and functions."""

from __future__ import annotations

import json
from pathlib import Path


DOCS = {
    "guitar": "A man is playing a guitar on stage.",
    "onion": "A woman slices an onion in the kitchen.",
    "stocks": "Stock markets fell sharply on Monday amid inflation fears.",
    "soccer": "The football team won the championship final.",
    "rain": "Heavy rain caused flooding in the city centre.",
    "dog": "A dog runs through the grass chasing a ball.",
    "cat": "The cat sat on the mat and purred softly.",
    "python": "Python is a programming language that lets you work quickly.",
}


def write_jsonl(path: Path, docs: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in docs.items()), encoding="utf-8")
    return path


def sentences(count: int, start: int = 0) -> dict[str, str]:
    """Distinct, varied documents for tests that need more than a handful."""
    subjects = ["A dog", "The committee", "My neighbour", "A small robot", "The orchestra", "An old sailor"]
    verbs = ["discussed", "painted", "repaired", "forgot", "celebrated", "measured", "sold"]
    things = ["the harbour", "a red bicycle", "the budget", "an ancient map", "the garden fence", "a violin"]
    return {f"d{i}": f"{subjects[i % 6]} {verbs[i % 7]} {things[(i // 7) % 6]} on day {i}."
            for i in range(start, start + count)}


SUBJECTS = ["A dog", "The committee", "My neighbour", "A small robot", "The orchestra", "An old sailor", "A baker"]
VERBS = ["discussed", "painted", "repaired", "forgot", "celebrated", "measured", "sold", "carried"]
THINGS = ["the harbour", "a red bicycle", "the budget", "an ancient map", "the garden fence", "a violin"]


def documents(count: int, prefix: str = "d") -> list[dict]:
    return [{"_id": f"{prefix}{i}", "title": f"note {i}",
             "text": f"{SUBJECTS[i % 7]} {VERBS[i % 8]} {THINGS[(i // 8) % 6]} on day {i}."} for i in range(count)]


def long_text(number: int, sentences: int = 60) -> str:
    """A document of SENTENCES varied sentences, longer than a small model reads (60: about 780 tokens)."""
    return " ".join(f"{SUBJECTS[(i + number) % 7]} {VERBS[(i * 3 + number) % 8]} {THINGS[(i + 2 * number) % 6]} "
                    f"on page {number} line {i}." for i in range(sentences))


def with_long(docs: dict[str, str], every: int = 10) -> dict[str, str]:
    """DOCS with every EVERY-th one's text replaced by a long text (so a build cuts it into passages)."""
    return {doc_id: long_text(number) if number % every == every - 1 else text
            for number, (doc_id, text) in enumerate(docs.items())}


def write_corpus(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def one_line_error(response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["status"] == status and isinstance(body["detail"], str)
    assert "\n" not in body["detail"] and "Traceback" not in body["detail"]
    return body["detail"]


TEXTS = [
    "A man is playing a guitar on stage.",
    "A woman slices an onion in the kitchen.",
    "Stock markets fell sharply on Monday.",
    "The football team won the final.",
]


def assert_one_line_error(done, *fragments):
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()  # not stripped: a blank line before the error is one line too many
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def assert_usage_error(done, *fragments):
    """A usage error (a bad value, an unknown option): exit code 2, as click gives one, on one line `error: ...`."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def build_notes(index_dir: Path, model: Path, count: int, name: str = "notes", prefix: str = "d",
                calibrator: str = "sn") -> Path:
    """An index NAME of COUNT `documents` in INDEX_DIR, on MODEL (the tiny random BERT), its corpus written beside
    INDEX_DIR. sn (standard normalization): a calibrator that changes the space yet stays well conditioned on a
    random 32-d model, so scores compare to a few decimals across runtimes and batch paddings."""
    from retriever.index import Index

    corpus = write_corpus(index_dir.parent / f"{name}.jsonl", documents(count, prefix))
    Index.build(corpus, name, index_dir, model=str(model), calibrator=calibrator, device="cpu")
    return index_dir


# --- searching an index by vector (the search layer under `Index.search`) ---------------------------------------


def encoder_of(index):
    """A new instance of the encoder INDEX records, on the default runtime: what a build encodes with (ONNX Runtime
    on a CPU), so its vectors are the stored ones bit for bit."""
    from retriever.index import load_encoder

    return load_encoder(index.snapshot)


def embed(index, texts: list[str]):
    """TEXTS in INDEX's space: the recorded encoder, the saved calibrator, L2 normalization."""
    return index.snapshot.calibrate(encoder_of(index).encode(texts))


def search_vectors(index, vectors, k: int, **settings):
    """The dense side's (scores, row ids) for calibrated VECTORS over INDEX, as `Index.search` plans it."""
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    return Searcher(index.snapshot).dense_top(vectors, SearchOptions(k=k, **settings))


def vector_hits(index, vectors, k: int, **settings):
    """Dense hits (with their documents) for calibrated VECTORS over INDEX."""
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    return Searcher(index.snapshot).search([""] * len(vectors), vectors, SearchOptions(k=k, mode="dense", **settings))


def raw_hits(index, raw, k: int, **settings):
    """The exact ranking in the raw space of encoder outputs RAW over INDEX (`space="raw"`)."""
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    return Searcher(index.snapshot).search_raw(raw, SearchOptions(k=k, space="raw", **settings))


def sick_sentences(data: Path, count: int = 200) -> list[str]:
    """COUNT distinct real sentences from SICK's trial file in DATA (a small real corpus, in file order)."""
    seen: dict[str, None] = {}
    for line in (data / "sick" / "SICK_trial.txt").read_text(encoding="utf-8").splitlines()[1:]:
        for sentence in line.split("\t")[1:3]:
            seen.setdefault(sentence.strip(), None)
    return [sentence for sentence in seen if sentence][:count]
