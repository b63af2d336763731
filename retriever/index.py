"""The calibrated index, as a library user meets it: `Index` is a read snapshot (`retriever.snapshot`) that can
also build, add, delete, compact and refit. Each of those is one writer transaction (`retriever.writer`) that
commits a new version and returns a `ChangeSummary`; the `Index` it went through stays on the version it was
opened on (a server's requests rely on that), and `summary.snapshot()` opens the new one:

    index = Index.build("corpus.jsonl", "notes").snapshot()
    index = index.add(more_documents).snapshot()

`build` streams a corpus through the pipeline stages (`retriever.pipeline`) and fits the calibrator unsupervised
on a sample of the corpus's own embeddings; `add` writes one new segment calibrated with the saved calibrator;
`delete` writes tombstones; `compact` merges every segment (writes also merge by themselves, by the writer's
`MergePolicy`); `refit` fits a new calibrator on the stored raw vectors and rewrites the vector indexes, without
re-encoding. A failed or killed write loses nothing (see `index_folder`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retriever.build_steps import (
    ChangeSummary,
    now_iso,
    parse_fit_queries,
)
from retriever.calibration import (
    DEFAULT_CALIBRATOR,
    DEFAULT_FIT_SAMPLE,
    Calibrator,
    fit_calibrator,
    make_calibrator,
    too_few_to_fit,
)
from retriever.corpus import Document, check_documents, corpus_format, document_text, iter_corpus
from retriever.engines import ENGINES
from retriever.engines.base import BuildEngine, BuildSpec, run_build
from retriever.engines.local import LocalEngine
from retriever.errors import RetrieverError, param
from retriever.filters import parse_where
from retriever.index_folder import list_versions, resolve_index_dir, rollback
from retriever.layout import CALIBRATOR, DOCUMENTS, ENCODED, RAW, ROWIDS, SEGMENTS
from retriever.pipeline import (
    CHUNK_ROWS,
    BuildState,
    calibrated_blocks,
    check_set,
    check_vectors,
    encode_table,
    fitted_query_count,
    ingest,
    l2_normalize,
    with_queries,
    write_segment_vectors,
)
from retriever.snapshot import SearchHit, Snapshot, at_least, check_min_score, isotropy, search_record, verify_index
from retriever.store.arrays import VectorSource, vector_source
from retriever.store.documents import DocumentTable
from retriever.store.segment import finish_segment
from retriever.store.vectors import IndexSpec, train_template
from retriever.writer import IndexWriter, MergePolicy

if TYPE_CHECKING:  # the encoder (and torch) loads only where text is encoded
    from retriever.encoder import Encoder


class Index(Snapshot):
    """An opened version of an index (read-only, as `Snapshot`), with the writes as methods: each commits a new
    version through an `IndexWriter` and returns a `ChangeSummary` whose `snapshot()` opens it."""

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
        replace: bool = True,
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
        over rather than resuming. REPLACE False: refuse a NAME that exists (the CLI's default; building over it
        keeps its current version, which `rollback` restores)."""
        if engine not in ENGINES:
            raise RetrieverError(f"unknown engine '{engine}'; choose one of {', '.join(ENGINES)}")
        spec = BuildSpec(model=model, pooling=pooling, layers=layers, max_length=max_length, calibrator=calibrator,
                         calibrator_options=calibrator_options, fit_sample=fit_sample, index_type=index_type,
                         index_options=index_options, device=device, dtype=dtype, batch_size=batch_size,
                         encoding=encoding, fit_queries=fit_queries)
        if engine == "ray":
            if isinstance(corpus, (list, tuple)):
                raise RetrieverError("the ray engine reads corpus files; build from a list of documents with the "
                                     "local engine")
            if vectors is not None or encoder is not None:
                raise RetrieverError(f"the ray engine encodes the corpus itself; build from {param('vectors')} with "
                                     "the local engine")
            from retriever.engines.ray_build import RayEngine, RayOptions

            runner: BuildEngine = RayEngine(spec, progress, corpus=corpus, options=ray_options or RayOptions())
        else:
            runner = LocalEngine(spec, progress, corpus=corpus, vectors=vectors, encoder=encoder, resume=resume,
                                 chunk_rows=chunk_rows)
        index_dir = resolve_index_dir(index_dir)
        summary = run_build(runner, name, index_dir, replace)
        summary.opener = _version_opener(Path(summary.folder), name, index_dir, device)
        return summary

    @staticmethod
    def versions(name: str, index_dir: str | Path | None = None) -> list[dict]:
        """NAME's kept versions, newest first: the current one and the one it replaced (`index_folder.list_versions`:
        version, current, written, documents, calibrator)."""
        return list_versions(resolve_index_dir(index_dir), name)

    @classmethod
    def rollback(cls, name: str, version: str, index_dir: str | Path | None = None, device: str = "auto") -> Index:
        """Make VERSION (from `versions`) NAME's current version again, after checking its files, and open it. The
        version it replaces is kept: rolling back is undone the same way."""
        index_dir = resolve_index_dir(index_dir)
        rollback(index_dir, name, version)
        return cls.open(name, index_dir, device=device)

    def add(self, corpus: str | Path | Sequence[Document], encoding: str = "utf-8", progress: bool = False,
            vectors: str | Path | np.ndarray | None = None, chunk_rows: int = CHUNK_ROWS,
            upsert: bool = False) -> ChangeSummary:
        """Write CORPUS's documents (a corpus file, or a list of Documents) as one new segment, encoded (or taken
        from VECTORS) and calibrated with the saved calibrator (no refit); every existing segment is reused. An id
        already in the index is refused, or with UPSERT its old document is deleted in the same version."""
        started = time.perf_counter()
        given = list(corpus) if isinstance(corpus, (list, tuple)) else None  # Documents (the server's records)
        if given is None:
            corpus_format(corpus)
        else:
            check_documents(given)
        source = vector_source(vectors) if vectors is not None else None
        timings: dict[str, float] = {}
        with self._writer() as writer:
            current = writer.base
            # Read into the new version: the calibrator (through the new vectors), the template (`template`) and
            # merged segments (`merge`) are re-hashed; the rest is linked, or only looked up in (the ids already
            # there): hashing it would make every add cost the whole index.
            current.check_read(CALIBRATOR)
            folder = writer.folder
            segment = writer.new_segment_folder()
            first = writer.manifest.next_rowid
            dim = current.manifest.encoder["dim"]

            clock = time.perf_counter()
            table = DocumentTable.create(segment / DOCUMENTS)
            documents = iter(given) if given is not None else iter_corpus(corpus, encoding)
            count = ingest(documents, table, first, chunk_rows=chunk_rows)
            if count == 0:
                raise RetrieverError(f"{corpus}: no documents (the file is empty or all blank lines)")
            # Before any encoding: ids already in the index are refused, or (upsert) replaced in this same version.
            if upsert:
                replaced = [document.doc_id for document in writer.existing_ids(table)]
            else:
                writer.refuse_existing_ids(table)
                replaced = []
            table.close()
            timings["read"] = time.perf_counter() - clock
            if source is not None and source.rows != count:
                raise RetrieverError(f"{source.path} holds {_count(source.rows, 'vector')} for {_documents(count)} in "
                                     f"{corpus}")
            if source is not None and source.dim != dim:
                raise RetrieverError(f"{source.path} holds {source.dim}-dimensional vectors; this index's encoder "
                                     f"gives {dim}")

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
            blocks = calibrated_blocks(source, current.calibrator, first)
            write_segment_vectors(segment, blocks, dim, current.manifest.dim, current.spec.for_segment(count),
                                  writer.template())
            finish_segment(segment)
            (folder / ENCODED).unlink(missing_ok=True)
            if replaced:
                writer.delete(replaced)  # the old documents of those ids: tombstones, in this same version
            writer.add_segment(segment, count)
            final = writer.commit()
            timings["write"] = time.perf_counter() - clock
        notes = ([f"replaced {_documents(len(replaced))} whose ids were already in the index"] if replaced else [])
        return ChangeSummary(self.name, str(final), writer.manifest.documents, count, state.truncated,
                             time.perf_counter() - started, timings, notes + _merge_notes(writer),
                             opener=self._opener(final))

    def delete(self, doc_ids: Sequence[str] | None = None, where: str | dict | None = None) -> ChangeSummary:
        """Delete documents by id, all or nothing, or every document the filter WHERE selects (`retriever.filters`):
        their row ids become tombstones that searches filter out."""
        started = time.perf_counter()
        doc_ids = list(dict.fromkeys(doc_ids or ()))
        if bool(doc_ids) == (where is not None):
            raise RetrieverError(f"give document ids to delete or {param('where')}: one of the two"
                                 + (", not both" if doc_ids else ""))
        compiled = parse_where(where)
        with self._writer() as writer:
            removed = writer.delete(doc_ids) if compiled is None else writer.delete_where(compiled)
            final = writer.commit()
        return ChangeSummary(self.name, str(final), writer.manifest.documents, removed,
                             seconds=time.perf_counter() - started, notes=_merge_notes(writer),
                             opener=self._opener(final))

    def compact(self) -> ChangeSummary:
        """Merge every segment into one and drop the deleted documents for good."""
        started = time.perf_counter()
        with self._writer() as writer:
            dropped = len(writer.tombstones)
            writer.merge([entry.name for entry in writer.manifest.segments])
            final = writer.commit(merge=False)
        return ChangeSummary(self.name, str(final), writer.manifest.documents, dropped,
                             seconds=time.perf_counter() - started, opener=self._opener(final))

    def refit(self, calibrator: str | None = None, calibrator_options: dict | None = None,
              fit_sample: int | None = DEFAULT_FIT_SAMPLE,
              fit_queries: str | Path | Sequence[str] | np.ndarray | None = None,
              progress: bool = False) -> ChangeSummary:
        """Fit a new calibrator on a sample of the stored raw vectors (no re-encoding of documents) and rewrite every
        segment's vector index with it; documents and raw vectors are reused as they are. FIT_QUERIES, as in
        `build`: example queries fitted on too (texts are encoded with the index's encoder)."""
        started = time.perf_counter()
        dim = self.manifest.encoder["dim"]
        name = calibrator or self.manifest.calibrator["name"]
        fitted = make_calibrator(name, **(calibrator_options or {}))
        fitted.check_dim(dim)  # before any query is encoded
        query_texts, query_vectors, queries_from = parse_fit_queries(fit_queries, "utf-8")
        if query_texts and name != "none":
            query_vectors = self.load_encoder().encode(query_texts, progress=progress, description="Encoding queries")
        if query_vectors is not None and query_vectors.shape[1] != dim:
            raise RetrieverError(f"fit_queries holds {query_vectors.shape[1]}-dimensional vectors; index "
                                 f"'{self.name}' stores {dim}")
        if name == "none":
            query_vectors = None
        with self._writer() as writer:
            current = writer.base
            # Read into the new version: every raw vector and row id (the new vector indexes); re-hashed before the
            # sample is drawn from them.
            current.check_read(*(f"{SEGMENTS}/{entry.name}/{part}" for entry in current.manifest.segments
                                 for part in (RAW, ROWIDS)))
            rows = min(len(current), fit_sample or len(current))
            shortfall = too_few_to_fit(fitted, rows, dim)
            if shortfall:  # refit is an explicit request: refused, never quietly replaced by another calibrator
                have = (f"{param('fit_sample', fit_sample)} is" if rows < len(current) else
                        f"index '{self.name}' holds only {_documents(len(current))}:")
                raise RetrieverError(f"{have} {shortfall}")
            seed = getattr(fitted, "seed", 0)
            sample = current.raw_sample(fit_sample or len(current), seed=seed)
            check = (check_set(fitted, len(current), *current.check_sources(), current.encoder, seed, progress)
                     if fitted.uses_check else None)  # only auto needs the model here
            fit_calibrator(fitted, with_queries(sample, query_vectors, fit_sample, seed), check)
            calibrated_sample = l2_normalize(fitted.transform(sample))
            spec_record = dict(current.manifest.index)
            if calibrated_sample.shape[1] != current.manifest.dim:
                spec_record.pop("pq_m", None)  # set again for the new dimension
            spec = IndexSpec.from_dict(spec_record).for_dim(calibrated_sample.shape[1])
            template = train_template(spec, calibrated_sample)
            writer.replace_calibrator(fitted, spec, template)
            writer.manifest = writer.manifest.replace(
                dim=int(calibrated_sample.shape[1]), refitted=now_iso(),
                fit={"sample": len(sample), "of": len(current), "seed": seed,
                     **({"queries": fitted_query_count(query_vectors, fit_sample), "queries_from": queries_from}
                        if query_vectors is not None else {})})
            final = writer.commit(merge=False)
        return ChangeSummary(self.name, str(final), len(current), len(current), 0, time.perf_counter() - started,
                             opener=self._opener(final))

    def _writer(self) -> IndexWriter:
        """A write transaction on this index, based on this version if it is still the current one (its loaded
        model is kept), else on the current one."""
        return IndexWriter(self.index_dir, self.name, current=self, device=self.device, merge_policy=MERGE_POLICY)

    def _opener(self, folder: Path):
        return _version_opener(folder, self.name, self.index_dir, self.device)


# What every write of the library API merges by itself (`compact` merges everything).
MERGE_POLICY = MergePolicy()


def _merge_notes(writer: IndexWriter) -> list[str]:
    rewritten = writer.merges.count(1)
    merged = sum(size for size in writer.merges if size > 1)
    return ([f"rewrote {_count(rewritten, 'segment')} without {'its' if rewritten == 1 else 'their'} deleted "
             "documents"] if rewritten else []) + ([f"merged {merged} segments into "
                                                    f"{_count(len(writer.merges) - rewritten, 'segment')}"]
                                                   if merged else [])


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def _documents(count: int) -> str:
    return _count(count, "document")


def _version_opener(folder: Path, name: str, index_dir: Path, device: str):
    return lambda: Index.open_version(folder, name, index_dir, device)


__all__ = ["Index", "IndexWriter", "MergePolicy", "SearchHit", "ChangeSummary", "at_least", "check_min_score",
           "search_record", "verify_index",
           "document_text", "l2_normalize", "isotropy"]
