"""The calibrated index: text -> Encoder -> Calibrator -> L2 -> FAISS, with documents in SQLite.

`Index.build` streams a corpus through the pipeline stages (`retriever.pipeline`) and fits the calibrator
unsupervised on a sample of the corpus's own embeddings; `Index.open(...).search` sends queries through exactly
the encode path the manifest records. A version is a manifest over immutable segments plus tombstones:

- `add` writes one new segment; `delete` writes tombstones that searches filter out; both reuse everything else
  through hard links (`index_folder.link_tree`), so a write costs what it changes, not the size of the index;
- `compact` merges segments and drops tombstones (and runs by itself past `COMPACT_*` thresholds);
- `refit` fits a new calibrator on the stored raw vectors and rewrites the vector indexes, without re-encoding.

Every write builds a new version folder and swaps it in atomically (see `index_folder`), so a failed or killed
write loses nothing and readers see one version or the other, never a mix. A write re-hashes what it reads from
the previous version (`index_folder.verify_read`), so damage is refused rather than carried into a new version.

Damage found while reading (a file that no longer parses, counts that disagree) is a `DamagedIndexError` naming
the index, in one line; `close()` releases a version's files (a server swapping versions calls it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever.calibration import (
    DEFAULT_CALIBRATOR,
    AutoCalibrator,
    DEFAULT_FIT_SAMPLE,
    Calibrator,
    fit_calibrator,
    fit_sample_rows,
    load_calibrator,
    make_calibrator,
    too_few_to_fit,
)
from retriever.corpus import Document, check_documents, corpus_format, document_text, iter_corpus
from retriever.build_steps import (
    ChangeSummary,
    check_build_arguments,
    enough_to_fit,
    fallback_note,
    fit_summary,
    fitted_out_dim,
    new_manifest,
    note,
    now_iso,
    parse_fit_queries,
    queries_to_fit,
    save_fitted,
    segment_entry,
    train_index,
)
from retriever.encoder import Encoder
from retriever.engines import ENGINES
from retriever.errors import ConflictError, DamagedIndexError, NotFoundError, RetrieverError
from retriever.index_folder import (
    BUILD_STATE,
    resolve_index_dir,
    MANIFEST,
    damaged_index,
    link_tree,
    read_manifest,
    resolve_existing,
    verify_files,
    verify_read,
    write_manifest,
    writing,
)
from retriever.pipeline import (
    CHUNK_ROWS,
    BuildState,
    calibrated_blocks,
    check_set,
    check_vectors,
    encode_table,
    fit,
    fitted_query_count,
    ingest,
    l2_normalize,
    source_fingerprint,
    table_texts,
    with_queries,
    write_segment_vectors,
)
from retriever.layout import (
    CALIBRATOR,
    ENCODED,
    SEGMENT_NAME,
    SEGMENTS,
    TEMPLATE,
    TOMBSTONES,
    segment_name,
)
from retriever.progress import stderr_console
from retriever.pseudo_queries import make_check_set
from retriever.store.arrays import VectorSource, load_npy, npy_layout, vector_source
from retriever.store.documents import DocumentTable
from retriever.store.segment import DOCUMENTS, RAW, ROWIDS, VECTORS, RawWriter, Segment
from retriever.store.vectors import IndexSpec, VectorStore, train_template
from retriever.text import check_queries

# Automatic compaction after a write: a segment whose tombstones reach this share of its rows is rewritten...
COMPACT_TOMBSTONE_SHARE = 0.3
# ...and past this many segments, the adjacent run with the fewest rows is merged into one.
COMPACT_MAX_SEGMENTS = 8
# What readers take from a manifest, with the JSON type each must have; the manifest's checksum catches damage,
# but not a manifest written by hand or by a buggy tool, which must still fail with a clear line.
MANIFEST_FIELDS = {"name": str, "created": str, "encoder": dict, "calibrator": dict, "index": dict, "dim": int,
                   "documents": int, "segments": list, "next_rowid": int, "next_segment": int, "versions": dict}
ENCODER_FIELDS = {"model": str, "pooling": str, "layers": (list, type(None)), "max_length": int, "dtype": str,
                  "dim": int}
# How often `open` starts again when the version it resolved is pruned under it (two writes in the meantime).
OPEN_ATTEMPTS = 5


@dataclass
class SearchHit:
    rank: int
    doc_id: str
    score: float
    title: str | None
    text: str


def search_record(query_id: str | None, query: str, hits: Sequence[SearchHit]) -> dict:
    """The one JSON shape of a query's results, for `retriever search --json` (one line per query) and the
    server: {"query_id", "query", "results": [{"rank", "doc_id", "score", "title", "text"}]}."""
    return {"query_id": query_id, "query": query,
            "results": [{"rank": h.rank, "doc_id": h.doc_id, "score": round(float(h.score), 6), "title": h.title,
                         "text": h.text} for h in hits]}


class Index:
    """An opened, read-only version of an index. Writers are the classmethod `build` and the methods that
    return a ChangeSummary; each of those writes a new version and leaves this object on the old one."""

    def __init__(self, folder: Path, manifest: dict, device: str = "auto", index_dir: str | Path | None = None):
        self.folder = folder
        self.manifest = manifest
        self.name = manifest["name"]
        self.index_dir = resolve_index_dir(index_dir)
        self.device = device
        self._encoder: Encoder | None = None
        self._segments: list[Segment] = []
        self._closed = False
        if device != "cpu":  # a device this machine lacks is the caller's error, not damage: refused before the guard
            from retriever.device import resolve_device

            resolve_device(device)
        try:
            with self._reading(MANIFEST, everything=True):
                self.spec = IndexSpec.from_dict(manifest["index"])
            for entry in manifest["segments"]:
                with self._reading(f"{SEGMENTS}/{entry['name']}", everything=True):
                    self._segments.append(Segment(folder / SEGMENTS / entry["name"], _segment_spec(entry, self.spec),
                                                  device=device))
            with self._reading(CALIBRATOR, everything=True):
                self.calibrator = load_calibrator(folder / CALIBRATOR, expected_dim=manifest["encoder"]["dim"])
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

    def __enter__(self) -> Index:
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
    def open(cls, name: str, index_dir: str | Path | None = None, device: str = "auto") -> Index:
        """Open the current version: checks the manifest's checksum and every file's size (`verify` re-hashes).
        INDEX_DIR: where indexes live (default: the index home, `index_folder.resolve_index_dir`)."""
        index_dir = resolve_index_dir(index_dir)
        attempts = OPEN_ATTEMPTS
        while True:
            folder = resolve_existing(index_dir, name)  # resolved once: a concurrent swap cannot mix versions
            try:
                manifest = read_manifest(folder, name=name)
                _check_manifest(manifest, name, folder)
                return cls(folder, manifest, device=device, index_dir=index_dir)
            except (RetrieverError, OSError):
                # Writes committed while it opened, and one pruned the version it had resolved: files went missing
                # under it. Not damage: the index is whole, in the newer version the link points at now.
                attempts -= 1
                if not attempts or resolve_existing(index_dir, name) == folder:
                    raise

    @classmethod
    def open_version(cls, folder: str | Path, name: str, index_dir: str | Path | None = None,
                     device: str = "auto") -> Index:
        """Open one version folder of NAME (as a write's `ChangeSummary.snapshot` does), current or not."""
        folder = Path(folder)
        manifest = read_manifest(folder, name=name)
        _check_manifest(manifest, name, folder)
        return cls(folder, manifest, device=device, index_dir=index_dir)

    def _opener(self, folder: Path):
        return _version_opener(folder, self.name, self.index_dir, self.device)

    @property
    def encoder(self) -> Encoder:
        """The recorded encoder, loaded on first use (search needs it; info and delete do not)."""
        if self._encoder is None:
            self._encoder = self.load_encoder()
        return self._encoder

    def use_encoder(self, encoder: Encoder) -> None:
        """Search with ENCODER, already loaded, instead of loading the recorded one: a server holding one model
        for many indexes (and versions) built with it. The caller vouches that it is the recorded encoder."""
        self._encoder = encoder

    def load_encoder(self, runtime: str = "torch") -> Encoder:
        """A new instance of the recorded encoder; RUNTIME picks PyTorch or ONNX Runtime for its forward pass."""
        try:
            return Encoder.from_config(self.manifest["encoder"], device=self.device, runtime=runtime)
        except RetrieverError as error:  # e.g. built elsewhere with a model this machine does not have
            raise RetrieverError(
                f"index '{self.name}' cannot encode text with the model it was built with: {error}"
            ) from None

    def __len__(self) -> int:
        return int(self.manifest["documents"])

    # --- reading -------------------------------------------------------------------------------------------

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Texts to the index's space: the recorded encoder, the saved calibrator, L2 normalization."""
        return l2_normalize(self.calibrator.transform(self.encoder.encode(texts, progress=progress)))

    def search(self, queries: str | Sequence[str], k: int = 10, progress: bool = False, nprobe: int | None = None,
               ef_search: int | None = None, rerank: int | None = None) -> list[list[SearchHit]]:
        """Top-k documents for each query (a single string gives a one-element list).

        NPROBE (ivf, ivfpq), EF_SEARCH (hnsw) and RERANK (ivfpq) override the index's defaults."""
        queries = [queries] if isinstance(queries, str) else list(queries)
        check_queries(queries)
        if k < 1:
            raise RetrieverError(f"-k must be at least 1 (got {k})")
        scores, ids = self.search_vectors(self.embed(queries, progress=progress), k, nprobe, ef_search, rerank)
        return self.hits(scores, ids)

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
                    hits.append(SearchHit(len(hits) + 1, row["doc_id"], score, row["title"], row["text"]))
                results.append(hits)
        return results

    def search_raw(self, raw: np.ndarray, k: int) -> list[list[SearchHit]]:
        """Exact cosine ranking in the uncalibrated space: RAW encoder outputs of queries against every stored raw
        vector (deleted documents excluded). What the index would return without calibration, to compare with."""
        queries = l2_normalize(np.asarray(raw, dtype=np.float32))
        best_scores = np.full((len(queries), k), -np.inf, np.float32)
        best_ids = np.full((len(queries), k), -1, np.int64)
        for segment in self.segments:
            # From the mapping, not the file path: a server may still answer from a version since pruned.
            for start in range(0, len(segment), 65536):
                rowids = np.asarray(segment.rowids[start : start + 65536])
                block = np.asarray(segment.raw[start : start + 65536], dtype=np.float32)
                keep = ~np.isin(rowids, self.tombstones)
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
                       rerank: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k row ids and scores for calibrated, L2-normalized query vectors, over every segment, deleted
        documents excluded; rows padded with id -1 where fewer than k documents exist."""
        if rerank is not None and rerank < 1:
            raise RetrieverError(f"--rerank must be at least 1 (got {rerank})")
        rerank = rerank if rerank is not None else self.spec.search_rerank
        candidates = k * rerank if self.spec.kind.compressed else k
        all_scores, all_ids = [], []
        for segment in self.segments:
            with self._reading(f"{SEGMENTS}/{segment.name}"):
                scores, ids = segment.vectors.search(queries, candidates, self.tombstones, nprobe, ef_search)
                if candidates > k:
                    scores, ids = self._rerank(segment, queries, ids, k)
            all_scores.append(scores)
            all_ids.append(ids)
        if not all_scores:
            return np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
        scores, ids = np.concatenate(all_scores, axis=1), np.concatenate(all_ids, axis=1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)

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
        dim = self.manifest["encoder"]["dim"]
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
        return np.concatenate(parts) if parts else np.empty((0, self.manifest["encoder"]["dim"]), np.float32)

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
            dim = self.manifest["encoder"]["dim"]
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
        record["current"]["calibrator"] = self.manifest["calibrator"]["name"]
        record["auto"] = {"chosen": auto.decision["chosen"]["name"], "reason": auto.decision["reason"]}
        return record

    def info(self, sample: int = 5000, seed: int = 0) -> dict:
        """Manifest, counts, and isotropy before and after calibration on a sample of the stored vectors."""
        raw = self.raw_sample(sample, seed)
        rng = np.random.default_rng(seed)
        with self._reading(f"{SEGMENTS} and {CALIBRATOR}", everything=True):  # no argument here can fail these
            files = self.manifest["files"]
            segments = [{"name": s.name, "rows": len(s),
                         "index_bytes": files[f"{SEGMENTS}/{s.name}/{VECTORS}"]["bytes"]} for s in self.segments]
            calibrated = l2_normalize(self.calibrator.transform(raw)) if len(raw) else raw
            measured = {"raw": isotropy(raw, rng), "calibrated": isotropy(calibrated, rng) if len(raw) else {}}
        return {
            "manifest": {key: value for key, value in self.manifest.items() if key not in ("files", "checksum")},
            "folder": str(self.folder),
            "documents": len(self),
            "vectors": sum(segment.vectors.ntotal for segment in self.segments),
            "deleted": len(self.tombstones),
            "segments": segments,
            "search_backend": self.segments[0].vectors.backend if self.segments else "none",
            "search_settings": self.spec.search_settings(),
            "isotropy": measured,
        }

    def verify(self, progress=None) -> int:
        """Re-hash every file against the manifest (opening only checks sizes, and the counts); returns the bytes
        checked."""
        return verify_files(self.folder, self.manifest, name=self.name, progress=progress)

    def _check_read(self, *parts: str) -> None:
        """Before a write reads PARTS of this version (files, or folders of them) into a new one: re-hash them
        against the manifest (`index_folder.verify_read`), so damage is refused instead of carried on."""
        files = self.manifest["files"]
        verify_read(self.folder, [relative for relative in files
                                  if any(relative == part or relative.startswith(part + "/") for part in parts)],
                    files, self.name)

    @contextmanager
    def _current(self) -> Iterator[Index]:
        """The version that is current now, for a write (`_current_version`); closed after it if opened for it."""
        current = self._current_version()
        try:
            yield current
        finally:
            if current is not self:
                current.close()

    # --- writing -------------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        corpus: str | Path | Sequence[Document],
        name: str,
        index_dir: str | Path | None = None,
        *,
        vectors: str | Path | np.ndarray | None = None,
        model: str | None = None,
        pooling: str | None = "last-avg",
        layers: str | Sequence[int] | None = None,
        max_length: int | None = None,
        calibrator: str | Calibrator = DEFAULT_CALIBRATOR,
        calibrator_options: dict | None = None,
        fit_sample: int | None = DEFAULT_FIT_SAMPLE,
        index_type: str = "auto",
        index_options: dict | None = None,
        device: str = "auto",
        dtype: str = "fp32",
        batch_size: int = 64,
        encoding: str = "utf-8",
        resume: bool = True,
        progress: bool = False,
        chunk_rows: int = CHUNK_ROWS,
        encoder: Encoder | None = None,
        fit_queries: str | Path | Sequence[str] | np.ndarray | None = None,
        engine: str = "local",
        ray_options=None,
    ) -> ChangeSummary:
        """Stream CORPUS (a corpus file, or a list of Documents) through the pipeline into a new index version
        under NAME and swap it in.

        VECTORS: precomputed raw vectors (a .npy, a folder of .npy shards, or an array; row i = document i) made with the
        encoder that MODEL/POOLING/LAYERS/MAX_LENGTH name; no encoding happens. CALIBRATOR may be a name or an
        already fitted calibrator (then nothing is fitted). With RESUME, a killed build of the same corpus with
        the same encoder settings continues from its last finished chunk. ENCODER: an already loaded encoder,
        used instead of loading the one MODEL/POOLING/LAYERS/MAX_LENGTH/DTYPE name (many builds, one model).
        FIT_QUERIES: a file of example queries (.txt, one per line, or BEIR queries.jsonl), a list of them, or their
        raw vectors; the calibrator is fitted on the documents' sample plus these, unlabeled (ignored with a
        prefitted calibrator). ENGINE "ray" runs the build on a Ray cluster (`retriever.engines.ray_build`, set up
        by RAY_OPTIONS, a `RayOptions`); CORPUS may then also be a folder of corpus files, and a failed build starts
        over rather than resuming."""
        if engine not in ENGINES:
            raise RetrieverError(f"unknown engine '{engine}'; choose one of {', '.join(ENGINES)}")
        if engine == "ray":
            if isinstance(corpus, (list, tuple)):
                raise RetrieverError("the ray engine reads corpus files; build from a list of documents with the "
                                     "local engine")
            if vectors is not None or encoder is not None:
                raise RetrieverError("the ray engine encodes the corpus itself; build from --vectors with the local "
                                     "engine")
            from retriever.engines.ray_build import RayOptions, build as ray_build

            summary = ray_build(corpus, name, index_dir, options=ray_options or RayOptions(), model=model,
                              pooling=pooling, layers=layers, max_length=max_length, calibrator=calibrator,
                              calibrator_options=calibrator_options, fit_sample=fit_sample, index_type=index_type,
                              index_options=index_options, device=device, dtype=dtype, batch_size=batch_size,
                              encoding=encoding, progress=progress, fit_queries=fit_queries)
            summary.opener = _version_opener(Path(summary.folder), name, resolve_index_dir(index_dir), device)
            return summary
        started = time.perf_counter()
        index_dir = resolve_index_dir(index_dir)
        loaded = encoder
        # Cheap refusals first: bad arguments never wait for a corpus read or a model load.
        given = list(corpus) if isinstance(corpus, (list, tuple)) else None
        if isinstance(vectors, np.ndarray):
            resume = False  # vectors in memory: nothing on disk to tell a rerun's from this one's
        if given is not None:
            check_documents(given)
            corpus, resume = "the given documents", False  # nothing on disk to resume from
        elif Path(corpus).is_dir():
            raise RetrieverError(f"{corpus}: a folder; the local engine builds from one corpus file, --engine ray "
                                 "from a folder of them")
        else:
            corpus_format(corpus)
            if not Path(corpus).is_file():
                raise RetrieverError(f"{corpus}: no such file")
        fitted, prefitted, (query_texts, query_vectors, queries_from) = check_build_arguments(
            calibrator, calibrator_options, index_type, fit_sample, fit_queries, encoding, index_dir, name)
        source = vector_source(vectors) if vectors is not None else None
        encoder_settings = (loaded.config() if loaded is not None else
                            {"model": model, "pooling": pooling, "layers": _layers_key(layers),
                             "max_length": max_length, "dtype": dtype})
        key = {"corpus": source_fingerprint(corpus) if given is None else None, "encoding": encoding, "encoder": encoder_settings,
               "vectors": source.fingerprint() if source else None}
        timings: dict[str, float] = {}
        notes: list[str] = []
        # A build never queues behind another writer of NAME: one of the two would silently replace the other.
        with writing(index_dir, name, resume_key=key if resume else None, wait=False,
                     busy_hint="wait for it to finish, or build under another --name") as writer:
            folder = writer.folder
            segment = folder / SEGMENTS / segment_name(1)
            segment.mkdir(parents=True, exist_ok=True)
            state = BuildState.load(folder / BUILD_STATE) if writer.resumed else BuildState(folder / BUILD_STATE, key)
            if writer.resumed:
                _resumable(folder, segment, state, notes, progress)

            clock = time.perf_counter()
            if state.documents is None:
                table = DocumentTable.create(segment / DOCUMENTS)
                documents = iter(given) if given is not None else iter_corpus(corpus, encoding)
                state.documents = ingest(documents, table, 1, progress, chunk_rows)
                table.close()
                if state.documents == 0:
                    raise RetrieverError(f"{corpus}: no documents (the file is empty or all blank lines)")
                state.save()
            timings["read"] = time.perf_counter() - clock
            if source is not None and source.rows != state.documents:
                raise RetrieverError(f"{source.path} holds {_count(source.rows, 'vector')} for "
                                     f"{_documents(state.documents)} in {corpus}; row i must be document i")

            clock = time.perf_counter()
            encoder = loaded or Encoder(model, pooling, layers, max_length, device, dtype, batch_size)
            timings["load_model"] = time.perf_counter() - clock  # in a fresh process: mostly importing model code
            if source is not None and source.dim != encoder.dim:
                raise RetrieverError(f"{source.path} holds {source.dim}-dimensional vectors; {encoder.model_name} "
                                     f"gives {encoder.dim}")
            if query_vectors is not None and query_vectors.shape[1] != encoder.dim:
                raise RetrieverError(f"fit_queries holds {query_vectors.shape[1]}-dimensional vectors; "
                                     f"{encoder.model_name} gives {encoder.dim}")
            # Decided before encoding, now that the documents are counted and the dimension is known.
            if not prefitted:
                fitted.check_dim(encoder.dim)
            fitted, fallback = enough_to_fit(fitted, prefitted, state.documents, fit_sample, encoder.dim)
            if fallback:
                note(notes, fallback_note(fallback, index_dir, name), progress)

            clock = time.perf_counter()
            if source is None:
                if state.encoded:
                    notes.append(f"resumed a killed build: {state.encoded:,} of {state.documents:,} documents "
                                 "were already encoded")
                    if progress:
                        stderr_console.print(notes[-1])
                with DocumentTable.open(segment / DOCUMENTS) as table:
                    encode_table(encoder, table, folder / ENCODED, state, progress=progress, chunk_rows=chunk_rows)
                source = VectorSource(folder / ENCODED)
                timings["encode"] = time.perf_counter() - clock
            else:
                check_vectors(source, progress)
                timings["check_vectors"] = time.perf_counter() - clock

            clock = time.perf_counter()
            seed = getattr(fitted, "seed", 0)
            with DocumentTable.open(segment / DOCUMENTS) as table:
                check = check_set(fitted, state.documents, table_texts(table), source.take, encoder, seed, progress)
            if check is not None:
                timings["pseudo_queries"] = time.perf_counter() - clock
            clock = time.perf_counter()
            query_vectors = queries_to_fit(query_texts, query_vectors, fitted, prefitted, encoder, notes, progress)
            calibrated_sample = fit(fitted, source, fit_sample, seed, query_vectors, check)
            timings["fit"] = time.perf_counter() - clock

            clock = time.perf_counter()
            spec, template = train_index(state.documents, calibrated_sample, index_type, index_options)
            del calibrated_sample
            timings["train_index"] = time.perf_counter() - clock

            clock = time.perf_counter()
            blocks = calibrated_blocks(source, fitted, 1, progress)
            write_segment_vectors(segment, blocks, encoder.dim, fitted_out_dim(fitted, encoder.dim),
                                  spec.for_segment(state.documents), template)
            (folder / ENCODED).unlink(missing_ok=True)
            timings["index"] = time.perf_counter() - clock

            clock = time.perf_counter()
            save_fitted(folder, fitted, spec, template)
            fit_record = fit_summary(prefitted, state.documents, fit_sample, seed, query_vectors, queries_from)
            manifest = new_manifest(name, corpus if given is None else None, encoder.config(), fitted, fit_record, spec,
                                    [(segment.name, state.documents)], state.truncated, fallback,
                                    vectors_from=None if isinstance(vectors, np.ndarray) else vectors)
            write_manifest(folder, manifest)
            final = writer.commit()
            timings["write"] = time.perf_counter() - clock
        return ChangeSummary(name, str(final), state.documents, state.documents, state.truncated,
                             time.perf_counter() - started, timings, notes,
                             opener=_version_opener(final, name, index_dir, device))

    def add(self, corpus: str | Path | Sequence[Document], encoding: str = "utf-8", progress: bool = False,
            vectors: str | Path | np.ndarray | None = None, chunk_rows: int = CHUNK_ROWS) -> ChangeSummary:
        """Write CORPUS's documents (a corpus file, or a list of Documents) as one new segment, encoded (or taken from VECTORS) and calibrated with the
        saved calibrator (no refit); every existing segment is reused as it is."""
        started = time.perf_counter()
        given = list(corpus) if isinstance(corpus, (list, tuple)) else None  # Documents (the server's records)
        if given is None:
            corpus_format(corpus)
        else:
            check_documents(given)
        source = vector_source(vectors) if vectors is not None else None
        timings: dict[str, float] = {}
        with writing(self.index_dir, self.name) as writer, self._current() as current:
            # Read into the new version: the calibrator (through the new vectors) and the tombstones (written again);
            # the template as it is loaded (`_template`), merged segments in `_merge_segments`. The rest is linked,
            # or only looked up in (the ids already there): hashing it would make every add cost the whole index.
            current._check_read(CALIBRATOR, TOMBSTONES)
            folder = writer.folder
            link_tree(current.folder, folder)
            segment = folder / SEGMENTS / segment_name(current.manifest["next_segment"])
            segment.mkdir(parents=True)
            first = current.manifest["next_rowid"]

            clock = time.perf_counter()
            table = DocumentTable.create(segment / DOCUMENTS)
            documents = iter(given) if given is not None else iter_corpus(corpus, encoding)
            count = ingest(documents, table, first, chunk_rows=chunk_rows)
            if count == 0:
                raise RetrieverError(f"{corpus}: no documents (the file is empty or all blank lines)")
            current._refuse_existing_ids(table)  # before any encoding
            table.close()
            timings["read"] = time.perf_counter() - clock
            if source is not None and source.rows != count:
                raise RetrieverError(f"{source.path} holds {_count(source.rows, 'vector')} for {_documents(count)} in "
                                     f"{corpus}")
            if source is not None and source.dim != current.manifest["encoder"]["dim"]:
                raise RetrieverError(f"{source.path} holds {source.dim}-dimensional vectors; this index's encoder "
                                     f"gives {current.manifest['encoder']['dim']}")

            clock = time.perf_counter()
            state = BuildState(None, {}, documents=count)
            if source is None:
                with DocumentTable.open(segment / DOCUMENTS) as table:
                    encode_table(current.encoder, table, folder / ENCODED, state, first, progress, chunk_rows)
                source = VectorSource(folder / ENCODED)
                timings["encode"] = time.perf_counter() - clock
            else:
                check_vectors(source)
                timings["check_vectors"] = time.perf_counter() - clock

            clock = time.perf_counter()
            template = current._template()
            blocks = calibrated_blocks(source, current.calibrator, first)
            write_segment_vectors(segment, blocks, current.manifest["encoder"]["dim"], current.manifest["dim"],
                                  current.spec.for_segment(count), template)
            (folder / ENCODED).unlink(missing_ok=True)
            manifest = {**current.manifest,
                        "segments": [*current.manifest["segments"], segment_entry(segment.name, count, current.spec)],
                        "documents": len(current) + count, "next_rowid": first + count,
                        "next_segment": current.manifest["next_segment"] + 1}
            manifest, merged = _compact_if_needed(folder, manifest, current.tombstones, template, current)
            write_manifest(folder, manifest, current.folder, current.manifest["files"])
            final = writer.commit()
            timings["write"] = time.perf_counter() - clock
        notes = [f"merged {merged} segments"] if merged else []
        return ChangeSummary(self.name, str(final), manifest["documents"], count, state.truncated,
                             time.perf_counter() - started, timings, notes, opener=self._opener(final))

    def delete(self, doc_ids: Sequence[str]) -> ChangeSummary:
        """Delete documents by id, all or nothing: their row ids become tombstones that searches filter out."""
        started = time.perf_counter()
        doc_ids = list(dict.fromkeys(doc_ids))
        if not doc_ids:
            raise RetrieverError("give at least one document id to delete")
        with writing(self.index_dir, self.name) as writer, self._current() as current:
            current._check_read(TOMBSTONES)  # written again, with the new ones
            found = current.live_rowids(doc_ids)
            missing = [doc_id for doc_id in doc_ids if doc_id not in found]
            if missing:
                shown = ", ".join(repr(d) for d in missing[:5])
                more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
                noun = "id is" if len(missing) == 1 else "ids are"
                raise NotFoundError(f"{len(missing)} {noun} not in the index: {shown}{more}")
            folder = writer.folder
            link_tree(current.folder, folder, skip=lambda relative: relative == TOMBSTONES)
            removed = np.fromiter((rowid for rowid, _ in found.values()), dtype=np.int64, count=len(found))
            tombstones = np.union1d(current.tombstones, removed)
            newly = np.bincount([position for _, position in found.values()], minlength=len(current.segments))
            segments = [{**entry, "deleted": _deleted_rows(current.folder, entry, current.tombstones) + int(count)}
                        for entry, count in zip(current.manifest["segments"], newly)]
            manifest = {**current.manifest, "segments": segments, "documents": len(current) - len(removed),
                        "deleted": len(tombstones)}
            manifest, merged = _compact_if_needed(folder, manifest, tombstones, current._template(), current)
            write_manifest(folder, manifest, current.folder, current.manifest["files"])
            final = writer.commit()
        notes = [f"merged {merged} segments"] if merged else []
        return ChangeSummary(self.name, str(final), manifest["documents"], len(removed),
                             seconds=time.perf_counter() - started, notes=notes, opener=self._opener(final))

    def compact(self) -> ChangeSummary:
        """Merge every segment into one and drop the deleted documents for good."""
        started = time.perf_counter()
        with writing(self.index_dir, self.name) as writer, self._current() as current:
            current._check_read(TOMBSTONES)  # which rows to drop; every segment is checked as it is merged
            folder = writer.folder
            link_tree(current.folder, folder, skip=lambda relative: relative == TOMBSTONES)
            names = [entry["name"] for entry in current.manifest["segments"]]
            manifest, _ = _merge_segments(folder, current.manifest, names, current.tombstones,
                                          current._template(), current)
            _write_tombstones(folder, np.empty(0, np.int64))
            manifest["deleted"] = 0
            write_manifest(folder, manifest, current.folder, current.manifest["files"])
            final = writer.commit()
        return ChangeSummary(self.name, str(final), manifest["documents"], len(current.tombstones),
                             seconds=time.perf_counter() - started, opener=self._opener(final))

    def refit(self, calibrator: str | None = None, calibrator_options: dict | None = None,
              fit_sample: int | None = DEFAULT_FIT_SAMPLE,
              fit_queries: str | Path | Sequence[str] | np.ndarray | None = None,
              progress: bool = False) -> ChangeSummary:
        """Fit a new calibrator on a sample of the stored raw vectors (no re-encoding of documents) and rewrite every
        segment's vector index with it; documents and raw vectors are reused as they are. FIT_QUERIES, as in
        `build`: example queries fitted on too (texts are encoded with the index's encoder)."""
        started = time.perf_counter()
        name = calibrator or self.manifest["calibrator"]["name"]
        fitted = make_calibrator(name, **(calibrator_options or {}))
        fitted.check_dim(self.manifest["encoder"]["dim"])  # before any query is encoded
        query_texts, query_vectors, queries_from = parse_fit_queries(fit_queries, "utf-8")
        if query_texts and name != "none":
            query_vectors = self.load_encoder().encode(query_texts, progress=progress, description="Encoding queries")
        if query_vectors is not None and query_vectors.shape[1] != self.manifest["encoder"]["dim"]:
            raise RetrieverError(f"fit_queries holds {query_vectors.shape[1]}-dimensional vectors; index "
                                 f"'{self.name}' stores {self.manifest['encoder']['dim']}")
        if name == "none":
            query_vectors = None
        with writing(self.index_dir, self.name) as writer, self._current() as current:
            # Read into the new version: every raw vector and row id (the new vector indexes), the tombstones. The
            # documents and raw vectors are linked into renamed segments and keep their entries (`write_manifest`).
            current._check_read(TOMBSTONES, *(f"{SEGMENTS}/{entry['name']}/{part}"
                                              for entry in current.manifest["segments"] for part in (RAW, ROWIDS)))
            rows = min(len(current), fit_sample or len(current))
            shortfall = too_few_to_fit(fitted, rows, current.manifest["encoder"]["dim"])
            if shortfall:  # refit is an explicit request: refused, never quietly replaced by another calibrator
                have = (f"--fit-sample {fit_sample:,} is" if rows < len(current) else
                        f"index '{self.name}' holds only {_documents(len(current))}:")
                raise RetrieverError(f"{have} {shortfall}")
            seed = getattr(fitted, "seed", 0)
            sample = current.raw_sample(fit_sample or len(current), seed=seed)
            check = (check_set(fitted, len(current), *current.check_sources(), current.encoder, seed, progress)
                     if fitted.uses_check else None)  # only auto needs the model here
            fit_calibrator(fitted, with_queries(sample, query_vectors, fit_sample, seed), check)
            calibrated_sample = l2_normalize(fitted.transform(sample))
            spec_record = dict(current.manifest["index"])
            if calibrated_sample.shape[1] != current.manifest["dim"]:
                spec_record.pop("pq_m", None)  # set again for the new dimension
            spec = IndexSpec.from_dict(spec_record).for_dim(calibrated_sample.shape[1])
            template = train_template(spec, calibrated_sample)
            folder = writer.folder
            link_tree(current.folder, folder, skip=lambda relative: relative.startswith((SEGMENTS + "/", CALIBRATOR,
                                                                                          TEMPLATE)))
            segments, next_segment = [], current.manifest["next_segment"]
            for old, entry in zip(current.segments, current.manifest["segments"]):
                new = folder / SEGMENTS / segment_name(next_segment)
                new.mkdir(parents=True)
                next_segment += 1
                for file_name in (DOCUMENTS, RAW, ROWIDS):
                    (new / file_name).hardlink_to(old.folder / file_name)
                store = VectorStore.create(calibrated_sample.shape[1], spec.for_segment(len(old)), template,
                                           device="cpu")
                for rowids, raw in old.raw_blocks():
                    store.add(rowids, l2_normalize(fitted.transform(raw)))
                store.save(new / VECTORS)
                segments.append(segment_entry(new.name, len(old), spec,
                                               _deleted_rows(current.folder, entry, current.tombstones)))
            fitted.save(folder / CALIBRATOR)
            if template is not None:
                VectorStore(template, spec).save(folder / TEMPLATE)
            kept = {key: value for key, value in current.manifest.items() if key != "calibrator_fallback"}
            manifest = {**kept, "calibrator": fitted.config(), "dim": int(calibrated_sample.shape[1]),
                        "index": spec.to_dict(), "segments": segments, "next_segment": next_segment,
                        "fit": {"sample": len(sample), "of": len(current), "seed": seed,
                                **({"queries": fitted_query_count(query_vectors, fit_sample),
                                    "queries_from": queries_from} if query_vectors is not None else {})},
                        "refitted": now_iso()}
            write_manifest(folder, manifest, current.folder, current.manifest["files"])
            final = writer.commit()
        return ChangeSummary(self.name, str(final), len(current), len(current), 0, time.perf_counter() - started,
                             opener=self._opener(final))

    def _current_version(self) -> Index:
        """The version that is current now (another writer may have committed since this one was opened)."""
        if resolve_existing(self.index_dir, self.name) == self.folder:
            return self  # versions never change: nothing to re-read, and a loaded model is kept
        return Index.open(self.name, self.index_dir, device=self.device)

    def _template(self):
        """The trained template, for a write: re-hashed first, since every new segment starts from a copy of it."""
        if not (self.folder / TEMPLATE).is_file():
            return None
        self._check_read(TEMPLATE)
        with self._reading(TEMPLATE, everything=True):
            return VectorStore.load(self.folder / TEMPLATE, self.spec, device="cpu", mmap=False)._index

    def _refuse_existing_ids(self, table: DocumentTable) -> None:
        """Refuse (one line, before any encoding) new documents whose ids are already in the index."""
        clashes = []
        batch = []
        rows = table.documents()
        for rowid, document in rows:
            batch.append(document)
            if len(batch) == 10000:
                clashes += self._clashing(batch)
                batch = []
        clashes += self._clashing(batch)
        if clashes:
            shown = ", ".join(f"{d.doc_id!r} (line {d.line})" for d in clashes[:5])
            more = f" and {len(clashes) - 5} more" if len(clashes) > 5 else ""
            noun = "id is" if len(clashes) == 1 else "ids are"
            raise ConflictError(f"{clashes[0].source}: {len(clashes)} {noun} already in the index: {shown}{more}")

    def _clashing(self, documents: list) -> list:
        found = self.live_rowids([d.doc_id for d in documents]) if documents else {}
        return [d for d in documents if d.doc_id in found]


def verify_index(name: str, index_dir: str | Path | None = None, progress=None) -> tuple[dict, int]:
    """Re-hash every file of NAME's current version against its manifest, without opening (and so trusting)
    any of them first; returns the manifest and the bytes checked."""
    index_dir = resolve_index_dir(index_dir)
    folder = resolve_existing(index_dir, name)
    manifest = read_manifest(folder, name=name)
    _check_manifest(manifest, name, folder)  # before a path from it is followed
    checked = verify_files(folder, manifest, name=name, progress=progress)
    _check_counts(manifest, [_stored_rows(folder, f"{SEGMENTS}/{entry['name']}/{ROWIDS}", name)
                             for entry in manifest["segments"]], None,
                  _stored_rows(folder, TOMBSTONES, name) if (folder / TOMBSTONES).is_file() else 0, name)
    return manifest, checked


def _stored_rows(folder: Path, relative: str, name: str) -> int:
    """The rows of a .npy of the version in FOLDER, from its header alone."""
    try:
        return int(npy_layout(folder / relative)[0][0])
    except (RetrieverError, IndexError) as error:
        reason = str(error).replace(f"{folder}/", "") if isinstance(error, RetrieverError) else "no rows"
        raise damaged_index(f"index '{name}'", f"{relative} cannot be read ({reason})") from None


def _check_counts(manifest: dict, rows: list[int], vectors: list[int] | None, deleted: int, name: str) -> None:
    """The manifest's counts against the files': each segment's ROWS (and VECTORS, when loaded), and its document
    count against all rows less the DELETED ones. Header reads only, so opening stays cheap; a manifest written
    by hand or a swapped file shows here rather than as wrong counts or missing rows later."""
    def damaged(problem: str) -> DamagedIndexError:
        return damaged_index(f"index '{name}'", problem)

    for number, (entry, held) in enumerate(zip(manifest["segments"], rows)):
        where = f"{SEGMENTS}/{entry['name']}"
        if held != entry["rows"]:
            raise damaged(f"{where}/{ROWIDS} holds {held:,} rows, the manifest says {entry['rows']:,}")
        if vectors is not None and vectors[number] != held:
            raise damaged(f"{where}/{VECTORS} holds {vectors[number]:,} vectors for {held:,} rows")
    if manifest["documents"] != sum(rows) - deleted:
        raise damaged(f"the manifest counts {_documents(manifest['documents'])}, but its segments hold "
                      f"{_count(sum(rows), 'row')} of which {deleted:,} are deleted")


def _check_tombstones(tombstones: np.ndarray) -> None:
    """Tombstones are row ids, ascending and distinct (searches look them up by bisection)."""
    if tombstones.ndim != 1 or tombstones.dtype.kind not in "iu" or (np.diff(tombstones) <= 0).any():
        raise RetrieverError("not an ascending list of row ids")


def _compact_if_needed(folder: Path, manifest: dict, tombstones: np.ndarray, template, previous: Index):
    """Apply the automatic compaction policy to the version being written in FOLDER over PREVIOUS; returns the
    manifest and how many segments were merged (0: nothing to do). Only small segments or heavily deleted ones
    are rewritten, so a write's cost stays proportional to what it changes."""
    merged = 0
    for entry in list(manifest["segments"]):
        if entry["rows"] and _deleted_rows(folder, entry, tombstones) >= COMPACT_TOMBSTONE_SHARE * entry["rows"]:
            manifest, tombstones = _merge_segments(folder, manifest, [entry["name"]], tombstones, template, previous)
            merged += 1
    names = [entry["name"] for entry in manifest["segments"]]
    if len(names) > COMPACT_MAX_SEGMENTS:
        rows = [entry["rows"] for entry in manifest["segments"]]
        run = len(names) - COMPACT_MAX_SEGMENTS + 1
        start = min(range(len(names) - run + 1), key=lambda first: sum(rows[first : first + run]))
        manifest, tombstones = _merge_segments(folder, manifest, names[start : start + run], tombstones, template,
                                               previous)
        merged += run
    _write_tombstones(folder, tombstones)
    return {**manifest, "deleted": len(tombstones)}, merged


def _merge_segments(folder: Path, manifest: dict, names: list[str], tombstones: np.ndarray, template,
                    previous: Index) -> tuple[dict, np.ndarray]:
    """Replace the adjacent segments NAMES of the version in FOLDER (written over PREVIOUS) by one, without the
    TOMBSTONES' rows; returns the manifest and the tombstones still needed (those of the other segments). Every
    byte of the merged segments is copied into the new one, so those of PREVIOUS are re-hashed first: a new
    segment, hashed as it is written, would vouch for any damage it copied."""
    spec = previous.spec
    previous._check_read(*(f"{SEGMENTS}/{name}" for name in names))
    new = folder / SEGMENTS / segment_name(manifest["next_segment"])
    new.mkdir(parents=True)
    entries = {entry["name"]: entry for entry in manifest["segments"]}
    old = [Segment(folder / SEGMENTS / name, _segment_spec(entries[name], spec), device="cpu") for name in names]
    dropped = np.zeros(len(tombstones), dtype=bool)
    try:
        with DocumentTable.create(new / DOCUMENTS) as table:
            for segment in old:
                table.copy_from(segment.documents, tombstones)
            table.finish()
        raw = RawWriter(new, manifest["encoder"]["dim"])
        rows = 0
        for segment in old:
            dropped |= segment.contains(tombstones)
            for rowids, block in segment.raw_blocks():
                keep = ~np.isin(rowids, tombstones)
                raw.append(rowids[keep], block[keep])
                rows += int(keep.sum())
        raw.close()
        VectorStore.merged([s.vectors for s in old], tombstones, spec.for_segment(rows), template).save(new / VECTORS)
    finally:
        for segment in old:
            segment.close()
    for folder_to_remove in [folder / SEGMENTS / name for name in names] + ([new] if rows == 0 else []):
        for path in folder_to_remove.iterdir():
            path.unlink()  # a hard link: the previous version keeps its file
        folder_to_remove.rmdir()
    segments = []
    for entry in manifest["segments"]:
        if entry["name"] == names[0] and rows:
            segments.append(segment_entry(new.name, rows, spec))
        elif entry["name"] not in names:
            segments.append(entry)
    return {**manifest, "segments": segments, "next_segment": manifest["next_segment"] + 1}, tombstones[~dropped]


def _segment_spec(entry: dict, spec: IndexSpec) -> IndexSpec:
    kind = entry.get("index", spec.type)
    return spec if kind == spec.type else IndexSpec(type=kind)


def _deleted_rows(folder: Path, entry: dict, tombstones: np.ndarray) -> int:
    """How many of the segment's rows are tombstoned: recorded by `delete`; counted for a record without it."""
    if "deleted" in entry:
        return int(entry["deleted"])
    if not len(tombstones):
        return 0
    return int(np.isin(load_npy(folder / SEGMENTS / entry["name"] / ROWIDS, mmap_mode="r"), tombstones).sum())


def _resumable(folder: Path, segment: Path, state: BuildState, notes: list[str], progress: bool) -> None:
    """Match a killed build's STATE to what its folder really holds, so the re-run continues from there whatever
    step the kill hit: its temporary files go; documents without their table are read again; vectors on record
    but not on disk are encoded again (the build deletes them once the segment is written: a kill between that
    and the commit leaves the state saying "all encoded" with no file)."""
    for stale in [path for path in folder.rglob("*.partial") if path.is_file()]:
        stale.unlink()  # a file a killed step was writing, never renamed into place
    if state.documents is not None and not (segment / DOCUMENTS).is_file():
        state.documents, state.encoded, state.truncated = None, 0, 0
    if state.encoded and _encoded_rows(folder / ENCODED) < state.encoded:
        note(notes, f"resumed a killed build: its {state.documents:,} documents were already read; their "
                     "vectors were gone, so they are encoded again", progress)
        state.encoded, state.truncated = 0, 0
        state.save()


def _encoded_rows(path: Path) -> int:
    """Rows a build's encoded-vectors file holds whole: as many as its header says (rewritten at every flush), if
    the file is that long; 0 for no file, or one that is not a 2-D .npy."""
    try:
        (rows, dim), dtype, offset = npy_layout(path)
        return min(int(rows), (path.stat().st_size - offset) // max(1, dim * dtype.itemsize))
    except (RetrieverError, OSError, ValueError):
        return 0


def _write_tombstones(folder: Path, tombstones: np.ndarray) -> None:
    path = folder / TOMBSTONES
    path.unlink(missing_ok=True)  # a hard link to the previous version's file must not be written through
    if len(tombstones):
        np.save(path, np.asarray(tombstones, dtype=np.int64))


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _documents(count: int) -> str:
    return _count(count, "document")


def _in(rowid: int, sorted_ids: np.ndarray) -> bool:
    position = np.searchsorted(sorted_ids, rowid)
    return bool(position < len(sorted_ids) and sorted_ids[position] == rowid)


def _layers_key(layers: str | Sequence[int] | None):
    return layers if layers is None or isinstance(layers, str) else list(layers)


def _version_opener(folder: Path, name: str, index_dir: Path, device: str):
    return lambda: Index.open_version(folder, name, index_dir, device)


def _check_manifest(manifest: dict, name: str, folder: Path) -> None:
    def damaged(problem: str) -> RetrieverError:
        return damaged_index(f"index '{name}'", f"{folder / MANIFEST} {problem}")

    sections = ((MANIFEST_FIELDS, manifest, ""), (ENCODER_FIELDS, manifest.get("encoder"), "encoder."))
    for fields, record, where in sections:  # the encoder section is reached only once it is known to be a dict
        for field_name, kind in fields.items():
            if field_name not in record:
                raise damaged(f"lacks '{where}{field_name}'")
            if not isinstance(record[field_name], kind) or isinstance(record[field_name], bool):
                raise damaged(f"has a wrong type for '{where}{field_name}'")
    if not isinstance(manifest["calibrator"].get("name"), str):
        raise damaged("lacks 'calibrator.name'")
    if not all(isinstance(entry, dict) and isinstance(entry.get("name"), str) and type(entry.get("rows")) is int
               for entry in manifest["segments"]):
        raise damaged("has a malformed 'segments' list")
    strange = next((entry["name"] for entry in manifest["segments"] if not SEGMENT_NAME.fullmatch(entry["name"])),
                   None)
    if strange is not None:  # written by hand: followed, '../x' would reach outside the version
        raise damaged(f"names a segment {strange[:40]!r}, which is not a segment's name")


def isotropy(vectors: np.ndarray, rng: np.random.Generator, pairs: int = 20000) -> dict:
    """Mean cosine of random pairs (0 for an isotropic space) and the variance share of the top direction."""
    if len(vectors) < 2:
        return {}
    unit = l2_normalize(vectors.astype(np.float32))
    first, second = rng.integers(0, len(unit), (2, pairs))
    distinct = first != second
    mean_cosine = float((unit[first[distinct]] * unit[second[distinct]]).sum(1).mean())
    singular = np.linalg.svd(vectors - vectors.mean(0), compute_uv=False)
    variance = singular**2
    return {"mean_cosine_random_pairs": round(mean_cosine, 4),
            "top_direction_variance_share": round(float(variance[0] / variance.sum()), 4)}


__all__ = ["Index", "SearchHit", "ChangeSummary", "document_text", "l2_normalize", "isotropy"]
