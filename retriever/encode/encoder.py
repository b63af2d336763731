"""Text -> sentence vectors with a frozen transformer. The one encode path used by build, search and bench.

Texts are tokenized in chunks, sorted by token length so each batch pads to a similar length (this is what makes
batching cheap), run under `torch.inference_mode`, pooled, and put back in input order.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from retriever.encode.device import resolve_device
from retriever.errors import RetrieverError, param
from retriever.encode.models import load_model
from retriever.encode.pooling import Pooling
from retriever.progress import progress_bar
from retriever.encode.runtimes import RUNTIMES, resolve_runtime
from retriever.encode.query_kit import keep_kit
from retriever.encode.tokenizing import (
    CPU_BATCH_SIZE,
    ENCODING_FIELDS,
    GPU_BATCH_SIZE,
    ONNX_CPU_BATCH_SIZE,
    TOKENIZE_CHUNK,
    Prefetched,
    TokenizedBatch,
    TokenizedTexts,
    TokenizerPool,
    TokenizerSettings,
    backend_tokens,
    padded_batches,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Encoder:
    """A frozen Hugging Face encoder with a pooling mode. `encode(texts)` gives float32 (n, d)."""

    def __init__(
        self,
        model: str | None = None,
        pooling: str | None = "last-avg",
        layers: str | Sequence[int] | None = None,
        max_length: int | None = None,
        device: str | None = "auto",
        dtype: str = "fp32",
        batch_size: int | None = None,
        runtime: str = "auto",
        cap_max_length: bool = False,
    ):
        """BATCH_SIZE: texts per forward pass; None: `default_batch_size` for the device. RUNTIME: where the
        forward pass runs (`retriever.encode.runtimes`; auto: ONNX Runtime on a CPU in float32, PyTorch elsewhere
        or where the model cannot be exported). CAP_MAX_LENGTH: take a MAX_LENGTH above the model's positions as
        the model's limit instead of refusing it (for settings recorded before the limit was checked, see
        `from_config`)."""
        if dtype not in DTYPES:
            raise RetrieverError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}", parameter="dtype")
        if batch_size is not None and batch_size < 1:
            raise RetrieverError(f"{param('batch_size')} must be at least 1 (got {batch_size})")
        if max_length is not None and max_length < 2:
            raise RetrieverError(f"{param('max_length')} must be at least 2 tokens (got {max_length})")
        self.pooling = Pooling.parse(pooling, layers)
        self.device = resolve_device(device)
        self.dtype = dtype
        # Where the forward pass runs (`retriever.encode.runtimes`): ONNX Runtime (float32, CPU) gives the same
        # numbers with less overhead per call and faster kernels for a batch (benchmarks/results/README.md,
        # "Documents on the fastest runtime"); auto falls back to PyTorch for a model it cannot export (below).
        self.runtime = resolve_runtime(runtime, str(self.device), dtype)
        loaded = load_model(model)
        self.model_name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.model = loaded.model.to(self.device, DTYPES[dtype])
        self.max_length = _checked_max_length(max_length, loaded.max_length, self.model, loaded.name, cap_max_length)
        self.num_hidden_layers = self.model.config.num_hidden_layers
        deepest = max(self.pooling.layer_indices(self.num_hidden_layers))  # validates the layers against this model
        self.layers_run = _drop_unused_layers(self.model, deepest)
        self.dim = self.model.config.hidden_size
        self._input_names = [name for name in self.tokenizer.model_input_names if name != "attention_mask"]
        self._pad_id = self.tokenizer.pad_token_id or 0
        self._direct_inputs = set(self._input_names) <= set(ENCODING_FIELDS)
        # Processes tokenizing ahead of a GPU (`encode_chunks`), started by the first encode of several chunks.
        self.tokenizer_workers = tokenizer_workers(self.device)
        self._pool: TokenizerPool | None = None
        # A fast tokenizer is not safe to call from two threads at once ("Already borrowed"); the model's forward
        # pass is. The server encodes searches and writes on different threads, so tokenizing takes turns.
        self._tokenizer_lock = threading.Lock()
        self._rows_that_fit = sys.maxsize  # below the smallest batch the GPU had no memory for
        try:
            self._forward = RUNTIMES[self.runtime](self.model, self.pooling, self.num_hidden_layers,
                                                   self._input_names, self.device)
        except Exception:  # noqa: BLE001 - under auto, whatever keeps ONNX Runtime from taking the model
            if runtime != "auto" or self.runtime == "torch":
                raise
            self.runtime = "torch"
            self._forward = RUNTIMES["torch"](self.model, self.pooling, self.num_hidden_layers, self._input_names,
                                              self.device)
        # The batch size suits the runtime that runs (PyTorch where auto fell back).
        self.batch_size = batch_size or default_batch_size(self.device, self.runtime)
        self._settings = TokenizerSettings(self.max_length, self.tokenizer.truncation_side, self.batch_size,
                                           tuple(self._input_names), self._pad_id)

    @classmethod
    def from_config(cls, config: dict, device: str | None = "auto", batch_size: int | None = None,
                    runtime: str = "auto") -> Encoder:
        """Rebuild the exact encoder recorded in an index manifest or a benchmark result.

        A recorded max_length above the model's positions (an index built before that was refused) is capped at
        them: that build could encode no longer text, so every vector it made is reproduced."""
        return cls(
            model=config["model"],
            pooling=config["pooling"],
            layers=config.get("layers"),
            max_length=config["max_length"],
            device=device,
            dtype=config.get("dtype", "fp32"),
            batch_size=batch_size,
            runtime=runtime,
            cap_max_length=True,
        )

    def config(self) -> dict:
        return {
            "model": self.model_name,
            "pooling": self.pooling.mode,
            "layers": list(self.pooling.layers) if self.pooling.layers else None,
            "max_length": self.max_length,
            "dtype": self.dtype,
            "dim": self.dim,
        }

    def keep_query_kit(self, record: dict) -> None:
        """On ONNX Runtime with a kept graph, leave what another process needs to encode this encoder's queries
        without loading it (`query_kit`; RECORD: the encoder's manifest record, the kit's key). Only at the
        runtime's default batch size: the kit is the default encoder's (a build or write at another batch size
        loads the model, `model_card.kit_opener`, and would otherwise replace the kit every other run)."""
        graph = getattr(self._forward, "graph_path", None)
        default = self.batch_size == default_batch_size(self.device, self.runtime)
        if graph is not None and self._direct_inputs and default:
            with self._tokenizer_lock:
                tokenizer_json = self.tokenizer.backend_tokenizer.to_str()
            keep_kit(record, graph, tokenizer_json, self._settings, self.dim)

    def encode(self, texts: Sequence[str], progress: bool = False, description: str = "Encoding") -> np.ndarray:
        return self.encode_counting_truncated(texts, progress, description)[0]

    def encode_counting_truncated(
        self, texts: Sequence[str], progress: bool = False, description: str = "Encoding"
    ) -> tuple[np.ndarray, int]:
        """Vectors (n, d) float32 in input order, and how many texts were cut at max_length."""
        texts = list(texts)
        output = np.empty((len(texts), self.dim), dtype=np.float32)
        truncated, start = 0, 0
        chunks = [texts[first : first + TOKENIZE_CHUNK] for first in range(0, len(texts), TOKENIZE_CHUNK)]
        with progress_bar(description, total=len(texts), enabled=progress) as advance:
            if len(chunks) == 1:  # a query or a small batch: no second thread to start
                tokenized = self.tokenize(chunks[0])
                return self.encode_tokenized(tokenized, advance), tokenized.truncated
            for vectors, chunk_truncated in self.encode_chunks(chunks, on_batch=advance):
                output[start : start + len(vectors)] = vectors
                start += len(vectors)
                truncated += chunk_truncated
        return output, truncated

    def encode_chunks(self, chunks: Iterable[Sequence[str]],
                      on_batch: Callable[[int], None] | None = None) -> Iterator[tuple[np.ndarray, int]]:
        """(vectors, truncated) for each chunk of texts, in order. The next chunk is read from CHUNKS and tokenized
        on a second thread while the device encodes this one, so the CPU's share (reading, tokenizing, padding)
        overlaps the forward passes instead of adding to them; on a GPU, worker processes tokenize
        (`tokenizer_workers`). ON_BATCH(rows) after each batch."""
        pool = self._tokenizer_pool()
        if pool is None:
            with Prefetched(self.tokenize, chunks) as tokenized_chunks:
                for tokenized in tokenized_chunks:
                    yield self.encode_tokenized(tokenized, on_batch), tokenized.truncated
            return
        # A GPU: the thread only reads chunks and hands them to the worker processes, several chunks ahead.
        with Prefetched(pool.submit, chunks, ahead=pool.workers) as futures:
            for future in futures:
                tokenized = future.result()
                yield self.encode_tokenized(tokenized, on_batch), tokenized.truncated

    def close(self) -> None:
        """Stop the tokenizing processes, if any ran (they also stop when the encoder is garbage-collected)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _tokenizer_pool(self) -> TokenizerPool | None:
        if self._pool is not None and self._pool.workers != self.tokenizer_workers:
            self.close()
        if not self.tokenizer_workers or not self._direct_inputs:
            return None
        if self._pool is None:
            self._pool = TokenizerPool(self.tokenizer.backend_tokenizer, self._settings, self.tokenizer_workers)
            weakref.finalize(self, self._pool.close)
        return self._pool

    def tokenize(self, texts: Sequence[str]) -> TokenizedTexts:
        """TEXTS tokenized (cut at max_length) and cut into padded batches of similar length, longest first."""
        texts = list(texts)
        with self._tokenizer_lock:
            if self._direct_inputs:
                tokens, truncated = backend_tokens(self.tokenizer.backend_tokenizer, texts, self._settings)
            else:  # inputs the Rust encodings do not hold: the tokenizer's own call
                encoded = self.tokenizer(texts, truncation=True, max_length=self.max_length)
                tokens = {name: encoded[name] for name in ("input_ids", *self._input_names)}
                truncated = sum(1 for encoding in encoded.encodings if encoding.overflowing)
        return padded_batches(texts, tokens, truncated, self._settings)

    def encode_tokenized(self, tokenized: TokenizedTexts,
                         on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """Vectors (n, d) float32 for TOKENIZED's texts, in their order. On a GPU the batches' vectors stay there
        until the last batch is queued, then come back in one copy: no wait for the device per batch."""
        output = np.empty((len(tokenized.texts), self.dim), dtype=np.float32)
        pending_rows, pending = [], []
        for batch in tokenized.batches:
            vectors = self._forward_in_memory(batch)
            if isinstance(vectors, np.ndarray):
                output[batch.rows] = vectors
            else:
                pending_rows.append(batch.rows)
                pending.append(vectors)
            if on_batch is not None:
                on_batch(len(batch.rows))
        if pending:
            output[np.concatenate(pending_rows)] = torch.cat(pending).cpu().numpy()
        return output

    def _forward_in_memory(self, batch: TokenizedBatch) -> np.ndarray | torch.Tensor:
        """BATCH's vectors, row for row. A batch the GPU has no memory for is encoded in halves, and each half the
        same way, down to one text: the default batch size assumes memory that a small card, a large model or a long
        max_length may lack, and a build should slow down there, not fail. A size that failed is not tried again:
        later batches are split below it from the start (a chunk's batches come longest first, so the first to fail
        is among the widest)."""
        rows = len(batch.rows)
        if rows <= self._rows_that_fit:
            try:
                return self._forward(batch.attention_mask, batch.inputs)
            except torch.cuda.OutOfMemoryError:
                if rows == 1:
                    raise
                self._rows_that_fit = rows - 1
            torch.cuda.empty_cache()  # outside the handler: the error's traceback no longer holds the failed tensors
        half = rows // 2
        parts = [self._forward_in_memory(TokenizedBatch(batch.rows[part], {name: values[part] for name, values in
                                                                           batch.inputs.items()},
                                                        batch.attention_mask[part]))
                 for part in (slice(None, half), slice(half, None))]
        return np.concatenate(parts) if isinstance(parts[0], np.ndarray) else torch.cat(parts)


def default_batch_size(device: torch.device, runtime: str = "torch") -> int:
    """Texts per forward pass on DEVICE, the forward pass on RUNTIME, when none is asked for."""
    if device.type == "cuda":
        return GPU_BATCH_SIZE
    return ONNX_CPU_BATCH_SIZE if runtime == "onnx" else CPU_BATCH_SIZE


TOKENIZER_WORKERS_ENV = "RETRIEVER_TOKENIZER_WORKERS"


def tokenizer_workers(device: torch.device) -> int:
    """Tokenizing processes for an encoder on DEVICE: on a GPU a quarter of the cores (at most 8); none on a CPU,
    where the forward pass is the bottleneck and takes every core; $RETRIEVER_TOKENIZER_WORKERS, where set."""
    asked = os.environ.get(TOKENIZER_WORKERS_ENV, "").strip()
    if asked:
        if not asked.isdigit():
            raise RetrieverError(f"${TOKENIZER_WORKERS_ENV} must be a number of processes (0: none), not '{asked}'")
        return int(asked)
    if device.type != "cuda":
        return 0
    return max(1, min(8, (os.cpu_count() or 1) // 4))


def model_positions(model) -> int | None:
    """The longest input MODEL's position embeddings take, in tokens; None when it has no absolute positions.

    RoBERTa-style models (RoBERTa, XLM-R, MPNet...) count positions from padding_idx + 1, so of mpnet's 514
    position embeddings 512 are usable; BERT's start at 0."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(positions, int) or positions <= 0:
        return None
    padding_idx = getattr(getattr(model, "embeddings", None), "padding_idx", None)
    return positions - (padding_idx + 1 if isinstance(padding_idx, int) else 0)


def _checked_max_length(asked: int | None, default: int, model, name: str, cap: bool) -> int:
    """The tokens per text to keep: ASKED, else the model's DEFAULT, never more than its positions. A longer
    --max-length is refused (not clamped): it would only fail later, inside a batch, on the first long text."""
    limit = model_positions(model)
    if limit is None:
        return asked or default
    if asked is not None and asked > limit and not cap:
        raise RetrieverError(f"{param('max_length')} {asked:,} is more than model '{name}' takes: at most "
                             f"{limit} tokens")
    return min(asked or default, limit)


def _drop_unused_layers(model, deepest: int) -> int:
    """Run only the transformer layers up to DEEPEST: with `--layers 0` the pooled vector depends on the embedding
    output alone, and later layers cannot change earlier hidden states, so skipping them changes no number and
    saves their time. Applies to encoders that keep their layers in `encoder.layer` (BERT, MPNet, RoBERTa...);
    returns how many layers run.

    The list is cut in place: transformers records hidden states through hooks on these very modules, and it
    reports the embedding output only as the first layer's input, so one layer always stays."""
    layers = getattr(getattr(model, "encoder", None), "layer", None)
    if not isinstance(layers, torch.nn.ModuleList):
        return model.config.num_hidden_layers
    keep = max(deepest, 1)
    if keep < len(layers):
        del layers[keep:]
    return len(layers)
