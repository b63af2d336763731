"""Vector store: a FAISS inner-product index of L2-normalized vectors keyed by int64 row ids.

Index types (`retriever.store.spec.IndexSpec`): ``flat`` (``IndexIDMap(IndexFlatIP)``), ``hnsw``
(``IndexIDMap(IndexHNSWFlat)``), ``ivf`` (IVF-Flat) and ``ivfpq`` (IVF with product-quantized codes, re-ranked
exactly from the stored raw vectors).

IVF types are trained once per index on a sample (`train_template`); every segment of the index starts from a
copy of that trained, empty template, so segments share buckets and codes and merge without retraining.

Stored indexes are immutable: deletions are filtered at search time (`exclude`, FAISS ID selectors, so a search
still returns k hits where k remain), and compaction writes a new store with `merged`. Loading maps the file
instead of reading it where FAISS can (flat and IVF), so opening a large index costs milliseconds.

Searching can run elsewhere; the first search builds a searcher for the chosen device and backend
(`retriever.store.searchers`): faiss-cpu (the index itself), faiss-gpu (a flat index copied to the GPU, when the
faiss build has GPU support) or torch (exact search as one matrix product and top-k: on CUDA for flat and hnsw
when faiss has no GPU support; also on the CPU, which is how the tests check it against faiss).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np

from retriever.errors import RetrieverError, param
from retriever.numeric import row_norms
from retriever.processes import available_cpus, shared_thread_pool
from retriever.store.searchers import StoreQuery, StoreSearcher, make_searcher
from retriever.store.spec import BACKENDS, TRAIN_PER_BUCKET, IndexSpec

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)



# A filter's matches are scanned on several threads from this many per thread on (below, one thread is faster).
SCAN_PART_ROWS = 16_384
# Row norms further than this from 1 mean the caller forgot to normalize.
_NORM_TOLERANCE = 1e-3


def set_threads(threads: int | None = None) -> None:
    """Threads faiss uses; default: OMP_NUM_THREADS if set, else the CPUs this process may run on.

    faiss defaults to every core of the host, which oversubscribes containers and cgroup-limited machines.
    """
    if threads is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return
        threads = available_cpus()
    faiss.omp_set_num_threads(max(1, threads))


def load_template(path: Path, spec: IndexSpec) -> faiss.Index:
    """A trained template saved by a build (`VectorStore(template, spec).save`), read into memory, to start new
    segments from."""
    return VectorStore.load(path, spec, device="cpu", mmap=False)._index


PQ_CODES = 256  # codes per sub-quantizer of 8 bits


def train_template(spec: IndexSpec, sample: np.ndarray) -> faiss.Index | None:
    """The trained, empty index every segment of an ivf/ivfpq index starts from (None for flat and hnsw).

    SAMPLE holds calibrated, L2-normalized vectors; k-means wants 39 or more per bucket, so nlist shrinks to fit
    a small sample rather than train on too few points.
    """
    if not spec.kind.trained:
        return None
    set_threads()
    n, dim = sample.shape
    if spec.kind.compressed and n < PQ_CODES:  # FAISS's k-means refuses fewer points than codes (a RuntimeError)
        raise RetrieverError(f"{spec.type} learns {PQ_CODES} codes for each part of a vector, from at least "
                             f"{PQ_CODES} vectors; this build has {n:,}: choose {param('index_type', 'flat')} or "
                             f"{param('index_type', 'hnsw')} for so few", parameter="index_type")
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
    # Fewer than 39 training points a bucket only where there are fewer than 39 vectors in all, in one bucket (its
    # centroid is their mean): FAISS's warning about it would be the only line of a small build not its own.
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    ivf.cp.min_points_per_centroid = 1
    quantizer = None
    if spec.kind.compressed:
        # Likewise each part's 256 codes, under 9,984 vectors: FAISS warned once a part (96 lines at 3,000 vectors),
        # and an OPQ rotation's PQ once a part and iteration (400 lines); at least 256 are asked for above.
        ivf.pq.cp.min_points_per_centroid = 1
        if spec.opq:
            quantizer = faiss.ProductQuantizer(dim, spec.pq_m, 8)  # held here while the rotation trains with it
            quantizer.cp.min_points_per_centroid = 1
            faiss.downcast_VectorTransform(faiss.downcast_index(index).chain.at(0)).pq = quantizer
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
        self._gpu = None if device == "cpu" else gpu_device(device)  # None: search on the CPU
        self._backend, self._fp16 = backend, fp16
        self._searcher: StoreSearcher | None = None
        self._searcher_lock = threading.Lock()
        self._direct_map = False  # ivf: `vectors_of`'s table, built on first use
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
        _without_list_prefetch(index)
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
        # Through a Python file: a write or close that fails (a full disk) is an OSError here, where FAISS's own
        # file printed its complaint to stderr, glued to the line the command then printed.
        with open(partial, "wb") as file:
            faiss.write_index(self._index, faiss.PyCallbackIOWriter(file.write))
            file.flush()
            os.fsync(file.fileno())
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
        norms = row_norms(vectors)
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
        those ids are (a filter: the ANN walks the same index and skips the rest, see `retriever.search.plan` for
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
        query = StoreQuery(nprobe or self.spec.search_nprobe, ef_search or self.spec.search_ef, exclude, include)
        if exact and include is not None and self.spec.kind.graph and self.backend == "faiss-cpu":
            scores, ids = self._scan_included(queries, k, include)
        else:
            scores, ids = self._get_searcher().search(queries, k, query)
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
        found = self._sorted_ids  # read once: another thread may set it meanwhile (to the same arrays' equal)
        if found is None:
            held = self.ids()
            order = np.argsort(held, kind="stable")
            found = self._sorted_ids = (held, held[order], order)
        return found

    def vectors_of(self, ids: np.ndarray) -> np.ndarray | None:
        """The stored float32 vectors of IDS (all of them held here), for the types that keep them (flat, hnsw, and
        ivf, whose codes are the vectors): the very numbers a search scores; None for ivfpq."""
        if self._ivf is not None and not self.spec.kind.compressed:
            if not self._direct_map:
                with self._searcher_lock:  # an id -> list and offset table, built once (a hash: ids are sparse)
                    if not self._direct_map:
                        self._ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
                        self._direct_map = True
            return self._ivf.reconstruct_batch(np.ascontiguousarray(ids, dtype=np.int64))
        if not self.spec.kind.exact_vectors or self._ivf is not None:
            return None
        return np.asarray(self.stored_vectors()[self._positions(ids)])

    def stored_vectors(self) -> np.ndarray:
        """The float32 vectors of a flat or hnsw store, in insertion order (a view: no copy)."""
        if self._ivf is not None:
            raise RetrieverError(f"an {self.spec.type} store keeps no float vectors in insertion order")
        return _stored_vectors(faiss.downcast_index(self._index.index))

    @classmethod
    def merged(cls, stores: list[VectorStore], excluded: list[np.ndarray], spec: IndexSpec,
               template: faiss.Index | None, shifts: list[int] | None = None) -> VectorStore:
        """One new store holding every vector of STORES whose id is not in its EXCLUDED ids (for compaction), each
        id shifted left by its SHIFTS bits (a segment keyed by row id merged into one keyed by passage).

        IVF stores copy their codes bucket by bucket (no re-encoding, the sources stay untouched); flat and hnsw
        stores re-add their exact float vectors, in order."""
        dim = stores[0].dim
        merged = cls.create(dim, spec, template, device="cpu")
        for store, exclude, shift in zip(stores, excluded, shifts or [0] * len(stores)):
            if store._ivf is not None:
                _copy_ivf_entries(store._ivf, merged._ivf, exclude, shift)
                merged._index.ntotal = merged._ivf.ntotal
            else:
                ids = store.ids()
                keep = ~np.isin(ids, exclude)
                merged.add(ids[keep] << shift, store.stored_vectors()[keep])
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

    def _get_searcher(self) -> StoreSearcher:
        searcher = self._searcher  # read once: searches on other threads may build it at the same time
        if searcher is None:
            with self._searcher_lock:
                if self._searcher is None:
                    self._searcher = self._make_searcher()
                searcher = self._searcher
        return searcher

    def _make_searcher(self) -> StoreSearcher:
        return make_searcher(self._index, self.spec, self._backend, self._gpu, self._fp16, self.ids,
                             self.stored_vectors)


def _scan_pool() -> ThreadPoolExecutor:
    """Threads for scanning a filter's matches side by side (one per core)."""
    return shared_thread_pool("filter-scan", max(1, faiss.omp_get_max_threads()))


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


def _without_list_prefetch(index: faiss.Index) -> None:
    """Mapped IVF lists (FAISS's `OnDiskInvertedLists`) are read by the search itself, not first by prefetching
    threads: FAISS starts 32 of them for every search to touch the lists it will scan, which costs more than the
    scan of lists the page cache holds (benchmarks/results/search_p50_prefetch.md), and from a cold page cache the
    threads gain the first search a little and the next ones nothing (benchmarks/results/ivf_prefetch.md)."""
    try:
        lists = faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists)
    except RuntimeError:  # not an IVF index
        return
    if isinstance(lists, faiss.OnDiskInvertedLists):
        lists.prefetch_nthread = 0


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


def _copy_ivf_entries(source: faiss.IndexIVF, target: faiss.IndexIVF, exclude: np.ndarray, shift: int = 0) -> None:
    """Append SOURCE's entries, except ids in EXCLUDE, to the same buckets of TARGET (same trained template), their
    ids shifted left by SHIFT bits."""
    lists, code_size = source.invlists, source.code_size
    for number in range(lists.nlist):
        size = lists.list_size(number)
        if size == 0:
            continue
        ids = faiss.rev_swig_ptr(lists.get_ids(number), size)
        codes = faiss.rev_swig_ptr(lists.get_codes(number), size * code_size).reshape(size, code_size)
        keep = ~np.isin(ids, exclude) if len(exclude) else slice(None)
        kept_ids = np.ascontiguousarray(np.asarray(ids[keep], dtype=np.int64) << shift)
        kept_codes = np.ascontiguousarray(codes[keep])
        if len(kept_ids):
            target.invlists.add_entries(number, len(kept_ids), faiss.swig_ptr(kept_ids), faiss.swig_ptr(kept_codes))
    target.ntotal = sum(target.invlists.list_size(number) for number in range(target.invlists.nlist))


def gpu_device(device: str) -> torch.device | None:
    """The CUDA device DEVICE ("auto", "cuda", "cuda:N") resolves to, or None for the CPU."""
    from retriever.encode.device import resolve_device, surely_cpu

    if surely_cpu(device):
        return None  # known without importing torch
    resolved = resolve_device(device)  # imports torch: only where a GPU may be wanted
    return resolved if resolved.type == "cuda" else None
