"""Issue 56 (1): what a default build costs beside encoding the same texts alone. Each corpus is built with
`retriever build` (the defaults: calibrator auto, passages, keyword index, the hybrid check) and encoded with
`retriever encode`, each a whole process as a user runs it, the two taking turns:

    python benchmarks/build_vs_encode.py run --out benchmarks/results/build_vs_encode/cpu.json
    python benchmarks/build_vs_encode.py report benchmarks/results/build_vs_encode/cpu.json \\
        benchmarks/results/build_vs_encode/cpu_c8a3faf.json --out benchmarks/results/build_vs_encode.md

Corpora: 300 short records (the first 300 distinct sentences of STS-B dev, one per line) and Cranfield's 1,398
abstracts (title and text, JSONL), written from `RETRIEVER_DATA` into a temporary folder.

    python benchmarks/build_vs_encode.py tokens --out benchmarks/results/build_vs_encode/tokens.json

`merge FILES --out PATH` gathers runs of one code into one file (each corpus's times, the ratio of their medians):
single-round runs of two checkouts taking turns (`PYTHONPATH=../before` for the other's `retriever`), read as two runs.

`tokens` counts, without encoding anything, the tokens the encoder reads for each corpus: `retriever encode` (each
text's first max-length tokens), the default build's passages (the build's own cutter), and auto's check if it reads
every pseudo-query it makes (the build's own sample: each query, and each target that is its document with the
query cut out, encoded again). The check reads them in rounds and may stop early; where it reads them all (both
corpora here, `cpu_0cbb255.json`), a build encodes all of these.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.study_cli import generated_from, study_main  # noqa: E402


def write_corpora(folder: Path) -> dict[str, Path]:
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS

    data = resolve_data_dir()
    sentences: list[str] = []
    for line in (data / "stsb" / "sts-dev.csv").read_text(encoding="utf-8").splitlines():
        for sentence in line.split("\t")[5:7]:
            sentence = sentence.strip()
            if sentence and sentence not in sentences:
                sentences.append(sentence)
    short = folder / "short-records.txt"
    short.write_text("\n".join(sentences[:300]) + "\n", encoding="utf-8")
    cranfield = folder / "cranfield.jsonl"
    corpus = RETRIEVAL_TASKS["cranfield"].load(data).corpus
    cranfield.write_text("".join(json.dumps({"_id": doc, "title": title or "", "text": text}) + "\n"
                                 for doc, (title, text) in corpus.items()), encoding="utf-8")
    return {"300 short records": short, "cranfield (1,398 abstracts)": cranfield}


def run(rounds: int, runtimes: list[str] | None = None, corpora: list[str] | None = None) -> dict:
    """Each corpus (or those of CORPORA, by the first word of their labels: "300", "cranfield") encoded and built
    ROUNDS times, in turns; with RUNTIMES, once on each (`--runtime`) per round, in turn too, so the default build
    on each runtime is timed in the same run."""
    retriever = str(Path(sys.executable).parent / "retriever")
    found = {"machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
             "rounds": rounds, "corpora": []}
    if runtimes:
        found["runtimes"] = runtimes
    else:
        found["default_runtime"] = "auto (the default)"
    with tempfile.TemporaryDirectory(prefix="retriever-build-cost-") as folder:
        folder = Path(folder)
        for label, corpus in write_corpora(folder).items():
            if corpora and label.split()[0] not in corpora:
                continue
            seconds = {f"{step}{_suffix(runtime)}": [] for runtime in runtimes or [None]
                       for step in ("encode", "build")}
            for number in range(rounds):
                for runtime in runtimes or [None]:
                    chosen = ["--runtime", runtime] if runtime else []
                    for step in ("encode", "build"):
                        command = ([retriever, "encode", str(corpus), "--out", str(folder / "vectors.npy"), *chosen]
                                   if step == "encode" else
                                   [retriever, "build", str(corpus), "--name", f"{corpus.stem}-{number}",
                                    "--index-dir", str(folder / "indexes"), "--replace", *chosen])
                        started = time.perf_counter()
                        done = subprocess.run(command, capture_output=True, text=True)
                        seconds[f"{step}{_suffix(runtime)}"].append(time.perf_counter() - started)
                        if done.returncode != 0:
                            raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
            details = json.loads(subprocess.run([retriever, "info", "--name", f"{corpus.stem}-0", "--json",
                                                 "--index-dir", str(folder / "indexes")], capture_output=True,
                                                text=True, check=True).stdout)
            checks = {"auto": details["manifest"]["calibrator"].get("decision", {}).get("check", {}),
                      "hybrid": details["hybrid"].get("evidence", {})}
            record = {"corpus": label, **{f"{name}_s": [round(s, 2) for s in values]
                                          for name, values in seconds.items()},
                      "vectors": details["passages"], "documents": details["documents"],
                      "pseudo_queries": {name: [check.get("pseudo_queries"), check.get("planned")]
                                         for name, check in checks.items()}}
            for runtime in runtimes or [None]:
                record[f"ratio{_suffix(runtime)}"] = round(float(np.median(seconds[f"build{_suffix(runtime)}"])
                                                             / np.median(seconds[f"encode{_suffix(runtime)}"])), 2)
            print(json.dumps(record), file=sys.stderr, flush=True)
            found["corpora"].append(record)
    return found


def _suffix(runtime: str | None) -> str:
    """The key suffix of a step's seconds on RUNTIME (none where the run named no runtime)."""
    return f"_{runtime}" if runtime else ""


def tokens() -> dict:
    """The tokens the encoder reads for each corpus (`retriever encode`, the build's passages, auto's check)."""
    from retriever.calibration.pseudo_queries import CheckRounds
    from retriever.corpus import Document, document_text, iter_corpus
    from retriever.encode.models import resolve_model_path
    from retriever.encode.passages import PassageCutter, PassageSettings
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(None))
    max_length = 256  # the default model's read, as `retriever encode` and `retriever build` take it

    def read(texts: list[str]) -> int:
        """Tokens the encoder reads of TEXTS: each one's first MAX_LENGTH (special tokens included)."""
        found = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
        return sum(len(ids) for ids in found)

    found = {"model": "all-MiniLM-L6-v2", "max_length": max_length, "corpora": []}
    with tempfile.TemporaryDirectory(prefix="retriever-build-tokens-") as folder:
        for label, corpus in write_corpora(Path(folder)).items():
            documents: list[Document] = list(iter_corpus(corpus))
            cutter = PassageCutter(tokenizer, PassageSettings().checked(max_length), max_length)
            passages = cutter.cut(documents)
            texts = [(document.title, document.text) for document in documents]
            check = CheckRounds(len(documents), lambda positions: [texts[i] for i in positions.tolist()],
                                lambda positions: np.zeros((len(positions), 1), np.float32), encoder=None)
            targets = [query.target for query in check.made if query.target is not None]
            record = {"corpus": label, "documents": len(documents),
                      "cut": int((passages.counts() > 1).sum()), "passages": len(passages.texts),
                      "encode": read([document_text(document) for document in documents]),
                      "passage_tokens": read(passages.texts),
                      "pseudo_queries": len(check.made), "rewritten_targets": len(targets),
                      "queries": read([query.query for query in check.made]), "targets": read(targets)}
            print(json.dumps(record), file=sys.stderr, flush=True)
            found["corpora"].append(record)
    return found


def tokens_report(found: dict, path: Path) -> list[str]:
    lines = [f"## Tokens the encoder reads (`{path.name}`: {found['model']}, max length {found['max_length']})", "",
             "Command: `python benchmarks/build_vs_encode.py tokens`. Nothing encoded: each corpus cut by the build's "
             "own cutter, and auto's check sampled as the build samples it, all its pseudo-queries read.", "",
             "| corpus | documents (cut) | vectors | `retriever encode`, tokens | the build's passages | auto's check: "
             "queries + targets encoded again (of pseudo-queries) | the build's tokens / encode's |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for record in found["corpora"]:
        least = record["passage_tokens"] + record["queries"] + record["targets"]
        lines.append(f"| {record['corpus']} | {record['documents']:,} ({record['cut']:,}) | {record['passages']:,} | "
                     f"{record['encode']:,} | {record['passage_tokens']:,} "
                     f"({record['passage_tokens'] / record['encode']:.2f}x) | {record['queries']:,} + "
                     f"{record['targets']:,} ({record['rewritten_targets']:,} of {record['pseudo_queries']:,}) | "
                     f"{least / record['encode']:.2f}x |")
    return lines + ["", "Where encoding is most of the time (Cranfield's abstracts), the build's tokens bound its time "
                    "against encode's when the check reads every pseudo-query; for a few hundred short records starting "
                    "the process and loading the model take most of both, and they do not.", ""]


def report(paths: list[Path]) -> str:
    lines = ["# A default build beside encoding the same texts (issue 56)", "",
             generated_from(__file__, paths) + " (all-MiniLM-L6-v2). Each timed run: a whole "
             "`retriever` process, encode and build taking turns; the ratio of the medians. The pseudo-queries read are those of "
             "the first build: auto's check and the hybrid check read them in rounds until their answers are clear "
             "(`docs/auto.md`, 5), of those made.", ""]
    for path in paths:
        found = json.loads(path.read_text())
        if "rounds" not in found:
            lines += tokens_report(found, path)
            continue
        lines += [f"## {found.get('label', path.stem)} ({found['machine']}, {found['rounds']} rounds)", ""]
        runtimes = found.get("runtimes") or [None]
        lines += ["| corpus | vectors / document | pseudo-queries read: auto, hybrid check (of made) | runtime | "
                  "encode, s (median) | build, s (median) | build / encode |", "|---|---:|---|---|---:|---:|---:|"]
        for record in found["corpora"]:
            read = record.get("pseudo_queries")
            checks = (f"{read['auto'][0]:,}, {read['hybrid'][0]:,} (of {read['auto'][1] or read['auto'][0]:,})"
                      if read and read["auto"][0] is not None else "not recorded")
            per = f"{record['vectors'] / record['documents']:.2f}" if "vectors" in record else "not recorded"
            for runtime in runtimes:
                key = _suffix(runtime)
                named = runtime or found.get("default_runtime", "torch (the default then)")
                lines.append(f"| {record['corpus']} | {per} | {checks} | {named} | "
                             f"{np.median(record['encode' + key + '_s']):.2f} | "
                             f"{np.median(record['build' + key + '_s']):.2f} | {record['ratio' + key]:.2f}x |")
        if len(runtimes) > 1:
            lines += ["", "The default build on each runtime, against the first's (medians, the same run):", ""]
            lines += [f"- {record['corpus']}: " + ", ".join(
                f"{runtime} {np.median(record[f'build_{runtime}_s']) / np.median(record[f'build_{runtimes[0]}_s']):.2f}x"
                for runtime in runtimes[1:]) for record in found["corpora"]]
        lines.append("")
    return "\n".join(lines)


def merge(paths: list[Path], label: str | None) -> dict:
    """Runs of one code (each `run`'s file, every corpus timed alike) as one: each corpus's times gathered in the
    order given, the ratio of their medians, so single-round runs of two checkouts taking turns read as two runs of
    several rounds."""
    runs = [json.loads(path.read_text()) for path in paths]
    found = {key: value for key, value in runs[0].items() if key not in ("command", "label")}
    found["rounds"] = sum(run["rounds"] for run in runs)
    found["merged"] = [run.get("command", path.name) for run, path in zip(runs, paths)]
    for record in found["corpora"]:
        times = [other for run in runs for other in run["corpora"] if other["corpus"] == record["corpus"]]
        for key in [key for key in record if key.endswith("_s")]:
            record[key] = [seconds for other in times for seconds in other[key]]
        for key in [key for key in record if key.startswith("ratio")]:
            suffix = key[len("ratio"):]
            build, encode = np.median(record[f"build{suffix}_s"]), np.median(record[f"encode{suffix}_s"])
            record[key] = round(float(build / encode), 2)
    return {**found, "label": label} if label else found


def main() -> None:
    def run_arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--rounds", type=int, default=3)
        running.add_argument("--runtimes", default=None,
                             help="comma-separated --runtime values, each timed in turn (default: none named)")
        running.add_argument("--corpora", default=None,
                             help='comma-separated corpora by their first word, "300" or "cranfield" (default: both)')
        running.add_argument("--label", default=None,
                             help="the report's heading for this run (default: the file's name)")

    def measured(args: argparse.Namespace) -> dict:
        found = run(args.rounds, args.runtimes.split(",") if args.runtimes else None,
                    args.corpora.split(",") if args.corpora else None)
        return {**found, "label": args.label} if args.label else found

    def merge_arguments(merging: argparse.ArgumentParser) -> None:
        merging.add_argument("files", nargs="+", type=Path)
        merging.add_argument("--label", default=None)

    study_main(__file__, __doc__, report, run=(run_arguments, measured),
               tokens=(None, lambda args: tokens()),
               merge=(merge_arguments, lambda args: merge(args.files, args.label)))


if __name__ == "__main__":
    main()
