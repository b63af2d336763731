"""What kind of FAISS index a version holds (`IndexSpec`, recorded in the manifest), what each type is
(`IndexKind`), and which type a corpus gets when it asks for "auto" (`choose_spec`).

- ``flat``: exact search over float32 vectors, 4 x dim bytes per vector.
- ``hnsw``: approximate graph search over float32 vectors, exact vectors kept.
- ``ivf``: IVF-Flat; the vectors are bucketed by a k-means quantizer and a search scans `nprobe` buckets.
- ``ivfpq``: IVF with product-quantized codes (``pq_m`` bytes per vector, optionally after an OPQ rotation): the
  index for corpora whose float vectors do not fit in memory. Scores are approximate; the index re-ranks the best
  candidates exactly from the stored vectors (`rerank`), which is what brings recall back.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields

from retriever.errors import RetrieverError, param


@dataclass(frozen=True)
class IndexKind:
    """What the code needs to know about one FAISS index type, so that adding a type is one entry here rather
    than a branch in every function that asks "which type is this?"."""

    name: str
    options: tuple[str, ...]  # the IndexSpec fields that matter for this type (what the manifest records)
    trained: bool = False  # segments start from one trained template (the IVF quantizer)
    graph: bool = False  # an HNSW graph: searched with a beam (ef_search)
    compressed: bool = False  # PQ codes: candidates re-ranked exactly from the raw vectors
    exact_vectors: bool = False  # holds the float vectors themselves (searchable exactly, by torch or on a GPU)


INDEX_KINDS: dict[str, IndexKind] = {kind.name: kind for kind in (
    IndexKind("flat", (), exact_vectors=True),
    IndexKind("hnsw", ("hnsw_m", "ef_construction", "ef_search"), graph=True, exact_vectors=True),
    IndexKind("ivf", ("nlist", "nprobe"), trained=True),
    IndexKind("ivfpq", ("nlist", "pq_m", "opq", "nprobe", "rerank"), trained=True, compressed=True),
)}
INDEX_TYPES = ("auto", *INDEX_KINDS)


def check_index_options(index_type: str, options: dict | None) -> None:
    """Refuse OPTIONS the INDEX_TYPE asked for does not take (--opq with flat): ignored, they would look applied.
    With auto the type follows the corpus's size, and an option of another type waits for the size that takes it."""
    kind = INDEX_KINDS.get(index_type)
    unused = sorted(set(options or {}) - set(kind.options)) if kind is not None else []
    if unused:
        raise RetrieverError(f"{param('index_type', index_type)} takes no {', '.join(unused)} (an option of "
                             "another index type)", parameter="index_options")
BACKENDS = ("auto", "faiss", "torch")

# `auto` keeps exact search up to this many documents, and takes the graph above: from here on an hnsw walk at the
# default settings answers a single query faster than a flat scan, at recall@10 >= 0.95, on every vector set and
# calibrator measured, 384- and 768-d (benchmarks/results/hnsw_crossover_cpu.md). Below, the two are about even
# and flat is exact and costs nothing to build.
FLAT_MAX_DOCUMENTS = 20_000
# Above it, `auto` takes hnsw while its float vectors and graph take at most this share of the machine's memory,
# else ivfpq. Not ivf: on calibrated (Gaussianized, isotropic) vectors k-means buckets separate neighbours poorly,
# so IVF needs a large share of its buckets scanned for recall@10 >= 0.95, while the hnsw graph reaches it at a
# small fraction of the cost of exact search (measured: benchmarks/results/scale.md).
MEMORY_SHARE = 0.25
# IVF training points per bucket (faiss warns below 39 and subsamples above 256).
TRAIN_PER_BUCKET = 64
# Search-time defaults (see IndexSpec): hnsw beam width, and how many times k ivfpq candidates are re-ranked.
# At 1M real calibrated vectors (M 32, efConstruction 40) ef_search 128 gives recall@10 0.92 and 256 gives 0.95.
DEFAULT_EF_SEARCH = 256
DEFAULT_RERANK = 10
# An hnsw walk at the default ef_search scores thousands of vectors per query (ef x M neighbours looked at), so
# below this many vectors an exact scan costs about the same, is exact, and takes nothing to build: segments
# this small (most `add`s) stay flat in an hnsw index until a compaction merges them into a graph.
SMALL_SEGMENT_ROWS = 10_000
def memory_bytes() -> int:
    """Physical memory of this machine (what `auto` plans against)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


@dataclass
class IndexSpec:
    """What kind of FAISS index a version holds, and its search-time defaults (recorded in the manifest)."""

    type: str = "flat"
    nlist: int | None = None  # ivf, ivfpq: number of k-means buckets
    pq_m: int | None = None  # ivfpq: bytes per vector (sub-quantizers of 8 bits)
    opq: bool = False  # ivfpq: learn a rotation that balances the sub-spaces before quantizing
    hnsw_m: int = 32  # hnsw: graph degree
    ef_construction: int = 40  # hnsw: beam width while building
    # Search-time settings the user pinned at build (None: the library's current default, `search_*` below,
    # so a better measured default reaches existing indexes too); each can be overridden per search.
    nprobe: int | None = None  # ivf, ivfpq: buckets scanned per query
    ef_search: int | None = None  # hnsw: beam width per query
    rerank: int | None = None  # ivfpq: re-rank this many times k candidates exactly

    def __post_init__(self) -> None:
        if self.type not in INDEX_KINDS:
            raise RetrieverError(f"unknown index type {self.type!r}; use one of {', '.join(INDEX_TYPES)}",
                                 parameter="index_type")
        if self.kind.trained:
            self.nlist = self.nlist or 1024
        if self.kind.compressed:
            self.pq_m = self.pq_m or 0  # 0: set from the dimension by `for_dim`
        if self.kind.graph and self.hnsw_m < 2:
            raise RetrieverError(f"hnsw M must be at least 2, got {self.hnsw_m}")
        for name in ("nlist", "nprobe", "ef_search", "rerank"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise RetrieverError(f"{param(name)} must be at least 1, got {value}")

    @property
    def kind(self) -> IndexKind:
        return INDEX_KINDS[self.type]

    @property
    def search_nprobe(self) -> int | None:
        return (self.nprobe or default_nprobe(self.nlist)) if self.nlist else None

    @property
    def search_ef(self) -> int | None:
        return (self.ef_search or DEFAULT_EF_SEARCH) if self.kind.graph else None

    def for_segment(self, rows: int) -> IndexSpec:
        """The spec of a segment of ROWS vectors in an index of this spec (see SMALL_SEGMENT_ROWS)."""
        return IndexSpec(type="flat") if self.kind.graph and rows < SMALL_SEGMENT_ROWS else self

    @property
    def search_rerank(self) -> int:
        return (self.rerank or DEFAULT_RERANK) if self.kind.compressed else 1

    @classmethod
    def from_dict(cls, record: dict) -> IndexSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in known})

    def to_dict(self) -> dict:
        """The settings that matter for this type and were set (what the manifest records)."""
        relevant = self.kind.options
        return {"type": self.type,
                **{key: value for key, value in asdict(self).items() if key in relevant and value is not None}}

    def search_settings(self) -> dict:
        """The search-time settings in effect: pinned at build, or the library's defaults."""
        settings = {"nprobe": self.search_nprobe, "ef_search": self.search_ef,
                    "rerank": self.search_rerank if self.kind.compressed else None}
        return {key: value for key, value in settings.items() if value is not None}

    def for_dim(self, dim: int) -> IndexSpec:
        """This spec with dimension-dependent settings filled in (pq_m: dim / 4, a divisor of dim)."""
        if self.kind.compressed and not self.pq_m:
            self.pq_m = max(m for m in range(1, max(1, dim // 4) + 1) if dim % m == 0)
        if self.kind.compressed and dim % self.pq_m:
            raise RetrieverError(f"pq_m {self.pq_m} must divide the dimension {dim}")
        return self

    def bytes_per_vector(self, dim: int) -> int:
        """Memory the index holds per vector: codes plus the 8-byte id."""
        if self.kind.compressed:
            return self.pq_m + 8
        graph = 2 * self.hnsw_m * 4 if self.kind.graph else 0  # level-0 links, the bulk of the graph
        return 4 * dim + 8 + graph


def default_nlist(documents: int) -> int:
    """Buckets for an IVF index: about sqrt(n), a power of two, within [16, 8192]: training k-means and assigning
    every vector to a bucket cost O(n x nlist) and dominate a CPU build."""
    return int(min(8192, max(16, 2 ** round(math.log2(math.sqrt(max(documents, 1)))))))


def default_nprobe(nlist: int) -> int:
    """Buckets scanned per query: nlist / 4 (at least 8). On calibrated vectors this is what recall@10 >= 0.95
    takes (measured on 1M real passages: benchmarks/results/scale.md)."""
    return min(nlist, max(8, nlist // 4))


def choose_spec(documents: int, dim: int, index_type: str = "auto", memory: int | None = None) -> IndexSpec:
    """The index for DOCUMENTS vectors of DIM dimensions: INDEX_TYPE, or for "auto" by corpus size and memory."""
    if index_type not in INDEX_TYPES:
        raise RetrieverError(f"unknown index type '{index_type}'; choose one of {', '.join(INDEX_TYPES)}",
                             parameter="index_type")
    if index_type == "auto":
        if documents <= FLAT_MAX_DOCUMENTS:
            index_type = "flat"
        elif documents * IndexSpec(type="hnsw").bytes_per_vector(dim) <= MEMORY_SHARE * (memory or memory_bytes()):
            index_type = "hnsw"
        else:
            index_type = "ivfpq"
    nlist = default_nlist(documents) if INDEX_KINDS[index_type].trained else None
    return IndexSpec(type=index_type, nlist=nlist).for_dim(dim)
