"""On-disk cache of encoded sentences, so re-runs and calibrator comparisons encode each sentence once.

``CachedEncoder(encoder, folder)`` has the encoder's ``encode(texts)`` and encodes only texts it has not seen
for this exact encoder. Vectors live under ``<cache dir>/<encoder key>/``:

- ``encoder.json``: what the key stands for (encoder settings and the model folder's identity), for people;
- ``shard-<random>.npz``: ``keys`` (hex sha256 of each text, 32 chars) and ``vectors`` (float32, one row each).

The encoder key hashes everything that changes a vector: pooling/layers, max_length, dtype and the model's
identity (its folder path plus a hash of its small files and the size and mtime of its weights; for a hub id,
the id, commit and config). A shard is written to a temporary file and renamed into place, so an interrupted
run leaves whole shards or none, and concurrent runs never write the same file.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError, param

CACHE_ENV_VAR = "RETRIEVER_CACHE"
DEFAULT_CACHE_DIR = Path("~/.cache/retriever/embeddings")
# Model files smaller than this are hashed by content (configs, vocabularies, tokenizers); larger ones (weights)
# by size and modification time, which catches a rewrite without reading hundreds of MB on every run.
_HASH_CONTENT_BELOW = 8 * 1024 * 1024


def resolve_cache_dir(explicit: str | os.PathLike | None = None) -> Path:
    """``explicit``, else $RETRIEVER_CACHE, else ~/.cache/retriever/embeddings."""
    if explicit is not None:
        return Path(explicit).expanduser()
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    return DEFAULT_CACHE_DIR.expanduser()


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def model_identity(encoder) -> dict:
    """What distinguishes this model's weights and tokenizer from any other model's."""
    from retriever.encode.models import resolve_model_path

    path = Path(resolve_model_path(encoder.model_name))
    if not path.is_dir():  # a hub id, loaded through the transformers cache
        config = encoder.model.config
        return {
            "hub_id": str(path),
            "commit": getattr(config, "_commit_hash", None),
            "config_sha256": hashlib.sha256(config.to_json_string().encode()).hexdigest(),
        }
    files = {}
    for file in sorted(path.iterdir()):
        if not file.is_file():
            continue
        stat = file.stat()
        if stat.st_size < _HASH_CONTENT_BELOW:
            files[file.name] = hashlib.sha256(file.read_bytes()).hexdigest()
        else:
            files[file.name] = f"size={stat.st_size} mtime_ns={stat.st_mtime_ns}"
    return {"folder": str(path.resolve()), "files": files}


def encoder_description(encoder) -> dict:
    """Every setting that changes a vector. The model's given name is left out: its identity says more."""
    settings = {key: value for key, value in encoder.config().items() if key != "model"}
    return {**settings, "identity": model_identity(encoder)}


def encoder_key(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:24]


class CachedEncoder:
    """An ``Encoder`` whose ``encode`` reuses vectors already computed, in memory and (with a folder) on disk.

    ``folder=None`` keeps the cache in memory only: a run still encodes each sentence once.
    ``hits`` and ``encoded`` count texts served from the cache and texts sent to the encoder.
    """

    def __init__(self, encoder, folder: str | os.PathLike | None = None):
        self.encoder = encoder
        self.dim = encoder.dim
        self.folder: Path | None = None
        self.hits = 0
        self.encoded = 0
        self._vectors: dict[str, np.ndarray] = {}
        if folder is not None:
            description = encoder_description(encoder)
            self.folder = Path(folder) / encoder_key(description)
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                if not (self.folder / "encoder.json").is_file():
                    _write_atomically(self.folder / "encoder.json", (json.dumps(description, indent=2) + "\n").encode())
            except OSError as error:
                raise RetrieverError(
                    f"cannot write the embedding cache in {folder} ({error.strerror or error}); "
                    f"pass another {param('folder')} or {param('folder', None)}"
                ) from None
            self._load_shards()

    def __getattr__(self, name: str):
        # Everything else (config(), model_name, max_length, ...) is the wrapped encoder's, so a cached encoder can
        # stand in for it, e.g. as `Index.build(encoder=...)`, whose pseudo-queries then come from the cache too.
        if name == "encoder":  # not set yet: unpickling or a failed __init__
            raise AttributeError(name)
        return getattr(self.encoder, name)

    def encode(self, texts: Sequence[str], progress: bool = False, description: str = "Encoding") -> np.ndarray:
        keys = [text_key(text) for text in texts]
        missing = {key: text for key, text in zip(keys, texts) if key not in self._vectors}
        self.hits += len(texts) - sum(1 for key in keys if key in missing)
        if missing:
            vectors = self.encoder.encode(list(missing.values()), progress=progress, description=description)
            self.encoded += len(missing)
            self._vectors.update(zip(missing, vectors))
            if self.folder is not None:
                self._write_shard(list(missing), vectors)
        if not keys:
            return np.empty((0, self.dim), dtype=np.float32)
        return np.stack([self._vectors[key] for key in keys])

    def _load_shards(self) -> None:
        for shard in sorted(self.folder.glob("shard-*.npz")):
            try:
                with np.load(shard) as stored:
                    keys, vectors = stored["keys"], stored["vectors"]
            except (OSError, ValueError, KeyError):
                continue  # unreadable (e.g. written by a crashed disk): ignore it, its texts are encoded again
            if vectors.ndim == 2 and vectors.shape == (len(keys), self.dim):
                self._vectors.update(zip(keys.tolist(), vectors))

    def _write_shard(self, keys: list[str], vectors: np.ndarray) -> None:
        path = self.folder / f"shard-{uuid.uuid4().hex}.npz"
        temporary = path.with_name(f".{path.name}.tmp")
        with open(temporary, "wb") as file:  # a file object stops numpy from renaming it to .tmp.npz
            np.savez(file, keys=np.array(keys, dtype="U32"), vectors=np.asarray(vectors, dtype=np.float32))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
