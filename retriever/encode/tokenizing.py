"""Texts -> padded batches of token ids: the CPU's share of encoding, before the forward pass.

Kept free of torch and transformers so that the worker processes which tokenize ahead of a GPU (`TokenizerPool`)
start in a fraction of a second. On a GPU the forward passes outrun one Python thread's tokenizing, and a second
thread does not help: it holds the interpreter lock the thread feeding the GPU needs for every kernel launch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain

import numpy as np

from retriever.processes import spawn_context, start_worker

# Model inputs read straight off a fast tokenizer's encodings: input name -> Encoding field.
ENCODING_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids"}
# Texts per forward pass when none is asked for. A CPU gains nothing from larger batches, and ONNX Runtime encodes
# long texts faster in smaller ones (each pads to its longest; benchmarks/results/README.md, "Documents on the
# fastest runtime"); a GPU at 64 spends its time launching kernels for small matrices (benchmarks/results/gpu.md,
# "The encoder's batch size"). A GPU that lacks the memory for a batch encodes it in halves
# (`Encoder._forward_in_memory`).
CPU_BATCH_SIZE = 64
ONNX_CPU_BATCH_SIZE = 32
GPU_BATCH_SIZE = 512
# Tokenize this many texts at a time: bounds memory on big corpora while sorting still removes most padding. Every
# encoder of texts (`Encoder`, `QueryKitEncoder`) pads in batches within chunks of this many, so the same texts make
# the same batches, and so the same vectors to the last bit, whichever encodes them.
TOKENIZE_CHUNK = 16384


@dataclass(frozen=True)
class TokenizerSettings:
    max_length: int
    truncation_side: str  # "right" or "left", as the model's tokenizer says
    batch_size: int
    input_names: tuple[str, ...]  # the model's inputs besides attention_mask
    pad_id: int


@dataclass
class TokenizedBatch:
    rows: np.ndarray  # positions in the chunk's texts
    inputs: dict[str, np.ndarray]  # int64 (batch, width) per model input, padded
    attention_mask: np.ndarray  # int64 (batch, width): 1 for real tokens


@dataclass
class TokenizedTexts:
    """Texts ready for the device: their padded batches and how many texts were cut at max_length."""
    texts: list[str]
    truncated: int
    batches: list[TokenizedBatch]


def backend_tokens(backend, texts: list[str], settings: TokenizerSettings) -> tuple[dict[str, list[list[int]]], int]:
    """Each text's token ids per model input (special tokens added, cut at max_length), and how many were cut,
    from a fast tokenizer's Rust BACKEND with the truncation `tokenizer(texts, truncation=True, max_length=...)`
    sets: the same ids, without building a Python dict per text (a third of the time)."""
    backend.enable_truncation(settings.max_length, strategy="longest_first", direction=settings.truncation_side)
    backend.no_padding()
    encodings = backend.encode_batch(texts)
    tokens = {name: [getattr(encoding, ENCODING_FIELDS[name]) for encoding in encodings]
              for name in ("input_ids", *settings.input_names)}
    return tokens, sum(1 for encoding in encodings if encoding.overflowing)


def padded_batches(texts: list[str], tokens: dict[str, list[list[int]]], truncated: int,
                   settings: TokenizerSettings) -> TokenizedTexts:
    """TEXTS' TOKENS cut into padded batches of similar length (sorted by length, so each batch pads little),
    longest first (peak memory shows up at once)."""
    if not texts:
        return TokenizedTexts(texts, truncated, [])
    lengths = np.fromiter(map(len, tokens["input_ids"]), dtype=np.int64, count=len(texts))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    # Every text's tokens in one flat array: a batch is then padded by one gather, not a Python loop per row.
    flat = {name: np.fromiter(chain.from_iterable(tokens[name]), dtype=np.int64, count=int(lengths.sum()))
            for name in settings.input_names}
    order = np.argsort(-lengths, kind="stable")
    batches = []
    for batch_start in range(0, len(order), settings.batch_size):
        rows = order[batch_start : batch_start + settings.batch_size]
        width = int(lengths[rows[0]])
        mask = np.arange(width) < lengths[rows, None]
        # Padding positions read the text's first token (any valid index), then are overwritten.
        gather = np.where(mask, offsets[rows, None] + np.arange(width), offsets[rows, None])
        inputs = {}
        for name, ids in flat.items():
            padded = ids[gather]
            padded[~mask] = settings.pad_id if name == "input_ids" else 0
            inputs[name] = padded
        batches.append(TokenizedBatch(rows, inputs, mask.astype(np.int64)))
    return TokenizedTexts(texts, truncated, batches)


class Prefetched:
    """FUNCTION applied to each item of ITEMS on a worker thread, AHEAD items ahead of the consumer. An error in
    the worker is raised in the consumer; a consumer that stops early stops the worker."""

    def __init__(self, function: Callable, items: Iterable, ahead: int = 1):
        self._function, self._items = function, iter(items)
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="retriever-tokenize", daemon=True)

    def _work(self) -> None:
        try:
            for item in self._items:
                if not self._put((True, self._function(item))):
                    return
        except BaseException as error:  # noqa: BLE001 -- handed to the consumer, which raises it
            self._put((False, error))
            return
        self._put(None)

    def _put(self, entry) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __enter__(self) -> Iterator:
        self._thread.start()
        return self._results()

    def _results(self) -> Iterator:
        while (entry := self._queue.get()) is not None:
            ok, value = entry
            if not ok:
                raise value
            yield value

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class TokenizerPool:
    """Worker processes, each with its own copy of a fast tokenizer, that turn chunks of texts into
    `TokenizedTexts`. `submit(texts)` returns a Future."""

    def __init__(self, backend, settings: TokenizerSettings, workers: int):
        self.workers = workers
        self._executor = ProcessPoolExecutor(workers, mp_context=spawn_context(), initializer=_start_worker,
                                             initargs=(backend.to_str(), settings))

    def submit(self, texts) -> Future:
        return self._executor.submit(_tokenize_in_worker, list(texts))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


_worker: tuple | None = None  # (backend, settings) in a worker process


def _start_worker(tokenizer_json: str, settings: TokenizerSettings) -> None:
    from tokenizers import Tokenizer

    global _worker
    start_worker()
    _worker = (Tokenizer.from_str(tokenizer_json), settings)


def _tokenize_in_worker(texts: list[str]) -> TokenizedTexts:
    backend, settings = _worker
    tokens, truncated = backend_tokens(backend, texts, settings)
    return padded_batches(texts, tokens, truncated, settings)
