"""Does fitting the flow with larger batches (fewer, bigger steps: what a GPU wants) keep its quality?

STS-B test Spearman x 100 after a flow fitted on the 15,457 STS-B sentences (all-MiniLM-L6-v2, max_length 64,
layer 0 and the last layer 6, the embeddings `calibration_table.py` caches), seeds 0 and 1, for batch sizes
32 (the default), 256 and 1024. The learning rate grows with the square root of the batch (3e-3 at 32), and
larger batches get more epochs so that they take enough steps. Fit seconds on this machine's CPU, 2 threads.

    python benchmarks/calibration_table.py      # once: caches the embeddings under .cache/calibration_table
    python benchmarks/flow_batch_size.py        # writes benchmarks/results/flow_batch_size.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.calibration_table import stsb_test_scorer  # noqa: E402
from retriever.calibration import make_calibrator  # noqa: E402

# (batch size, learning rate, epochs)
SETTINGS = [(32, 3e-3, 1), (256, 8.5e-3, 1), (256, 8.5e-3, 4), (1024, 1.7e-2, 4), (1024, 1.7e-2, 16), (1024, 1e-2, 16)]


def main() -> None:
    torch.set_num_threads(2)
    sentences, spearman = stsb_test_scorer()
    results = []
    for layer in (0, 6):
        X = np.load(REPO / ".cache" / "calibration_table" / f"stsb-minilm-layer{layer}-len64-{len(sentences)}.npy")
        for batch_size, lr, epochs in SETTINGS:
            scores, seconds = [], []
            for seed in (0, 1):
                start = time.perf_counter()
                flow = make_calibrator("flow", batch_size=batch_size, lr=lr, epochs=epochs, seed=seed,
                                       device="cpu").fit(X)
                seconds.append(round(time.perf_counter() - start, 2))
                Z = flow.transform(X)
                scores.append(round(spearman(Z), 2))
            record = {"layer": layer, "batch_size": batch_size, "lr": lr, "epochs": epochs, "spearman": scores,
                      "fit_seconds": seconds}
            print(record, flush=True)
            results.append(record)
    out = REPO / "benchmarks" / "results" / "flow_batch_size.json"
    out.write_text(json.dumps({"benchmark": "flow_batch_size", "model": "all-MiniLM-L6-v2", "max_length": 64,
                               "device": "cpu", "threads": 2, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
