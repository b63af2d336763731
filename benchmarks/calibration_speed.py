"""Calibrator speed: BERT-flow fit time and transform throughput (and whitening's, for scale). JSON on stdout.

Vectors are synthetic: a correlated Gaussian (random low-rank structure plus noise, shifted), float32, the shape
of real sentence embeddings. The flow uses its default hyperparameters unless told otherwise.

    python benchmarks/calibration_speed.py                                  # 15,000 x 384 on CPU, 2 threads
    python benchmarks/calibration_speed.py --n 1000000 --dim 768 --device cuda --transform-n 1000000
    python benchmarks/calibration_speed.py --memmap                         # fit streams from an np.memmap
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from retriever.calibration import make_calibrator  # noqa: E402
from retriever.calibration.glow import Glow  # noqa: E402
from retriever.encode.device import resolve_device  # noqa: E402


def synthetic_vectors(n: int, dim: int, seed: int = 0, rank: int = 32) -> np.ndarray:
    """Anisotropic like raw embeddings: a few strong shared directions, per-dimension noise, a common offset."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(rank, dim)).astype(np.float32) * np.geomspace(2, 0.1, rank, dtype=np.float32)[:, None]
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):  # in chunks: 1M x 768 float64 temporaries would need 6 GB
        rows = min(100_000, n - start)
        out[start : start + rows] = rng.standard_normal((rows, rank), dtype=np.float32) @ directions
        out[start : start + rows] += 0.3 * rng.standard_normal((rows, dim), dtype=np.float32) + 0.5
    return out


def best_time(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def step_milliseconds(X: np.ndarray, config: dict, device: str, steps: int = 200) -> dict:
    """One training step's loss and gradients (no optimizer), hand-derived as the flow trains vs torch.autograd.

    The calibrator's flow (`config`), one batch, one CPU thread as in training, the two taking turns; the best of
    5 runs of `steps` steps each."""
    flow = Glow(X.shape[1], config["levels"], config["depth"], config["width"], config["permutation"],
                config["seed"]).to(device)
    batch = torch.from_numpy(np.ascontiguousarray(X[: config["batch_size"]], dtype=np.float32)).to(device)
    flow.initialize(batch)
    for parameter in flow.parameters():
        parameter.grad = torch.zeros_like(parameter)

    def by_hand():
        flow.loss_and_gradients(batch, config["shift_penalty"])

    def by_autograd():
        flow.zero_grad(set_to_none=True)
        flow.loss(batch, config["shift_penalty"]).backward()

    def run(step):
        step()  # warm-up
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - start) / steps

    threads = torch.get_num_threads()
    if not device.startswith("cuda"):
        torch.set_num_threads(1)
    try:
        times = {"by_hand": [], "autograd": []}
        for _ in range(5):
            times["by_hand"].append(run(by_hand))
            times["autograd"].append(run(by_autograd))
    finally:
        torch.set_num_threads(threads)
    hand, autograd = min(times["by_hand"]), min(times["autograd"])
    return {"batch_size": config["batch_size"], "by_hand_ms": round(hand, 3), "autograd_ms": round(autograd, 3),
            "autograd_over_by_hand": round(autograd / hand, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=15_000, help="vectors to fit on")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--epochs", type=int, default=None, help="flow epochs (default: the flow's default)")
    parser.add_argument("--batch-size", type=int, default=None, help="flow batch size (default: the flow's default)")
    parser.add_argument("--transform-n", type=int, default=200_000, help="vectors to transform for throughput")
    parser.add_argument("--repeats", type=int, default=3, help="transform timings; the best is reported")
    parser.add_argument("--memmap", action="store_true", help="fit from an np.memmap on disk instead of RAM")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = str(resolve_device(args.device))
    options = {"device": device}
    if args.epochs is not None:
        options["epochs"] = args.epochs
    if args.batch_size is not None:
        options["batch_size"] = args.batch_size

    X = synthetic_vectors(args.n, args.dim)
    with tempfile.TemporaryDirectory() as folder:
        if args.memmap:
            np.save(Path(folder) / "vectors.npy", X)
            del X
            X = np.load(Path(folder) / "vectors.npy", mmap_mode="r")

        # The first fit in a process pays one-off costs (lazy imports, kernel setup): time it apart.
        start = time.perf_counter()
        make_calibrator("flow", **{**options, "epochs": 1}).fit(np.asarray(X[:256]))
        first_call_overhead = time.perf_counter() - start

        flow = make_calibrator("flow", **options)
        start = time.perf_counter()
        flow.fit(X)
        fit_seconds = time.perf_counter() - start

        gradient_step = step_milliseconds(X, flow.config(), device)

        start = time.perf_counter()
        whitening = make_calibrator("whitening").fit(X)
        whitening_fit_seconds = time.perf_counter() - start

        if args.transform_n <= args.n:
            vectors = np.ascontiguousarray(X[: args.transform_n])
        else:
            vectors = synthetic_vectors(args.transform_n, args.dim, seed=1)
        flow.transform(vectors[:1000])  # warm-up
        flow_transform = best_time(lambda: flow.transform(vectors), args.repeats)
        whitening_transform = best_time(lambda: whitening.transform(vectors), args.repeats)

    config = flow.config()
    steps = len(flow.losses)
    report = {
        "benchmark": "calibration_speed",
        "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "n": args.n,
        "dim": args.dim,
        "memmap": args.memmap,
        "flow_config": config,
        "flow_steps": steps,
        "flow_fit_seconds": round(fit_seconds, 3),
        "flow_fit_seconds_per_epoch": round(fit_seconds / config["epochs"], 3),
        "flow_step_ms": round(1000 * fit_seconds / steps, 3),
        "flow_first_call_overhead_seconds": round(first_call_overhead, 3),
        "flow_gradient_step": gradient_step,
        "flow_final_loss": round(float(np.mean(flow.losses[-50:])), 4),
        "transform_n": len(vectors),
        "flow_transform_vectors_per_second": round(len(vectors) / flow_transform),
        "whitening_fit_seconds": round(whitening_fit_seconds, 3),
        "whitening_transform_vectors_per_second": round(len(vectors) / whitening_transform),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
