"""Issue 57: what reading a folder of files costs beside encoding them. A folder of 1,000 files is written from
real passages (`../shared/data/passages`): the same number of Markdown, HTML, reStructuredText, text, PDF and Word
files, each a few passages long; then, in one run, `retriever.files.read_folder` reads it (every file parsed, its
bytes hashed) and the default encoder encodes the documents it read (title and text, as a build encodes them,
passages not cut), each timed, the two taking turns over ROUNDS rounds.

    python benchmarks/folder_read.py --out benchmarks/results/folder_read_cpu
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PASSAGES = REPO.parent / "shared" / "data" / "passages" / "passages.jsonl.gz"
FORMATS = ("md", "html", "rst", "txt", "pdf", "docx")


def write_folder(root: Path, files: int, per_file: int = 4) -> None:
    """FILES files under ROOT (a sub-folder per format), file i holding passages i*PER_FILE.. of the corpus."""
    from fpdf import FPDF
    import docx

    with gzip.open(PASSAGES, "rt", encoding="utf-8") as lines:
        records = [json.loads(line) for line in islice(lines, files * per_file)]
    for number in range(files):
        kind = FORMATS[number % len(FORMATS)]
        chunk = records[number * per_file:(number + 1) * per_file]
        title = chunk[0].get("title") or f"Document {number}"
        paragraphs = [record["text"] for record in chunk]
        path = root / kind / f"{number:04d}.{kind}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "md":
            path.write_text(f"# {title}\n\n" + "\n\n".join(paragraphs) + "\n", encoding="utf-8")
        elif kind == "html":
            body = "".join(f"<p>{paragraph}</p>" for paragraph in paragraphs)
            path.write_text(f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{body}</body></html>",
                            encoding="utf-8")
        elif kind == "rst":
            path.write_text(f"{title}\n{'=' * len(title)}\n\n" + "\n\n".join(paragraphs) + "\n", encoding="utf-8")
        elif kind == "txt":
            path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
        elif kind == "pdf":
            pdf = FPDF()
            pdf.set_title(title)
            pdf.set_font("Helvetica", size=11)
            for paragraph in paragraphs:  # a page each
                pdf.add_page()
                pdf.multi_cell(0, 6, paragraph.encode("latin-1", "replace").decode("latin-1"))
            path.write_bytes(bytes(pdf.output()))
        else:
            document = docx.Document()
            document.add_heading(title, level=1)
            for paragraph in paragraphs:
                document.add_paragraph(paragraph)
            document.save(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="path without suffix: .json and .md are written")
    args = parser.parse_args()
    from retriever.corpus import document_text
    from retriever.encode.encoder import Encoder
    from retriever.files import FolderReport, read_folder

    encoder = Encoder(device="cpu")
    seconds = {"read": [], "encode": []}
    by_kind: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="retriever-folder-") as folder:
        root = Path(folder)
        write_folder(root, args.files)
        for _ in range(args.rounds):
            clock = time.perf_counter()
            report = FolderReport()
            documents = list(read_folder(root, report=report))
            seconds["read"].append(time.perf_counter() - clock)
            for kind in FORMATS:  # each format's share of the reading
                clock = time.perf_counter()
                list(read_folder(root / kind))
                by_kind.setdefault(kind, []).append(time.perf_counter() - clock)
            clock = time.perf_counter()
            encoder.encode([document_text(document) for document in documents])
            seconds["encode"].append(time.perf_counter() - clock)
    read, encode = float(np.median(seconds["read"])), float(np.median(seconds["encode"]))
    result = {"command": " ".join(["python", "benchmarks/folder_read.py", *sys.argv[1:]]),
              "machine": f"{platform.machine()}, {len(__import__('os').sched_getaffinity(0))} CPUs",
              "files": args.files, "documents": len(documents), "skipped": len(report.skipped),
              "characters": sum(len(document.text) for document in documents),
              "seconds": {key: [round(value, 3) for value in values] for key, values in seconds.items()},
              "read_by_format_s": {kind: round(float(np.median(values)), 3) for kind, values in by_kind.items()},
              "read_over_encode": round(read / encode, 4)}
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    kinds = ", ".join(f"{kind} {value:.2f} s" for kind, value in result["read_by_format_s"].items())
    args.out.with_suffix(".md").write_text(
        f"# Reading a folder of files beside encoding them (issue 57)\n\n`{result['command']}` ({result['machine']}, "
        f"{args.rounds} rounds, medians)\n\n{args.files:,} files ({', '.join(FORMATS)}, {args.files // len(FORMATS)}"
        f"-{-(-args.files // len(FORMATS))} of each, four real passages each; {result['documents']:,} documents, "
        f"{result['skipped']} skipped, {result['characters']:,} characters): reading the folder (every file parsed "
        f"and hashed) took **{read:.2f} s**, encoding what it read with the default model {encode:.2f} s: reading "
        f"is **{read / encode:.1%}** of encoding. By format (each {args.files // len(FORMATS)} or so files): "
        f"{kinds}.\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
