"""The steps of a build that do not depend on where it runs: checking its arguments, choosing what to fit,
training the index template, saving what every segment is written with, and writing the new manifest. Both
engines, the local one (`Index.build`) and Ray's (`retriever.engines.ray_build`), take their build from here, so
neither imports the other and a change to one step is a change to both.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from retriever import __version__
from retriever.calibration import Calibrator, fit_sample_rows, make_calibrator, too_few_to_fit
from retriever.errors import RetrieverError, param
from retriever.numeric import l2_normalize_in_place
from retriever.versions.home import check_target, index_options as options_hint
from retriever.versions.layout import CALIBRATOR, SEGMENTS, TEMPLATE
from retriever.versions.manifest import Manifest, SegmentEntry
from retriever.engines.stages import fitted_query_count
from retriever.progress import stderr_console
from retriever.store.arrays import load_npy, npy_layout
from retriever.store.layout import PASSAGES, ROWIDS
from retriever.store.passages import passage_numbers
from retriever.store.vectors import VectorStore, train_template
from retriever.store.spec import INDEX_TYPES, IndexSpec, choose_spec
from retriever.text import check_queries, counted

if TYPE_CHECKING:
    from retriever.encode.encoder import Encoder


@dataclass
class ChangeSummary:
    """What a build/add/delete/refit/compact did, for the CLI's closing line and for benchmarks."""

    name: str
    folder: str
    documents: int  # in the index afterwards
    changed: int  # documents added, removed or re-calibrated
    truncated: int = 0  # documents cut at the max length; where passages are cut, those past MAX_PASSAGES of them
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. "resumed after 32,768 encoded documents"
    version: int = 0  # the committed version's number
    cut: int = 0  # of the documents written, those longer than the encoder reads, cut into passages...
    passages: int = 0  # ...and the passages (a vector each) all the documents written became
    opener: Callable[[], object] | None = field(default=None, repr=False, compare=False)

    def open(self):
        """The version this change committed, opened as a new `Index`. The `Index` a write went through stays on
        the version it was opened on (a server's requests rely on that), so this is how a caller goes on from its
        own write: `index = index.add(documents).open()`."""
        if self.opener is None:
            raise RetrieverError(f"this change of index '{self.name}' has no version to open")
        return self.opener()


def check_build_arguments(calibrator: str | Calibrator, calibrator_options: dict | None, index_type: str,
                          fit_sample: int | None, fit_queries, encoding: str, index_dir: Path,
                          name: str) -> tuple[Calibrator, bool, tuple[list[str], np.ndarray | None, str | None]]:
    """A build's refusals that need no corpus read or model load; returns the calibrator to fit, whether it came
    fitted, and the queries to fit on (`parse_fit_queries`)."""
    prefitted = isinstance(calibrator, Calibrator) and calibrator.fitted
    queries = parse_fit_queries(fit_queries, encoding)
    fitted = calibrator if isinstance(calibrator, Calibrator) else make_calibrator(calibrator, **(calibrator_options or {}))
    if index_type not in INDEX_TYPES:
        raise RetrieverError(f"unknown index type '{index_type}'; choose one of {', '.join(INDEX_TYPES)}")
    fit_sample_rows(0, fit_sample)  # validates the bound
    check_target(index_dir, name)
    return fitted, prefitted, queries

def parse_fit_queries(fit_queries, encoding: str) -> tuple[list[str], np.ndarray | None, str | None]:
    """The example queries a build fits on, as texts to encode or as given raw vectors, and where they came
    from (a path, or "given")."""
    if fit_queries is None:
        return [], None, None
    if isinstance(fit_queries, np.ndarray):
        if fit_queries.ndim != 2 or not len(fit_queries):
            raise RetrieverError(f"fit_queries vectors must be a non-empty 2-D array (got shape {fit_queries.shape})")
        return [], fit_queries.astype(np.float32, copy=False), "given"
    if isinstance(fit_queries, (str, Path)):
        from retriever.corpus import read_queries

        if not Path(fit_queries).is_file():
            why = "a folder, not a file of queries" if Path(fit_queries).is_dir() else "no such file"
            raise RetrieverError(f"{param('fit_queries')} {fit_queries}: {why}")
        return [text for _, text in read_queries(fit_queries, encoding)], None, str(Path(fit_queries).resolve())
    texts = list(fit_queries)
    check_queries(texts)
    return texts, None, "given"

def fallback_note(fallback: dict, index_dir: Path, name: str) -> str:
    return (f"warning: {fallback['reason']}; built without calibration (calibrator none); once the index holds "
            f"more documents run: retriever refit {options_hint(index_dir, name)} --calibrator {fallback['asked']}")

def queries_to_fit(query_texts: list[str], query_vectors: np.ndarray | None, calibrator: Calibrator,
                   prefitted: bool, encoder: Encoder, notes: list[str], progress: bool) -> np.ndarray | None:
    """The raw query vectors a build adds to its fit sample (`--fit-queries`): encoded now if given as texts,
    none (with a note) when nothing is fitted."""
    if (query_texts or query_vectors is not None) and (prefitted or calibrator.name == "none"):
        note(notes, "note: --fit-queries ignored: " + ("the calibrator was fitted before the build" if prefitted
                                                        else "calibrator none fits nothing"), progress)
        return None
    if query_texts:
        return encoder.encode(query_texts, progress=progress, description="Encoding queries")
    return query_vectors

def enough_to_fit(calibrator: Calibrator, prefitted: bool, documents: int, fit_sample: int | None,
                   dim: int) -> tuple[Calibrator, dict | None]:
    """The calibrator a build fits, and the record of a fallback: with fewer documents than CALIBRATOR needs
    (`Calibrator.min_fit_rows`) the build goes on uncalibrated (`none`) rather than fit on too few vectors or
    fail after encoding; a --fit-sample below the need is the caller's explicit choice and is refused."""
    rows = min(documents, fit_sample or documents)
    shortfall = None if prefitted else too_few_to_fit(calibrator, rows, dim)
    if shortfall is None:
        return calibrator, None
    if rows < documents:
        raise RetrieverError(f"{param('fit_sample', fit_sample)} is {shortfall}")
    # Recorded and shown as plain text (a note, the manifest), spelled as the note's own hint is: for the CLI.
    reason = RetrieverError(f"only {counted(documents, 'document')}: {shortfall}").render({"calibrator": "--calibrator"})
    return make_calibrator("none"), {"asked": calibrator.name, "reason": reason}

def train_index(vectors: int, sample: np.ndarray, calibrator: Calibrator, index_type: str,
                index_options: dict | None) -> tuple[IndexSpec, object]:
    """The index spec for VECTORS vectors (INDEX_TYPE, with INDEX_OPTIONS over its defaults) and its trained
    template (the IVF quantizer every segment shares, trained on the raw SAMPLE as fitted CALIBRATOR calibrates it;
    None for flat and hnsw, which calibrate nothing here)."""
    spec = index_spec(vectors, fitted_out_dim(calibrator, sample.shape[1]), index_type, index_options)
    if not spec.kind.trained:
        return spec, None
    return spec, train_template(spec, l2_normalize_in_place(calibrator.transform(sample)))

def index_spec(vectors: int, dim: int, index_type: str, index_options: dict | None) -> IndexSpec:
    """The index for VECTORS calibrated vectors of DIM dimensions: INDEX_TYPE, with INDEX_OPTIONS over its
    defaults."""
    spec = choose_spec(vectors, dim, index_type)
    return IndexSpec.from_dict({**spec.to_dict(), **(index_options or {})}).for_dim(dim)

def untrained_index(calibrator: Calibrator, vectors: int, dim: int, index_type: str,
                    index_options: dict | None) -> IndexSpec | None:
    """The index for VECTORS raw vectors of DIM dimensions where writing them needs no sample of them: CALIBRATOR
    is fitted (given so, or `none`, which learns nothing and is fitted here) and the index trains no template.
    None where a sample is needed."""
    if calibrator.name == "none" and not calibrator.fitted:
        calibrator.fit(np.empty((0, dim), np.float32))
    if not calibrator.fitted:
        return None
    spec = index_spec(vectors, fitted_out_dim(calibrator, dim), index_type, index_options)
    return None if spec.kind.trained else spec

def save_fitted(folder: Path, calibrator: Calibrator, spec: IndexSpec, template) -> None:
    """What every segment of a version is written with: the calibrator and the trained template."""
    calibrator.save(folder / CALIBRATOR)
    if template is not None:
        VectorStore(template, spec).save(folder / TEMPLATE)

def fit_summary(prefitted: bool, documents: int, fit_sample: int | None, seed: int,
                query_vectors: np.ndarray | None, queries_from: str | None) -> dict:
    """The manifest's record of how a build fitted its calibrator."""
    if prefitted:
        return {"prefitted": True}
    return {"sample": min(documents, fit_sample or documents), "of": documents, "seed": seed,
            **({"queries": fitted_query_count(query_vectors, fit_sample), "queries_from": queries_from}
               if query_vectors is not None else {})}

def new_manifest(name: str, corpus: str | Path | None, encoder_config: dict, calibrator: Calibrator, fit_record: dict,
                 spec: IndexSpec, segments: Sequence[tuple], truncated: int, fallback: dict | None,
                 vectors_from: str | Path | None = None, engine: dict | None = None,
                 passages: dict | None = None, hybrid: dict | None = None, folder: dict | None = None) -> Manifest:
    """The manifest of a freshly built index of SEGMENTS ((name, rows) or (name, rows, vectors) in row id order,
    ids from 1), whichever engine built it; PASSAGES: how long documents were cut (None: one vector each); HYBRID:
    the hybrid decision (`Manifest.hybrid`)."""
    documents = sum(segment[1] for segment in segments)
    return Manifest(
        name=name,
        created=now_iso(),
        source=str(Path(corpus).resolve()) if corpus is not None else None,  # None: documents given in Python
        vectors_from=str(Path(vectors_from).resolve()) if vectors_from is not None else None,
        encoder=encoder_config,
        calibrator=calibrator.config(),
        fit=fit_record,
        index=spec.to_dict(),
        index_type=spec.type,
        dim=fitted_out_dim(calibrator, encoder_config["dim"]),
        documents=documents,
        segments=tuple(SegmentEntry.written(segment[0], segment[1], spec, vectors=segment[2] if len(segment) > 2 else None)
                       for segment in segments),
        next_rowid=documents + 1,
        next_segment=len(segments) + 1,
        truncated_at_build=truncated,
        passages=passages,
        versions=library_versions(),
        engine=engine or None,
        calibrator_fallback=fallback or None,
        hybrid=hybrid,
        folder=folder,
    )


def written_passages(folder: Path, segments: Sequence[str]) -> tuple[int, int]:
    """(documents cut into several passages, vectors) of the SEGMENTS a write made in the version FOLDER."""
    cut = vectors = 0
    for name in segments:
        segment = folder / SEGMENTS / name
        keys = load_npy(segment / PASSAGES, mmap_mode="r") if (segment / PASSAGES).is_file() else None
        if keys is None:
            vectors += int(npy_layout(segment / ROWIDS)[0][0])
        else:
            cut += int(np.count_nonzero(passage_numbers(np.asarray(keys)) == 1))
            vectors += len(keys)
    return cut, vectors


def fitted_out_dim(calibrator: Calibrator, dim: int) -> int:
    """The dimension of CALIBRATOR's output for DIM-dimensional input (whitening-K and flow-K reduce it)."""
    return int(calibrator.transform(np.zeros((1, dim), np.float32)).shape[1])

def note(notes: list[str], note: str, progress: bool) -> None:
    notes.append(note)
    if progress:
        stderr_console.print(note, markup=False, highlight=False, soft_wrap=True)

def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

def library_versions() -> dict[str, str]:
    versions = {"retriever": __version__, "python": platform.python_version()}
    for package in ("torch", "transformers", "faiss-cpu", "faiss-gpu-cu12", "numpy", "sqlite-utils"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


# What the vectors of `retriever encode` record of their encoder that queries must be encoded alike with.
_ENCODER_SETTINGS = ("pooling", "layers", "max_length")


def check_encoded_alike(path: Path, config: dict, building: bool = True) -> None:
    """Refuse vectors `retriever encode` wrote (PATH, beside it the record PATH.json) with other encoder settings
    than CONFIG's (the build's encoder; not BUILDING: the index's record, for an add): the index would encode its
    queries otherwise than those documents were, and rank them poorly without a word. Vectors without a record are
    the caller's to vouch for."""
    try:
        record = json.loads(path.with_suffix(".json").read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):  # none, or not one `retriever encode` wrote
        return
    encoded = record.get("encoder") if isinstance(record, dict) else None
    if not isinstance(encoded, dict):
        return
    differ = [name for name in _ENCODER_SETTINGS if name in encoded and encoded[name] != config.get(name)]
    model, built = encoded.get("model"), config.get("model")
    if isinstance(model, str) and isinstance(built, str) and Path(model).name != Path(built).name:
        differ.insert(0, "model")
    if not differ:
        return

    def value(settings: dict, name: str):  # layers as the command line takes them: 0,2
        found = settings.get(name)
        return ",".join(map(str, found)) if isinstance(found, list) else found

    said = ", ".join(f"{name} {encoded[name]}" for name in differ)
    index_said = ", ".join(f"{name} {config.get(name)}" for name in differ)
    if building:
        fix = f"build with {' '.join(param(name, value(encoded, name)) for name in differ)}, or encode the corpus again"
    else:  # not the add's own parameters: `retriever encode`'s, spelled as its command line spells them
        options = " ".join(f"--{name.replace('_', '-')} {value(config, name)}" for name in differ)
        fix = f"encode them again as it does (retriever encode {options})"
    raise RetrieverError(f"{path} was encoded with {said} ({path.with_suffix('.json').name}), and this "
                         f"{'build' if building else 'index'} encodes its queries with {index_said}: {fix}")
