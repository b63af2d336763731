"""The build skeleton every engine shares, and the interface an engine fills in.

An engine decides where the documents are read and encoded and where the segments are written; everything
between is the same for all of them and lives here, once: checking the arguments, deciding what can be fitted on
this many documents, the retrieval check's pseudo-queries, fitting the calibrator, training the index template,
saving both, and committing the manifest through the writer (`retriever.versions.writer.IndexWriter`).

    run_build(engine, name, index_dir, spec)
      engine.check()                                  cheap refusals, before anything is read or loaded
      with engine.session(index_dir, name) as writer: the writer transaction (and whatever the engine runs in)
        engine.read(writer)      -> documents         row ids 1..documents, in corpus order
        engine.load_encoder()    -> Encoder           the driver's copy: queries, pseudo-queries, the config
        engine.encode(writer)    -> VectorSource      raw vectors, row i - 1 for row id i
        fit, train, save                              shared
        engine.write_segments(writer, ...)            -> [(segment name, rows)]
        commit                                        shared
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retriever.engines.steps import (
    ChangeSummary,
    check_build_arguments,
    enough_to_fit,
    fallback_note,
    fit_summary,
    new_manifest,
    note,
    queries_to_fit,
    save_fitted,
    train_index,
    untrained_index,
    written_passages,
)
from retriever.calibration import DEFAULT_CALIBRATOR, DEFAULT_FIT_SAMPLE, Calibrator
from retriever.calibration.pseudo_queries import CheckRounds
from retriever.errors import RetrieverError
from retriever.versions.catalog import refuse_replacing
from retriever.engines.stages import check_set, document_reads, fit
from retriever.encode.passages import PassageSettings
from retriever.store.arrays import VectorSource
from retriever.store.spec import IndexSpec
from retriever.versions.writer import IndexWriter

if TYPE_CHECKING:  # the encoder (and torch) loads only where text is encoded
    from retriever.calibration.check import CheckSet
    from retriever.encode.encoder import Encoder


@dataclass
class BuildSpec:
    """What a build makes, whichever engine runs it: the encoder, the calibrator and how it is fitted, the index
    type, and how the corpus is read."""

    model: str | None = None
    pooling: str | None = "last-avg"
    layers: str | Sequence[int] | None = None
    max_length: int | None = None
    calibrator: str | Calibrator = DEFAULT_CALIBRATOR
    calibrator_options: dict | None = None
    fit_sample: int | None = DEFAULT_FIT_SAMPLE
    index_type: str = "auto"
    index_options: dict | None = None
    device: str = "auto"
    dtype: str = "fp32"
    batch_size: int | None = None  # None: the encoder's default for its device
    runtime: str = "auto"  # the encoder's forward pass (`retriever.encode.runtimes`)
    encoding: str = "utf-8"
    fit_queries: str | Path | Sequence[str] | np.ndarray | None = None
    passages: PassageSettings = field(default_factory=PassageSettings)


@dataclass
class BuildEngine(ABC):
    """Where a build's read, encode and segment stages run. An engine records its stages' seconds in `timings`
    and anything worth telling in `notes` (shown by the CLI, returned in the ChangeSummary)."""

    spec: BuildSpec
    progress: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Refuse what can be refused before anything is read or loaded."""

    @abstractmethod
    def session(self, index_dir: Path, name: str) -> AbstractContextManager[IndexWriter]:
        """The build's writer transaction, inside whatever the engine needs around it (a cluster)."""

    @abstractmethod
    def read(self, writer: IndexWriter) -> int:
        """Read the corpus; returns how many documents (row ids 1..that, in corpus order)."""

    @abstractmethod
    def load_encoder(self) -> Encoder:
        """The encoder the build's config records, loaded where the build is driven."""

    @abstractmethod
    def encode(self, writer: IndexWriter, encoder: Encoder) -> tuple[VectorSource, int]:
        """Every document's raw vector, in row order, and how many documents were truncated."""

    @abstractmethod
    def documents_at(self, writer: IndexWriter) -> Callable[[np.ndarray], list[tuple[str | None, str]]]:
        """(title, text) of the documents at 0-based positions (row id - 1), for the retrieval check's
        pseudo-queries."""

    @abstractmethod
    def passage_rows(self, writer: IndexWriter) -> np.ndarray | None:
        """The (key, start, end) rows of the encoded vectors, row for row, where some document was cut into
        passages; None where each document is one vector."""

    @abstractmethod
    def write_segments(self, writer: IndexWriter, source: VectorSource, calibrator: Calibrator, spec: IndexSpec,
                       template) -> list[tuple[str, int]]:
        """Write the segments (calibrated with CALIBRATOR, saved in the writer's folder too); returns their
        (name, rows) in row id order."""

    def index_while_encoding(self, calibrator: Calibrator, spec: IndexSpec) -> None:
        """Offered before encoding where the vectors need no fit and the index no training (CALIBRATOR fitted,
        SPEC untrained): an engine may build the vector index from each chunk as it is encoded. Its
        `write_segments` is then still handed the calibrator and spec to write with, and must write the same."""

    def encoder_config(self, encoder: Encoder) -> dict:
        """The encoder record the manifest keeps: queries are encoded exactly so."""
        return encoder.config()

    def corpus_record(self) -> str | Path | None:
        """The corpus the manifest records as the source (None: documents given in Python)."""
        return None

    def manifest_extras(self) -> dict:
        """Engine-specific manifest fields (`vectors_from`, `engine`)."""
        return {}

    def passages_record(self, encoder: Encoder) -> dict | None:
        """How the build cut long documents (the manifest's `passages`; None: one vector per document)."""
        return self.spec.passages.checked(encoder.max_length).to_record()


def run_build(engine: BuildEngine, name: str, index_dir: Path, replace: bool = True,
              hybrid_check: Callable[[CheckSet | CheckRounds | None, Callable[[np.ndarray], np.ndarray], int], dict]
              | None = None,
              ) -> ChangeSummary:
    """Build index NAME in INDEX_DIR with ENGINE (see the module docstring); returns the ChangeSummary of the
    committed version. REPLACE False: refuse a NAME that exists, once the arguments are checked. HYBRID_CHECK(check
    set or None, the fitted calibrator's transform, seed): the hybrid decision the manifest records
    (`retriever.search.fusion_check.hybrid_check`, handed down by the library API, which sits above both)."""
    started = time.perf_counter()
    spec, timings, notes, progress = engine.spec, engine.timings, engine.notes, engine.progress
    engine.check()
    fitted, prefitted, (query_texts, query_vectors, queries_from) = check_build_arguments(
        spec.calibrator, spec.calibrator_options, spec.index_type, spec.fit_sample, spec.fit_queries, spec.encoding,
        index_dir, name)
    if not replace:
        refuse_replacing(index_dir, name)
    with engine.session(index_dir, name) as writer:
        if not replace:
            refuse_replacing(index_dir, name)  # again under the lock: a build that held it may have made NAME
        clock = time.perf_counter()
        documents = engine.read(writer)
        timings["read"] = time.perf_counter() - clock

        clock = time.perf_counter()
        encoder = engine.load_encoder()
        timings.setdefault("load_model", time.perf_counter() - clock)  # in a fresh process: mostly importing
        if query_vectors is not None and query_vectors.shape[1] != encoder.dim:
            raise RetrieverError(f"fit_queries holds {query_vectors.shape[1]}-dimensional vectors; "
                                 f"{encoder.model_name} gives {encoder.dim}")
        # Decided before encoding, now that the documents are counted and the dimension is known.
        if not prefitted:
            fitted.check_dim(encoder.dim)
        fitted, fallback = enough_to_fit(fitted, prefitted, documents, spec.fit_sample, encoder.dim)
        if fallback:
            note(notes, fallback_note(fallback, index_dir, name), progress)

        ready = untrained_index(fitted, documents, encoder.dim, spec.index_type, spec.index_options)
        if ready is not None:
            engine.index_while_encoding(fitted, ready)
        source, truncated = engine.encode(writer, encoder)
        # The calibrator is fitted, and auto's check run, on the documents' own vectors (what the encoder reads of
        # each, a cut document's first passage): the space the corpus's documents define, whatever passages
        # follow, and so the same one a build without passages fits.
        reads = document_reads(source, engine.passage_rows(writer))

        clock = time.perf_counter()
        seed = getattr(fitted, "seed", 0)
        check = check_set(fitted, reads.rows, engine.documents_at(writer), reads.take, encoder, seed, progress)
        made = time.perf_counter() - clock
        clock = time.perf_counter()
        query_vectors = queries_to_fit(query_texts, query_vectors, fitted, prefitted, encoder, notes, progress)
        # Sized by the vectors it holds: a passage each. Where nothing is fitted or trained, no sample is read.
        ready = untrained_index(fitted, source.rows, encoder.dim, spec.index_type, spec.index_options)
        sample = None if ready is not None else fit(fitted, reads, spec.fit_sample, seed, query_vectors, check)
        # The pseudo-queries are encoded as the fit's check and the hybrid check read them: timed apart.
        encoded = check.seconds if check is not None else 0.0
        timings["fit"] = time.perf_counter() - clock - encoded
        clock = time.perf_counter()
        hybrid = hybrid_check(check, fitted.transform, seed) if hybrid_check is not None else None
        if check is not None:
            timings["pseudo_queries"] = made + check.seconds
        if hybrid is not None and "evidence" in hybrid:
            timings["hybrid_check"] = time.perf_counter() - clock - (check.seconds - encoded)
        del check

        clock = time.perf_counter()
        index_spec, template = ((ready, None) if ready is not None else
                                train_index(source.rows, sample, fitted, spec.index_type, spec.index_options))
        del sample
        save_fitted(writer.folder, fitted, index_spec, template)  # what every segment is calibrated with
        timings["train_index"] = time.perf_counter() - clock

        clock = time.perf_counter()
        segments = engine.write_segments(writer, source, fitted, index_spec, template)
        timings["index"] = time.perf_counter() - clock - timings.get("keywords", 0.0)  # the vectors' part

        clock = time.perf_counter()
        fit_record = fit_summary(prefitted, documents, spec.fit_sample, seed, query_vectors, queries_from)
        manifest = new_manifest(name, engine.corpus_record(), engine.encoder_config(encoder),
                                fitted, fit_record, index_spec, segments, truncated, fallback,
                                passages=engine.passages_record(encoder), hybrid=hybrid, **engine.manifest_extras())
        final = writer.commit(manifest)
        timings["write"] = time.perf_counter() - clock
    # An encoder that ran on ONNX Runtime leaves the kit a search needs to encode queries without loading the model
    # (`encode.query_kit`): the first search after a build starts as fast as any later one.
    keep_query_kit = getattr(encoder, "keep_query_kit", None)
    if keep_query_kit is not None:
        try:
            keep_query_kit(manifest.encoder)
        except Exception:  # noqa: BLE001 - the version is committed; a kit only saves the next search time
            pass
    cut, passages = written_passages(final, [segment[0] for segment in segments])
    return ChangeSummary(name, str(final), documents, documents, truncated, time.perf_counter() - started, timings,
                         notes, version=writer.manifest.version, cut=cut, passages=passages)

