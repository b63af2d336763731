"""Vector store: a FAISS inner-product index keyed by int64 ids (the metadata store's row ids).

The stored format is always a CPU FAISS index, ``IndexIDMap2`` around either ``IndexFlatIP`` (exact) or
``IndexHNSWFlat`` (approximate graph search). Vectors must be L2-normalized, so inner product = cosine.

Searching can run elsewhere; the first search builds a searcher for the chosen device and backend:

- ``faiss-cpu``: the index itself.
- ``faiss-gpu``: a flat index copied to the GPU, when the faiss build has GPU support.
- ``torch``: exact search as one matrix product + top-k, chunked over queries to bound memory. Used on CUDA when
  faiss has no GPU support, and for HNSW on a GPU (faiss cannot walk an HNSW graph there; scoring every vector
  on a GPU is fast and exact). Also runs on CPU, which is how the tests check it against faiss.

Any add/remove drops the searcher; the next search rebuilds it from the updated index.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np

from retriever.errors import RetrieverError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "hnsw")
BACKENDS = ("auto", "faiss", "torch")

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


class VectorStore:
    def __init__(self, index: faiss.IndexIDMap2, device: str = "auto", backend: str = "auto", fp16: bool = False):
        """Wrap ``index``; ``device`` ("auto", "cpu", "cuda", "cuda:N") and ``backend`` say where searches run."""
        if backend not in BACKENDS:
            raise RetrieverError(f"unknown search backend {backend!r}; use one of {', '.join(BACKENDS)}")
        self._index = index
        self._inner = faiss.downcast_index(index.index)
        self._gpu = None if device == "cpu" else _gpu_device(device)  # None: search on the CPU
        self._backend, self._fp16 = backend, fp16
        self._searcher: _FaissSearcher | _FaissGpuSearcher | _TorchSearcher | None = None
        # An upper bound on the stored ids (None: not computed yet). Row ids only grow, so a batch above it
        # cannot clash and skips the O(ntotal) membership check: adding in many batches stays linear.
        self._id_bound: int | None = None

    @classmethod
    def create(
        cls,
        dim: int,
        index_type: str = "flat",
        hnsw_m: int = 32,
        ef_search: int = 128,
        ef_construction: int = 40,
        device: str = "auto",
        backend: str = "auto",
        fp16: bool = False,
    ) -> VectorStore:
        """An empty store. ``hnsw_m``/``ef_*`` matter only for ``index_type="hnsw"``."""
        set_threads()
        if dim < 1:
            raise RetrieverError(f"vector dimension must be positive, got {dim}")
        if index_type == "flat":
            inner = faiss.IndexFlatIP(dim)
        elif index_type == "hnsw":
            inner = _new_hnsw(dim, hnsw_m, ef_construction, ef_search)
        else:
            raise RetrieverError(f"unknown index type {index_type!r}; use one of {', '.join(INDEX_TYPES)}")
        return cls(faiss.IndexIDMap2(inner), device=device, backend=backend, fp16=fp16)

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", backend: str = "auto", fp16: bool = False) -> VectorStore:
        set_threads()
        path = Path(path)
        if not path.is_file():
            raise RetrieverError(f"{path}: no vector index there")
        try:
            index = faiss.read_index(str(path))
        except RuntimeError:
            raise RetrieverError(f"{path}: not a readable faiss index (corrupt or from another program)") from None
        if not isinstance(index, faiss.IndexIDMap2) or index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise RetrieverError(f"{path}: not a retriever vector index ({type(index).__name__})")
        if not isinstance(faiss.downcast_index(index.index), (faiss.IndexFlat, faiss.IndexHNSWFlat)):
            raise RetrieverError(f"{path}: unsupported index type {type(faiss.downcast_index(index.index)).__name__}")
        return cls(index, device=device, backend=backend, fp16=fp16)

    def save(self, path: str | Path) -> None:
        """Write the index to ``path`` (written next to it, flushed to disk, then renamed into place)."""
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
        return int(self._index.ntotal)

    @property
    def dim(self) -> int:
        return int(self._index.d)

    @property
    def index_type(self) -> str:
        return "hnsw" if isinstance(self._inner, faiss.IndexHNSWFlat) else "flat"

    @property
    def ef_search(self) -> int | None:
        return int(self._inner.hnsw.efSearch) if self.index_type == "hnsw" else None

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        if self.index_type != "hnsw":
            raise RetrieverError("ef_search applies to hnsw indexes only")
        self._inner.hnsw.efSearch = int(value)

    @property
    def backend(self) -> str:
        """What searches run on: faiss-cpu, faiss-gpu, torch-cpu or torch-cuda (builds the searcher)."""
        return self._get_searcher().name

    def ids(self) -> np.ndarray:
        """All stored ids, int64, in insertion order."""
        return faiss.vector_to_array(self._index.id_map).astype(np.int64, copy=False)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add L2-normalized float32 ``vectors`` (n, dim) under new, unique, non-negative ``ids`` (n,)."""
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
        self._id_bound = max(self._id_bound, int(ids.max()))
        self._searcher = None

    def remove(self, ids: np.ndarray) -> int:
        """Remove ``ids`` (unknown ones are ignored); returns how many vectors were removed.

        A flat index removes in place. HNSW graphs cannot drop nodes, so the index is rebuilt from the vectors
        it keeps (O(n log n), like building it): batch removals rather than removing one id at a time.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64).ravel()
        if len(ids) == 0 or self.ntotal == 0:
            return 0
        if self.index_type == "flat":
            removed = int(self._index.remove_ids(ids))
        else:
            all_ids = self.ids()
            keep = ~np.isin(all_ids, ids)
            removed = int(len(keep) - keep.sum())
            if removed:
                hnsw = self._inner.hnsw
                inner = _new_hnsw(self.dim, hnsw.nb_neighbors(1), hnsw.efConstruction, hnsw.efSearch)
                index = faiss.IndexIDMap2(inner)
                index.add_with_ids(_stored_vectors(self._inner)[keep], all_ids[keep])
                self._index, self._inner = index, inner
        if removed:
            self._searcher = None
        return removed

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: (scores (q, k) float32, ids (q, k) int64), best first.

        Where fewer than ``k`` vectors are found the row is padded with id -1 and score -inf.
        """
        queries = self._as_matrix(queries, "queries", allow_single=True)
        if k < 1:
            raise RetrieverError(f"k must be at least 1, got {k}")
        if len(queries) == 0 or self.ntotal == 0:
            return np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
        scores, ids = self._get_searcher().search(queries, k)
        scores[ids < 0] = -np.inf  # faiss pads with -FLT_MAX; one convention for every backend
        return scores, ids

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
        if self._backend == "faiss":
            if self._gpu is None:
                return _FaissSearcher(self._index)
            if not _faiss_has_gpu():
                raise RetrieverError("this faiss build has no GPU support; install faiss-gpu or use the torch backend")
            if self.index_type != "flat":
                raise RetrieverError("faiss cannot search an hnsw index on the GPU; use the torch backend")
            return _FaissGpuSearcher(self._index, self._gpu)
        if self._backend == "torch":
            return _TorchSearcher(self.ids(), _stored_vectors(self._inner), self._gpu or "cpu", self._fp16)
        # auto: CPU → the faiss index itself; GPU → faiss-gpu for flat if available, else exact torch search.
        if self._gpu is None:
            return _FaissSearcher(self._index)
        if self.index_type == "flat" and _faiss_has_gpu():
            return _FaissGpuSearcher(self._index, self._gpu)
        if not _fits_on_gpu(self.ntotal * self.dim * (2 if self._fp16 else 4), self._gpu):
            log.warning("the %d vectors do not fit in free GPU memory; searching on the CPU with faiss", self.ntotal)
            return _FaissSearcher(self._index)
        return _TorchSearcher(self.ids(), _stored_vectors(self._inner), self._gpu, self._fp16)


class _FaissSearcher:
    name = "faiss-cpu"

    def __init__(self, index: faiss.Index):
        self.index = index

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        inner = faiss.downcast_index(self.index.index)
        if isinstance(inner, faiss.IndexHNSWFlat) and k > inner.hnsw.efSearch:
            # HNSW finds at most efSearch candidates; widen the beam so k results can come back.
            return self.index.search(queries, k, params=faiss.SearchParametersHNSW(efSearch=k))
        return self.index.search(queries, k)


class _FaissGpuSearcher:
    name = "faiss-gpu"

    def __init__(self, index: faiss.Index, device: torch.device):
        self.cpu_index = index
        self.resources = faiss.StandardGpuResources()  # must outlive the GPU index
        self.gpu_index = faiss.index_cpu_to_gpu(self.resources, device.index or 0, index)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        index = self.gpu_index if k <= _FAISS_GPU_MAX_K else self.cpu_index
        return index.search(queries, k)


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

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import torch

        n = len(self.ids)
        found = min(k, n)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        ids = np.full((len(queries), k), -1, dtype=np.int64)
        rows = max(1, self.chunk_bytes // (n * self.vectors.element_size()))
        with torch.inference_mode():
            for start in range(0, len(queries), rows):
                chunk = torch.from_numpy(queries[start : start + rows]).to(self.device, self.dtype)
                top_scores, top_positions = torch.topk(chunk @ self.vectors.T, found, dim=1)
                scores[start : start + rows, :found] = top_scores.float().cpu().numpy()
                ids[start : start + rows, :found] = self.ids[top_positions.cpu().numpy()]
        return scores, ids


def _new_hnsw(dim: int, m: int, ef_construction: int, ef_search: int) -> faiss.IndexHNSWFlat:
    if m < 2:
        raise RetrieverError(f"hnsw M must be at least 2, got {m}")
    index = faiss.IndexHNSWFlat(dim, int(m), faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = int(ef_construction)
    index.hnsw.efSearch = int(ef_search)
    return index


def _stored_vectors(inner: faiss.Index) -> np.ndarray:
    """A view (no copy) of the raw float32 vectors inside a flat or HNSW-flat index, in insertion order."""
    storage = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSWFlat) else inner
    if storage.ntotal == 0:
        return np.empty((0, storage.d), np.float32)
    return faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d).reshape(storage.ntotal, storage.d)


def _faiss_has_gpu() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _gpu_device(device: str) -> torch.device | None:
    """The CUDA device ``device`` ("auto", "cuda", "cuda:N") resolves to, or None for the CPU."""
    from retriever.device import resolve_device  # imports torch: only when a GPU may be wanted

    resolved = resolve_device(device)
    return resolved if resolved.type == "cuda" else None


def _fits_on_gpu(nbytes: int, device: torch.device) -> bool:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return nbytes < 0.8 * free
