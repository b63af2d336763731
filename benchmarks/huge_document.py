"""One document of megabytes cut into passages, one checkout's code against another's: the seconds the build's cutter
(`retriever.encode.passages.PassageCutter`, the default model's tokenizer, the default window) takes, and the
memory it holds at its peak over what the process held before (its resident set, sampled every 20 ms). The text is
the first MEGABYTES of `../shared/data/passages` (real English passages, a blank line between two), one document
titled "big", cut beside a one-line document. Each run is a fresh process importing one checkout's code (`--code`);
its passages' spans and texts are hashed, so two checkouts' runs show whether they cut alike.

    git worktree add ../prev b054997          # the code before pieces and heads
    for code in ../prev . ; do
        python benchmarks/huge_document.py run --code $code --megabytes 10 --out benchmarks/results/huge_document/runs.jsonl
        python benchmarks/huge_document.py run --code $code --megabytes 50 --out benchmarks/results/huge_document/runs.jsonl
    done
    python benchmarks/huge_document.py heads --out benchmarks/results/huge_document/heads.json
    python benchmarks/huge_document.py report benchmarks/results/huge_document/runs.jsonl \\
        --heads benchmarks/results/huge_document/heads.json --out benchmarks/results/huge_document.md

`heads` checks that a cut document's first passage, handed to the encoder as the head of its text, encodes as the
whole text did: every cut document of Cranfield and CISI at max length 64 and 128, both encoded by the default
model on the default runtime, the vectors compared.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import platform
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(REPO))
from benchmarks.study_cli import append_run, checkout  # noqa: E402


def corpus_text(data: Path, megabytes: float) -> str:
    """The first MEGABYTES (10^6 characters) of the passages corpus, a blank line between two passages."""
    parts, size = [], 0
    with gzip.open(data / "passages" / "passages.jsonl.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            text = json.loads(line)["text"]
            parts.append(text)
            size += len(text) + 2
            if size >= megabytes * 1e6:
                break
    return "\n\n".join(parts)


def _resident_gb() -> float:
    with open("/proc/self/statm") as status:
        return int(status.read().split()[1]) * 4096 / 1e9


def run(code: Path, megabytes: float) -> dict:
    """Cut the text with CODE's cutter in this process (a fresh one: `main` runs it so)."""
    commit, dirty = checkout(code)
    sys.path.insert(0, str(code.resolve()))
    import retriever
    from retriever.corpus import Document
    from retriever.encode.models import default_model_path
    from retriever.encode.passages import MAX_PASSAGES, PassageCutter, PassageSettings
    from retriever.evaluation.data import resolve_data_dir
    from transformers import AutoTokenizer

    assert Path(retriever.__file__).resolve().is_relative_to(code.resolve()), retriever.__file__
    text = corpus_text(resolve_data_dir(), megabytes)
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    cutter = PassageCutter(tokenizer, PassageSettings().checked(256), 256)
    peak, done = [_resident_gb()], threading.Event()
    before = peak[0]

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _resident_gb())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    started = time.perf_counter()
    passages = cutter.cut([Document("big", text, "big"), Document("small", "One line.")])
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    return {"code": commit, "dirty": dirty, "megabytes": megabytes, "characters": len(text),
            "seconds": round(seconds, 2), "peak_over_start_gb": round(max(peak[0], _resident_gb()) - before, 2),
            "passages": int(passages.counts()[0]), "max_passages": MAX_PASSAGES, "truncated": passages.truncated,
            "spans_sha1": hashlib.sha1(passages.spans.tobytes()).hexdigest()[:12],
            "later_texts_sha1": hashlib.sha1("\0".join(passages.texts[1:]).encode()).hexdigest()[:12],
            "first_text_characters": len(passages.texts[0]), "machine": platform.machine()}


def heads() -> dict:
    """Whether the cut documents' first passages (heads) encode as their whole texts (`heads` in the docstring)."""
    import numpy as np

    from retriever.corpus import Document, document_text
    from retriever.encode.encoder import Encoder
    from retriever.encode.passages import PassageCutter, PassageSettings
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS

    found = []
    for task in ("cranfield", "cisi"):
        corpus = RETRIEVAL_TASKS[task].load(resolve_data_dir()).corpus
        documents = [Document(doc, text, title or None) for doc, (title, text) in corpus.items() if text.strip()]
        for max_length in (64, 128):
            encoder = Encoder(max_length=max_length)
            cut = PassageCutter(encoder.tokenizer, PassageSettings().checked(max_length), max_length).cut(documents)
            numbers = np.flatnonzero(cut.counts() > 1)
            whole = np.asarray(encoder.encode([document_text(documents[number]) for number in numbers]))
            head = np.asarray(encoder.encode([cut.texts[cut.offsets[number]] for number in numbers]))
            found.append({"task": task, "max_length": max_length, "cut": len(numbers),
                          "identical": int((whole == head).all(axis=1).sum()),
                          "max_abs_difference": float(np.abs(whole - head).max()),
                          "head_characters": int(sum(len(cut.texts[cut.offsets[n]]) for n in numbers)),
                          "whole_characters": int(sum(len(document_text(documents[n])) for n in numbers))})
    return {"model": "all-MiniLM-L6-v2", "runtime": "auto (the default)",
            "sets": found}


def report(path: Path, heads_path: Path | None = None) -> str:
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lines = ["# One document of megabytes cut into passages", "",
             f"Generated by `benchmarks/huge_document.py report` from `{path.name}`: each run a fresh process cutting "
             "the first megabytes of the passages corpus as one document with one checkout's cutter (the commands "
             "are in the script's docstring). Peak: the resident memory over what the process held before the cut. "
             "Runs whose spans and later passages' texts hash alike cut the document alike; the first passage's "
             "text is what the encoder is handed of the whole document (it reads its first 256 tokens).", "",
             "| code | MB | seconds | peak GB | passages of the document (at most) | truncated | spans | later texts "
             "| first passage's characters |",
             "|---|---:|---:|---:|---:|---:|---|---|---:|"]
    for run in runs:
        code = run["code"] + (" (uncommitted changes)" if run["dirty"] else "")
        lines.append(f"| {code} | {run['megabytes']:g} | {run['seconds']:.1f} | {run['peak_over_start_gb']:.2f} | "
                     f"{run['passages']:,} ({run['max_passages']:,}) | {run['truncated']} | {run['spans_sha1']} | "
                     f"{run['later_texts_sha1']} | {run['first_text_characters']:,} |")
    if heads_path is not None:
        found = json.loads(heads_path.read_text())
        lines += ["", f"## A cut document's first passage: its head against its whole text (`{heads_path.name}`)", "",
                  "Command: `python benchmarks/huge_document.py heads`. Every cut document's first passage encoded "
                  "as the build hands it to the encoder (the head of its text) and as the whole text, "
                  f"{found['model']}:", "",
                  "| collection | max length | cut documents | vectors identical | largest difference | characters "
                  "handed to the encoder: head / whole |", "|---|---:|---:|---:|---:|---|"]
        for row in found["sets"]:
            lines.append(f"| {row['task']} | {row['max_length']} | {row['cut']:,} | {row['identical']:,} | "
                         f"{row['max_abs_difference']:g} | {row['head_characters']:,} / {row['whole_characters']:,} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("run")
    running.add_argument("--code", type=Path, default=REPO)
    running.add_argument("--megabytes", type=float, required=True)
    running.add_argument("--out", type=Path, required=True)
    reporting = commands.add_parser("report")
    reporting.add_argument("runs", type=Path)
    reporting.add_argument("--heads", type=Path)
    reporting.add_argument("--out", type=Path, required=True)
    checking = commands.add_parser("heads")
    checking.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "report":
        args.out.write_text(report(args.runs, args.heads))
        return
    if args.command == "heads":
        sys.path.insert(0, str(REPO))
        found = {**heads(), "command": " ".join(["python", "benchmarks/huge_document.py", *sys.argv[1:]])}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=1) + "\n")
        return
    found = run(args.code, args.megabytes)
    append_run(__file__, found, args.out)


if __name__ == "__main__":
    main()
