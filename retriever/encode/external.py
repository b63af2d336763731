"""An encoder that is not ours: vectors computed outside the index (a framework's embedding model, a service),
recorded as such in the manifest.

    encoder = ExternalEncoder("DeterministicFakeEmbedding", 6, embed=lambda texts: model.embed_documents(texts))
    Index.build(records, "notes", vectors=vectors, encoder=encoder)

The index is built and grown from the given vectors (`Index.build(..., vectors=...)`, `Index.add(..., vectors=...)`)
and searched with given query vectors (`Index.search(..., vectors=...)`): no model of ours is loaded, and the
manifest says whose vectors they are (`model` "external:NAME", `external` true), so a later reader of the index is
told to bring query vectors rather than to load a model that does not exist. EMBED, where there is one, encodes
texts the build itself needs (auto's pseudo-queries); without it the build makes none, and auto keeps the raw
vectors, as it does for any corpus it cannot check.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from retriever.errors import RetrieverError

PREFIX = "external:"


class ExternalEncoder:
    """Vectors of DIM dimensions from NAME, computed outside the index; EMBED(texts) -> (n, DIM), if given,
    encodes texts."""

    def __init__(self, name: str, dim: int, embed: Callable[[Sequence[str]], object] | None = None):
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise RetrieverError(f"an embedding dimension must be a whole number from 1 (got {dim!r})")
        self.model_name = PREFIX + name
        self.dim = dim
        self._embed = embed

    @property
    def encodes_text(self) -> bool:
        return self._embed is not None

    def config(self) -> dict:
        # The manifest's encoder record: its fields as `Encoder.config()` has them, marked external.
        return {"model": self.model_name, "pooling": "external", "layers": None, "max_length": 0, "dtype": "fp32",
                "dim": self.dim, "external": True}

    def encode(self, texts: Sequence[str], progress: bool = False, description: str = "Encoding") -> np.ndarray:
        if self._embed is None:
            raise RetrieverError(f"vectors come from {self.model_name[len(PREFIX):]}, outside this index: give them "
                                 "(query vectors to search with, document vectors to add)")
        if not texts:
            return np.empty((0, self.dim), np.float32)
        vectors = np.asarray(self._embed(list(texts)), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape != (len(texts), self.dim):
            raise RetrieverError(f"{self.model_name[len(PREFIX):]} gave vectors of shape {vectors.shape} for "
                                 f"{len(texts)} texts; expected ({len(texts)}, {self.dim})")
        return vectors

    def close(self) -> None:
        """Nothing is held here (the caller owns the model)."""


def is_external(record: dict) -> bool:
    """Whether an index's encoder record (its manifest's) names vectors computed outside it."""
    return bool(record.get("external"))
