"""A read snapshot of an index: one version, opened and searched, never changed.

A version is a manifest (`retriever.manifest`) over immutable segments (`retriever.store.segment`) plus the
calibrator every segment was written with and tombstones (row ids deleted since). `Snapshot.open` resolves the
index's link once and reads only that version, so a write committed meanwhile (by `retriever.writer`) is never
half seen; `close()` releases its files (a server swapping versions calls it). Searching by texts sends them
through exactly the encode path the manifest records; searching by vectors takes them already calibrated.

Damage found while reading (a file that no longer parses, counts that disagree) is a `DamagedIndexError` naming
the index, in one line.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from retriever.calibration import (
    DEFAULT_FIT_SAMPLE,
    AutoCalibrator,
    Calibrator,
    fit_sample_rows,
    load_calibrator,
    loads_torch,
    make_calibrator,
    saved_config,
)
from retriever.errors import DamagedIndexError, RetrieverError, param
from retriever.filter_plan import FilterPlan, plan_filtered_search
from retriever.filters import Filter, parse_where
from retriever.index_folder import (
    damaged_index,
    read_manifest,
    resolve_existing,
    resolve_index_dir,
    verify_files,
    verify_read,
)
from retriever.layout import CALIBRATOR, DOCUMENTS, MANIFEST, RAW, ROWIDS, SEGMENTS, TEMPLATE, TOMBSTONES, VECTORS
from retriever.manifest import Manifest, SegmentEntry
from retriever.pipeline import l2_normalize
from retriever.pseudo_queries import make_check_set
from retriever.store.arrays import load_npy, npy_layout
from retriever.fusion import CANDIDATES, Candidates, Fusion, check_weight, make_fusion, top_list
from retriever.store.keywords import KeywordScorer, QueryMatches
from retriever.store.segment import Segment
from retriever.store.vectors import IndexSpec, load_template
from retriever.text import check_queries

if TYPE_CHECKING:  # the encoder (and torch) loads only where text is encoded
    from retriever.encoder import Encoder

# How often `open` starts again when the version it resolved is pruned under it (two writes in the meantime).
OPEN_ATTEMPTS = 5
SPACES = ("calibrated", "raw")  # the index's own vectors, or the uncalibrated ones (to compare)
MODES = ("dense", "keyword", "hybrid")
# Hybrid search's defaults, chosen by measurement (benchmarks/hybrid.py), and whether keyword search leaves out a
# query's stop words.
DEFAULT_FUSION, DEFAULT_WEIGHT, DEFAULT_STOP_WORDS = "zscore", 0.7, False
# Per opened version: the most recent filters' matching row ids (and their split by segment), at most this many
# and this many bytes, so that clients cycling broad filters cannot fill memory.
FILTERS_REMEMBERED = 32
FILTER_CACHE_BYTES = 256 * 2**20
NULL_SAMPLE = 4096  # stored vectors sampled for the dense score's distribution (fusion "null")


@dataclass
class Ranked:
    """A ranked row id before its document is read: the fields of a SearchHit."""

    rowid: int
    score: float
    dense_score: float | None = None
    keyword_score: float | None = None
    dense_rank: int | None = None
    keyword_rank: int | None = None


def merge_top_lists(lists: Iterable[tuple[int, np.ndarray, np.ndarray]], k: int,
                    queries: int) -> tuple[np.ndarray, np.ndarray]:
    """Segments' top lists (number, scores, ids) merged into each query's top-k, in segment order (so ties fall
    the same way wherever the segments were searched)."""
    lists = sorted(lists, key=lambda found: found[0])
    if not lists:
        return np.full((queries, k), -np.inf, np.float32), np.full((queries, k), -1, np.int64)
    scores = np.concatenate([found[1] for found in lists], axis=1)
    ids = np.concatenate([found[2] for found in lists], axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)


class RemoteSegments(Protocol):
    """Where a version's vectors are searched when not in this process: a distributed server's shards
    (`retriever.shards`). Each answers with `Snapshot.segment_top_lists` / `space_vectors` of the same version."""

    def top_lists(self, snapshot: Snapshot, queries: np.ndarray, k: int, rerank: int, nprobe: int | None,
                  ef_search: int | None, includes: dict[int, np.ndarray] | None,
                  exact: bool) -> list[tuple[int, np.ndarray, np.ndarray]]: ...

    def space_vectors(self, snapshot: Snapshot, rowids: np.ndarray) -> np.ndarray: ...


@dataclass
class KeywordList:
    """One query's keyword side: its BM25 matches (to score any document) and its top list, best first."""

    matches: QueryMatches
    rowids: np.ndarray
    scores: np.ndarray


def _member(rowids: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Which of ROWIDS are in ALLOWED (sorted)."""
    if not len(allowed):
        return np.zeros(len(rowids), bool)
    positions = np.minimum(np.searchsorted(allowed, rowids), len(allowed) - 1)
    return allowed[positions] == rowids


def _ranks(rowids: np.ndarray, listed: np.ndarray) -> np.ndarray:
    """The 1-based position of each of ROWIDS in LISTED (best first), 0 where it is not there."""
    ranks = np.zeros(len(rowids), np.int64)
    if len(listed):
        order = np.argsort(listed)
        at = np.minimum(np.searchsorted(listed, rowids, sorter=order), len(listed) - 1)
        found = listed[order[at]] == rowids
        ranks[found] = order[at[found]] + 1
    return ranks


@dataclass
class SearchHit:
    """One result. SCORE is what the search mode ranked by (the fused score in hybrid search); DENSE_SCORE (cosine
    in the index's space) and KEYWORD_SCORE (BM25) are each side's own score where that side was searched, and
    DENSE_RANK / KEYWORD_RANK the result's 1-based rank in that side's own top list (None: not in it)."""

    rank: int
    doc_id: str
    score: float
    title: str | None
    text: str
    dense_score: float | None = None
    keyword_score: float | None = None
    dense_rank: int | None = None
    keyword_rank: int | None = None
    metadata: dict | None = None


def at_least(found: list[list[SearchHit]], min_score: float | None) -> list[list[SearchHit]]:
    """FOUND without the hits whose dense score (cosine in the space searched) is below MIN_SCORE: "no good match"
    is an empty list. Hybrid hits are held to their dense side: the fused score has no fixed scale."""
    if min_score is None:
        return found
    return [[replace(hit, rank=rank) for rank, hit in enumerate(
        (hit for hit in hits if hit.dense_score is not None and hit.dense_score >= min_score), start=1)]
        for hits in found]


def check_min_score(min_score: float | None, mode: str) -> None:
    """Refuse a MIN_SCORE that no hit of MODE could be held to."""
    if min_score is None:
        return
    if mode == "keyword":
        raise RetrieverError(f"{param('min_score')} holds hits to their dense score (a cosine); keyword search has "
                             f"none: search with {param('mode', 'dense')} or {param('mode', 'hybrid')}")
    if not -1.0 <= min_score <= 1.0:
        raise RetrieverError(f"{param('min_score')} is a cosine: between -1 and 1 (got {min_score})")


def search_record(query_id: str | None, query: str, hits: Sequence[SearchHit], mode: str | None = None) -> dict:
    """The one JSON shape of a query's results, for `retriever search --json` (one line per query) and the
    server: {"query_id", "query", "mode", "results": [{"rank", "doc_id", "score", "dense_score", "keyword_score",
    "dense_rank", "keyword_rank", "title", "text", "metadata"}]}; a side that was not searched has null scores and
    ranks, a document without metadata null metadata."""
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(float(value), 6)
    return {"query_id": query_id, "query": query, "mode": mode,
            "results": [{"rank": h.rank, "doc_id": h.doc_id, "score": rounded(h.score),
                         "dense_score": rounded(h.dense_score), "keyword_score": rounded(h.keyword_score),
                         "dense_rank": h.dense_rank, "keyword_rank": h.keyword_rank, "title": h.title,
                         "text": h.text, "metadata": h.metadata} for h in hits]}


class Snapshot:
    """An opened, read-only version of an index. Writers are the classmethod `build` and the methods that
    return a ChangeSummary; each of those writes a new version and leaves this object on the old one."""

    def __init__(self, folder: Path, manifest: Manifest, device: str = "auto", index_dir: str | Path | None = None,
                 runtime: str = "torch"):
        self.folder = folder
        self.manifest = manifest
        self.name = manifest.name
        self.index_dir = resolve_index_dir(index_dir)
        self.device = device
        self.runtime = runtime  # the encoder's forward pass (`retriever.runtimes`), loaded on first search
        self._encoder: Encoder | None = None
        self._segments: list[Segment] = []
        self._closed = False
        self._keyword_scorer: KeywordScorer | None = None
        self._dense_moments: tuple[np.ndarray, np.ndarray] | None = None
        # Filters' matching row ids, by filter, most recent last: a filter is evaluated over every document once
        # per version, and users repeat theirs.
        self._matching: OrderedDict[str, np.ndarray] = OrderedDict()
        self._splits: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}  # `_per_segment`, by the matches' array
        self._lazy_lock = threading.Lock()  # what searches build on first use, built once
        self._calibrator_lock = threading.Lock()  # its own: what is built under _lazy_lock may need the calibrator
        self._calibrator: Calibrator | None = None
        self._remote: RemoteSegments | None = None  # `use_remote_segments`
        if device != "cpu":  # a device this machine lacks is the caller's error, not damage: refused before the guard
            from retriever.device import resolve_device

            resolve_device(device)
        try:
            with self._reading(MANIFEST, everything=True):
                self.spec = IndexSpec.from_dict(manifest.index)
            for entry in manifest.segments:
                with self._reading(f"{SEGMENTS}/{entry.name}", everything=True):
                    self._segments.append(Segment(folder / SEGMENTS / entry.name, segment_spec(entry, self.spec),
                                                  device=device))
            with self._reading(CALIBRATOR, everything=True):
                config = saved_config(folder / CALIBRATOR, expected_dim=manifest.encoder["dim"])
                # A flow's weights load at first use (they need torch): show, delete, verify... never import it.
                self._calibrator = (None if loads_torch(config) else
                                    load_calibrator(folder / CALIBRATOR, expected_dim=manifest.encoder["dim"]))
            with self._reading(TOMBSTONES, everything=True):
                self.tombstones = (load_npy(folder / TOMBSTONES) if (folder / TOMBSTONES).is_file()
                                   else np.empty(0, dtype=np.int64))
                _check_tombstones(self.tombstones)
            _check_counts(manifest, [len(segment) for segment in self._segments],
                          [segment.vectors.ntotal for segment in self._segments], len(self.tombstones), self.name)
        except BaseException:
            self.close()  # the segments opened before the damage was found
            raise

    @property
    def calibrator(self) -> Calibrator:
        """The saved calibrator (a flow's weights are read here, on first use)."""
        if self._calibrator is None:
            with self._calibrator_lock, self._reading(CALIBRATOR, everything=True):
                if self._calibrator is None:
                    self._calibrator = load_calibrator(self.folder / CALIBRATOR,
                                                       expected_dim=self.manifest.encoder["dim"])
        return self._calibrator

    @property
    def segments(self) -> list[Segment]:
        if self._closed:
            raise RetrieverError(f"index '{self.name}' was closed; open it again to use it")
        return self._segments

    def close(self) -> None:
        """Release this version's files: each segment's SQLite connection, FAISS index and memory maps (a few
        descriptors a segment). A long-running process that swaps in new versions (the server) calls it once no
        request uses the old one, so pruned versions do not pile up open; using the index afterwards is refused.
        Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            segment.close()
        self._segments = []

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _reading(self, part: str, everything: bool = False) -> Iterator[None]:
        """Damage found while reading PART of this version (a file, or a folder of them) becomes one line naming the
        index, a DamagedIndexError, instead of whatever a parser raised (UnicodeDecodeError, ValueError, faiss's
        RuntimeError, sqlite3.DatabaseError...). EVERYTHING: our own refusals (RetrieverError) too, where no
        argument of the caller's is involved (opening), so any failure is the files'. OSErrors pass: a file that
        cannot be opened is not a damaged one."""
        try:
            yield
        except OSError:
            raise
        except DamagedIndexError as error:
            if str(error).startswith(f"index '{self.name}' "):
                raise
            raise self._damaged(part, error) from None
        except RetrieverError as error:
            if not everything:
                raise
            raise self._damaged(part, error) from None
        except Exception as error:
            raise self._damaged(part, error) from None

    def _damaged(self, part: str, error: BaseException | str) -> DamagedIndexError:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = reason.replace(f"{self.folder}/", "").replace(str(self.folder), "")[:200]
        return damaged_index(f"index '{self.name}'", f"{part} cannot be read ({reason}); `retriever verify` checks "
                                                     "every file")

    @classmethod
    def open(cls, name: str, index_dir: str | Path | None = None, device: str = "auto",
             runtime: str = "torch") -> Snapshot:
        """Open the current version: checks the manifest's checksum and every file's size (`verify` re-hashes).
        INDEX_DIR: where indexes live (default: the index home, `index_folder.resolve_index_dir`). RUNTIME: the
        encoder's forward pass for searches by text: "torch", or "auto"/"onnx" (ONNX Runtime on a CPU, what the
        server uses: about 3x less time per query, after a one-off export of a few seconds at the first search)."""
        index_dir = resolve_index_dir(index_dir)
        attempts = OPEN_ATTEMPTS
        while True:
            folder = resolve_existing(index_dir, name)  # resolved once: a concurrent swap cannot mix versions
            try:
                return cls(folder, read_manifest(folder, name=name), device=device, index_dir=index_dir,
                           runtime=runtime)
            except (RetrieverError, OSError):
                # Writes committed while it opened, and one pruned the version it had resolved: files went missing
                # under it. Not damage: the index is whole, in the newer version the link points at now.
                attempts -= 1
                if not attempts or resolve_existing(index_dir, name) == folder:
                    raise

    @classmethod
    def open_version(cls, folder: str | Path, name: str, index_dir: str | Path | None = None,
                     device: str = "auto") -> Snapshot:
        """Open one version folder of NAME (as a write's `ChangeSummary.snapshot` does), current or not."""
        folder = Path(folder)
        return cls(folder, read_manifest(folder, name=name), device=device, index_dir=index_dir)

    @property
    def encoder(self) -> Encoder:
        """The recorded encoder, loaded on first use (search needs it; info and delete do not)."""
        if self._encoder is None:
            self._encoder = self.load_encoder(self.runtime)
        return self._encoder

    def use_encoder(self, encoder: Encoder) -> None:
        """Search with ENCODER, already loaded, instead of loading the recorded one: a server holding one model
        for many indexes (and versions) built with it. The caller vouches that it is the recorded encoder."""
        self._encoder = encoder

    def load_encoder(self, runtime: str = "torch") -> Encoder:
        """A new instance of the recorded encoder; RUNTIME picks PyTorch or ONNX Runtime for its forward pass."""
        from retriever.encoder import Encoder

        try:
            return Encoder.from_config(self.manifest.encoder, device=self.device, runtime=runtime)
        except RetrieverError as error:  # e.g. built elsewhere with a model this machine does not have
            raise RetrieverError(
                f"index '{self.name}' cannot encode text with the model it was built with: {error}"
            ) from None

    def __len__(self) -> int:
        return self.manifest.documents

    # --- reading -------------------------------------------------------------------------------------------

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Texts to the index's space: the recorded encoder, the saved calibrator, L2 normalization."""
        return l2_normalize(self.calibrator.transform(self.encoder.encode(texts, progress=progress)))

    def search(self, queries: str | Sequence[str], k: int = 10, progress: bool = False, nprobe: int | None = None,
               ef_search: int | None = None, rerank: int | None = None, mode: str | None = None,
               fusion: str | None = None, weight: float | None = None,
               stop_words: bool | None = None, space: str = "calibrated",
               min_score: float | None = None, where: str | dict | Filter | None = None) -> list[list[SearchHit]]:
        """Top-k documents for each query (a single string gives a one-element list).

        MIN_SCORE: leave out hits whose dense score (cosine) is below it, so that a query with no good match gets
        fewer hits or none (`at_least`); hybrid hits are held to their dense side, keyword search refuses it.
        WHERE: only documents this filter selects (`retriever.filters`: a JSON text or object), in every mode
        and space; a filter that selects at least k documents always gets k hits.

        SPACE "raw": rank by the uncalibrated vectors instead (exact; dense only), to compare with the calibrated
        ranking (`search_raw`).

        MODE: "dense" (the calibrated vectors), "keyword" (BM25) or "hybrid" (both, fused by FUSION with the
        dense side's WEIGHT: `retriever.fusion`); default: hybrid where the index has a keyword index, else dense.
        STOP_WORDS: keyword search leaves out a query's English stop words when it has other words (default:
        DEFAULT_STOP_WORDS).
        NPROBE (ivf, ivfpq), EF_SEARCH (hnsw) and RERANK (ivfpq) override the index's defaults."""
        queries = [queries] if isinstance(queries, str) else list(queries)
        check_queries(queries)
        where = where if isinstance(where, Filter) else parse_where(where)
        if self.raw_space(space, mode):
            check_min_score(min_score, "dense")
            return at_least(self.search_raw(self.encoder.encode(queries, progress=progress), k, where), min_score)
        mode = self.resolve_mode(mode)
        check_min_score(min_score, mode)
        vectors = self.embed(queries, progress=progress) if mode != "keyword" else None
        return at_least(self.search_encoded(queries, vectors, k, mode, fusion, weight, nprobe, ef_search, rerank,
                                            stop_words, where), min_score)

    @staticmethod
    def raw_space(space: str, mode: str | None) -> bool:
        """Whether SPACE asks for the raw (uncalibrated) ranking; refuses a space it does not know, and raw with a
        MODE other than dense."""
        if space not in SPACES:
            raise RetrieverError(f"unknown {param('space')} {space!r}; known: {', '.join(SPACES)}")
        if space == "raw" and mode not in (None, "dense"):
            raise RetrieverError(f"{param('space', 'raw')} ranks by the uncalibrated vectors: it goes with "
                                 f"{param('mode', 'dense')} only")
        return space == "raw"

    def resolve_mode(self, mode: str | None) -> str:
        """MODE checked against this index; None: hybrid where the index has a keyword index, else dense."""
        keywords = all(segment.keywords is not None for segment in self.segments)
        if mode is None:
            return "hybrid" if keywords else "dense"
        if mode not in MODES:
            raise RetrieverError(f"unknown {param('mode')} {mode!r}; known: {', '.join(MODES)}")
        if mode != "dense" and not keywords:
            raise RetrieverError(f"index '{self.name}' has no keyword index (it was written before keyword search "
                                 f"existed): compacting it adds one, or search with {param('mode', 'dense')}")
        return mode

    def search_encoded(self, texts: Sequence[str], vectors: np.ndarray | None, k: int, mode: str | None = None,
                       fusion: str | None = None, weight: float | None = None, nprobe: int | None = None,
                       ef_search: int | None = None, rerank: int | None = None,
                       stop_words: bool | None = None, where: Filter | None = None) -> list[list[SearchHit]]:
        """The one search path (`search`, the server's batches, the benchmarks): TEXTS with their VECTORS already
        in the index's space (`embed` or `calibrate`; None for keyword search), WHERE a compiled filter."""
        if k < 1:
            raise RetrieverError(f"-k must be at least 1 (got {k})")
        mode = self.resolve_mode(mode)
        allowed = self.matching(where) if where is not None else None
        if mode == "dense":
            return self.hits(*self.search_vectors(vectors, k, nprobe, ef_search, rerank, allowed))
        if mode == "keyword":
            return self._ranked_hits([[Ranked(int(r), float(s), keyword_score=float(s), keyword_rank=rank)
                                       for rank, (r, s) in enumerate(zip(side.rowids.tolist(), side.scores.tolist()),
                                                                     start=1)]
                                      for side in self._keyword_side(texts, k, stop_words, allowed)])
        fuser = make_fusion(fusion or DEFAULT_FUSION)
        weight = check_weight(DEFAULT_WEIGHT if weight is None else weight)
        return self._hybrid(texts, vectors, k, fuser, weight, nprobe, ef_search, rerank, stop_words, allowed)

    def matching(self, where: Filter) -> np.ndarray:
        """The live row ids (int64, ascending) WHERE selects, over every segment; remembered for the version's
        most recent filters."""
        key = json.dumps(where.source, sort_keys=True)
        with self._lazy_lock:
            if key in self._matching:
                self._matching.move_to_end(key)
                return self._matching[key]
        parts = []
        for segment in self.segments:
            with self._reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                parts.append(segment.documents.matching(where))
        found = np.concatenate(parts) if parts else np.empty(0, np.int64)
        found = found[~np.isin(found, self.tombstones)] if len(self.tombstones) else found
        with self._lazy_lock:
            self._matching[key] = found
            total = sum(2 * held.nbytes for held in self._matching.values())  # with its per-segment split
            while len(self._matching) > 1 and (len(self._matching) > FILTERS_REMEMBERED
                                               or total > FILTER_CACHE_BYTES):
                _, old = self._matching.popitem(last=False)
                self._splits.pop(id(old), None)
                total -= 2 * old.nbytes
        return found

    def _per_segment(self, allowed: np.ndarray) -> list[np.ndarray]:
        """ALLOWED split by segment; remembered with the filter's matches (the same array object) so that a
        repeated filter costs no pass over its matches per query."""
        with self._lazy_lock:
            split = self._splits.get(id(allowed))
            if split is not None and split[0] is allowed:
                return split[1]
        parts = [allowed[segment.contains(allowed)] for segment in self.segments]
        with self._lazy_lock:
            if any(held is allowed for held in self._matching.values()):  # kept, and dropped, with its matches
                self._splits[id(allowed)] = (allowed, parts)
        return parts

    def filter_plan(self, matches: int, k: int, nprobe: int | None = None,
                    ef_search: int | None = None) -> FilterPlan:
        """How a dense search restricted to MATCHES documents runs (`retriever.filter_plan`)."""
        return plan_filtered_search(matches, len(self), k, self.spec, ef_search, nprobe)

    def _keyword_side(self, texts: Sequence[str], depth: int, stop_words: bool | None,
                      allowed: np.ndarray | None) -> list[KeywordList]:
        """Each text's keyword top DEPTH (with ALLOWED, among those row ids), with its matches kept for scoring
        other candidates."""
        scorer = self.keyword_scorer()
        stop_words = DEFAULT_STOP_WORDS if stop_words is None else stop_words
        sides = []
        for text in texts:
            matches = self._match(scorer, text, stop_words)
            sides.append(KeywordList(matches, *self._keyword_top(matches, depth, allowed)))
        return sides

    def _hybrid(self, texts: Sequence[str], vectors: np.ndarray, k: int, fuser: Fusion, weight: float,
                nprobe: int | None, ef_search: int | None, rerank: int | None, stop_words: bool | None,
                allowed: np.ndarray | None) -> list[list[SearchHit]]:
        """Fuse each query's dense top list (of VECTORS) with its keyword top list by FUSER, the dense side weighing
        WEIGHT. The two sides run one after the other: measured on 2 cores, a thread for the keyword side gained
        nothing beside the dense search and lost beside the encoder (`benchmarks/results/README.md`, hybrid at 1M)."""
        depth = max(k, CANDIDATES)
        dense_scores, dense_ids = self.search_vectors(vectors, depth, nprobe, ef_search, rerank, allowed)
        null = self._dense_null(vectors) if fuser.needs_null else [(0.0, 1.0)] * len(texts)
        found = []
        for number, side in enumerate(self._keyword_side(texts, depth, stop_words, allowed)):
            candidates = self._candidates(vectors[number], dense_scores[number], dense_ids[number], side,
                                          null[number], fuser.needs_null)
            fused = fuser.scores(candidates, weight)
            found.append([Ranked(int(candidates.rowids[i]), float(fused[i]), float(candidates.dense[i]),
                                 float(candidates.keyword[i]), int(candidates.dense_rank[i]) or None,
                                 int(candidates.keyword_rank[i]) or None)
                          for i in top_list(fused, candidates.rowids, k).tolist()])
        return self._ranked_hits(found)

    def _candidates(self, query: np.ndarray, dense_scores: np.ndarray, dense_ids: np.ndarray, side: KeywordList,
                    dense_null: tuple[float, float], with_null: bool) -> Candidates:
        """One query's hybrid candidates: the union of the dense top list (DENSE_IDS, DENSE_SCORES) and the keyword
        top list (SIDE), each scored on both sides (a dense score as the dense search gave it, or from the stored
        vector)."""
        listed = dense_ids[dense_ids >= 0]
        union = np.union1d(listed, side.rowids)
        dense_rank, keyword_rank = _ranks(union, listed), _ranks(union, side.rowids)
        dense = np.zeros(len(union), np.float32)
        dense[dense_rank > 0] = dense_scores[dense_rank[dense_rank > 0] - 1]
        dense[dense_rank == 0] = self._dense_scores(query, union[dense_rank == 0])
        keyword = np.zeros(len(union), np.float32)
        keyword[keyword_rank > 0] = side.scores[keyword_rank[keyword_rank > 0] - 1]
        keyword[keyword_rank == 0] = self._keyword_scores(side.matches, union[keyword_rank == 0])
        with self._reading(SEGMENTS):
            keyword_null = side.matches.null() if with_null else (0.0, 1.0)
        return Candidates(union, dense, keyword, dense_rank, keyword_rank, dense_null, keyword_null)

    def keyword_scorer(self) -> KeywordScorer:
        """BM25 over this version's live documents (built on first use, then kept: a version never changes)."""
        with self._lazy_lock:
            if self._keyword_scorer is None:
                with self._reading(SEGMENTS):
                    self._keyword_scorer = KeywordScorer(
                        [segment.keywords for segment in self.segments],
                        [~np.isin(segment.rowids, self.tombstones) for segment in self.segments])
            return self._keyword_scorer

    def _match(self, scorer: KeywordScorer, text: str, stop_words: bool) -> QueryMatches:
        with self._reading(SEGMENTS):  # damaged keyword files: one line naming the index
            return scorer.match(text, stop_words)

    def _keyword_top(self, matches: QueryMatches, count: int,
                     allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The COUNT best keyword matches over all segments: (row ids, BM25 scores), best first; with ALLOWED, among
        those row ids only (every match scored, then filtered: the scores are the unfiltered index's)."""
        with self._reading(SEGMENTS):
            segments, positions, scores = matches.candidates(count) if allowed is None else matches.every_match()
        rowids = np.empty(len(positions), np.int64)
        for number, segment in enumerate(self.segments):
            mine = segments == number
            rowids[mine] = np.asarray(segment.rowids)[positions[mine]]
        if allowed is not None:
            kept = _member(rowids, allowed)
            rowids, scores = rowids[kept], scores[kept]
        best = top_list(scores, rowids, count)
        return rowids[best], scores[best]

    def _keyword_scores(self, matches: QueryMatches, rowids: np.ndarray) -> np.ndarray:
        scores = np.zeros(len(rowids), np.float32)
        for number, segment in enumerate(self.segments):
            mine = segment.contains(rowids)
            if mine.any():
                with self._reading(f"{SEGMENTS}/{segment.name}"):
                    scores[mine] = matches.scores(number, np.searchsorted(segment.rowids, rowids[mine]))
        return scores

    def _dense_scores(self, query: np.ndarray, rowids: np.ndarray) -> np.ndarray:
        """Cosines of ROWIDS' vectors with QUERY (in the index's space)."""
        return self._space_vectors(rowids) @ query if len(rowids) else np.zeros(0, np.float32)

    def _space_vectors(self, rowids: np.ndarray) -> np.ndarray:
        if self._remote is not None:
            return self._remote.space_vectors(self, rowids)
        return self.space_vectors(rowids)

    def space_vectors(self, rowids: np.ndarray, numbers: Iterable[int] | None = None) -> np.ndarray:
        """ROWIDS' vectors in the index's space: the stored vectors a search scores (flat, hnsw), else their raw
        vectors calibrated as at build (IVF types keep no float vectors). NUMBERS: only those segments are read
        (rows of the others stay zero)."""
        vectors = np.zeros((len(rowids), self.manifest.dim), np.float32)
        wanted = None if numbers is None else set(numbers)
        for number, segment in enumerate(self.segments):
            if wanted is not None and number not in wanted:
                continue
            mine = segment.contains(rowids)
            if mine.any():
                with self._reading(f"{SEGMENTS}/{segment.name}"):
                    found = segment.vectors.vectors_of(rowids[mine])
                    if found is None:
                        found = l2_normalize(self.calibrator.transform(segment.raw_for(rowids[mine])))
                    vectors[mine] = found
        return vectors

    def _dense_null(self, queries: np.ndarray) -> list[tuple[float, float]]:
        """Each query's dense score over every document: mean and standard deviation, from the mean and covariance
        of a sample of the stored vectors in the index's space (estimated once per version)."""
        with self._lazy_lock:
            if self._dense_moments is None:
                sample = self.calibrate(self.raw_sample(NULL_SAMPLE, seed=0))
                if len(sample) < 2:
                    sample = (np.vstack([sample, -sample]) if len(sample) else
                              np.eye(2, queries.shape[1], dtype=np.float32))
                self._dense_moments = (sample.mean(0), np.cov(sample, rowvar=False).astype(np.float32))
            mean, covariance = self._dense_moments
        means = queries @ mean
        spreads = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", queries, covariance, queries), 0.0))
        return list(zip(means.tolist(), spreads.tolist()))

    def _ranked_hits(self, found: list[list[Ranked]]) -> list[list[SearchHit]]:
        """SearchHits with their documents for each query's ranked row ids."""
        ids = np.array([r.rowid for ranked in found for r in ranked], dtype=np.int64)
        with self._reading(SEGMENTS):
            rows = self._rows(ids)
            return [[SearchHit(rank, rows[r.rowid]["doc_id"], r.score, rows[r.rowid]["title"], rows[r.rowid]["text"],
                               r.dense_score, r.keyword_score, r.dense_rank, r.keyword_rank,
                               rows[r.rowid]["metadata"])
                     for rank, r in enumerate(ranked, start=1)] for ranked in found]

    def calibrate(self, raw: np.ndarray) -> np.ndarray:
        """Raw encoder output to the index's space: the saved calibrator, then L2 normalization. The server
        encodes many requests' queries in one encoder call and calibrates each with its own index's calibrator."""
        return l2_normalize(self.calibrator.transform(raw))

    def hits(self, scores: np.ndarray, ids: np.ndarray) -> list[list[SearchHit]]:
        """SearchHits with their documents for `search_vectors`' scores and row ids (padding ids skipped)."""
        with self._reading(SEGMENTS):  # a row id no segment holds (a KeyError here) means damaged files
            rows = self._rows(ids)
            results = []
            for query_scores, query_ids in zip(scores, ids):
                hits = []
                for score, rowid in zip(query_scores.tolist(), query_ids.tolist()):
                    if rowid < 0:
                        break
                    row = rows[rowid]
                    hits.append(SearchHit(len(hits) + 1, row["doc_id"], score, row["title"], row["text"],
                                          dense_score=score, dense_rank=len(hits) + 1, metadata=row["metadata"]))
                results.append(hits)
        return results

    def search_raw(self, raw: np.ndarray, k: int, where: Filter | None = None) -> list[list[SearchHit]]:
        """Exact cosine ranking in the uncalibrated space: RAW encoder outputs of queries against every stored raw
        vector (deleted documents excluded; with WHERE, only those it selects). What the index would return without
        calibration, to compare with."""
        allowed = self.matching(where) if where is not None else None
        queries = l2_normalize(np.asarray(raw, dtype=np.float32))
        best_scores = np.full((len(queries), k), -np.inf, np.float32)
        best_ids = np.full((len(queries), k), -1, np.int64)
        for segment in self.segments:
            # From the mapping, not the file path: a server may still answer from a version since pruned.
            for start in range(0, len(segment), 65536):
                rowids = np.asarray(segment.rowids[start : start + 65536])
                block = np.asarray(segment.raw[start : start + 65536], dtype=np.float32)
                keep = ~np.isin(rowids, self.tombstones) if allowed is None else _member(rowids, allowed)
                if not keep.any():
                    continue
                scores = queries @ l2_normalize(block[keep]).T
                merged_scores = np.concatenate([best_scores, scores], axis=1)
                merged_ids = np.concatenate([best_ids, np.broadcast_to(rowids[keep], scores.shape)], axis=1)
                order = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
                best_scores = np.take_along_axis(merged_scores, order, axis=1)
                best_ids = np.take_along_axis(merged_ids, order, axis=1)
        best_ids[np.isneginf(best_scores)] = -1
        return self.hits(best_scores, best_ids)

    def search_vectors(self, queries: np.ndarray, k: int, nprobe: int | None = None, ef_search: int | None = None,
                       rerank: int | None = None, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k row ids and scores for calibrated, L2-normalized query vectors, over every segment, deleted
        documents excluded (with ALLOWED, sorted live row ids: among those only, planned by `filter_plan`); rows
        padded with id -1 where fewer than k documents exist."""
        if rerank is not None and rerank < 1:
            raise RetrieverError(f"{param('rerank')} must be at least 1 (got {rerank})")
        rerank = rerank if rerank is not None else self.spec.search_rerank
        if allowed is None:
            return self._search_segments(queries, k, rerank, nprobe, ef_search)
        plan = self.filter_plan(len(allowed), k, nprobe, ef_search)
        includes = self._per_segment(allowed)
        scores, ids = self._search_segments(queries, k, rerank, plan.nprobe or nprobe, plan.ef_search or ef_search,
                                            includes, plan.exact)
        # A filter that matches k documents gets k hits: where the ANN found fewer among the matches (they lay
        # outside the buckets probed or the beam), those queries score every match.
        short = (ids >= 0).sum(axis=1) < min(k, len(allowed))
        if short.any() and not plan.exact:
            scores[short], ids[short] = self._search_segments(queries[short], k, rerank, self.spec.nlist, None,
                                                              includes, exact=True)
        return scores, ids

    def _search_segments(self, queries: np.ndarray, k: int, rerank: int, nprobe: int | None,
                         ef_search: int | None, includes: list[np.ndarray] | None = None,
                         exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Each segment's top-k (INCLUDES: only those row ids, per segment; EXACT: every one scored, or for IVF
        types every bucket probed), re-ranked where compressed, merged; by the remote segments where some are set."""
        by_number = None if includes is None else dict(enumerate(includes))
        if self._remote is not None:
            lists = self._remote.top_lists(self, queries, k, rerank, nprobe, ef_search, by_number, exact)
        else:
            lists = self.segment_top_lists(range(len(self.segments)), queries, k, rerank, nprobe, ef_search, by_number,
                                           exact)
        return merge_top_lists(lists, k, len(queries))

    def segment_top_lists(self, numbers: Iterable[int], queries: np.ndarray, k: int, rerank: int,
                          nprobe: int | None, ef_search: int | None, includes: dict[int, np.ndarray] | None = None,
                          exact: bool = False) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(segment number, scores, row ids) of the top-k of each segment of NUMBERS, as `_search_segments` merges
        them (a shard of a distributed server answers for its own segments with it)."""
        candidates = k * rerank if self.spec.kind.compressed else k
        lists = []
        for number in numbers:
            segment = self.segments[number]
            include = None if includes is None else includes.get(number, np.empty(0, np.int64))
            if include is not None and not len(include):
                continue
            with self._reading(f"{SEGMENTS}/{segment.name}"):
                # An include list holds live rows only: no tombstones to exclude on top.
                scores, ids = segment.vectors.search(queries, candidates, self.tombstones if include is None else None,
                                                     nprobe, ef_search, include, exact)
                if candidates > k:
                    scores, ids = self._rerank(segment, queries, ids, k)
            lists.append((number, scores, ids))
        return lists

    def use_remote_segments(self, remote: RemoteSegments) -> None:
        """Search this version's vectors through REMOTE (a distributed server's shards) instead of in this
        process; keyword search, documents and fusion stay here."""
        self._remote = remote

    def _rerank(self, segment: Segment, queries: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact scores for approximate candidates: their raw vectors, calibrated as at build, against the query."""
        found = ids >= 0
        unique = np.unique(ids[found])
        exact = np.full(ids.shape, -np.inf, dtype=np.float32)
        if len(unique):
            vectors = l2_normalize(self.calibrator.transform(segment.raw_for(unique)))
            positions = np.searchsorted(unique, ids[found])
            rows = np.nonzero(found)[0]
            exact[found] = np.einsum("ij,ij->i", queries[rows], vectors[positions])
        order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
        scores, best = np.take_along_axis(exact, order, axis=1), np.take_along_axis(ids, order, axis=1)
        best[np.isneginf(scores)] = -1
        return scores, best

    def _rows(self, ids: np.ndarray) -> dict[int, dict]:
        """Document rows for the found row ids, fetched from each segment that holds some."""
        wanted = np.unique(ids[ids >= 0])
        rows: dict[int, dict] = {}
        for segment in self.segments:
            here = wanted[segment.contains(wanted)]
            if len(here):
                with self._reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                    rows.update((row["rowid"], row) for row in segment.documents.get(here))
        return rows

    def document(self, doc_id: str) -> dict | None:
        """The stored row of DOC_ID (doc_id, title, text, source, line), or None if it is not in the index."""
        for segment in self.segments:
            with self._reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                rowid = segment.documents.rowids_for([doc_id]).get(doc_id)
                if rowid is not None and not _in(rowid, self.tombstones):
                    return segment.documents.get([rowid])[0]
        return None

    def live_rowids(self, doc_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """doc_id -> (row id, segment position) for those of DOC_IDS in the index (deleted ones are not)."""
        found: dict[str, tuple[int, int]] = {}
        for position, segment in enumerate(self.segments):
            with self._reading(f"{SEGMENTS}/{segment.name}/{DOCUMENTS}"):
                for doc_id, rowid in segment.documents.rowids_for(doc_ids).items():
                    if not _in(rowid, self.tombstones):
                        found[doc_id] = (rowid, position)
        return found

    def raw_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """All uncalibrated vectors (float32) of documents in the index, with their row ids. Holds every vector
        in memory: for small indexes and tests; the library itself streams (`Segment.raw_blocks`)."""
        raws, ids = [], []
        for segment in self.segments:
            keep = ~np.isin(segment.rowids, self.tombstones)
            raws.append(np.asarray(segment.raw[keep], dtype=np.float32))
            ids.append(np.asarray(segment.rowids[keep]))
        dim = self.manifest.encoder["dim"]
        return (np.concatenate(raws) if raws else np.empty((0, dim), np.float32),
                np.concatenate(ids) if ids else np.empty(0, np.int64))

    def raw_sample(self, size: int, seed: int = 0) -> np.ndarray:
        """At most SIZE raw vectors (float32) of documents in the index, drawn uniformly with SEED; a value that is
        not finite (what a flipped bit in a float16 file can make) is a damaged segment, not something to fit on."""
        total = sum(len(segment) for segment in self.segments)
        rows = fit_sample_rows(total, size, seed)
        parts, offset = [], 0
        for segment in self.segments:
            local = np.arange(len(segment)) if rows is None else rows[(rows >= offset) & (rows < offset + len(segment))] - offset
            if len(local):
                vectors = np.asarray(segment.raw[local], dtype=np.float32)
                if not np.isfinite(vectors).all():
                    raise self._damaged(f"{SEGMENTS}/{segment.name}/{RAW}", "it holds values that are not finite")
                parts.append(vectors[~np.isin(np.asarray(segment.rowids[local]), self.tombstones)])
            offset += len(segment)
        return np.concatenate(parts) if parts else np.empty((0, self.manifest.encoder["dim"]), np.float32)

    def check_sources(self):
        """DOCUMENTS_AT and VECTORS_AT over the documents in the index (deleted ones left out), for
        `pseudo_queries.make_check_set`: position i is the i-th live row id, segment by segment."""
        live = [np.asarray(segment.rowids)[~np.isin(segment.rowids, self.tombstones)] for segment in self.segments]
        rowids = np.concatenate(live) if live else np.empty(0, np.int64)
        owner = np.concatenate([np.full(len(ids), number) for number, ids in enumerate(live)]) if live else rowids

        def each_segment(positions: np.ndarray, read) -> list:
            found: list = [None] * len(positions)
            for number, segment in enumerate(self.segments):
                mine = np.flatnonzero(owner[positions] == number)
                if len(mine):
                    with self._reading(f"{SEGMENTS}/{segment.name}"):
                        for slot, value in zip(mine.tolist(), read(segment, rowids[positions[mine]])):
                            found[slot] = value
            return found

        def documents_at(positions: np.ndarray) -> list[tuple[str | None, str]]:
            return each_segment(positions, lambda segment, ids: [(row["title"], row["text"]) for row in
                                                                segment.documents.get(ids, ("title", "text"))])

        def vectors_at(positions: np.ndarray) -> np.ndarray:
            dim = self.manifest.encoder["dim"]
            return np.asarray(each_segment(positions, lambda segment, ids: list(segment.raw_for(ids))),
                              dtype=np.float32).reshape(len(positions), dim)

        return documents_at, vectors_at

    def check(self, fit_sample: int | None = DEFAULT_FIT_SAMPLE, seed: int = 0, progress: bool = False) -> dict:
        """The retrieval check on this index's own documents, without labels: pseudo-queries made from them
        (`retriever.pseudo_queries`), searched through the raw vectors, through `auto`'s candidates fitted on a
        sample of the stored raw vectors, and through the index's own calibrator as saved. Returns the check's
        record (`AutoCalibrator.decision["check"]`) with what auto would choose now ("auto") and the index's own
        calibrator's result ("current")."""
        from retriever.calibration.auto import supported_kinds, voting_kinds
        from retriever.calibration.check import CONFIDENCE, baseline_result, compare, score_queries

        documents_at, vectors_at = self.check_sources()
        check = make_check_set(len(self), documents_at, vectors_at, self.encoder, seed, progress=progress)
        if not len(check):
            raise RetrieverError(f"index '{self.name}' has no document long enough to cut a pseudo-query from (a "
                                 "title and 3 words of text, or 6 words): there is nothing to check with")
        auto = make_calibrator("auto", seed=seed, device="cpu")
        auto.fit(self.raw_sample(fit_sample or len(self), seed=seed), check=check)
        baseline = score_queries(check, lambda raw: np.asarray(raw, np.float32))
        none, voters = baseline_result("none", check, baseline), voting_kinds(check)
        record = dict(auto.decision.get("check") or {
            "pseudo_queries": len(check), "kinds": check.counts(), "pool": check.pool_size, "confidence": CONFIDENCE,
            "voting_kinds": voters, "none": none.record(), "candidates": []})
        current = self.calibrator.chosen if isinstance(self.calibrator, AutoCalibrator) else self.calibrator
        if current.name != "none":
            (result,) = compare(check, baseline, [(current.name, score_queries(check, current.transform))], seed=seed)
            record["current"] = {**result.record(), "kinds_improved": supported_kinds(result, none, voters)}
        else:
            record["current"] = {"name": "none"}
        record["current"]["calibrator"] = self.manifest.calibrator["name"]
        record["auto"] = {"chosen": auto.decision["chosen"]["name"], "reason": auto.decision["reason"]}
        return record

    def info(self, sample: int = 5000, seed: int = 0) -> dict:
        """Manifest, counts, and isotropy before and after calibration on a sample of the stored vectors."""
        raw = self.raw_sample(sample, seed)
        with self._reading(f"{SEGMENTS} and {CALIBRATOR}", everything=True):  # no argument here can fail these
            files = self.manifest.files
            segments = [{"name": s.name, "rows": len(s),
                         "index_bytes": files[f"{SEGMENTS}/{s.name}/{VECTORS}"].bytes} for s in self.segments]
            calibrated = l2_normalize(self.calibrator.transform(raw)) if len(raw) else raw
            # The same pairs for both (one seed each), so calibrator none reads the same before and after.
            measured = {"raw": isotropy(raw, np.random.default_rng(seed)),
                        "calibrated": isotropy(calibrated, np.random.default_rng(seed)) if len(raw) else {}}
        return {
            "manifest": self.manifest.described(),
            "folder": str(self.folder),
            "documents": len(self),
            "vectors": sum(segment.vectors.ntotal for segment in self.segments),
            "deleted": len(self.tombstones),
            "segments": segments,
            "search_backend": self.segments[0].vectors.backend if self.segments else "none",
            "search_settings": self.spec.search_settings(),
            "metadata_fields": self.manifest.metadata_fields,
            "search_modes": list(MODES) if self.resolve_mode(None) == "hybrid" else ["dense"],
            "default_mode": self.resolve_mode(None),
            "isotropy": measured,
        }

    def verify(self, progress=None) -> int:
        """Re-hash every file against the manifest (opening only checks sizes, and the counts); returns the bytes
        checked."""
        return verify_files(self.folder, self.manifest, name=self.name, progress=progress)

    def template(self):
        """This version's trained template (IVF types), re-hashed first, for a write whose new segments start from
        a copy of it; None for the types that train nothing."""
        if not (self.folder / TEMPLATE).is_file():
            return None
        self.check_read(TEMPLATE)
        with self._reading(TEMPLATE, everything=True):
            return load_template(self.folder / TEMPLATE, self.spec)

    def check_read(self, *parts: str) -> None:
        """Before a write reads PARTS of this version (files, or folders of them) into a new one: re-hash them
        against the manifest (`index_folder.verify_read`), so damage is refused instead of carried on."""
        files = self.manifest.files
        verify_read(self.folder, [relative for relative in files
                                  if any(relative == part or relative.startswith(part + "/") for part in parts)],
                    files, self.name)


def verify_index(name: str, index_dir: str | Path | None = None, progress=None) -> tuple[Manifest, int]:
    """Re-hash every file of NAME's current version against its manifest, without opening (and so trusting)
    any of them first; returns the manifest and the bytes checked."""
    index_dir = resolve_index_dir(index_dir)
    folder = resolve_existing(index_dir, name)
    manifest = read_manifest(folder, name=name)  # its types checked before a path from it is followed
    checked = verify_files(folder, manifest, name=name, progress=progress)
    _check_counts(manifest, [_stored_rows(folder, f"{SEGMENTS}/{entry.name}/{ROWIDS}", name)
                             for entry in manifest.segments], None,
                  _stored_rows(folder, TOMBSTONES, name) if (folder / TOMBSTONES).is_file() else 0, name)
    return manifest, checked


def _stored_rows(folder: Path, relative: str, name: str) -> int:
    """The rows of a .npy of the version in FOLDER, from its header alone."""
    try:
        return int(npy_layout(folder / relative)[0][0])
    except (RetrieverError, IndexError) as error:
        reason = str(error).replace(f"{folder}/", "") if isinstance(error, RetrieverError) else "no rows"
        raise damaged_index(f"index '{name}'", f"{relative} cannot be read ({reason})") from None


def _check_counts(manifest: Manifest, rows: list[int], vectors: list[int] | None, deleted: int, name: str) -> None:
    """The manifest's counts against the files': each segment's ROWS (and VECTORS, when loaded), and its document
    count against all rows less the DELETED ones. Header reads only, so opening stays cheap; a manifest written
    by hand or a swapped file shows here rather than as wrong counts or missing rows later."""
    def damaged(problem: str) -> DamagedIndexError:
        return damaged_index(f"index '{name}'", problem)

    for number, (entry, held) in enumerate(zip(manifest.segments, rows)):
        where = f"{SEGMENTS}/{entry.name}"
        if held != entry.rows:
            raise damaged(f"{where}/{ROWIDS} holds {held:,} rows, the manifest says {entry.rows:,}")
        if vectors is not None and vectors[number] != held:
            raise damaged(f"{where}/{VECTORS} holds {vectors[number]:,} vectors for {held:,} rows")
    if manifest.documents != sum(rows) - deleted:
        raise damaged(f"the manifest counts {_documents(manifest.documents)}, but its segments hold "
                      f"{_count(sum(rows), 'row')} of which {deleted:,} are deleted")


def _check_tombstones(tombstones: np.ndarray) -> None:
    """Tombstones are row ids, ascending and distinct (searches look them up by bisection)."""
    if tombstones.ndim != 1 or tombstones.dtype.kind not in "iu" or (np.diff(tombstones) <= 0).any():
        raise RetrieverError("not an ascending list of row ids")


def segment_spec(entry: SegmentEntry, spec: IndexSpec) -> IndexSpec:
    """The index settings of the segment ENTRY in a version whose settings are SPEC (small hnsw segments are
    flat)."""
    kind = entry.index or spec.type
    return spec if kind == spec.type else IndexSpec(type=kind)


def _in(rowid: int, sorted_ids: np.ndarray) -> bool:
    position = np.searchsorted(sorted_ids, rowid)
    return bool(position < len(sorted_ids) and sorted_ids[position] == rowid)


def isotropy(vectors: np.ndarray, rng: np.random.Generator, pairs: int = 20000) -> dict:
    """Mean cosine of random pairs (0 for an isotropic space) and the variance share of the top direction, both of
    the unit-normalized vectors: what cosine similarity sees."""
    if len(vectors) < 2:
        return {}
    unit = l2_normalize(vectors.astype(np.float32))
    first, second = rng.integers(0, len(unit), (2, pairs))
    distinct = first != second
    mean_cosine = float((unit[first[distinct]] * unit[second[distinct]]).sum(1).mean())
    singular = np.linalg.svd(unit - unit.mean(0), compute_uv=False)
    variance = singular**2
    return {"mean_cosine_random_pairs": round(mean_cosine, 4),
            "top_direction_variance_share": round(float(variance[0] / variance.sum()), 4)}


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _documents(count: int) -> str:
    return _count(count, "document")
