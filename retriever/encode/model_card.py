"""What an encoder will be, read from its model's files without loading it.

A build from precomputed vectors (`--vectors`) encodes nothing, unless it makes pseudo-queries or fits on example
queries; it still needs the encoder's record for the manifest (model, pooling, layers, max_length, dtype, dim) and
the dimension to check the vectors against. Loading the model for that costs seconds and hundreds of MB (torch,
transformers, the weights): here the same record comes from `config.json`, `sentence_bert_config.json` and
`tokenizer_config.json`, and `DeferredEncoder` loads the real encoder only when text is encoded, or encodes from the
query kit an earlier run of the same encoder left (`query_kit`) and loads nothing.

The record must equal what `Encoder(...).config()` gives (the tests compare them). Where the files do not say
enough to be sure (a model type whose position count is not known here, a hub name not in the local cache) there
is no card, and the encoder is loaded as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from retriever.errors import RetrieverError, param
from retriever.encode.models import DEFAULT_MODEL, MAX_LENGTH_CAP, resolve_model_path
from retriever.encode.pooling import Pooling

if TYPE_CHECKING:
    import numpy as np

    from retriever.encode.encoder import Encoder
    from retriever.encode.query_kit import QueryKitEncoder

# Model types whose usable positions are known from config.json alone: how many of max_position_embeddings the
# model's own embeddings leave usable (RoBERTa-style models count positions from padding_idx + 1, BERT's from 0;
# `retriever.encode.encoder.model_positions` reads the same off a loaded model).
_POSITIONS_OFFSET: dict[str, Callable[[dict], int]] = {
    "bert": lambda config: 0,
    "electra": lambda config: 0,
    "mpnet": lambda config: int(config.get("pad_token_id", 1)) + 1,
    "roberta": lambda config: int(config.get("pad_token_id", 1)) + 1,
    "xlm-roberta": lambda config: int(config.get("pad_token_id", 1)) + 1,
    "camembert": lambda config: int(config.get("pad_token_id", 1)) + 1,
}


@dataclass(frozen=True)
class ModelCard:
    """The facts about a model that an encoder's record depends on."""

    name: str  # what the user asked for, recorded in manifests
    hidden_size: int
    num_hidden_layers: int
    positions: int | None  # the longest input its position embeddings take; None: no absolute positions
    default_max_length: int  # sentence-transformers' max_seq_length, else the tokenizer's limit capped at 512

    @classmethod
    def read(cls, name: str | None) -> ModelCard | None:
        """The card of model NAME from its files, or None where they cannot say for sure."""
        folder = _model_folder(name)
        if folder is None or not (folder / "config.json").is_file():
            return None
        try:
            config = json.loads((folder / "config.json").read_text())
            offset = _POSITIONS_OFFSET.get(config.get("model_type", ""))
            if offset is None or "hidden_size" not in config or "num_hidden_layers" not in config:
                return None
            positions = config.get("max_position_embeddings")
            positions = positions - offset(config) if isinstance(positions, int) and positions > 0 else None
            # `models.model_max_length` reads sentence-transformers' setting from a local folder only (a hub id in
            # the cache is loaded by transformers, which does not read it).
            local = Path(resolve_model_path(name)).is_dir()
            return cls(name or DEFAULT_MODEL, int(config["hidden_size"]), int(config["num_hidden_layers"]),
                       positions, _default_max_length(folder, local))
        except (OSError, ValueError, TypeError):
            return None

    def encoder_config(self, pooling: str | None, layers: str | Sequence[int] | None, max_length: int | None,
                       dtype: str) -> dict:
        """What `Encoder(model, pooling, layers, max_length, dtype=dtype).config()` gives, with its refusals."""
        spec = Pooling.parse(pooling, layers)
        spec.layer_indices(self.num_hidden_layers)  # validates the layers against this model
        if max_length is not None and max_length < 2:
            raise RetrieverError(f"{param('max_length')} must be at least 2 tokens (got {max_length})")
        if self.positions is not None and max_length is not None and max_length > self.positions:
            raise RetrieverError(f"{param('max_length')} {max_length:,} is more than model '{self.name}' takes: at "
                                 f"most {self.positions} tokens")
        length = max_length or self.default_max_length
        return {
            "model": self.name,
            "pooling": spec.mode,
            "layers": list(spec.layers) if spec.layers else None,
            "max_length": length if self.positions is None else min(length, self.positions),
            "dtype": dtype,
            "dim": self.hidden_size,
        }


class DeferredEncoder:
    """An encoder known by its record, loaded on first encode. `dim`, `model_name`, `max_length` and `config()`
    answer from the model card; `encode`, `encode_chunks`, `encode_counting_truncated` and `tokenizer` load the
    encoder LOAD makes, check that its record is the card's, and go on with it. KIT: what opens the query kit kept
    for the record (`query_kit.QueryKitEncoder.open`, None where there is none), where the encoder LOAD makes would
    run on ONNX Runtime on the CPU: texts are then encoded from the kit, and passages cut with its tokenizer, the
    same vectors and passages without importing torch or transformers or loading the weights (seconds, where a
    build of a few hundred records or from precomputed vectors encodes in less than one)."""

    def __init__(self, record: dict, load: Callable[[], Encoder],
                 kit: Callable[[], QueryKitEncoder | None] | None = None):
        self._record = record
        self._load = load
        self._encoder: Encoder | None = None
        self._open_kit = kit
        self._kit: QueryKitEncoder | None = None
        self.dim: int = record["dim"]
        self.model_name: str = record["model"]
        self.max_length: int = record["max_length"]

    @property
    def loaded(self) -> bool:
        return self._encoder is not None

    def config(self) -> dict:
        return dict(self._record)

    def keep_query_kit(self, record: dict) -> None:
        """`Encoder.keep_query_kit`, where the encoder was loaded (nothing where it never had to be)."""
        if self._encoder is not None:
            self._encoder.keep_query_kit(record)

    def encoder(self) -> Encoder:
        if self._encoder is None:
            encoder = self._load()
            if encoder.config() != self._record:  # the card read the files wrong: never record what was not run
                raise RetrieverError(f"model '{self.model_name}': its files describe {self._record}, the loaded "
                                     f"encoder is {encoder.config()}")
            self._encoder = encoder
        return self._encoder

    def encode(self, texts: Sequence[str], progress: bool = False, description: str = "Encoding") -> np.ndarray:
        return self._texts_encoder().encode(texts, progress=progress, description=description)

    def encode_counting_truncated(self, texts: Sequence[str], progress: bool = False,
                                  description: str = "Encoding") -> tuple[np.ndarray, int]:
        return self._texts_encoder().encode_counting_truncated(texts, progress=progress, description=description)

    def _texts_encoder(self) -> Encoder | QueryKitEncoder:
        """What encodes a list of texts: the kit, where one is kept and the encoder is not loaded; else the encoder."""
        if self._open_kit is not None:  # looked for once
            self._kit, self._open_kit = self._open_kit(), None
        if self._kit is not None and self._encoder is None:
            return self._kit
        return self.encoder()

    def encode_chunks(self, chunks: Iterable[Sequence[str]], **options):
        return self._texts_encoder().encode_chunks(chunks, **options)

    @property
    def tokenizer(self):
        """The tokenizer passages are cut with (`passages.PassageCutter`): the kit's or the encoder's."""
        encoder = self._texts_encoder()
        return encoder.backend if encoder is self._kit else encoder.tokenizer

    def close(self) -> None:
        if self._encoder is not None:
            self._encoder.close()


def _model_folder(name: str | None) -> Path | None:
    """The folder holding model NAME's files: the folder itself, the default model's, or a hub name's snapshot in
    the local Hugging Face cache; None when it is in none of them."""
    path = resolve_model_path(name)
    if Path(path).is_dir():
        return Path(path)
    try:
        from huggingface_hub import try_to_load_from_cache  # light: no torch
        found = try_to_load_from_cache(path, "config.json")
    except Exception:  # an id huggingface_hub refuses: loading the model gives the one-line error
        return None
    return Path(found).parent if isinstance(found, str) else None


def _default_max_length(folder: Path, local: bool) -> int:
    """`retriever.encode.models.model_max_length` from the files: sentence-transformers' max_seq_length for a LOCAL
    folder, else the tokenizer's limit, its config's model_max_length (transformers' default when absent is
    unbounded, so the cap applies)."""
    st_config = folder / "sentence_bert_config.json"
    if local and st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    limit = None
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        limit = json.loads(tokenizer_config.read_text()).get("model_max_length")
    return int(min(limit or MAX_LENGTH_CAP, MAX_LENGTH_CAP))


def encoder_for(model: str | None, pooling: str | None = "last-avg", layers: str | Sequence[int] | None = None,
                max_length: int | None = None, device: str | None = "auto", dtype: str = "fp32",
                batch_size: int | None = None, runtime: str = "auto",
                deferred: bool = False) -> Encoder | DeferredEncoder:
    """The encoder these settings make (`Encoder`'s arguments). Where it would run on ONNX Runtime on the CPU and an
    earlier run kept its kit (`query_kit`), one that encodes from the kit and loads no model (`DeferredEncoder`: the
    same vectors, the same passages); else the encoder, loaded now. DEFERRED: where the model's files say its record
    (`ModelCard`), never load it now: on first encode (a build from precomputed vectors encodes only its
    pseudo-queries, if anything)."""

    def load() -> Encoder:
        from retriever.encode.encoder import Encoder

        return Encoder(model, pooling, layers, max_length, device, dtype, batch_size, runtime=runtime)

    card = ModelCard.read(model)
    if card is not None:
        record = card.encoder_config(pooling, layers, max_length, dtype)
        open_kit = kit_opener(record, device, runtime, batch_size)
        if deferred:
            return DeferredEncoder(record, load, kit=open_kit)
        if open_kit is not None and (kit := open_kit()) is not None:
            return DeferredEncoder(record, load, kit=lambda: kit)
    return load()


def kit_opener(record: dict, device: str | None, runtime: str,
               batch_size: int | None) -> Callable[[], QueryKitEncoder | None] | None:
    """What opens the kit kept for the encoder RECORD on DEVICE with RUNTIME, where that encoder would run on ONNX
    Runtime on the CPU (`query_kit.kit_may_serve`); None where it would not. A kit that does not fit the record at
    BATCH_SIZE (`kit_fits`) is not used."""
    from retriever.encode.query_kit import QueryKitEncoder, kit_may_serve

    if not kit_may_serve(record, device, runtime) or (batch_size is not None and batch_size < 1):
        return None  # (a batch size below 1 goes to the encoder, which refuses it in one line)

    def open_kit() -> QueryKitEncoder | None:
        kit = QueryKitEncoder.open(record)
        return kit if kit is not None and kit_fits(kit, record, batch_size) else None
    return open_kit


def kit_fits(kit: QueryKitEncoder, record: dict, batch_size: int | None = None) -> bool:
    """Whether KIT encodes as the encoder RECORD does at BATCH_SIZE (None: the runtime's default): the record is
    what a manifest will say was run, so the kit must be that encoder (a record from before max_length was capped at
    the model's positions names more than any kit reads), in the same batches (other batches, other last bits)."""
    from retriever.encode.tokenizing import ONNX_CPU_BATCH_SIZE

    return (kit.settings.batch_size, kit.dim, kit.max_length) == (
        batch_size or ONNX_CPU_BATCH_SIZE, record.get("dim"), record.get("max_length"))
