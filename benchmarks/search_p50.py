"""Query p50 of one checkout's code against another's, on the same machine and the same million passages: issue
54's "no worse than today". Each run builds (once, with the checkout it runs) the cut-pages index of
`benchmarks/passage_cost.py` (365,140 pages, 1,089,521 passage vectors, IVF) and times 270 QNLI questions per mode
(30 more first, untimed) through `Searcher.search`, one query at a time. Runs of the two checkouts alternate, so a
load that comes and goes on the machine weighs on both:

    git worktree add ../before 772c492
    for code in ../before . ../before .; do
        python benchmarks/search_p50.py run --code $code --work /tmp/cost --out benchmarks/results/search_p50/runs.jsonl
    done
    python benchmarks/search_p50.py report benchmarks/results/search_p50/runs.jsonl \\
        --out benchmarks/results/search_p50.md --note "..."

`--work` is `passage_cost.py search`'s folder (its corpora and vectors are written there if missing); each checkout
builds its own index under it (`indexes-<commit>`), since an index is read by the code that wrote it.

With `--corpus` (and `--vectors`, its encoded vectors row for row, or the build encodes it), the index is instead
the default build of that corpus (`auto`: hnsw past 20,000 documents; `--model`, `--calibrator` as `Index.build`
takes them), under `indexes-<commit>-default` (`-<model>-<calibrator>` added where given). `--by-text` times
`Index.search(question)` instead, as a user's query arrives (encoded, calibrated, searched in the index's default
mode), in place of the three modes by vector.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

WARM_UP, TIMED = 30, 270
MODES = ("dense", "keyword", "hybrid")
BY_TEXT = "default search, by text"


def run(code: Path, work: Path, corpus: Path | None = None, vectors_file: Path | None = None, model: str | None = None,
        calibrator: str | None = None, by_text: bool = False) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks.study_cli import checkout

    commit, dirty = checkout(code)
    sys.path.insert(0, str(code.resolve()))
    from benchmarks.passage_cost import vector_pool, write_corpora
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import qnli_retrieval
    from retriever.index import Index, load_encoder
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    import retriever
    assert Path(retriever.__file__).resolve().is_relative_to(code.resolve()), retriever.__file__
    work.mkdir(parents=True, exist_ok=True)
    if corpus is not None:
        chosen = {"model": model, "calibrator": calibrator}
        suffix = "".join(f"-{Path(value).name}" for value in chosen.values() if value)
        index_dir = work / f"indexes-{commit}{'-dirty' if dirty else ''}-default{suffix}"
        if not (index_dir / "passages").exists():
            Index.build(corpus, "passages", index_dir, vectors=vectors_file, device="cpu", replace=True,
                        **{name: value for name, value in chosen.items() if value})
    else:
        _, pages, spans = write_corpora(work)
        if not (work / "vectors.npy").is_file():
            np.save(work / "vectors.npy", vector_pool(len(np.load(spans))))
        index_dir = work / f"indexes-{commit}{'-dirty' if dirty else ''}"
        if not (index_dir / "passages").exists():
            Index.build(pages, "passages", index_dir, vectors=work / "vectors.npy", vector_spans=spans, device="cpu",
                        index_type="ivf", replace=True)
    index = Index.open("passages", index_dir, device="cpu")
    texts = list(qnli_retrieval(resolve_data_dir()).queries.values())[: WARM_UP + TIMED]
    found = {"code": commit, "dirty": dirty, "vectors": index.snapshot.manifest.live_vectors,
             "documents": len(index.snapshot), "index": index.snapshot.spec.type, "p50_ms": {}}
    if by_text:
        found["p50_ms"][BY_TEXT] = p50_ms(texts, lambda number, text: index.search(text))
        encoder = index.snapshot.manifest.encoder  # a record, or in older code its dict
        found["model"] = encoder["model"] if isinstance(encoder, dict) else encoder.model
        found["calibrator"] = index.snapshot.calibrator.name
        index.close()
        return found
    searcher = Searcher(index.snapshot)
    vectors = index.snapshot.calibrate(load_encoder(index.snapshot).encode(texts))
    for mode in MODES:
        options = SearchOptions(k=10, mode=mode)
        found["p50_ms"][mode] = p50_ms(texts, lambda number, text: searcher.search(
            [text], None if mode == "keyword" else vectors[number : number + 1], options))
    index.close()
    return found


def p50_ms(texts: list[str], search) -> float:
    """The median milliseconds of SEARCH(number, text) over TEXTS, one at a time, the first WARM_UP untimed."""
    timings = []
    for number, text in enumerate(texts):
        clock = time.perf_counter()
        search(number, text)
        if number >= WARM_UP:
            timings.append(time.perf_counter() - clock)
    return round(1000 * float(np.percentile(timings, 50)), 2)


def report(path: Path, note: str | None = None, baseline: str | None = None) -> str:
    """The runs in PATH as markdown; every code's medians against BASELINE's (a code's label; the first run's by
    default)."""
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    modes = list(runs[0]["p50_ms"])
    codes = list(dict.fromkeys(f"{run['code']}{' (uncommitted changes)' if run['dirty'] else ''}" for run in runs))
    if baseline is not None:
        codes = [baseline] + [code for code in codes if code != baseline]
    lines = ["# Query p50, one checkout's code against another's (issue 54)", "",
             f"Generated by `benchmarks/search_p50.py report` from `{path.name}`: {len(runs)} runs, alternating. "
             f"Each: {TIMED} QNLI questions, one at a time, k 10, over {corpus_words(runs[0])}, after {WARM_UP} "
             "untimed.", "",
             *([note, ""] if note else []),
             "| code | run | " + " | ".join(f"p50 {mode} (ms)" for mode in modes) + " |",
             "|---|---:|" + "---:|" * len(modes)]
    for number, run in enumerate(runs, start=1):
        label = f"{run['code']}{' (uncommitted changes)' if run['dirty'] else ''}"
        lines.append(f"| {label} | {number} | " + " | ".join(f"{run['p50_ms'][mode]:.2f}" for mode in modes) + " |")
    labels = [f"{run['code']}{' (uncommitted changes)' if run['dirty'] else ''}" for run in runs]

    def median(numbers: list[int], mode: str) -> float:
        return float(np.median([runs[number]["p50_ms"][mode] for number in numbers]))

    lines += ["", f"Median over each code's runs; each code against {codes[0]}'s runs it alternated with ("
              f"{codes[0]}'s runs just before or after one of its own):", "",
              "| code | runs | " + " | ".join(modes) + " | " + " | ".join(f"{mode}: ratio" for mode in modes) + " |",
              "|---|---:|" + "---:|" * (2 * len(modes))]
    for code in codes:
        own = [number for number, label in enumerate(labels) if label == code]
        row = f"| {code} | {len(own)} | " + " | ".join(f"{median(own, mode):.2f}" for mode in modes)
        if code == codes[0]:
            lines.append(row + " |" + " |" * len(modes))
            continue
        beside = alternated_with(labels, own, codes[0])
        lines.append(row + " | " + " | ".join(f"{median(own, mode) / median(beside, mode):.2f}x" for mode in modes)
                     + " |")
    return "\n".join(lines) + "\n"


def corpus_words(run: dict) -> str:
    """What RUN searched, in words (runs before `documents` was recorded searched the cut pages)."""
    documents, index = run.get("documents", 365_140), run.get("index", "ivf")
    if documents == run["vectors"]:
        return f"{documents:,} documents, one vector each ({index})"
    return f"{documents:,} pages cut into {run['vectors']:,} passage vectors ({index})"


def alternated_with(labels: list[str], own: list[int], first: str) -> list[int]:
    """The runs of FIRST (by LABELS, run for run) just before or after one of the runs OWN: those a later code is
    compared with, so a load that came and went weighs on both."""
    return sorted({near for number in own for near in (number - 1, number + 1)
                   if 0 <= near < len(labels) and labels[near] == first})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("run")
    running.add_argument("--code", type=Path, default=Path("."), help="the checkout whose retriever is timed")
    running.add_argument("--work", type=Path, required=True)
    running.add_argument("--out", type=Path, required=True, help="a .jsonl file each run appends a line to")
    running.add_argument("--corpus", type=Path, help="time the default build of this corpus instead (with --vectors)")
    running.add_argument("--vectors", type=Path, help="--corpus's vectors, row for row (`retriever encode`)")
    running.add_argument("--model", help="with --corpus: the encoder the build takes")
    running.add_argument("--calibrator", help="with --corpus: the calibrator the build takes")
    running.add_argument("--by-text", action="store_true", help="time Index.search(question), encoding included")
    reporting = commands.add_parser("report")
    reporting.add_argument("runs", type=Path)
    reporting.add_argument("--out", type=Path, required=True)
    reporting.add_argument("--note", help="a paragraph to print above the table (what the checkouts were)")
    reporting.add_argument("--baseline", help="the code the others are compared with (the first run's by default)")
    args = parser.parse_args()
    if args.command == "report":
        args.out.write_text(report(args.runs, args.note, args.baseline))
        return
    if args.corpus is None and (args.vectors or args.model or args.calibrator):
        parser.error("--vectors, --model and --calibrator describe a --corpus's build")
    found = run(args.code, args.work, args.corpus, args.vectors, args.model, args.calibrator, args.by_text)
    from benchmarks.study_cli import append_run  # the repository is on the path once `run` has run

    append_run(__file__, found, args.out)


if __name__ == "__main__":
    main()
