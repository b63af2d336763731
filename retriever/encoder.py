"""Text -> sentence vectors with a frozen transformer. The one encode path used by build, search and bench.

Texts are tokenized in chunks, sorted by token length so each batch pads to a similar length (this is what makes
batching cheap), run under `torch.inference_mode`, pooled, and put back in input order.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from retriever.device import resolve_device
from retriever.errors import RetrieverError, param
from retriever.models import load_model
from retriever.pooling import Pooling
from retriever.progress import progress_bar
from retriever.runtimes import RUNTIMES, resolve_runtime

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Tokenize this many texts at a time: bounds memory on big corpora while sorting still removes most padding.
TOKENIZE_CHUNK = 16384


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
        batch_size: int = 64,
        runtime: str = "torch",
        cap_max_length: bool = False,
    ):
        """CAP_MAX_LENGTH: take a MAX_LENGTH above the model's positions as the model's limit instead of refusing it
        (for settings recorded before the limit was checked, see `from_config`)."""
        if dtype not in DTYPES:
            raise RetrieverError(f"unknown dtype '{dtype}'; choose one of {', '.join(DTYPES)}", parameter="dtype")
        if batch_size < 1:
            raise RetrieverError(f"{param('batch_size')} must be at least 1 (got {batch_size})")
        if max_length is not None and max_length < 2:
            raise RetrieverError(f"{param('max_length')} must be at least 2 tokens (got {max_length})")
        self.pooling = Pooling.parse(pooling, layers)
        self.device = resolve_device(device)
        self.dtype = dtype
        self.batch_size = batch_size
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
        # A fast tokenizer is not safe to call from two threads at once ("Already borrowed"); the model's forward
        # pass is. The server encodes searches and writes on different threads, so tokenizing takes turns.
        self._tokenizer_lock = threading.Lock()
        # Where the forward pass runs (`retriever.runtimes`): ONNX Runtime (float32, CPU) where asked for gives
        # the same numbers with less overhead per call.
        self.runtime = resolve_runtime(runtime, str(self.device), dtype)
        self._forward = RUNTIMES[self.runtime](self.model, self.pooling, self.num_hidden_layers, self._input_names,
                                               self.device)

    @classmethod
    def from_config(cls, config: dict, device: str | None = "auto", batch_size: int = 64,
                    runtime: str = "torch") -> Encoder:
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

    def encode(self, texts: Sequence[str], progress: bool = False, description: str = "Encoding") -> np.ndarray:
        return self.encode_counting_truncated(texts, progress, description)[0]

    def encode_counting_truncated(
        self, texts: Sequence[str], progress: bool = False, description: str = "Encoding"
    ) -> tuple[np.ndarray, int]:
        """Vectors (n, d) float32 in input order, and how many texts were cut at max_length."""
        texts = list(texts)
        output = np.empty((len(texts), self.dim), dtype=np.float32)
        truncated = 0
        with progress_bar(description, total=len(texts), enabled=progress) as advance:
            for start in range(0, len(texts), TOKENIZE_CHUNK):
                chunk = texts[start : start + TOKENIZE_CHUNK]
                with self._tokenizer_lock:
                    encoded = self.tokenizer(chunk, truncation=True, max_length=self.max_length)
                truncated += sum(1 for encoding in encoded.encodings if encoding.overflowing)
                lengths = np.fromiter((len(ids) for ids in encoded["input_ids"]), dtype=np.int64, count=len(chunk))
                order = np.argsort(-lengths, kind="stable")  # longest first: peak memory shows up at once
                for batch_start in range(0, len(order), self.batch_size):
                    rows = order[batch_start : batch_start + self.batch_size]
                    output[start + rows] = self._encode_batch(encoded, rows, int(lengths[rows].max()))
                    advance(len(rows))
        return output, truncated

    def _encode_batch(self, encoded, rows: np.ndarray, width: int) -> np.ndarray:
        inputs = {}
        for name in self._input_names:
            pad_value = self._pad_id if name == "input_ids" else 0
            inputs[name] = _pad([encoded[name][row] for row in rows], width, pad_value)
        attention_mask = _pad([encoded["attention_mask"][row] for row in rows], width, 0)
        return self._forward(attention_mask, inputs)


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


def _pad(sequences: list[list[int]], width: int, value: int) -> np.ndarray:
    array = np.full((len(sequences), width), value, dtype=np.int64)
    for row, sequence in enumerate(sequences):
        array[row, : len(sequence)] = sequence
    return array
