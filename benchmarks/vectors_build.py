"""A build from precomputed vectors (`build --vectors`): wall time and peak memory, each in a fresh process.

Three builds of the same N passages and their raw vectors, measured in the same run:
- `ours`: `retriever build CORPUS --vectors V --calibrator C` as a user runs it; the encoder's record comes from the
  model's files, so no model is loaded (`retriever.encode.model_card`).
- `ours, model loaded`: the same build handed an already loaded `Encoder` (what every build from vectors did before
  the model card: load the transformer to learn the dimension).
- `raw faiss`: the floor a vector store can reach: read the .npy, L2-normalize, `IndexFlatIP.add`, `write_index`.

Peak memory is the child's maximum resident set (`os.wait4`). Vectors: the first N rows of a `retriever encode`
output of the passages (`--vectors`), and the corpus the first N passages of the same file.

    python benchmarks/vectors_build.py --vectors /work/scale/vectors-1m.npy --documents 50000 \
        --out benchmarks/results/vectors_build_cpu
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PASSAGES = REPO.parent / "shared" / "data" / "passages" / "passages.jsonl.gz"

WITH_LOADED_MODEL = """
import sys
from retriever.encode.encoder import Encoder
from retriever.index import Index
corpus, vectors, calibrator, home = sys.argv[1:5]
Index.build(corpus, "v", vectors=vectors, calibrator=calibrator, index_type="flat", index_dir=home,
            encoder=Encoder(device="cpu"))
"""

RAW_FAISS = """
import sys
import faiss
import numpy as np
vectors = np.load(sys.argv[1])
faiss.normalize_L2(vectors)
index = faiss.IndexFlatIP(vectors.shape[1])
index.add(vectors)
faiss.write_index(index, sys.argv[2])
"""


def measured(command: list[str]) -> dict:
    """Wall seconds and peak resident MiB of COMMAND run as a child process."""
    with tempfile.TemporaryFile("w+") as errors:
        started = time.perf_counter()
        child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"{command[:4]} failed: {errors.read().strip().splitlines()[-1:]}")
    return {"seconds": round(seconds, 2), "peak_mib": round(usage.ru_maxrss / 1024, 1)}


def prepare(work: Path, vectors_from: Path, documents: int) -> tuple[Path, Path]:
    source = np.load(vectors_from, mmap_mode="r")
    if len(source) < documents:
        raise SystemExit(f"{vectors_from} holds {len(source):,} rows; {documents:,} asked for")
    vectors = work / "vectors.npy"
    np.save(vectors, np.ascontiguousarray(source[:documents], dtype=np.float32))
    corpus = work / "corpus.jsonl"
    with gzip.open(PASSAGES, "rt", encoding="utf-8") as lines, corpus.open("w", encoding="utf-8") as out:
        out.writelines(islice(lines, documents))
    return corpus, vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=Path, required=True, help="a `retriever encode` output of the passages")
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--calibrators", default="none,whitening")
    parser.add_argument("--out", type=Path, help="writes OUT.json and OUT.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vectors-build-"))
    corpus, vectors = prepare(work, args.vectors, args.documents)
    rows = []
    for calibrator in args.calibrators.split(","):
        ours = measured([sys.executable, "-m", "cli.main", "build", str(corpus), "--name", "v", "--vectors",
                         str(vectors), "--calibrator", calibrator, "--index-type", "flat",
                         "--index-dir", str(work / f"home-{calibrator}")])
        loaded = measured([sys.executable, "-c", WITH_LOADED_MODEL, str(corpus), str(vectors), calibrator,
                           str(work / f"home-{calibrator}-loaded")])
        rows.append({"calibrator": calibrator, "ours": ours, "ours_model_loaded": loaded,
                     "seconds_ratio": round(ours["seconds"] / loaded["seconds"], 3),
                     "peak_ratio": round(ours["peak_mib"] / loaded["peak_mib"], 3)})
    raw = measured([sys.executable, "-c", RAW_FAISS, str(vectors), str(work / "raw.faiss")])
    result = {
        "benchmark": "vectors_build", "documents": args.documents, "dim": int(np.load(vectors, mmap_mode="r").shape[1]),
        "index_type": "flat", "rows": rows, "raw_faiss": raw,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/vectors_build.py", *sys.argv[1:]]),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        lines = [f"# Build from precomputed vectors: {args.documents:,} passages, flat index, fresh processes", "",
                 f"`{result['command']}`", "",
                 "| calibrator | ours s | ours peak MiB | model loaded s | model loaded peak MiB | time ratio | "
                 "peak ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
        for row in rows:
            lines.append(f"| {row['calibrator']} | {row['ours']['seconds']} | {row['ours']['peak_mib']} | "
                         f"{row['ours_model_loaded']['seconds']} | {row['ours_model_loaded']['peak_mib']} | "
                         f"{row['seconds_ratio']} | {row['peak_ratio']} |")
        lines += ["", f"Raw FAISS (read, normalize, IndexFlatIP, write): {raw['seconds']} s, {raw['peak_mib']} MiB."]
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
