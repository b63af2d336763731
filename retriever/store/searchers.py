"""Where a vector store's searches run: the faiss index itself (`FaissSearcher`), a flat index copied to a GPU
(`FaissGpuSearcher`), or exact search as one matrix product and top-k on a GPU or CPU (`TorchSearcher`);
`make_searcher` picks one for the store's device, backend and type.

Each searcher keeps what a filter costs to set up (a bitmap of its ids, its rows gathered on the GPU) for the
next query with the same filter. Searches run on many threads at once, so each such cache is read once into a
local and replaced whole: a search never applies another thread's filter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import faiss
import numpy as np

from retriever.errors import RetrieverError

from retriever.store.spec import IndexSpec

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# faiss GPU k-selection handles at most this many results per query.
FAISS_GPU_MAX_K = 2048

def make_searcher(index: faiss.Index, spec: IndexSpec, backend: str, gpu: torch.device | None, fp16: bool,
                  ids: Callable[[], np.ndarray], vectors: Callable[[], np.ndarray]):
    """The searcher for INDEX (of SPEC) on GPU (None: the CPU) with BACKEND ("auto", "faiss", "torch"); IDS and
    VECTORS give the stored ids and float vectors where an exact searcher needs its own copy."""
    exact_capable = spec.kind.exact_vectors
    if backend == "faiss":
        if gpu is None:
            return FaissSearcher(index, spec)
        if not faiss_has_gpu():
            raise RetrieverError("this faiss build has no GPU support; install faiss-gpu or use the torch backend")
        if spec.type != "flat":
            raise RetrieverError(f"faiss cannot search an {spec.type} index on the GPU here; use the torch backend")
        return FaissGpuSearcher(index, spec, gpu)
    if backend == "torch":
        if not exact_capable:
            raise RetrieverError(f"the torch backend searches flat and hnsw indexes, not {spec.type}")
        return TorchSearcher(ids(), vectors(), gpu or "cpu", fp16)
    # auto: CPU -> the faiss index itself; GPU -> faiss-gpu for flat if available, else exact torch search.
    if gpu is None or not exact_capable:
        return FaissSearcher(index, spec)
    if spec.type == "flat" and faiss_has_gpu():
        return FaissGpuSearcher(index, spec, gpu)
    stored = vectors()
    if not fits_on_gpu(stored.shape[0] * stored.shape[1] * (2 if fp16 else 4), gpu):
        log.warning("the %d vectors do not fit in free GPU memory; searching on the CPU with faiss", stored.shape[0])
        return FaissSearcher(index, spec)
    return TorchSearcher(ids(), stored, gpu, fp16)


@dataclass
class StoreQuery:
    """One search of a store: its breadth and which ids it may (INCLUDE) or may not (EXCLUDE) return."""

    nprobe: int | None
    ef_search: int | None
    exclude: np.ndarray | None
    include: np.ndarray | None = None


class FaissSearcher:
    name = "faiss-cpu"

    def __init__(self, index: faiss.Index, spec: IndexSpec):
        self.index, self.spec = index, spec
        self._bitmap: tuple[np.ndarray, np.ndarray] | None = None  # (include array, its bitmap): filters repeat
        # An IVF search splits its work over queries by default: one query, one core. Fewer queries than cores
        # split it over the buckets scanned instead (`parallel_mode` 1), for the same answers (the buckets' best
        # merged in one heap) and a shorter wait; a batch keeps one query per core, which does more per second
        # (benchmarks/results/README.md, "The query path at a million passages").
        self._ivf = faiss.extract_index_ivf(index) if spec.kind.trained else None  # as VectorStore finds it

    def search(self, queries: np.ndarray, k: int, options: StoreQuery) -> tuple[np.ndarray, np.ndarray]:
        # The selector objects must outlive the search: SWIG parameters hold bare pointers to them.
        keep_alive = []
        selector = None
        if options.include is not None:
            # A bitmap over the ids, tested in O(1) per visited vector; made once per include array. Read once:
            # a search on another thread may put its own filter's bitmap here meanwhile.
            cached = self._bitmap
            if cached is None or cached[0] is not options.include:
                cached = self._bitmap = (options.include, bitmap_of(options.include))
            bitmap = cached[1]
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
        if self._ivf is not None:
            # Read by faiss as each search starts; a search on another thread may set it meanwhile, which changes
            # how that search spreads over the cores, never what it finds.
            self._ivf.parallel_mode = 1 if len(queries) < faiss.omp_get_max_threads() else 0
        return self.index.search(queries, k, params=params)


class FaissGpuSearcher:
    name = "faiss-gpu"

    def __init__(self, index: faiss.Index, spec: IndexSpec, device: torch.device):
        self.cpu_index, self.spec = index, spec
        self.resources = faiss.StandardGpuResources()  # must outlive the GPU index
        self.gpu_index = faiss.index_cpu_to_gpu(self.resources, device.index or 0, index)

    def search(self, queries: np.ndarray, k: int, options: StoreQuery) -> tuple[np.ndarray, np.ndarray]:
        if options.exclude is not None or options.include is not None or k > FAISS_GPU_MAX_K:  # no ID selector
            return FaissSearcher(self.cpu_index, self.spec).search(queries, k, options)
        return self.gpu_index.search(queries, k)


class TorchSearcher:
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

    def search(self, queries: np.ndarray, k: int, options: StoreQuery) -> tuple[np.ndarray, np.ndarray]:
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
        cached = self._excluded  # read once, as every cache here: other threads' searches replace it
        if cached is None or cached[0] is not exclude:
            hidden = np.isin(self.ids, exclude)
            cached = self._excluded = (exclude, torch.from_numpy(hidden).to(self.device), int(hidden.sum()))
        return cached[1], cached[2]

    def _included(self, include: np.ndarray):
        """What a filter searches: (vectors, their positions or None, a mask or None, how many match).

        A narrow filter gathers its matching rows once (the product then costs what the matches cost); a wide one
        masks the rest of the full product. Made once per include array: a snapshot hands the same array to every
        query with the same filter."""
        import torch

        cached = self._filter
        if cached is not None and cached[0] is include:
            return cached[1]
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


def bitmap_of(ids: np.ndarray) -> np.ndarray:
    """IDS (non-negative) as faiss' IDSelectorBitmap reads them: bit i of byte i >> 3 set for each id i."""
    bits = np.zeros(int(ids.max()) + 1 if len(ids) else 1, dtype=bool)
    bits[ids] = True
    return np.packbits(bits, bitorder="little")


def faiss_has_gpu() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def fits_on_gpu(nbytes: int, device: torch.device) -> bool:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    return nbytes < 0.8 * free


StoreSearcher = Union[FaissSearcher, FaissGpuSearcher, TorchSearcher]
