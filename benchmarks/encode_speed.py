"""Encoder throughput: our `Encoder` against sentence-transformers' `encode`, same process, same everything.

Same model folder, texts (real STS-B sentences, or a corpus's documents with --texts), max_length, batch size,
device and dtype; ours on its default runtime (`--runtime`: ONNX Runtime on a CPU in fp32, as builds encode), theirs
on PyTorch. Each side is warmed up, then timed `--repeats` times alternately; the best run is reported.
JSON on stdout.

    python benchmarks/encode_speed.py                                # all-MiniLM-L6-v2, CPU, fp32 and bf16
    python benchmarks/encode_speed.py --texts ../shared/data/ir-classic/cranfield/corpus.jsonl --sentences 400 \
        --max-length 256 --dtypes fp32 --repeats 2          # documents: Cranfield's abstracts
    python benchmarks/encode_speed.py --random-model ../shared/models/bert-base-uncased-config --device cuda \
        --texts passages.jsonl.gz --max-length 256 --batch-sizes 128,512 --dtypes fp32,fp16

--random-model takes a model folder without weights (a config and a tokenizer) and times a randomly initialised
model of that shape: throughput does not depend on the weights' values, so a GPU run needs no checkpoint.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from retriever.encode.encoder import DTYPES, Encoder  # noqa: E402
from retriever.evaluation import get_task, resolve_data_dir  # noqa: E402
from retriever.encode.models import default_model_path  # noqa: E402


def random_model_folder(config_dir: Path) -> str:
    """A randomly initialised model of CONFIG_DIR's architecture saved with its tokenizer, so both sides load the
    same weights by folder."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder = tempfile.mkdtemp(prefix="random-model-")
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(config_dir)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(folder)
    return folder


def corpus_texts(path: Path, count: int) -> list[str]:
    """The first COUNT documents of a corpus file as `build` encodes them (title and text)."""
    from itertools import islice

    from retriever.corpus import document_text, iter_corpus

    return [document_text(document) for document in islice(iter_corpus(path), count)]


def sentence_transformer(folder: str, max_length: int, device: str, dtype: torch.dtype):
    from sentence_transformers import SentenceTransformer, models

    transformer = models.Transformer(folder, max_seq_length=max_length)
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[transformer, pooling], device=device).to(dtype)


def timed(fn, sentences) -> tuple[float, np.ndarray]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    vectors = fn(sentences)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, vectors


def measure(folder, sentences, max_length, device, dtype, batch_size, repeats, runtime="auto") -> dict:
    ours = Encoder(folder, max_length=max_length, device=device, dtype=dtype, batch_size=batch_size, runtime=runtime)
    peer = sentence_transformer(folder, max_length, str(ours.device), DTYPES[dtype])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()

    def ours_encode(texts):
        return ours.encode(texts)

    def peer_encode(texts):
        return np.asarray(peer.encode(texts, batch_size=batch_size, convert_to_numpy=False, convert_to_tensor=True).float().cpu())

    warm = sentences[: 4 * batch_size]
    ours_encode(warm), peer_encode(warm)
    ours_times, peer_times = [], []
    for _ in range(repeats):
        seconds, ours_vectors = timed(ours_encode, sentences)
        ours_times.append(seconds)
        seconds, peer_vectors = timed(peer_encode, sentences)
        peer_times.append(seconds)
    cosine = (ours_vectors * peer_vectors).sum(1) / (
        np.linalg.norm(ours_vectors, axis=1) * np.linalg.norm(peer_vectors, axis=1)
    )
    ours_rate = len(sentences) / min(ours_times)  # best of N: least disturbed by other work
    peer_rate = len(sentences) / min(peer_times)
    return {
        "dtype": dtype,
        "batch_size": batch_size,
        "ours_runtime": ours.runtime,
        "ours_sentences_per_s": round(ours_rate, 1),
        "sentence_transformers_sentences_per_s": round(peer_rate, 1),
        "ratio": round(ours_rate / peer_rate, 3),
        "min_cosine_ours_vs_peer": float(cosine.min()),
        "ours_seconds": [round(t, 3) for t in ours_times],
        "peer_seconds": [round(t, 3) for t in peer_times],
        "gpu_peak_memory_gib": (round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available()
                                else None),
        "vectors": ours_vectors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder [default: embedded all-MiniLM-L6-v2]")
    parser.add_argument("--random-model", type=Path,
                        help="config and tokenizer folder: time a randomly initialised model of that shape")
    parser.add_argument("--texts", type=Path, help="a corpus file whose documents are encoded [default: STS-B sentences]")
    parser.add_argument("--data-dir", default=None, help="[default: $RETRIEVER_DATA or ../shared/data]")
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--batch-sizes", default="64", help="comma-separated; each is timed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runtime", default="auto", choices=("auto", "torch", "onnx"),
                        help="our encoder's runtime [default: auto, what builds use: onnx on a CPU in fp32]")
    args = parser.parse_args()

    folder = random_model_folder(args.random_model) if args.random_model else (args.model or str(default_model_path()))
    sentences = (corpus_texts(args.texts, args.sentences) if args.texts else
                 get_task("stsb").all_sentences(resolve_data_dir(args.data_dir))[: args.sentences])
    runs = [measure(folder, sentences, args.max_length, args.device, dtype, int(batch_size), args.repeats,
                    args.runtime)
            for dtype in args.dtypes.split(",") for batch_size in args.batch_sizes.split(",")]
    fp32 = next((run["vectors"] for run in runs if run["dtype"] == "fp32"), None)
    for run in runs:
        vectors = run.pop("vectors")
        if fp32 is not None and run["dtype"] != "fp32":
            cosine = (vectors * fp32).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(fp32, axis=1))
            run["min_cosine_vs_ours_fp32"] = float(cosine.min())
    report = {
        "benchmark": "encode_speed",
        "model": "random " + str(args.random_model) if args.random_model else (args.model or "all-MiniLM-L6-v2"),
        "texts": str(args.texts) if args.texts else "STS-B sentences",
        "sentences": len(sentences),
        "max_length": args.max_length,
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "runs": runs,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
