"""Issue 56: a build encoded from the kept query kit stores what a build with the model loaded stores. One labeled
corpus is built twice with every default in one fresh ONNX cache: first with no kit kept (the model loaded, its
graph exported, the kit left), then from the kit (the model's load counted: none). Compared: the raw vectors (every
passage's), the calibrator record auto decided, the hybrid record, every file of the two versions by its checksum
(their manifests'), the dense top 10 of 100 of the task's questions (scores and rows) and the default search's hits
(ids, scores, passages).

    python benchmarks/kit_builds.py --task cisi --max-length 128 --out benchmarks/results/kit_builds/cisi_128.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True, help="a retrieval task (`retriever.evaluation.retrieval_tasks`)")
    parser.add_argument("--max-length", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ["RETRIEVER_ONNX_CACHE"] = tempfile.mkdtemp(prefix="retriever-onnx-fresh-")  # before any import reads it

    from retriever.encode.encoder import Encoder
    from retriever.evaluation.data import resolve_data_dir
    from retriever.evaluation.retrieval_tasks import RETRIEVAL_TASKS
    from retriever.index import Index
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher

    task = RETRIEVAL_TASKS[args.task].load(resolve_data_dir())
    documents = [{"_id": key, "title": title or "", "text": text} for key, (title, text) in task.corpus.items()]
    questions = list(task.queries.values())[:100]
    loads, init = [], Encoder.__init__
    Encoder.__init__ = lambda self, *a, **k: (loads.append(1), init(self, *a, **k))[1]
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    found: dict = {"code": commit, "task": args.task, "max_length": args.max_length, "documents": len(documents)}
    with tempfile.TemporaryDirectory(prefix="retriever-kit-builds-") as folder:
        for name in ("model", "kit"):
            loads.clear()
            started = time.perf_counter()
            summary = Index.build(documents, name, folder, max_length=args.max_length, device="cpu")
            found[name] = {"seconds": round(time.perf_counter() - started, 1), "model_loads": len(loads),
                           "stages": {stage: round(seconds, 2) for stage, seconds in summary.timings.items()}}
        model, kit = (Index.open(name, folder, device="cpu") for name in ("model", "kit"))
        raw = [index.snapshot.raw_vectors() for index in (model, kit)]
        probes = Encoder(max_length=args.max_length, device="cpu").encode(questions)
        dense = [Searcher(index.snapshot).dense_top(index.snapshot.calibrate(probes), SearchOptions(k=10))
                 for index in (model, kit)]
        hits = [[[(hit.doc_id, hit.score, hit.passage) for hit in answer] for answer in index.search(questions, k=10)]
                for index in (model, kit)]
        found.update({
            "vectors": len(raw[0][0]),
            "chosen": model.snapshot.manifest.calibrator.get("decision", {}).get("chosen", {}).get("name"),
            "raw_vectors_equal": bool(np.array_equal(raw[0][0], raw[1][0]) and np.array_equal(raw[0][1], raw[1][1])),
            "calibrator_record_equal": model.snapshot.manifest.calibrator == kit.snapshot.manifest.calibrator,
            "hybrid_record_equal": model.snapshot.manifest.hybrid == kit.snapshot.manifest.hybrid,
            "dense_top_equal": all(np.array_equal(a, b) for a, b in zip(*dense)),
            "default_search_equal": hits[0] == hits[1],
            # every file the two versions' manifests list, by its checksum
            "files": len(model.snapshot.manifest.files),
            "files_differing": sorted(path for path, entry in model.snapshot.manifest.files.items()
                                      if kit.snapshot.manifest.files.get(path) != entry),
            "command": " ".join(["python", "benchmarks/kit_builds.py", *sys.argv[1:]]),
        })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
