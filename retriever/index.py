"""The calibrated index: text -> Encoder -> Calibrator -> L2 -> FAISS, with documents in SQLite.

`Index.build` fits the calibrator unsupervised on the corpus's own embeddings; `Index.open(...).search` sends
queries through exactly the encode path the manifest records. Every change (build, add, delete, refit) writes a
new version folder and swaps it in atomically (see `index_folder`), so a failed or killed write loses nothing.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from retriever import __version__
from retriever.calibration import DEFAULT_CALIBRATOR, load_calibrator, make_calibrator
from retriever.corpus import Document, check_unique_ids, read_corpus
from retriever.encoder import Encoder
from retriever.errors import RetrieverError
from retriever.index_folder import (
    DEFAULT_INDEX_DIR,
    MANIFEST,
    check_target,
    damaged_index,
    read_manifest,
    resolve_existing,
    write_manifest,
    writing,
)
from retriever.store.metadata import MetadataStore
from retriever.store.vectors import INDEX_TYPES, VectorStore

FORMAT_VERSION = 1
# File names inside a version folder.
VECTORS, DOCUMENTS, RAW_VECTORS, RAW_IDS, CALIBRATOR = (
    "vectors.faiss", "documents.db", "raw_vectors.npy", "raw_ids.npy", "calibrator",
)
FLOAT16_MAX = 65504.0
# What readers take from a manifest, with the JSON type each must have; checksums cannot vouch for the manifest
# itself, so a damaged one must fail here with a clear line rather than deep inside a command.
MANIFEST_FIELDS = {"name": str, "created": str, "encoder": dict, "calibrator": dict, "index_type": str, "dim": int,
                   "documents": int, "versions": dict}
ENCODER_FIELDS = {"model": str, "pooling": str, "layers": (list, type(None)), "max_length": int, "dtype": str,
                  "dim": int}


@dataclass
class SearchHit:
    rank: int
    doc_id: str
    score: float
    title: str | None
    text: str


@dataclass
class ChangeSummary:
    """What a build/add/delete/refit did, for the CLI's closing line and for benchmarks."""

    name: str
    folder: str
    documents: int  # in the index afterwards
    changed: int  # documents added, removed or re-calibrated
    truncated: int = 0
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


def document_text(document: Document) -> str:
    """What gets encoded: the title joined to the text, as BEIR models do."""
    return f"{document.title} {document.text}" if document.title else document.text


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class Index:
    """An opened, read-only version of an index. Writers are the classmethod `build` and the methods that
    return a ChangeSummary; each of those writes a new version and leaves this object on the old one."""

    def __init__(self, folder: Path, manifest: dict, device: str = "auto", index_dir: str | Path = DEFAULT_INDEX_DIR):
        self.folder = folder
        self.manifest = manifest
        self.name = manifest["name"]
        self.index_dir = Path(index_dir)
        self.device = device
        self.metadata = MetadataStore(folder / DOCUMENTS, readonly=True)
        self.vectors = VectorStore.load(folder / VECTORS, device=device)
        self.calibrator = load_calibrator(folder / CALIBRATOR, expected_dim=manifest["encoder"]["dim"])
        # Mapped now, read on demand: the mapping keeps this version's data readable even after later writes
        # prune its folder, as the open SQLite connection does for the documents.
        self._raw = np.load(folder / RAW_VECTORS, mmap_mode="r"), np.load(folder / RAW_IDS, mmap_mode="r")
        self._encoder: Encoder | None = None

    @classmethod
    def open(cls, name: str, index_dir: str | Path = DEFAULT_INDEX_DIR, device: str = "auto", verify: bool = True) -> Index:
        folder = resolve_existing(index_dir, name)  # resolved once: a concurrent swap cannot mix versions
        manifest = read_manifest(folder, verify=verify, name=name)
        _check_manifest(manifest, name, folder)
        return cls(folder, manifest, device=device, index_dir=index_dir)

    @property
    def encoder(self) -> Encoder:
        """The recorded encoder, loaded on first use (search needs it; info and delete do not)."""
        if self._encoder is None:
            try:
                self._encoder = Encoder.from_config(self.manifest["encoder"], device=self.device)
            except RetrieverError as error:  # e.g. built elsewhere with a model this machine does not have
                raise RetrieverError(
                    f"index '{self.name}' cannot encode text with the model it was built with: {error}"
                ) from None
        return self._encoder

    def __len__(self) -> int:
        return self.vectors.ntotal

    # --- reading -------------------------------------------------------------------------------------------

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Texts to the index's space: the recorded encoder, the saved calibrator, L2 normalization."""
        return l2_normalize(self.calibrator.transform(self.encoder.encode(texts, progress=progress)))

    def search(self, queries: str | Sequence[str], k: int = 10, progress: bool = False) -> list[list[SearchHit]]:
        """Top-k documents for each query (a single string gives a one-element list)."""
        queries = [queries] if isinstance(queries, str) else list(queries)
        if k < 1:
            raise RetrieverError(f"-k must be at least 1 (got {k})")
        scores, ids = self.vectors.search(self.embed(queries, progress=progress), k)
        found = ids[ids >= 0]
        rows = {row["rowid"]: row for row in self.metadata.get(np.unique(found))} if len(found) else {}
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

    def raw_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """The uncalibrated vectors (float32) and their row ids, as stored for refitting."""
        raw, ids = self._raw
        return raw.astype(np.float32), np.array(ids)

    def info(self, sample: int = 5000, seed: int = 0) -> dict:
        """Manifest, counts, and isotropy before and after calibration on a sample of the stored vectors."""
        raw, _ = self.raw_vectors()
        rng = np.random.default_rng(seed)
        if len(raw) > sample:
            raw = raw[rng.choice(len(raw), sample, replace=False)]
        return {
            "manifest": {key: value for key, value in self.manifest.items() if key != "files"},
            "folder": str(self.folder),
            "documents": self.metadata.count(),
            "vectors": self.vectors.ntotal,
            "search_backend": self.vectors.backend,
            "isotropy": {
                "raw": isotropy(raw, rng),
                "calibrated": isotropy(l2_normalize(self.calibrator.transform(raw)), rng) if len(raw) else {},
            },
        }

    # --- writing -------------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        corpus: str | Path,
        name: str,
        index_dir: str | Path = DEFAULT_INDEX_DIR,
        *,
        model: str | None = None,
        pooling: str | None = "last-avg",
        layers: str | Sequence[int] | None = None,
        max_length: int | None = None,
        calibrator: str = DEFAULT_CALIBRATOR,
        calibrator_options: dict | None = None,
        index_type: str = "flat",
        device: str = "auto",
        dtype: str = "fp32",
        batch_size: int = 64,
        encoding: str = "utf-8",
        progress: bool = False,
    ) -> ChangeSummary:
        """Encode a corpus, fit the calibrator on it, and swap the new index in under NAME."""
        started = time.perf_counter()
        documents = read_corpus(corpus, encoding=encoding)  # bad input fails here, before the model loads
        fitted = make_calibrator(calibrator, **(calibrator_options or {}))  # so does a bad calibrator name
        if index_type not in INDEX_TYPES:  # and a bad index type
            raise RetrieverError(f"unknown index type '{index_type}'; choose one of {', '.join(INDEX_TYPES)}")
        check_target(index_dir, name)  # and a folder in the way
        timings = {"read": time.perf_counter() - started}
        clock = time.perf_counter()
        encoder = Encoder(model, pooling, layers, max_length, device, dtype, batch_size)
        timings["load_model"] = time.perf_counter() - clock  # in a fresh process: mostly importing model code

        clock = time.perf_counter()
        raw, truncated = encoder.encode_counting_truncated([document_text(d) for d in documents], progress=progress)
        timings["encode"] = time.perf_counter() - clock
        clock = time.perf_counter()
        fitted.fit(raw)
        calibrated = l2_normalize(fitted.transform(raw))
        timings["calibrate"] = time.perf_counter() - clock

        clock = time.perf_counter()
        with writing(index_dir, name) as writer:
            folder = writer.folder
            with MetadataStore(folder / DOCUMENTS) as metadata:
                rowids = metadata.add(documents)
            store = VectorStore.create(calibrated.shape[1], index_type, device="cpu")
            store.add(rowids, calibrated)
            store.save(folder / VECTORS)
            _save_raw(folder, raw, rowids)
            fitted.save(folder / CALIBRATOR)
            manifest = {
                "format_version": FORMAT_VERSION,
                "name": name,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "source": str(Path(corpus).resolve()),
                "encoder": encoder.config(),
                "calibrator": fitted.config(),
                "index_type": index_type,
                "dim": int(calibrated.shape[1]),
                "documents": len(documents),
                "truncated_at_build": truncated,
                "versions": library_versions(),
            }
            write_manifest(folder, manifest)
            final = writer.commit()
        timings["write"] = time.perf_counter() - clock
        return ChangeSummary(name, str(final), len(documents), len(documents), truncated,
                             time.perf_counter() - started, timings)

    def add(self, corpus: str | Path, encoding: str = "utf-8", progress: bool = False) -> ChangeSummary:
        """Encode new documents with the saved calibrator (no refit) and append them."""
        started = time.perf_counter()
        documents = read_corpus(corpus, encoding=encoding)  # refuses ids repeated within the file
        with writing(self.index_dir, self.name) as writer:
            current = self._current_version()
            with MetadataStore(current.folder / DOCUMENTS, readonly=True) as metadata:
                clashes, _ = metadata.rowids_for(d.doc_id for d in documents)
            check_unique_ids(documents, existing=set(clashes))  # refused before any encoding
            raw, truncated = current.encoder.encode_counting_truncated(
                [document_text(d) for d in documents], progress=progress
            )
            calibrated = l2_normalize(current.calibrator.transform(raw))
            folder = current._copy_into(writer.folder)
            with MetadataStore(folder / DOCUMENTS) as metadata:
                rowids = metadata.add(documents)
            store = VectorStore.load(folder / VECTORS, device="cpu")
            store.add(rowids, calibrated)
            store.save(folder / VECTORS)
            old_raw, old_ids = current.raw_vectors()
            _save_raw(folder, np.concatenate([old_raw, raw]), np.concatenate([old_ids, rowids]))
            count = current.metadata.count() + len(documents)
            write_manifest(folder, {**current.manifest, "documents": count})
            final = writer.commit()
        return ChangeSummary(self.name, str(final), count, len(documents), truncated, time.perf_counter() - started)

    def delete(self, doc_ids: Sequence[str]) -> ChangeSummary:
        """Remove documents from FAISS and SQLite together; unknown ids refuse the whole deletion."""
        started = time.perf_counter()
        if not doc_ids:
            raise RetrieverError("give at least one document id to delete")
        with writing(self.index_dir, self.name) as writer:
            current = self._current_version()
            folder = current._copy_into(writer.folder)
            with MetadataStore(folder / DOCUMENTS) as metadata:
                rowids = metadata.delete(list(dict.fromkeys(doc_ids)))
                count = metadata.count()
            store = VectorStore.load(folder / VECTORS, device="cpu")
            store.remove(rowids)
            store.save(folder / VECTORS)
            raw, ids = current.raw_vectors()
            keep = ~np.isin(ids, rowids)
            _save_raw(folder, raw[keep], ids[keep])
            write_manifest(folder, {**current.manifest, "documents": count})
            final = writer.commit()
        return ChangeSummary(self.name, str(final), count, len(rowids), 0, time.perf_counter() - started)

    def refit(self, calibrator: str | None = None, calibrator_options: dict | None = None) -> ChangeSummary:
        """Refit the calibrator on all stored raw vectors (no re-encoding) and rewrite the vector index."""
        started = time.perf_counter()
        with writing(self.index_dir, self.name) as writer:
            current = self._current_version()
            name = calibrator or current.manifest["calibrator"]["name"]
            fitted = make_calibrator(name, **(calibrator_options or {}))
            raw, ids = current.raw_vectors()
            fitted.fit(raw)
            calibrated = l2_normalize(fitted.transform(raw))
            folder = current._copy_into(writer.folder, skip=(VECTORS, CALIBRATOR))
            store = VectorStore.create(calibrated.shape[1], current.manifest["index_type"], device="cpu")
            store.add(ids, calibrated)
            store.save(folder / VECTORS)
            fitted.save(folder / CALIBRATOR)
            manifest = {**current.manifest, "calibrator": fitted.config(), "dim": int(calibrated.shape[1]),
                        "refitted": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            write_manifest(folder, manifest)
            final = writer.commit()
        return ChangeSummary(self.name, str(final), len(ids), len(ids), 0, time.perf_counter() - started)

    def _current_version(self) -> Index:
        """The version that is current now (another writer may have committed since this one was opened)."""
        current = Index.open(self.name, self.index_dir, device=self.device)
        if current.folder == self.folder:
            current._encoder = self._encoder  # reuse a loaded model
        return current

    def _copy_into(self, folder: Path, skip: Sequence[str] = ()) -> Path:
        for path in self.folder.iterdir():
            if path.name in skip or path.name == "manifest.json":
                continue
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, folder / path.name)
        return folder


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


def _save_raw(folder: Path, raw: np.ndarray, rowids: np.ndarray) -> None:
    # float16 halves the size; fall back to float32 for models with huge activations.
    fits = raw.size == 0 or float(np.abs(raw).max()) < FLOAT16_MAX
    np.save(folder / RAW_VECTORS, raw.astype(np.float16 if fits else np.float32))
    np.save(folder / RAW_IDS, np.asarray(rowids, dtype=np.int64))


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


def library_versions() -> dict[str, str]:
    versions = {"retriever": __version__, "python": platform.python_version()}
    for package in ("torch", "transformers", "faiss-cpu", "faiss-gpu-cu12", "numpy", "sqlite-utils"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


__all__ = ["Index", "SearchHit", "ChangeSummary", "DEFAULT_INDEX_DIR", "document_text", "l2_normalize", "isotropy"]

