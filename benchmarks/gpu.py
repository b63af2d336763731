"""Every GPU figure in one run: a build's encode stage against `Encoder.encode` on texts in memory, half precision
against fp32 on STS-B, the flow's fit at 1M vectors against whitening's, exact search on the GPU against faiss-cpu,
and hybrid search on the GPU against the CPU. Each figure is a ratio against a peer measured in the same run.

The lent GPU machine reaches nothing outside it, so `prepare` (here) packs what the run needs into one folder of
at most ~40 MB, carried with the working tree: wheels the machine's image lacks, a 100,000-passage sample, STS-B,
the models' configs and tokenizers, and all-MiniLM-L6-v2's real weights in fp16 with the word-embedding rows of
tokens STS-B never uses set to zero (they compress to nothing; on STS-B the model is the same, `prepare` checks it).

    python benchmarks/gpu.py prepare --assets .gpu            # on the CPU machine; .gpu is git-ignored
    python benchmarks/gpu.py run --assets .gpu --out $OUT     # on the GPU machine (see benchmarks/results/README.md)

Speed runs use models with random weights of the real shapes (throughput does not depend on weight values);
the precision check uses the real MiniLM weights. `run` writes gpu.json and gpu.md after every step.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import lzma
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PASSAGES = 100_000
ROWS = 1_000_000  # vectors for the fit and search figures
DEVICE = "cuda"  # `--smoke`: cpu, with small sizes, to check the script before a lease
SPEED_DTYPE = "fp16"  # `--smoke`: fp32 (half precision is slow on a CPU)
WHEELS = ("faiss-cpu==1.15.1", "rapidfuzz==3.14.3")
STS_MODEL = "minilm-sts"  # the real weights; its config and tokenizer also make the random MiniLM-shaped model
PASSAGES_FILE = "passages-100k.jsonl.xz"
MODEL_LABELS = {STS_MODEL: "all-MiniLM-L6-v2 (384-d, 6 layers)", "bert-base-config": "bert-base (768-d, 12 layers)"}


# ----------------------------------------------------------------------------------------------- prepare (CPU)

def prepare(assets: Path, shared: Path) -> None:
    from benchmarks.engine_speed import sample_passages
    from retriever.encode.models import default_model_path

    assets.mkdir(parents=True, exist_ok=True)
    wheels = assets / "whl"
    if not wheels.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp",
                        *[f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                                       "manylinux_2_17_x86_64", "manylinux2014_x86_64")],
                        "-d", str(wheels), *WHEELS], check=True)
    passages = assets / PASSAGES_FILE
    if not passages.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            plain = sample_passages(shared / "data/passages/passages.jsonl.gz", PASSAGES, Path(tmp) / "p.jsonl")
            with open(plain, "rb") as source, lzma.open(passages, "wb", preset=9) as target:
                shutil.copyfileobj(source, target)
    data = assets / "data"
    if not (data / "stsb").is_dir():  # the original layout only (what BERT-flow read)
        shutil.copytree(shared / "data/stsb", data / "stsb", ignore=shutil.ignore_patterns("senteval"))
    target = assets / "models" / "bert-base-config"
    target.mkdir(parents=True, exist_ok=True)
    for file in (shared / "models/bert-base-uncased-config").iterdir():
        if file.is_file() and file.suffix == ".json":  # tokenizer.json is the fast tokenizer whole
            shutil.copy(file, target)
    if not (assets / "models" / STS_MODEL / "check.json").is_file():
        _sts_checkpoint(Path(default_model_path()), assets / "models" / STS_MODEL, data)


def _sts_checkpoint(minilm: Path, target: Path, data: Path) -> None:
    """MiniLM's weights in fp16 with every word-embedding row that STS-B's sentences never use set to zero, and a
    check that STS-B test Spearman is the original's."""
    import torch
    from safetensors.torch import load_file, save_file

    from retriever.encode.encoder import Encoder
    from retriever.evaluation.runner import plan_benchmark, run_benchmark

    target.mkdir(parents=True, exist_ok=True)
    for file in minilm.iterdir():
        if file.is_file() and file.suffix == ".json":
            shutil.copy(file, target)
    encoder = Encoder(str(minilm), device="cpu")
    plan = plan_benchmark("stsb", calibrators="none", data_dir=data)
    sentences = sorted({s for subsets in plan.tasks[0].load(data).values() for subset in subsets
                        for s in (*subset.sent1, *subset.sent2)})
    used = set(encoder.tokenizer.all_special_ids)
    for tokens in encoder.tokenizer(sentences, truncation=True, max_length=encoder.max_length)["input_ids"]:
        used.update(tokens)
    weights = load_file(str(minilm / "model.safetensors"))
    name = next(key for key in weights if key.endswith("word_embeddings.weight"))
    keep = torch.zeros(weights[name].shape[0], dtype=torch.bool)
    keep[sorted(used)] = True
    weights[name] = weights[name] * keep[:, None]
    save_file({key: value.half().contiguous() for key, value in weights.items()}, str(target / "model.safetensors"))
    with open(target / "model.safetensors", "rb") as source, gzip.open(target / "model.safetensors.gz", "wb") as gz:
        shutil.copyfileobj(source, gz)
    scores = {}
    for label, folder in (("original fp32", minilm), ("carried fp16 weights, fp32 compute", target)):
        report = run_benchmark(plan, Encoder(str(folder), device="cpu"), progress=False)
        scores[label] = next(r["score"] for r in report.results if r["split"] == "test")
    (target / "model.safetensors").unlink()
    (target / "check.json").write_text(json.dumps({"rows_kept": int(keep.sum()), "rows": len(keep),
                                                   "stsb_test_spearman": scores}, indent=1))
    print(json.dumps(scores))


# ------------------------------------------------------------------------------------------------- run (GPU)

class Report:
    def __init__(self, out: Path):
        self.out, self.data = out, {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": {}}
        out.mkdir(parents=True, exist_ok=True)

    def step(self, name: str, function, *args) -> None:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        try:
            self.data["steps"][name] = function(*args)
        except Exception:  # noqa: BLE001 -- one failed step must not lose the others' figures
            self.data["steps"][name] = {"error": traceback.format_exc()}
            print(traceback.format_exc(), flush=True)
        self.data["steps"][name]["step_seconds"] = round(time.perf_counter() - started, 1)
        self.save()

    def save(self) -> None:
        (self.out / "gpu.json").write_text(json.dumps(self.data, indent=1))
        (self.out / "gpu.md").write_text(markdown(self.data))


def environment() -> dict:
    import tokenizers
    import torch
    import transformers

    import faiss

    return {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "none (smoke run on the CPU)",
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "faiss": faiss.__version__, "numpy": np.__version__}


def _timed(function, *args, repeats: int = 1, **kwargs):
    import torch

    best, value = float("inf"), None
    for _ in range(repeats):
        _synchronize()
        started = time.perf_counter()
        value = function(*args, **kwargs)
        _synchronize()
        best = min(best, time.perf_counter() - started)
    return best, value


def _synchronize() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def encode_stage(assets: Path, corpus: Path, model: str, max_length: int, batch_sizes: list[int], dtype: str) -> dict:
    """A build's encode stage against `Encoder.encode` on the same texts in memory, and the two halves of the
    work apart: tokenizing (one thread, no GPU) and the forward passes on texts tokenized beforehand."""
    import torch

    from benchmarks.encode_speed import corpus_texts, random_model_folder
    import retriever.index as index_module
    from retriever.encode.encoder import TOKENIZE_CHUNK, Encoder
    from retriever.index import Index

    folder = random_model_folder(assets / "models" / model)
    texts = corpus_texts(corpus, PASSAGES)
    result = {"model": model, "dtype": dtype, "max_length": max_length, "passages": len(texts), "runs": []}
    for batch_size in batch_sizes:
        encoder = Encoder(folder, device=DEVICE, dtype=dtype, batch_size=batch_size, max_length=max_length)
        default_workers = encoder.tokenizer_workers
        encoder.encode(texts[:40_000])  # warm-up: kernels, cuBLAS handles, the allocator's pool, the workers
        sweep = {}
        for workers in sorted({0, 2, 4, 8, default_workers}):  # tokenizing processes (0: one thread)
            encoder.tokenizer_workers = workers
            seconds, _ = _timed(encoder.encode, texts, repeats=2)
            sweep[workers] = len(texts) / seconds
        encoder.tokenizer_workers = default_workers
        memory_seconds, _ = _timed(encoder.encode, texts, repeats=2)
        chunks = [texts[i : i + TOKENIZE_CHUNK] for i in range(0, len(texts), TOKENIZE_CHUNK)]
        started = time.perf_counter()
        tokenized = [encoder.tokenize(chunk) for chunk in chunks]
        tokenize_seconds = time.perf_counter() - started
        forward_seconds, _ = _timed(lambda: [encoder.encode_tokenized(t) for t in tokenized], repeats=2)
        del tokenized
        builds = []
        # The default (the vector index built from each chunk as it is encoded) twice, and once with the vector
        # index built after encoding, as before: the gain in the same run.
        for repeat, during in enumerate((True, True, False)):
            home = Path(tempfile.mkdtemp(prefix="gpu-build-"))
            _synchronize()
            started = time.perf_counter()
            engine = index_module.LocalEngine
            index_module.LocalEngine = functools.partial(engine, index_during_encoding=during)
            try:
                summary = Index.build(corpus, "bench", home, calibrator="none", encoder=encoder, device=DEVICE,
                                      batch_size=batch_size, dtype=dtype, max_length=max_length, replace=True)
            finally:
                index_module.LocalEngine = engine
            builds.append({"wall": time.perf_counter() - started, "timings": summary.timings,
                           "index_during_encoding": during})
            print(json.dumps(builds[-1]), flush=True)
            if repeat == 0 and batch_size == batch_sizes[0]:
                result["index_home"] = str(home)
            else:
                shutil.rmtree(home, ignore_errors=True)
        build_encode = min(build["timings"]["encode"] for build in builds if build["index_during_encoding"])
        run = {"batch_size": batch_size, "tokenizer_workers": default_workers,
               "in_memory_per_s_by_tokenizer_workers": sweep,
               "in_memory_per_s": len(texts) / memory_seconds,
               "build_encode_per_s": len(texts) / build_encode,
               "ratio_build_to_in_memory": memory_seconds / build_encode,
               "tokenize_only_per_s": len(texts) / tokenize_seconds,
               "forward_only_per_s": len(texts) / forward_seconds,
               "builds": builds,
               "gpu_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None}
        result["runs"].append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "builds"}), flush=True)
        encoder.close()  # the tokenizing processes, before the next model's
        del encoder
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return result


def index_while_encoding(assets: Path, corpus: Path, flat: bool = False) -> dict:
    """Item 5's build (calibrator `none`, the MiniLM-shaped encoder loaded beforehand, batch 512) with the vector
    index built after encoding, and built while encoding on each of three thread counts (all the cores, the default;
    the cores the encoder's tokenizing processes and feeding thread leave; 4), alternating over two rounds, against
    `Encoder.encode` in memory in the same run. FLAT: after, while on all the cores, and a flat index (no graph)
    while encoding, instead."""
    import retriever.index as index_module
    from benchmarks.encode_speed import corpus_texts, random_model_folder
    from retriever.encode.encoder import Encoder
    from retriever.engines.local import LocalEngine
    from retriever.index import Index
    from retriever.processes import available_cpus

    texts = corpus_texts(corpus, PASSAGES)
    encoder = Encoder(random_model_folder(assets / "models" / STS_MODEL), device=DEVICE, dtype=SPEED_DTYPE,
                      batch_size=512, max_length=256)
    encoder.encode(texts[:40_000])  # warm-up: kernels, the allocator, the tokenizing processes
    memory_seconds, _ = _timed(encoder.encode, texts, repeats=2)
    variants = {"after": {"index_during_encoding": False},
                "while, all cores": {"index_during_encoding": True},
                "while, flat index (no HNSW graph)": {"index_during_encoding": True, "index_type": "flat"}} if flat else {
                "after": {"index_during_encoding": False},
                "while, all cores": {"index_during_encoding": True, "index_threads": available_cpus()},
                "while, cores less the encoder's feeding": {
                    "index_during_encoding": True, "index_threads": max(1, available_cpus() - encoder.tokenizer_workers - 2)},
                "while, 4 threads": {"index_during_encoding": True, "index_threads": 4}}
    result = {"in_memory_per_s": len(texts) / memory_seconds, "tokenizer_workers": encoder.tokenizer_workers,
              "cpus": available_cpus(), "builds": {name: [] for name in variants}}
    engine = index_module.LocalEngine
    for _ in range(2):
        for name, options in variants.items():
            home = Path(tempfile.mkdtemp(prefix="gpu-stream-"))
            options = dict(options)
            index_type = options.pop("index_type", "auto")
            index_module.LocalEngine = functools.partial(engine, **options)
            try:
                _synchronize()
                started = time.perf_counter()
                summary = Index.build(corpus, "bench", home, calibrator="none", encoder=encoder, device=DEVICE,
                                      batch_size=512, dtype=SPEED_DTYPE, max_length=256, replace=True,
                                      index_type=index_type)
                wall = time.perf_counter() - started
            finally:
                index_module.LocalEngine = engine
                shutil.rmtree(home, ignore_errors=True)
            build = {"wall_s": wall, "per_s": PASSAGES / wall, "ratio_to_in_memory": memory_seconds / wall,
                     "timings_s": summary.timings}
            result["builds"][name].append(build)
            print(json.dumps({name: build}), flush=True)
    encoder.close()
    return result


BATCH_SIZES = (64, 128, 256, 512, 1024)


def batch_sizes(assets: Path, corpus: Path) -> dict:
    """The encoder's batch size on the GPU. `Encoder.encode` in memory at each of BATCH_SIZES, with torch's peak GPU
    memory, for both model shapes (random weights); then builds of the 100,000 passages (calibrator `none`, the
    MiniLM-shaped encoder loaded beforehand) at batch 64 and 512, each with the keyword index written while encoding
    (the default) and after it."""
    import torch

    from benchmarks.encode_speed import corpus_texts, random_model_folder
    from retriever.encode.encoder import Encoder
    from retriever.engines import local
    from retriever.index import Index

    texts = corpus_texts(corpus, PASSAGES)
    result = {"dtype": SPEED_DTYPE, "repeats": 2, "in_memory": {}, "builds": []}
    kept = {}
    for model, max_length, rows in ((STS_MODEL, 256, PASSAGES // 2), ("bert-base-config", 512, PASSAGES // 5)):
        folder = random_model_folder(assets / "models" / model)
        figures = {}
        for batch in BATCH_SIZES:
            encoder = Encoder(folder, device=DEVICE, dtype=SPEED_DTYPE, batch_size=batch, max_length=max_length)
            encoder.encode(texts[-min(rows, 8 * batch):])  # warm-up: kernels, the allocator
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            seconds, _ = _timed(encoder.encode, texts[:rows], repeats=2)  # the first starts the tokenizing processes
            figures[batch] = {"per_s": rows / seconds,
                              "gpu_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None}
            if model == STS_MODEL and batch in (64, 512):
                kept[batch] = encoder
            else:
                encoder.close()
            del encoder
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        result["in_memory"][model] = {"max_length": max_length, "texts": rows, "by_batch": figures}
        print(json.dumps({model: figures}), flush=True)
    read = local.LocalEngine.read

    def read_after(self, writer):  # the keyword index written after the vectors, not beside them
        self.overlap = False
        return read(self, writer)

    for batch, encoder in kept.items():
        for overlap in (True, False):
            local.LocalEngine.read = read if overlap else read_after
            home = Path(tempfile.mkdtemp(prefix="gpu-batch-"))
            _synchronize()
            started = time.perf_counter()
            try:
                summary = Index.build(corpus, "bench", home, calibrator="none", encoder=encoder, device=DEVICE,
                                      batch_size=batch, dtype=SPEED_DTYPE, max_length=256, replace=True)
            finally:
                local.LocalEngine.read = read
            wall = time.perf_counter() - started
            shutil.rmtree(home, ignore_errors=True)
            build = {"batch_size": batch, "keywords_while_encoding": overlap, "wall_s": wall, "per_s": PASSAGES / wall,
                     "timings_s": summary.timings}
            result["builds"].append(build)
            print(json.dumps(build), flush=True)
        encoder.close()
    return result


def real_minilm(assets: Path) -> Path:
    """The carried all-MiniLM-L6-v2 (`prepare`'s: real weights in fp16, the word-embedding rows of tokens STS-B never
    uses set to zero) unpacked into a model folder."""
    folder = Path(tempfile.mkdtemp(prefix="minilm-sts-"))
    for file in (assets / "models" / STS_MODEL).iterdir():
        if file.name == "check.json":
            continue
        if file.suffix == ".gz":
            with gzip.open(file, "rb") as source, open(folder / file.stem, "wb") as target:
                shutil.copyfileobj(source, target)
        else:
            shutil.copy(file, folder)
    return folder


def precision(assets: Path) -> dict:
    """STS-B test Spearman of the real MiniLM, raw and flow, in fp32, fp16 and bf16 on the GPU, through `bench`."""
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.runner import plan_benchmark, run_benchmark

    folder = real_minilm(assets)
    plan = plan_benchmark("stsb", calibrators="none,flow", data_dir=assets / "data",
                          limit=None if DEVICE == "cuda" else 100)
    scores = {}
    for dtype in ("fp32", "fp16", "bf16"):
        started = time.perf_counter()
        report = run_benchmark(plan, Encoder(str(folder), device=DEVICE, dtype=dtype, batch_size=256), progress=False)
        scores[dtype] = {r["calibrator"]: r["score"] for r in report.results if r["split"] == "test"}
        scores[dtype]["seconds"] = time.perf_counter() - started
    difference = {dtype: {c: scores[dtype][c] - scores["fp32"][c] for c in ("none", "flow")}
                  for dtype in ("fp16", "bf16")}
    return {"stsb_test_spearman": scores, "minus_fp32": difference,
            "cpu_check": json.loads((assets / "models" / STS_MODEL / "check.json").read_text())}


# A default build in a process of its own, so that its peak memory is the build's: every default (calibrator auto,
# index type auto, the keyword index, the hybrid check) but the dtype, on the GPU; prints one JSON line. Peak
# resident memory: this process's, and the largest of the processes it waited for (the tokenizing processes).
DEFAULT_BUILD_SCRIPT = """
import json, resource, sys, tempfile, time
import torch
from retriever.index import Index
corpus, model, device, dtype = sys.argv[1:5]
options = {"batch_size": int(sys.argv[5])} if len(sys.argv) > 5 else {}  # else the default's
home = tempfile.mkdtemp(prefix="gpu-default-")
started = time.perf_counter()
summary = Index.build(corpus, "default", home, model=model, device=device, dtype=dtype, **options)
wall = time.perf_counter() - started
own, children = (resource.getrusage(who).ru_maxrss / 2**20 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
with Index.open("default", home, device="cpu") as index:
    manifest = index.snapshot.manifest
print(json.dumps({"documents": summary.documents, "passages": summary.passages, "wall_s": wall,
                  "timings_s": summary.timings,
                  "calibrator": ((manifest.calibrator.get("decision") or {}).get("chosen") or manifest.calibrator)["name"],
                  "index_type": manifest.index_type, "peak_rss_gib": own, "children_peak_rss_gib": children,
                  "torch_gpu_peak_gib": gpu}))
"""
# A build of a million passages on the lent machine: encoding at ~40,000 a second, the rest on 16 CPUs.
DEFAULT_BUILD_TIMEOUT_S = 540


def scaled_corpus(corpus: Path, documents: int, out: Path, seed: int = 0) -> Path:
    """DOCUMENTS passages for a build at scale from the carried sample (a million real ones would not fit the
    carry): the sample's own lines, then new passages of 2 to 6 of its sentences drawn at random (seeded), about a
    passage's length, none repeating another."""
    import random

    from benchmarks.encode_speed import corpus_texts
    from retriever.calibration.pseudo_queries import split_sentences

    pieces = [sentence for text in corpus_texts(corpus, PASSAGES) for sentence in split_sentences(text)]
    rng = random.Random(seed)
    with open(corpus, encoding="utf-8") as source, open(out, "w", encoding="utf-8") as target:
        seen = set()
        for line in source:
            target.write(line)
            seen.add(json.loads(line)["text"])
        while len(seen) < documents:
            text = " ".join(rng.sample(pieces, rng.randint(2, 6)))
            if text not in seen:
                seen.add(text)
                target.write(json.dumps({"_id": f"made-{len(seen)}", "text": text}) + "\n")
    return out


def default_builds(assets: Path, corpus: Path, sizes: list[int], report: Report, name: str,
                   batch_size: int | None = None) -> dict:
    """The default build at each of SIZES passages, every stage timed (`ChangeSummary.timings`), with its peak
    memory; each size's figures (or its error) saved in REPORT's step NAME as soon as they are known. The model is
    `real_minilm`: real weights, so its timings and memory are a real build's; but 7.8% of the carried passages'
    tokens fall on its zeroed rows (the first 2,000 passages, read to 256 tokens), so what auto's check and the
    hybrid check decide need not be what they would decide on the model's own vectors."""
    model = real_minilm(assets)
    result = {"dtype": SPEED_DTYPE, "carried_passages": PASSAGES, "batch_size": batch_size or "default", "sizes": {}}
    for size in sizes:
        path = corpus if size <= PASSAGES else scaled_corpus(corpus, size, corpus.with_name(f"scaled-{size}.jsonl"))
        try:
            batch = [str(batch_size)] if batch_size else []
            done = subprocess.run([sys.executable, "-c", DEFAULT_BUILD_SCRIPT, str(path), str(model), DEVICE,
                                   SPEED_DTYPE, *batch], capture_output=True, text=True, cwd=REPO,
                                  timeout=DEFAULT_BUILD_TIMEOUT_S)
            if done.returncode != 0:
                raise RuntimeError(f"exit {done.returncode}:\n{done.stderr[-3000:]}")
            result["sizes"][str(size)] = json.loads(done.stdout.strip().splitlines()[-1])
        except Exception as error:  # noqa: BLE001 -- one failed size must not lose the others' figures
            result["sizes"][str(size)] = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps({size: result["sizes"][str(size)]}), flush=True)
        report.data["steps"][name] = result
        report.save()
    return result


def anisotropic(rows: int, dim: int, seed: int = 0):
    """Vectors shaped like a transformer's: a shared offset (the cone) and a decaying spectrum. Made on the GPU."""
    import torch

    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    scales = torch.logspace(0, -2, dim, device=DEVICE)
    mixing = torch.linalg.qr(torch.randn(dim, dim, device=DEVICE, generator=generator))[0]
    x = torch.randn(rows, dim, device=DEVICE, generator=generator) * scales @ mixing
    return (x + 0.5 * torch.randn(dim, device=DEVICE, generator=generator) / dim**0.5).cpu().numpy()


def flow_fit() -> dict:
    """The flow's fit (the default flow, 1 epoch at batch 32) on 1M vectors, graphed, against whitening's fit on
    the same vectors; the eager loop on 100k of them; and the graphed fit against the eager one on 20k vectors."""
    import torch

    from retriever.calibration import make_calibrator

    result = {}
    small = anisotropic(min(20_000, ROWS), 384, seed=1)
    fits = {}
    for graphed in (True, False):
        flow = make_calibrator("flow", seed=0)
        flow.cuda_graph = graphed
        fits[graphed] = flow.fit(small)
    graph, eager = fits[True], fits[False]
    if DEVICE == "cuda":
        assert (graph.fit_path, eager.fit_path) == ("cuda-graph", "eager"), (graph.fit_path, eager.fit_path)
    z_graph, z_eager = graph.transform(small[:2000]), eager.transform(small[:2000])
    result["graph_vs_eager_20k"] = {
        "max_abs_diff_transform": float(np.abs(z_graph - z_eager).max()),
        "relative_diff": float(np.linalg.norm(z_graph - z_eager) / np.linalg.norm(z_eager)),
        "final_loss": [graph.losses[-1], eager.losses[-1]], "mean_loss": [float(np.mean(graph.losses)),
                                                                          float(np.mean(eager.losses))]}
    for dim in (384, 768):
        X = anisotropic(ROWS, dim)
        flow = make_calibrator("flow", seed=0)
        started = time.perf_counter()
        flow.fit(X)
        _synchronize()
        flow_seconds = time.perf_counter() - started
        whitening = make_calibrator("whitening")
        started = time.perf_counter()
        whitening.fit(X)
        whitening_seconds = time.perf_counter() - started
        eager = make_calibrator("flow", seed=0)
        eager.cuda_graph = False
        started = time.perf_counter()
        eager.fit(X[: ROWS // 10])
        _synchronize()
        eager_seconds = time.perf_counter() - started
        result[f"1M x {dim}"] = {"flow_seconds": flow_seconds, "flow_path": flow.fit_path,
                                 "whitening_seconds": whitening_seconds,
                                 "flow_over_whitening": flow_seconds / whitening_seconds,
                                 "eager_100k_seconds": eager_seconds, "eager_path": eager.fit_path,
                                 "steps": len(flow.losses)}
        print(json.dumps(result[f"1M x {dim}"]), flush=True)
        del X
    return result


def exact_search() -> dict:
    """Exact inner-product search over 1M x 384 normalized vectors: the library's torch path on the GPU (fp32 and
    fp16) against faiss-cpu's flat index on this machine's cores, for batches of 64 queries and single queries."""
    import faiss
    import torch

    from retriever.store.vectors import VectorStore

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((ROWS, 384), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((64 * 20, 384), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    ids = np.arange(1, len(vectors) + 1, dtype=np.int64)
    stores = {"faiss-cpu": VectorStore.create(384, "flat", device="cpu"),
              "torch-cuda fp32": VectorStore.create(384, "flat", device=DEVICE, backend="torch"),
              "torch-cuda fp16": VectorStore.create(384, "flat", device=DEVICE, backend="torch", fp16=True)}
    for store in stores.values():
        store.add(ids, vectors)
    result = {"faiss_threads": faiss.omp_get_max_threads(), "k": 10}
    reference = None
    for name, store in stores.items():
        store.search(queries[:64], 10)  # builds the searcher (the GPU copy) and warms up
        started = time.perf_counter()
        found = [store.search(queries[i : i + 64], 10)[1] for i in range(0, len(queries), 64)]
        batch_seconds = (time.perf_counter() - started) / (len(queries) / 64)
        singles = 200 if name == "faiss-cpu" else 1000
        started = time.perf_counter()
        for i in range(singles):
            store.search(queries[i : i + 1], 10)
        single_seconds = (time.perf_counter() - started) / singles
        found = np.concatenate(found)
        reference = found if reference is None else reference
        overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, reference)]))
        result[name] = {"batch64_ms": batch_seconds * 1e3, "batch64_queries_per_s": 64 / batch_seconds,
                        "single_ms": single_seconds * 1e3, "top10_overlap_with_faiss": overlap}
        print(name, json.dumps(result[name]), flush=True)
    for name in ("torch-cuda fp32", "torch-cuda fp16"):
        result[name]["batch64_speedup_over_faiss_cpu"] = result["faiss-cpu"]["batch64_ms"] / result[name]["batch64_ms"]
        result[name]["single_speedup_over_faiss_cpu"] = result["faiss-cpu"]["single_ms"] / result[name]["single_ms"]
    del stores
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return result


FILTER_SHARES = {"0.1%": 1, "1%": 10, "10%": 100, "50%": 500}  # bucket = row % 1000 below these


def filtered_search() -> dict:
    """Filtered exact search over 1M x 384 normalized vectors on the GPU (the library's torch path, fp16): single
    queries with a filter of each share (`bucket` = row % 1000) against the same queries unfiltered, top-10
    against NumPy's exact filtered search in fp32, and faiss-cpu's flat index with the same filters (16 threads).
    The selection a filter needs (its rows gathered, or a mask) is made on its first query and timed apart."""
    import torch

    from retriever.store.vectors import VectorStore

    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((ROWS, 384), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((300, 384), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    ids = np.arange(1, ROWS + 1, dtype=np.int64)
    stores = {"torch-cuda fp16": VectorStore.create(384, "flat", device=DEVICE, backend="torch", fp16=True),
              "faiss-cpu": VectorStore.create(384, "flat", device="cpu")}
    for store in stores.values():
        store.add(ids, vectors)
    filters = {"none": None, **{share: ids[(ids - 1) % 1000 < below] for share, below in FILTER_SHARES.items()}}
    result = {"rows": ROWS, "queries": len(queries), "k": 10}
    for name, store in stores.items():
        singles = len(queries) if name.startswith("torch") else 40
        store.search(queries[:8], 10)  # the searcher (the GPU copy) and warm-up
        figures = {}
        for share, include in filters.items():
            started = time.perf_counter()
            store.search(queries[:1], 10, include=include)
            first_ms = (time.perf_counter() - started) * 1e3
            times, found = [], []
            for i in range(singles):
                started = time.perf_counter()
                found.append(store.search(queries[i : i + 1], 10, include=include)[1][0])
                times.append(time.perf_counter() - started)
            allowed = vectors if include is None else vectors[include - 1]
            allowed_ids = ids if include is None else include
            checked = min(50, singles)
            exact = allowed_ids[np.argsort(-(queries[:checked] @ allowed.T), axis=1)[:, :10]]
            overlap = float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found[:checked], exact)]))
            figures[share] = {"p50_ms": float(np.median(times) * 1e3), "p99_ms": float(np.percentile(times, 99) * 1e3),
                              "first_query_ms": first_ms, "top10_overlap_with_exact_fp32": overlap}
        for share in FILTER_SHARES:
            figures[share]["p50_vs_unfiltered"] = figures[share]["p50_ms"] / figures["none"]["p50_ms"]
        result[name] = figures
        print(name, json.dumps(figures), flush=True)
    # What each filtered query paid before a filter's selection was kept: a position mask by np.isin over every id.
    started = time.perf_counter()
    for include in list(filters.values())[1:]:
        np.isin(ids, include)
    result["isin_mask_ms_per_filter"] = (time.perf_counter() - started) * 1e3 / len(FILTER_SHARES)
    del stores
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return result


def hybrid_search(home: str, queries: list[str]) -> dict:
    """Dense, keyword and hybrid search on the MiniLM build of the encode step (100k passages, random weights:
    speed only), the vectors searched on the GPU against the same on the CPU, queries one at a time."""
    from retriever.index import Index

    result = {"queries": len(queries)}
    for device in ("cuda", "cpu"):
        if device == "cuda" and DEVICE != "cuda":
            device = DEVICE  # (smoke run: the CPU twice)
        index = Index.open("bench", home, device=device)
        for mode in ("dense", "keyword", "hybrid"):
            index.search(queries[:5], k=10, mode=mode)  # warm-up: the searcher, the encoder's kernels
            times = []
            for query in queries:
                started = time.perf_counter()
                index.search(query, k=10, mode=mode)
                times.append(time.perf_counter() - started)
            result[f"{mode} on {device}"] = {"p50_ms": float(np.median(times) * 1e3),
                                             "p95_ms": float(np.percentile(times, 95) * 1e3)}
    result["hybrid_gpu_over_cpu_p50"] = result["hybrid on cuda"]["p50_ms"] / result["hybrid on cpu"]["p50_ms"]
    return result


def run(assets: Path, out: Path, only: set[str] | None) -> None:
    from benchmarks.encode_speed import corpus_texts

    report = Report(out)
    report.data["environment"] = environment()
    print(json.dumps(report.data["environment"]), flush=True)
    corpus = Path(tempfile.mkdtemp(prefix="passages-")) / "passages-100k.jsonl"
    with lzma.open(assets / PASSAGES_FILE, "rt", encoding="utf-8") as source, open(corpus, "w") as target:
        target.writelines(line for _, line in zip(range(PASSAGES), source))
    # Queries: the first words of 100 passages (titles and text), what a user types.
    queries = [" ".join(text.split()[:6]) for text in corpus_texts(corpus, 300)[::3]]

    def wanted(name: str) -> bool:
        return only is None or name in only

    if wanted("encode") or wanted("encode-minilm"):  # the second: MiniLM's shape alone, on a short lease
        report.step("encode MiniLM-L6 shape", encode_stage, assets, corpus, STS_MODEL, 256, [512], SPEED_DTYPE)
    if wanted("encode"):
        report.step("encode bert-base shape", encode_stage, assets, corpus, "bert-base-config", 512,
                    [512], SPEED_DTYPE)
    if wanted("precision"):
        report.step("precision: real MiniLM on STS-B", precision, assets)
    if wanted("flow"):
        report.step("flow fit", flow_fit)
    if wanted("search"):
        report.step("exact search 1M x 384", exact_search)
    if wanted("filtered"):
        report.step("filtered exact search 1M x 384", filtered_search)
    if wanted("stream"):
        report.step("vector index while encoding", index_while_encoding, assets, corpus)
    if wanted("stream-flat"):
        report.step("vector index while encoding, or no graph", index_while_encoding, assets, corpus, True)
    if wanted("batch"):
        report.step("batch sizes", batch_sizes, assets, corpus)
        report.step("default build at batch 512", default_builds, assets, corpus, [PASSAGES], report,
                    "default build at batch 512", 512)
    if wanted("builds"):
        report.step("default builds by stage", default_builds, assets, corpus, [PASSAGES, 10 * PASSAGES], report,
                    "default builds by stage")
    home = report.data["steps"].get("encode MiniLM-L6 shape", {}).get("index_home")
    if wanted("hybrid") and home:
        report.step("hybrid search, 100k", hybrid_search, home, queries)
    report.data["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    report.save()
    print(markdown(report.data), flush=True)


# ------------------------------------------------------------------------------------------------ the report

def markdown(data: dict) -> str:
    env = data.get("environment", {})
    lines = [f"# GPU figures: {env.get('gpu', '?')}, {env.get('cpus', '?')} CPUs",
             "",
             f"torch {env.get('torch')} (CUDA {env.get('cuda')}), transformers {env.get('transformers')}, "
             f"tokenizers {env.get('tokenizers')}, faiss {env.get('faiss')}, numpy {env.get('numpy')}, "
             f"Python {env.get('python')}. Run started {data.get('started')}.", ""]
    if data.get("runs"):
        lines += ["Merged from " + "; ".join(f"the run started {run['started']} ({', '.join(run['steps'])})"
                                             for run in data["runs"])
                  + ". A later run's step replaces an earlier run's (kept in gpu.json under `superseded`).", ""]
    steps = data.get("steps", {})
    encode_rows = []
    for name, step in steps.items():
        if name.startswith("encode") and "runs" in step:
            for run in step["runs"]:
                label = MODEL_LABELS.get(step["model"], step["model"])
                encode_rows.append(f"| {label} | {step['dtype']} | {run['batch_size']} | "
                                   f"{run['build_encode_per_s']:,.0f} | {run['in_memory_per_s']:,.0f} | "
                                   f"{run['ratio_build_to_in_memory']:.2f} | {run['tokenize_only_per_s']:,.0f} | "
                                   f"{run['forward_only_per_s']:,.0f} | "
                                   + ", ".join(f"{w}: {rate:,.0f}" for w, rate in
                                               run.get("in_memory_per_s_by_tokenizer_workers", {}).items())
                                   + " |")
    if encode_rows:
        lines += ["## Encode: a build's encode stage against `Encoder.encode` in memory (100,000 passages)", "",
                  "| model shape | dtype | batch | build's encode stage (passages/s) | `Encoder.encode` in memory | "
                  "ratio | tokenizing alone (1 thread) | forward passes alone | in memory by tokenizing processes |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---|", *encode_rows, ""]
        whole = [(MODEL_LABELS.get(step["model"], step["model"]), step, run) for name, step in steps.items()
                 if name.startswith("encode") and "runs" in step for run in step["runs"] if run.get("builds")]
        if whole:
            lines += ["The same builds end to end (calibrator `none`: read, encode, keyword index, vector index, "
                      "write), against the same encoder in memory:", "",
                      "| model shape | build end to end (documents/s, best of 2) | in memory | ratio | "
                      "stages of that build (s) |", "|---|---:|---:|---:|---|"]
            for label, step, run in whole:
                for during in (True, False):
                    kind = [build for build in run["builds"] if build.get("index_during_encoding", True) is during]
                    if not kind:
                        continue
                    best = min(kind, key=lambda build: build["wall"])
                    rate = step["passages"] / best["wall"]
                    how = (f", best of {len(kind)}" if during else ", vector index after encoding") if any(
                        "index_during_encoding" in build for build in run["builds"]) else ""
                    lines.append(f"| {label}{how} | {rate:,.0f} | {run['in_memory_per_s']:,.0f} | "
                                 f"{rate / run['in_memory_per_s']:.2f} | "
                                 + ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in best["timings"].items()
                                             if isinstance(seconds, (int, float))) + " |")
            lines.append("")
    for title, stream in (("", steps.get("vector index while encoding")),
                          (", or a flat index", steps.get("vector index while encoding, or no graph"))):
        if not stream:
            continue
        lines += [f"## Item 5's build, the vector index built after encoding or while encoding{title} (best of 2, "
                  "alternating)",
                  "", f"`Encoder.encode` in memory: {stream['in_memory_per_s']:,.0f} passages/s; "
                  f"{stream['cpus']} CPUs, {stream['tokenizer_workers']} tokenizing processes.", "",
                  "| vector index | build end to end (documents/s) | ratio to in memory | stages (s) |",
                  "|---|---:|---:|---|"]
        for name, builds in stream["builds"].items():
            best = min(builds, key=lambda build: build["wall_s"])
            lines.append(f"| {name} | {best['per_s']:,.0f} | {best['ratio_to_in_memory']:.2f} | "
                         + ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in best["timings_s"].items()
                                     if stage != "load_model") + " |")
        lines.append("")
    default = steps.get("default builds by stage", {})
    build_rows = []
    sized = [(step.get("batch_size", "default"), size, build)
             for step in (default, steps.get("default build at batch 512", {}))
             for size, build in step.get("sizes", {}).items()]
    for batch, size, build in sized:
        if "wall_s" not in build:
            build_rows.append(f"| {int(size):,} | {batch} | failed: {build.get('error', '?')[:200]} | | | | | | |")
            continue
        gpu = build["torch_gpu_peak_gib"]
        build_rows.append(
            f"| {int(size):,} | {batch} | {build['wall_s']:.1f} | {build['calibrator']} | {build['index_type']} | "
            f"{build['peak_rss_gib']:.1f} | {build['children_peak_rss_gib']:.1f} | "
            + (f"{gpu:.1f}" if gpu is not None else "-") + " | "
            + ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in build["timings_s"].items()
                        if isinstance(seconds, (int, float))) + " |")
    if build_rows:
        lines += [f"## The default build by stage (all-MiniLM-L6-v2 weights, {default['dtype']}; every other setting "
                  "the default: auto, the keyword index, the hybrid check)", "",
                  "| passages | batch | wall (s) | calibrator | index | peak memory (GiB) | largest child's (GiB) | "
                  "torch's GPU peak (GiB) | stages (s) |", "|---:|---|---:|---|---|---:|---:|---:|---|",
                  *build_rows, "",
                  f"Beyond the {default['carried_passages']:,} carried passages, new ones of 2 to 6 of their sentences "
                  "drawn at random (`scaled_corpus`). The carried model's word-embedding rows of tokens STS-B never "
                  "uses are zero: the timings and memory are a real build's, the calibrator and the hybrid weight "
                  "not necessarily.", ""]
    batches = steps.get("batch sizes", {})
    if batches.get("in_memory"):
        lines += [f"## The encoder's batch size ({batches['dtype']}; random weights of each shape)", "",
                  "`Encoder.encode` in memory, texts a second, and torch's peak GPU memory (GiB):", "",
                  "| model shape | max_length | texts | " + " | ".join(f"batch {size}" for size in BATCH_SIZES) + " |",
                  "|---|---:|---:|" + "---:|" * len(BATCH_SIZES)]
        for model, sweep in batches["in_memory"].items():
            figures = [sweep["by_batch"].get(str(size), {}) for size in BATCH_SIZES]
            cells = [f"{figure['per_s']:,.0f} ({figure['gpu_peak_gib']:.2f})"
                     if figure.get("gpu_peak_gib") is not None else "-" for figure in figures]
            lines.append(f"| {MODEL_LABELS.get(model, model)} | {sweep['max_length']} | {sweep['texts']:,} | "
                         + " | ".join(cells) + " |")
        if not batches.get("repeats"):
            lines += ["", "Timed once, with each encoder's tokenizing processes started inside the timing (its "
                      "warm-up was one chunk, which needs none): each figure carries that start, so it is not the "
                      "encoder's rate. The builds below, their encoders warm, compare batch 64 and 512 cleanly."]
        lines += ["", "Builds of the 100,000 passages (calibrator `none`, the MiniLM-shaped encoder loaded "
                  "beforehand), the keyword index written while encoding (the default: on a thread until 1db7ca4, "
                  "then in a process of its own on a GPU) or after:", "",
                  "| batch | keyword index | wall (s) | documents/s | stages (s) |", "|---:|---|---:|---:|---|"]
        for build in batches.get("builds", []):
            while_encoding = build.get("keywords_while_encoding", build.get("keywords_on_thread"))
            written = ("on a thread" if "keywords_on_thread" in build else "while encoding") if while_encoding \
                else "after"
            lines.append(f"| {build['batch_size']} | {written} | {build['wall_s']:.1f} | {build['per_s']:,.0f} | "
                         + ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in build["timings_s"].items()
                                     if isinstance(seconds, (int, float))) + " |")
        lines.append("")
    precision = steps.get("precision: real MiniLM on STS-B", {})
    if "stsb_test_spearman" in precision:
        lines += ["## Precision: all-MiniLM-L6-v2 (real weights), STS-B test Spearman x100 on the GPU", "",
                  "| dtype | none | flow | minus fp32 (none / flow) |", "|---|---:|---:|---:|"]
        for dtype, scores in precision["stsb_test_spearman"].items():
            diff = precision["minus_fp32"].get(dtype)
            lines.append(f"| {dtype} | {scores['none']:.2f} | {scores['flow']:.2f} | "
                         + (f"{diff['none']:+.3f} / {diff['flow']:+.3f} |" if diff else "- |"))
        lines.append("")
    flow = steps.get("flow fit", {})
    fit_rows = [f"| {name} | {fig['flow_seconds']:.1f} ({fig['flow_path']}, {fig['steps']:,} steps) | "
                f"{fig['whitening_seconds']:.1f} | {fig['flow_over_whitening']:.1f} | {fig['eager_100k_seconds']:.1f} |"
                for name, fig in flow.items() if name.startswith("1M")]
    if fit_rows:
        lines += ["## Flow fit (1 epoch, batch 32) against whitening on the same vectors", "",
                  "| vectors | flow (s) | whitening (s) | ratio | eager loop on 100k of them (s) |",
                  "|---|---:|---:|---:|---:|", *fit_rows, ""]
        if "graph_vs_eager_20k" in flow:
            check = flow["graph_vs_eager_20k"]
            lines += [f"Graphed fit against the eager loop on 20k x 384: transform max |diff| "
                      f"{check['max_abs_diff_transform']:.2e}, relative {check['relative_diff']:.2e}.", ""]
    search = steps.get("exact search 1M x 384", {})
    if "faiss-cpu" in search:
        lines += [f"## Exact search, 1M x 384, k=10 (faiss-cpu on {search['faiss_threads']} threads)", "",
                  "| searcher | batch of 64 (ms) | queries/s | single query (ms) | batch speed-up | single speed-up |"
                  " top-10 overlap with faiss |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name in ("faiss-cpu", "torch-cuda fp32", "torch-cuda fp16"):
            fig = search[name]
            lines.append(f"| {name} | {fig['batch64_ms']:.2f} | {fig['batch64_queries_per_s']:,.0f} | "
                         f"{fig['single_ms']:.2f} | {fig.get('batch64_speedup_over_faiss_cpu', 1):.1f} | "
                         f"{fig.get('single_speedup_over_faiss_cpu', 1):.1f} | {fig['top10_overlap_with_faiss']:.3f} |")
        lines.append("")
    hybrid = steps.get("hybrid search, 100k", {})
    if "queries" in hybrid:
        lines += [f"## Search by text on the 100k build ({hybrid['queries']} queries, one at a time, k=10)", "",
                  "| mode | GPU p50 (ms) | GPU p95 | CPU p50 (ms) | CPU p95 |", "|---|---:|---:|---:|---:|"]
        for mode in ("dense", "keyword", "hybrid"):
            gpu, cpu = hybrid[f"{mode} on cuda"], hybrid[f"{mode} on cpu"]
            lines.append(f"| {mode} | {gpu['p50_ms']:.2f} | {gpu['p95_ms']:.2f} | {cpu['p50_ms']:.2f} | "
                         f"{cpu['p95_ms']:.2f} |")
        lines.append("")
    filtered = steps.get("filtered exact search 1M x 384", {})
    if "rows" in filtered:
        lines += [f"## Filtered exact search, {filtered['rows']:,} x 384, single queries, k=10", "",
                  "| searcher | filter share | p50 (ms) | p99 (ms) | p50 vs unfiltered | first query (ms) |"
                  " top-10 overlap with exact fp32 |", "|---|---|---:|---:|---:|---:|---:|"]
        for name in ("torch-cuda fp16", "faiss-cpu"):
            for share, fig in filtered.get(name, {}).items():
                lines.append(f"| {name} | {share} | {fig['p50_ms']:.2f} | {fig['p99_ms']:.2f} | "
                             f"{fig.get('p50_vs_unfiltered', 1):.2f} | {fig['first_query_ms']:.1f} | "
                             f"{fig['top10_overlap_with_exact_fp32']:.3f} |")
        lines += ["", f"A position mask by `np.isin` over every id, what each filtered query paid before the "
                      f"selection was kept per filter: {filtered['isin_mask_ms_per_filter']:.1f} ms.", ""]
    errors = [name for name, step in steps.items() if "error" in step]
    if errors:
        lines += ["Steps that failed: " + ", ".join(errors), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("prepare", "run", "merge", "report"))
    parser.add_argument("runs", nargs="*", type=Path, help="merge: the runs' gpu.json files, oldest first")
    parser.add_argument("--assets", type=Path, default=REPO / ".gpu")
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results")
    parser.add_argument("--only", help="comma-separated steps: encode (encode-minilm: its MiniLM half), precision, "
                                       "flow, search, filtered, builds, batch, stream, stream-flat, hybrid")
    parser.add_argument("--smoke", action="store_true", help="run every step on the CPU at small sizes")
    args = parser.parse_args()
    if args.smoke:
        global PASSAGES, ROWS, DEVICE, SPEED_DTYPE
        PASSAGES, ROWS, DEVICE, SPEED_DTYPE = 100, 5_000, "cpu", "fp32"
    if args.action == "prepare":
        prepare(args.assets, args.shared)
    elif args.action == "run":
        run(args.assets, args.out, set(args.only.split(",")) if args.only else None)
    elif args.action == "merge":  # several runs' gpu.json into one: a later run's step replaces an earlier one's
        merged = {"runs": [], "steps": {}, "superseded": {}}
        for path in args.runs:
            data = json.loads(path.read_text())
            if "runs" in data:  # an earlier merge: its runs, steps and superseded steps as they stand
                merged["runs"] += data["runs"]
                merged["steps"].update(data["steps"])
                merged["superseded"].update(data.get("superseded", {}))
                merged["environment"], merged["started"] = data["environment"], data["started"]
                continue
            merged["runs"].append({"started": data["started"], "environment": data["environment"],
                                   "steps": list(data["steps"])})
            for name, step in data["steps"].items():
                if name in merged["steps"]:
                    merged["superseded"][f"{name} (run of {merged['steps'][name]['run_started']})"] = \
                        merged["steps"][name]
                merged["steps"][name] = {**step, "run_started": data["started"]}
            merged["environment"], merged["started"] = data["environment"], data["started"]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu.json").write_text(json.dumps(merged, indent=1))
        (args.out / "gpu.md").write_text(markdown(merged))
    else:  # report: the markdown again from a gpu.json
        print(markdown(json.loads((args.out / "gpu.json").read_text())))


if __name__ == "__main__":
    main()
