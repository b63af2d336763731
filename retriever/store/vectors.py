"""Vector store: a FAISS inner-product index of L2-normalized vectors keyed by int64 row ids.

Index types (`IndexSpec.type`), chosen per corpus by `choose_spec` when the type is "auto":

- ``flat``: exact search over float32 vectors (``IndexIDMap(IndexFlatIP)``), 4 x dim bytes per vector.
- ``hnsw``: approximate graph search over float32 vectors (``IndexIDMap(IndexHNSWFlat)``), exact vectors kept.
- ``ivf``: IVF-Flat; the vectors are bucketed by a k-means quantizer and a search scans `nprobe` buckets.
- ``ivfpq``: IVF with product-quantized codes (``pq_m`` bytes per vector, optionally after an OPQ rotation): the
  index for corpora whose float vectors do not fit in memory. Scores are approximate; the index re-ranks the best
  candidates exactly from the stored vectors (`rerank`), which is what brings recall back.

IVF types are trained once per index on a sample (`train_template`); every segment of the index starts from a
copy of that trained, empty template, so segments share buckets and codes and merge without retraining.

Stored indexes are immutable: deletions are filtered at search time (`exclude`, FAISS ID selectors, so a search
still returns k hits where k remain), and compaction writes a new store with `merged`. Loading maps the file
instead of reading it where FAISS can (flat and IVF), so opening a large index costs milliseconds.

Searching can run elsewhere; the first search builds a searcher for the chosen device and backend:

- ``faiss-cpu``: the index itself.
- ``faiss-gpu``: a flat index copied to the GPU, when the faiss build has GPU support.
- ``torch``: exact search as one matrix product + top-k, chunked over queries to bound memory. Used on CUDA for
  flat and hnsw when faiss has no GPU support (scoring every vector on a GPU is fast and exact). Also runs on
  CPU, which is how the tests check it against faiss.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np

from retriever.errors import RetrieverError, param

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)



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
# A filter's matches are scanned on several threads from this many per thread on (below, one thread is faster).
SCAN_PART_ROWS = 16_384
# faiss GPU k-selection handles at most this many results per query.
_FAISS_GPU_MAX_K = 2048
# Row norms further than this from 1 mean the caller forgot to normalize.
_NORM_TOLERANCE = 1e-3


def set_threads(threads: int | None = None) -> None:
    """Threads faiss uses; default: OMP_NUM_THREADS if set, else the CPUs this process may run on.

    faiss defaults to every core of the host, which oversubscribes containers and cgroup-limited machines.
    """
    if threads is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    faiss.omp_set_num_threads(max(1, threads))


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


def load_template(path: Path, spec: IndexSpec) -> faiss.Index:
    """A trained template saved by a build (`VectorStore(template, spec).save`), read into memory, to start new
    segments from."""
    return VectorStore.load(path, spec, device="cpu", mmap=False)._index


def train_template(spec: IndexSpec, sample: np.ndarray) -> faiss.Index | None:
    """The trained, empty index every segment of an ivf/ivfpq index starts from (None for flat and hnsw).

    SAMPLE holds calibrated, L2-normalized vectors; k-means wants 39 or more per bucket, so nlist shrinks to fit
    a small sample rather than train on too few points.
    """
    if not spec.kind.trained:
        return None
    set_threads()
    n, dim = sample.shape
    spec.nlist = max(1, min(spec.nlist, n // 39))
    if spec.nprobe:
        spec.nprobe = min(spec.nprobe, spec.nlist)
    # k-means learns nothing more from over TRAIN_PER_BUCKET points a bucket, only slower.
    step = max(1, n // (TRAIN_PER_BUCKET * spec.nlist))
    sample = np.ascontiguousarray(sample[::step], dtype=np.float32)
    if not spec.kind.compressed:
        description = f"IVF{spec.nlist},Flat"
    else:
        spec.for_dim(dim)
        # "np": no polysemous training. It reorders the codes so that Hamming distances between them mean
        # something, for a polysemous search this store never runs; it took 13 of 14 s of a 5,000-vector training.
        description = f"{'OPQ%d,' % spec.pq_m if spec.opq else ''}IVF{spec.nlist},PQ{spec.pq_m}np"
    index = faiss.index_factory(dim, description, faiss.METRIC_INNER_PRODUCT)
    index.train(sample)
    return index


class VectorStore:
    def __init__(self, index: faiss.Index, spec: IndexSpec, device: str = "auto", backend: str = "auto",
                 fp16: bool = False):
        """Wrap INDEX; DEVICE ("auto", "cpu", "cuda", "cuda:N") and BACKEND say where searches run."""
        if backend not in BACKENDS:
            raise RetrieverError(f"unknown search backend {backend!r}; use one of {', '.join(BACKENDS)}")
        self._index = index
        self.spec = spec
        self._ivf = faiss.extract_index_ivf(index) if spec.kind.trained else None
        self._gpu = None if device == "cpu" else _gpu_device(device)  # None: search on the CPU
        self._backend, self._fp16 = backend, fp16
        self._searcher: _FaissSearcher | _FaissGpuSearcher | _TorchSearcher | None = None
        # An upper bound on the stored ids (None: not computed yet). Row ids only grow, so a batch above it
        # cannot clash and skips the O(ntotal) membership check: adding in many batches stays linear.
        self._id_bound: int | None = None
        self._sorted_ids: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # `_id_order`
        # `_scan_included`: the last filter's positions, split by thread
        self._position_parts: tuple[np.ndarray, list[np.ndarray]] | None = None

    @classmethod
    def create(cls, dim: int, index_type: IndexSpec | str = "flat", template: faiss.Index | None = None,
               device: str = "auto", backend: str = "auto", fp16: bool = False, **spec_options) -> VectorStore:
        """An empty store: flat/hnsw from scratch, ivf/ivfpq as a copy of the trained TEMPLATE.

        INDEX_TYPE is an IndexSpec, or a type name whose settings SPEC_OPTIONS give (e.g. hnsw_m=32)."""
        set_threads()
        if dim < 1:
            raise RetrieverError(f"vector dimension must be positive, got {dim}")
        spec = index_type if isinstance(index_type, IndexSpec) else IndexSpec(type=index_type, **spec_options)
        spec = spec.for_dim(dim)
        if spec.kind.graph:
            index = faiss.IndexIDMap(_new_hnsw(dim, spec))
        elif not spec.kind.trained:
            index = faiss.IndexIDMap(faiss.IndexFlatIP(dim))
        else:
            if template is None:
                raise RetrieverError(f"an {spec.type} store starts from its index's trained template")
            index = faiss.clone_index(template)
        return cls(index, spec, device=device, backend=backend, fp16=fp16)

    @classmethod
    def load(cls, path: str | Path, spec: IndexSpec | None = None, device: str = "auto", backend: str = "auto",
             fp16: bool = False, mmap: bool = True) -> VectorStore:
        """Load a saved store; with MMAP (flat and IVF) the data is mapped, not read, so opening is instant."""
        set_threads()
        path = Path(path)
        if not path.is_file():
            raise RetrieverError(f"{path}: no vector index there")
        index = _read_index(path, mmap)
        spec = spec or IndexSpec(type=_index_type(index, path))
        if _index_type(index, path) != spec.type:
            raise RetrieverError(f"{path}: holds a {_index_type(index, path)} index, the manifest says {spec.type}")
        if index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise RetrieverError(f"{path}: not a retriever vector index (metric {index.metric_type})")
        return cls(index, spec, device=device, backend=backend, fp16=fp16)

    def save(self, path: str | Path) -> None:
        """Write the index to PATH (written next to it, flushed to disk, then renamed into place)."""
        path = Path(path)
        partial = path.with_name(path.name + ".partial")
        faiss.write_index(self._index, str(partial))
        descriptor = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(partial, path)

    @property
    def ntotal(self) -> int:
        return int(self._ivf.ntotal if self._ivf is not None else self._index.ntotal)

    @property
    def dim(self) -> int:
        return int(self._index.d)

    @property
    def index_type(self) -> str:
        return self.spec.type

    @property
    def backend(self) -> str:
        """What searches run on: faiss-cpu, faiss-gpu, torch-cpu or torch-cuda (builds the searcher)."""
        return self._get_searcher().name

    def ids(self) -> np.ndarray:
        """All stored ids, int64 (insertion order for flat and hnsw, bucket order for IVF)."""
        if self._ivf is None:
            return faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)
        lists = self._ivf.invlists
        parts = [_list_ids(lists, number) for number in range(lists.nlist)]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add L2-normalized float32 VECTORS (n, dim) under new, unique, non-negative IDS (n,)."""
        vectors = self._as_matrix(vectors, "vectors")
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.ndim != 1 or len(ids) != len(vectors):
            raise RetrieverError(f"got {len(vectors)} vectors but ids of shape {ids.shape}")
        if len(ids) == 0:
            return
        if ids.min() < 0:
            raise RetrieverError("vector ids must be non-negative (-1 marks 'no result')")
        if len(np.unique(ids)) != len(ids):
            raise RetrieverError("vector ids repeat within the batch being added")
        if self._id_bound is None:
            self._id_bound = int(self.ids().max()) if self.ntotal else -1
        if ids.min() <= self._id_bound:
            taken = ids[np.isin(ids, self.ids())]
            if len(taken):
                raise RetrieverError(f"{len(taken)} vector ids already in the index, e.g. {taken[:5].tolist()}")
        norms = np.linalg.norm(vectors, axis=1)
        off = np.flatnonzero(np.abs(norms - 1) > _NORM_TOLERANCE)
        if len(off):
            raise RetrieverError(f"vectors must be L2-normalized; row {off[0]} has norm {norms[off[0]]:.4f}")
        self._index.add_with_ids(vectors, ids)
        if self._ivf is not None:
            self._index.ntotal = self._ivf.ntotal  # a pre-transform wrapper does not track its inner index
        self._id_bound = max(self._id_bound, int(ids.max()))
        self._searcher = None
        self._sorted_ids = self._position_parts = None

    def search(self, queries: np.ndarray, k: int, exclude: np.ndarray | None = None, nprobe: int | None = None,
               ef_search: int | None = None, include: np.ndarray | None = None,
               exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-K by inner product: (scores (q, k) float32, ids (q, k) int64), best first.

        Ids in EXCLUDE (sorted) are never returned, and k others take their place; with INCLUDE (sorted), only
        those ids are (a filter: the ANN walks the same index and skips the rest, see `retriever.filter_plan` for
        the breadth it then needs). NPROBE / EF_SEARCH override the spec's defaults for this search. EXACT (flat
        and hnsw, with INCLUDE): score every included vector in place instead of walking the graph. Where fewer
        than K vectors are found the row is padded with id -1 and score -inf.
        """
        queries = self._as_matrix(queries, "queries", allow_single=True)
        if k < 1:
            raise RetrieverError(f"{param('k')} must be at least 1, got {k}")
        if len(queries) == 0 or self.ntotal == 0:
            return np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
        for option, value in (("nprobe", nprobe), ("ef_search", ef_search)):
            if value is not None and value < 1:
                raise RetrieverError(f"{param(option)} must be at least 1, got {value}")
        exclude = None if exclude is None or len(exclude) == 0 else np.ascontiguousarray(exclude, dtype=np.int64)
        if include is not None:
            include = np.ascontiguousarray(include, dtype=np.int64)
            if exclude is not None:
                include = include[~np.isin(include, exclude)]
            exclude = None
            if len(include) == 0:
                return np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
        options = _SearchOptions(nprobe or self.spec.search_nprobe, ef_search or self.spec.search_ef, exclude,
                                 include)
        if exact and include is not None and self.spec.kind.graph and self.backend == "faiss-cpu":
            scores, ids = self._scan_included(queries, k, include)
        else:
            scores, ids = self._get_searcher().search(queries, k, options)
        scores[ids < 0] = -np.inf  # faiss pads with -FLT_MAX; one convention for every backend
        return scores, ids

    def _scan_included(self, queries: np.ndarray, k: int, include: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k among INCLUDE in an hnsw store: its flat storage searched at the positions of INCLUDE only
        (each included vector scored where it lies: no copy, no graph, no pass over the others)."""
        cached = self._position_parts
        if cached is None or cached[0] is not include:
            # Few queries: faiss scans one query on one thread, so the positions are split into one part per
            # thread (in order: each part a contiguous stretch of the storage), scanned side by side. A position
            # list (IDSelectorArray) is scored row by row; a bitmap would be tested at every row of the storage.
            positions = np.sort(self._positions(include)).astype(np.int64)
            parts = max(1, min(faiss.omp_get_max_threads(), len(positions) // SCAN_PART_ROWS))
            cached = self._position_parts = (include, [np.ascontiguousarray(part)
                                                       for part in np.array_split(positions, parts)])
        storage = faiss.downcast_index(faiss.downcast_index(self._index.index).storage)

        def scan(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            selector = faiss.IDSelectorArray(len(part), faiss.swig_ptr(part))
            return storage.search(queries, k, params=faiss.SearchParameters(sel=selector))

        parts = cached[1]
        if len(parts) == 1 or len(queries) >= len(parts):  # many queries: faiss spreads them over threads
            found = [scan(part) for part in parts]
        else:
            found = list(_scan_pool().map(scan, parts))  # faiss releases the GIL while it scans
        scores, positions = (np.concatenate(column, axis=1) for column in zip(*found))
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        scores, positions = np.take_along_axis(scores, order, axis=1), np.take_along_axis(positions, order, axis=1)
        ids = np.where(positions >= 0, self._id_order()[0][np.maximum(positions, 0)], -1)
        return scores, ids

    def _positions(self, ids: np.ndarray) -> np.ndarray:
        """Where IDS (all held here) lie in insertion order."""
        _, held, order = self._id_order()
        return order[np.searchsorted(held, np.asarray(ids, dtype=np.int64))]

    def _id_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids in insertion order, the same sorted, the positions that sort them), kept until the next add."""
        if self._sorted_ids is None:
            held = self.ids()
            order = np.argsort(held, kind="stable")
            self._sorted_ids = (held, held[order], order)
        return self._sorted_ids

    def vectors_of(self, ids: np.ndarray) -> np.ndarray | None:
        """The stored float32 vectors of IDS (all of them held here), for the types that keep them (flat, hnsw):
        the very numbers a search scores; None for IVF types."""
        if not self.spec.kind.exact_vectors or self._ivf is not None:
            return None
        return np.asarray(self.stored_vectors()[self._positions(ids)])

    def stored_vectors(self) -> np.ndarray:
        """The float32 vectors of a flat or hnsw store, in insertion order (a view: no copy)."""
        if self._ivf is not None:
            raise RetrieverError(f"an {self.spec.type} store keeps no float vectors in insertion order")
        return _stored_vectors(faiss.downcast_index(self._index.index))

    @classmethod
    def merged(cls, stores: list[VectorStore], exclude: np.ndarray, spec: IndexSpec,
               template: faiss.Index | None) -> VectorStore:
        """One new store holding every vector of STORES whose id is not in EXCLUDE (for compaction).

        IVF stores copy their codes bucket by bucket (no re-encoding, the sources stay untouched); flat and hnsw
        stores re-add their exact float vectors, in order."""
        dim = stores[0].dim
        merged = cls.create(dim, spec, template, device="cpu")
        for store in stores:
            if store._ivf is not None:
                _copy_ivf_entries(store._ivf, merged._ivf, exclude)
                merged._index.ntotal = merged._ivf.ntotal
            else:
                ids = store.ids()
                keep = ~np.isin(ids, exclude)
                merged.add(ids[keep], store.stored_vectors()[keep])
        return merged

    def _as_matrix(self, array: np.ndarray, name: str, allow_single: bool = False) -> np.ndarray:
        array = np.asarray(array)
        if allow_single and array.ndim == 1:
            array = array[None, :]
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise RetrieverError(f"{name} have shape {array.shape}; this index holds {self.dim}-dimensional vectors")
        if not np.issubdtype(array.dtype, np.floating):
            raise RetrieverError(f"{name} must be floating point, got {array.dtype}")
        array = np.ascontiguousarray(array, dtype=np.float32)
        if not np.isfinite(array).all():
            raise RetrieverError(f"{name} contain NaN or infinite values")
        return array

    def _get_searcher(self) -> _FaissSearcher | _FaissGpuSearcher | _TorchSearcher:
        if self._searcher is None:
            self._searcher = self._make_searcher()
        return self._searcher

    def _make_searcher(self) -> _FaissSearcher | _FaissGpuSearcher | _TorchSearcher:
        exact_capable = self.spec.kind.exact_vectors
        if self._backend == "faiss":
            if self._gpu is None:
                return _FaissSearcher(self._index, self.spec)
            if not _faiss_has_gpu():
                raise RetrieverError("this faiss build has no GPU support; install faiss-gpu or use the torch backend")
            if self.spec.type != "flat":
                raise RetrieverError(f"faiss cannot search an {self.spec.type} index on the GPU here; use the torch backend")
            return _FaissGpuSearcher(self._index, self._gpu)
        if self._backend == "torch":
            if not exact_capable:
                raise RetrieverError(f"the torch backend searches flat and hnsw indexes, not {self.spec.type}")
            return _TorchSearcher(self.ids(), self.stored_vectors(), self._gpu or "cpu", self._fp16)
        # auto: CPU -> the faiss index itself; GPU -> faiss-gpu for flat if available, else exact torch search.
        if self._gpu is None or not exact_capable:
            return _FaissSearcher(self._index, self.spec)
        if self.spec.type == "flat" and _faiss_has_gpu():
            return _FaissGpuSearcher(self._index, self._gpu)
        if not _fits_on_gpu(self.ntotal * self.dim * (2 if self._fp16 else 4), self._gpu):
            log.warning("the %d vectors do not fit in free GPU memory; searching on the CPU with faiss", self.ntotal)
            return _FaissSearcher(self._index, self.spec)
        return _TorchSearcher(self.ids(), self.stored_vectors(), self._gpu, self._fp16)


@dataclass
class _SearchOptions:
    nprobe: int | None
    ef_search: int | None
    exclude: np.ndarray | None
    include: np.ndarray | None = None


class _FaissSearcher:
    name = "faiss-cpu"

    def __init__(self, index: faiss.Index, spec: IndexSpec):
        self.index, self.spec = index, spec
        self._bitmap: tuple[np.ndarray, np.ndarray] | None = None  # (include array, its bitmap): filters repeat

    def search(self, queries: np.ndarray, k: int, options: _SearchOptions) -> tuple[np.ndarray, np.ndarray]:
        # The selector objects must outlive the search: SWIG parameters hold bare pointers to them.
        keep_alive = []
        selector = None
        if options.include is not None:
            # A bitmap over the ids, tested in O(1) per visited vector; made once per include array.
            if self._bitmap is None or self._bitmap[0] is not options.include:
                self._bitmap = (options.include, bitmap_of(options.include))
            bitmap = self._bitmap[1]
            selector = faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap))
            keep_alive += [bitmap, selector]
        elif options.exclude is not None:
            batch = faiss.IDSelectorBatch(options.exclude)
            selector = faiss.IDSelectorNot(batch)
            keep_alive += [batch, selector]
        if self.spec.kind.graph:
            # HNSW finds at most efSearch candidates; widen the beam so k results can come back.
            params = faiss.SearchParametersHNSW(efSearch=max(k, options.ef_search or 0))
        elif self.spec.kind.trained:
            params = faiss.SearchParametersIVF(nprobe=options.nprobe)
        else:
            params = faiss.SearchParameters()
        if selector is not None:
            params.sel = selector
        if isinstance(self.index, faiss.IndexPreTransform):
            params = faiss.SearchParametersPreTransform(index_params=params)
            keep_alive.append(params.index_params)
        return self.index.search(queries, k, params=params)


class _FaissGpuSearcher:
    name = "faiss-gpu"

    def __init__(self, index: faiss.Index, device: torch.device):
        self.cpu_index = index
        self.resources = faiss.StandardGpuResources()  # must outlive the GPU index
        self.gpu_index = faiss.index_cpu_to_gpu(self.resources, device.index or 0, index)

    def search(self, queries: np.ndarray, k: int, options: _SearchOptions) -> tuple[np.ndarray, np.ndarray]:
        if options.exclude is not None or options.include is not None or k > _FAISS_GPU_MAX_K:  # no ID selector
            return _FaissSearcher(self.cpu_index, IndexSpec("flat")).search(queries, k, options)
        return self.gpu_index.search(queries, k)


class _TorchSearcher:
    """Exact inner-product search: the vectors live in one tensor; queries go through in chunks."""

    # Bound on the (chunk, n) score matrix of one step.
    chunk_bytes = 512 * 2**20

    def __init__(self, ids: np.ndarray, vectors: np.ndarray, device: str | torch.device, fp16: bool):
        import torch

        self.device = torch.device(device)
        self.name = f"torch-{self.device.type}"
        # fp16 halves GPU memory and doubles matmul speed; CPU matmul in fp16 is slow, so CPU stays fp32.
        self.dtype = torch.float16 if fp16 and self.device.type == "cuda" else torch.float32
        self.ids = ids
        # Copied once: the faiss storage may be reallocated by a later add.
        self.vectors = torch.tensor(vectors, dtype=self.dtype, device=self.device)
        self._excluded: tuple | None = None  # (the exclude array, its position mask, how many it hides)
        self._filter: tuple | None = None  # (the last include array, what `_included` made of it)
        self._sorted: tuple | None = None  # (positions that sort the ids, the ids sorted): filters look ids up

    def search(self, queries: np.ndarray, k: int, options: _SearchOptions) -> tuple[np.ndarray, np.ndarray]:
        import torch

        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        if options.include is not None:
            vectors, positions, mask, candidates = self._included(options.include)
        else:
            vectors, positions = self.vectors, None
            mask, excluded = self._excluded_mask(options.exclude)
            candidates = len(self.ids) - excluded
        found = min(k, candidates)
        if found <= 0:
            return scores, ids
        rows = max(1, self.chunk_bytes // (max(1, len(vectors)) * vectors.element_size()))
        with torch.inference_mode():
            for start in range(0, len(queries), rows):
                chunk = torch.from_numpy(queries[start : start + rows]).to(self.device, self.dtype)
                products = chunk @ vectors.T
                if mask is not None:
                    products.masked_fill_(mask, float("-inf"))
                top_scores, top_positions = torch.topk(products, found, dim=1)
                top_positions = top_positions.cpu().numpy()
                if positions is not None:
                    top_positions = positions[top_positions]
                scores[start : start + rows, :found] = top_scores.float().cpu().numpy()
                ids[start : start + rows, :found] = self.ids[top_positions]
        return scores, ids

    def _excluded_mask(self, exclude: np.ndarray | None):
        """(a position mask of the EXCLUDE ids or None, how many it hides): made once per exclude array."""
        import torch

        if exclude is None:
            return None, 0
        if self._excluded is None or self._excluded[0] is not exclude:
            hidden = np.isin(self.ids, exclude)
            self._excluded = (exclude, torch.from_numpy(hidden).to(self.device), int(hidden.sum()))
        return self._excluded[1], self._excluded[2]

    def _included(self, include: np.ndarray):
        """What a filter searches: (vectors, their positions or None, a mask or None, how many match).

        A narrow filter gathers its matching rows once (the product then costs what the matches cost); a wide one
        masks the rest of the full product. Made once per include array: a snapshot hands the same array to every
        query with the same filter."""
        import torch

        if self._filter is not None and self._filter[0] is include:
            return self._filter[1]
        if self._sorted is None:
            order = np.argsort(self.ids, kind="stable")
            self._sorted = (order, self.ids[order])
        order, sorted_ids = self._sorted
        at = np.minimum(np.searchsorted(sorted_ids, include), len(sorted_ids) - 1)
        positions = np.sort(order[at[sorted_ids[at] == include]])
        if len(positions) * 2 <= len(self.ids):
            gathered = self.vectors.index_select(0, torch.from_numpy(positions).to(self.device))
            selection = (gathered, positions, None, len(positions))
        else:
            mask = torch.ones(len(self.ids), dtype=torch.bool, device=self.device)
            mask[torch.from_numpy(positions).to(self.device)] = False
            selection = (self.vectors, None, mask, len(positions))
        self._filter = (include, selection)
        return selection


@functools.cache
def _scan_pool() -> ThreadPoolExecutor:
    """Threads for scanning a filter's matches side by side (one per core)."""
    return ThreadPoolExecutor(max(1, faiss.omp_get_max_threads()), thread_name_prefix="filter-scan")


def bitmap_of(ids: np.ndarray) -> np.ndarray:
    """IDS (non-negative) as faiss' IDSelectorBitmap reads them: bit i of byte i >> 3 set for each id i."""
    bits = np.zeros(int(ids.max()) + 1 if len(ids) else 1, dtype=bool)
    bits[ids] = True
    return np.packbits(bits, bitorder="little")


def _new_hnsw(dim: int, spec: IndexSpec) -> faiss.IndexHNSWFlat:
    index = faiss.IndexHNSWFlat(dim, int(spec.hnsw_m), faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = int(spec.ef_construction)
    index.hnsw.efSearch = int(spec.search_ef)
    return index


def _read_index(path: Path, mmap: bool) -> faiss.Index:
    # Flat storage and hnsw graphs map with MMAP_IFC, IVF lists with MMAP (and refuse MMAP_IFC with it).
    read_only = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
    attempts = [faiss.IO_FLAG_MMAP_IFC | read_only, read_only, 0] if mmap else [0]
    for flags in attempts:
        try:
            return faiss.read_index(str(path), flags)
        except RuntimeError:
            continue  # not mappable this way (e.g. an hnsw graph): the next way, finally a plain read
    raise RetrieverError(f"{path}: not a readable faiss index (corrupt or from another program)")


def _index_type(index: faiss.Index, path: Path) -> str:
    if isinstance(index, faiss.IndexIDMap):
        inner = faiss.downcast_index(index.index)
        if isinstance(inner, faiss.IndexHNSWFlat):
            return "hnsw"
        if isinstance(inner, faiss.IndexFlat):
            return "flat"
    else:
        try:
            ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
        except RuntimeError:
            ivf = None
        if isinstance(ivf, faiss.IndexIVFFlat):
            return "ivf"
        if isinstance(ivf, faiss.IndexIVFPQ):
            return "ivfpq"
    raise RetrieverError(f"{path}: not a retriever vector index ({type(index).__name__})")


def _stored_vectors(inner: faiss.Index) -> np.ndarray:
    """A view (no copy) of the raw float32 vectors inside a flat or HNSW-flat index, in insertion order."""
    storage = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSWFlat) else inner
    if storage.ntotal == 0:
        return np.empty((0, storage.d), np.float32)
    return faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d).reshape(storage.ntotal, storage.d)


def _list_ids(lists: faiss.InvertedLists, number: int) -> np.ndarray:
    size = lists.list_size(number)
    if size == 0:
        return np.empty(0, np.int64)
    return faiss.rev_swig_ptr(lists.get_ids(number), size).astype(np.int64, copy=True)


def _copy_ivf_entries(source: faiss.IndexIVF, target: faiss.IndexIVF, exclude: np.ndarray) -> None:
    """Append SOURCE's entries, except ids in EXCLUDE, to the same buckets of TARGET (same trained template)."""
    lists, code_size = source.invlists, source.code_size
    for number in range(lists.nlist):
        size = lists.list_size(number)
        if size == 0:
            continue
        ids = faiss.rev_swig_ptr(lists.get_ids(number), size)
        codes = faiss.rev_swig_ptr(lists.get_codes(number), size * code_size).reshape(size, code_size)
        keep = ~np.isin(ids, exclude) if len(exclude) else slice(None)
        kept_ids = np.ascontiguousarray(ids[keep], dtype=np.int64)
        kept_codes = np.ascontiguousarray(codes[keep])
        if len(kept_ids):
            target.invlists.add_entries(number, len(kept_ids), faiss.swig_ptr(kept_ids), faiss.swig_ptr(kept_codes))
    target.ntotal = sum(target.invlists.list_size(number) for number in range(target.invlists.nlist))


def _faiss_has_gpu() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _gpu_device(device: str) -> torch.device | None:
    """The CUDA device DEVICE ("auto", "cuda", "cuda:N") resolves to, or None for the CPU."""
    from retriever.device import resolve_device  # imports torch: only when a GPU may be wanted

    resolved = resolve_device(device)
    return resolved if resolved.type == "cuda" else None


def _fits_on_gpu(nbytes: int, device: torch.device) -> bool:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return nbytes < 0.8 * free
