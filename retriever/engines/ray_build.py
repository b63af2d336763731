"""`retriever build --engine ray`: a build spread over a Ray cluster, through Ray Data.

    driver                        cluster
    ------                        -------
    check arguments, load config  count: one task per corpus file, every line checked, row ids fixed
                                  read -> encode: Ray Data streams document batches to an actor pool; each actor
                                    holds one encoder (a GPU each with --gpus-per-worker) and writes raw-vector
                                    shards into the build's partial folder
    fit the calibrator on a
    sample of the shards, train
    the IVF quantizer once, save
    both in the partial folder    write: one task per segment calibrates its shards (saved calibrator, shared
                                    quantizer) into FAISS + SQLite
    check ids across segments,
    write the manifest, swap in

The partial folder must be on storage every node sees. Nothing is current until the final swap, so a build that
fails (cluster unreachable, a worker lost for good, a model missing on a node) leaves the previous index as it was.
Locally, a cluster is started on 127.0.0.1 and stopped afterwards; with --ray-address the build joins a running one.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
import os
import re
import socket
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import numpy as np

from retriever.calibration import Calibrator
from retriever.corpus import iter_corpus
from retriever.encode.encoder import Encoder
from retriever.encode.runtimes import resolve_runtime
from retriever.engines.base import BuildEngine
from retriever.engines.workers import (
    SHARDS,
    EncodeWorker,
    corpus_files,
    count_stage,
    read_stage,
    shard_passages,
    write_segment,
)
from retriever.errors import RetrieverError, param
from retriever.engines.steps import note
from retriever.files.folder import FolderOptions, noted_documents
from retriever.store.layout import segment_name
from retriever.engines.stages import CHUNK_ROWS, stream_texts
from retriever.progress import progress_bar, stderr_console
from retriever.store.arrays import VectorSource
from retriever.store.spec import IndexSpec
from retriever.versions.writer import IndexWriter

# Documents per piece and per encode call of an actor: the local engine's chunk. The encoder sorts each call's
# texts by length before batching, so a larger call pads less (on real passages, 2,048 texts per call encoded 8%
# slower than 6,144 on 2 cores); and with the local engine's chunking the batches, and so the vectors, are the same.
DEFAULT_BATCH_ROWS = CHUNK_ROWS
# CPUs a read task reserves: not a whole number, so it differs from every actor's (see `build`).
READ_CPUS = 0.25
# Restarts of an encode actor that dies (killed for memory, its node lost), each retrying the batch it held; one
# that dies more often fails the build instead of retrying forever (Ray Data's default) on a batch that kills it.
WORKER_RESTARTS = 3
# A folder of a person's files, read on the driver into the partial folder as BEIR records for the workers.
FOLDER_DOCUMENTS = "folder-documents.jsonl"
# A segment per this many documents at least (fewer, larger segments search faster; compaction merges later).
MIN_SEGMENT_ROWS = 50_000


@dataclass(frozen=True)
class RayOptions:
    """How a build uses Ray. ADDRESS: None starts a local cluster on 127.0.0.1 for this build; "auto" or HOST:PORT
    joins a running one. GPUS_PER_WORKER: None gives each actor a GPU when the cluster has any, else 0 (CPU).
    WORKERS: encode actors (default: one per GPU share, else locally one that uses every core but the read stage's,
    on a cluster one per CPU but one). BATCH_ROWS: documents per actor call."""

    address: str | None = None
    workers: int | None = None
    gpus_per_worker: float | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS

    def check(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise RetrieverError(f"{param('workers')} must be at least 1 (got {self.workers})")
        if self.gpus_per_worker is not None and self.gpus_per_worker < 0:
            raise RetrieverError(f"{param('gpus_per_worker')} must not be negative (got {self.gpus_per_worker})")
        if self.batch_rows < 1:
            raise RetrieverError(f"{param('batch_rows')} must be at least 1 (got {self.batch_rows})")


@dataclass(frozen=True)
class WorkerPlan:
    """How many encode actors, and what each reserves: CPUS (Ray's bookkeeping, and the torch threads it runs)
    and GPUS."""

    workers: int
    cpus: int
    gpus: float

    def describe(self) -> str:
        each = f"{self.cpus} CPU" + (f" + {self.gpus:g} GPU" if self.gpus else "")
        return f"{self.workers} worker{'s' if self.workers != 1 else ''} ({each} each)"


def plan_workers(options: RayOptions, cluster_cpus: float, cluster_gpus: float, local: bool) -> WorkerPlan:
    """Actors and their reservations for a cluster of CLUSTER_CPUS / CLUSTER_GPUS (Ray's counts).

    The actors never hold every CPU: the read stage needs one, and a pool that takes them all waits forever
    (ray-project/ray#44687). A local cluster is started with one CPU more than the machine has, so it is this
    spare one the reader gets, and the actors share out the real cores."""
    gpus = options.gpus_per_worker if options.gpus_per_worker is not None else (1 if cluster_gpus >= 1 else 0)
    if gpus:
        if cluster_gpus < gpus:
            raise RetrieverError(f"{param('gpus_per_worker', gpus)}: the Ray cluster has "
                                 f"{cluster_gpus:g} GPU{'s' if cluster_gpus != 1 else ''}")
        most = int(cluster_gpus // gpus)
        workers = options.workers or most
        if workers > most:
            raise RetrieverError(f"{param('workers', workers)} with {param('gpus_per_worker', gpus)} needs "
                                 f"{workers * gpus:g} GPUs; the Ray cluster has {cluster_gpus:g}")
        # A GPU actor needs a core or two to tokenize and feed it, never the reader's.
        spare = int(cluster_cpus) - 1
        if spare < workers:
            raise RetrieverError(f"{param('workers', workers)}: the Ray cluster has {cluster_cpus:g} CPUs and the read "
                                 f"stage needs one, so at most {max(spare, 0)} GPU workers fit")
        return WorkerPlan(workers, min(2, spare // workers), gpus)
    usable = int(cluster_cpus) - 1
    if usable < 1:
        raise RetrieverError(f"the Ray cluster has {cluster_cpus:g} CPU; an encode worker and the read stage need 2")
    workers = options.workers or (1 if local else usable)
    if workers > usable:
        raise RetrieverError(f"{param('workers', workers)}: the Ray cluster has {cluster_cpus:g} CPUs and the read stage "
                             f"needs one, so at most {usable} workers fit")
    return WorkerPlan(workers, max(1, usable // workers), 0)


def import_ray():
    """Ray, or one line saying how to get it (it is an optional extra)."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise RetrieverError("the ray engine needs Ray Data: pip install 'retriever[ray]' (or 'ray[data]')") from None
    return ray


@contextmanager
def loopback_only() -> Iterator[None]:
    """Nodes started inside the block bind and advertise 127.0.0.1 only.

    Ray replaces a loopback node address with the machine's external one unless clusters are switched off
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0). The variable reaches the processes Ray starts; this process read it when
    it imported Ray, so its constant is set too (restored afterwards)."""
    import ray._private.ray_constants as constants

    variable = constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    before = os.environ.get(variable), constants.ENABLE_RAY_CLUSTER
    os.environ[variable], constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        if before[0] is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before[0]
        constants.ENABLE_RAY_CLUSTER = before[1]


@contextmanager
def ray_cluster(address: str | None) -> Iterator[bool]:
    """Connected to Ray for the block; yields whether the cluster is one this build started on this machine.

    A Ray already initialised in this process (an application's, or a test's cluster) is used as it is and left
    running. Locally the cluster binds 127.0.0.1 only, has no dashboard, and is shut down afterwards."""
    ray = import_ray()
    if ray.is_initialized():
        yield False
        return
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR,
             "configure_logging": True}
    try:
        if address:
            _check_reachable(address)
            if address.split(":")[0] in ("127.0.0.1", "localhost"):  # a cluster on this machine's loopback
                with loopback_only():
                    ray.init(address=address, _node_ip_address="127.0.0.1", **quiet)
            else:
                ray.init(address=address, **quiet)
        else:
            with loopback_only():
                ray.init(num_cpus=(os.cpu_count() or 1) + 1, _node_ip_address="127.0.0.1", **quiet)
    except Exception as error:  # ConnectionError, TimeoutError, RuntimeError...: Ray's wording varies by version
        where = f"at {address}" if address else "on this machine"
        raise RetrieverError(f"cannot reach a Ray cluster {where}: {_first_line(error)}") from None
    try:
        yield address is None
    finally:
        ray.shutdown()


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail at once on a HOST:PORT nothing answers at: Ray itself retries for minutes before giving up."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a ray:// client address: Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
        raise RetrieverError(f"cannot reach a Ray cluster at {address}: {error.strerror or error}") from None


@dataclass
class RayEngine(BuildEngine):
    """The build engine on a Ray cluster (see the module docstring). CORPUS: a corpus file or a folder of them;
    OPTIONS: where the cluster is and how many workers it gives the build."""

    corpus: str | Path = ""
    options: RayOptions = field(default_factory=lambda: RayOptions())
    folder_options: FolderOptions = field(default_factory=FolderOptions)

    def check(self) -> None:
        self.options.check()
        # A folder is a person's files, one document each (read on the driver, into the partial folder every node
        # sees), unless it is said to hold corpus files.
        self._folder = (Path(self.corpus) if Path(self.corpus).is_dir() and not self.folder_options.corpus_files
                        else None)
        self._paths = [] if self._folder is not None else corpus_files(self.corpus)

    @contextmanager
    def session(self, index_dir: Path, name: str) -> Iterator[IndexWriter]:
        spec = self.spec
        clock = time.perf_counter()
        # The driver loads the model too: it resolves the config every actor rebuilds (max_length, dim), checks the
        # model exists before a cluster spends anything, and encodes --fit-queries.
        self._encoder = Encoder(spec.model, spec.pooling, spec.layers, spec.max_length, device="cpu",
                                dtype=spec.dtype if spec.dtype != "fp16" else "fp32", runtime=spec.runtime)
        self.timings["load_model"] = time.perf_counter() - clock
        ray = self._ray = import_ray()
        clock = time.perf_counter()
        with IndexWriter(index_dir, name, build=True,
                         busy_hint=f"wait for it to finish, or build under another {param('name')}") as writer, \
                ray_cluster(self.options.address) as local, quiet_ray_data(ray):
            resources = ray.cluster_resources()
            options = self.options
            if spec.device == "cpu":  # asked for: no GPU actors even where the cluster has GPUs
                options = RayOptions(options.address, options.workers, 0, options.batch_rows)
            self.options = options
            self._plan = plan = plan_workers(options, resources.get("CPU", 0), resources.get("GPU", 0), local)
            if spec.device.startswith("cuda") and not plan.gpus:
                raise RetrieverError(f"{param('device', spec.device)}: the Ray cluster has no GPU")
            # The actors' runtime, refused here in one line rather than by every actor (onnx on a GPU, in fp16).
            resolve_runtime(spec.runtime, "cuda" if plan.gpus else "cpu", spec.dtype)
            self.timings["start_cluster"] = time.perf_counter() - clock
            if self.progress:
                stderr_console.print(f"ray: {plan.describe()} on {_nodes(ray)}; batches of {options.batch_rows:,} "
                                     "documents")
            self._shard_dir = writer.folder / SHARDS
            self._shard_dir.mkdir()
            yield writer

    def read(self, writer: IndexWriter) -> int:
        ray, options = self._ray, self.options
        if self._folder is not None:
            self._paths = [self._folder_corpus(writer.folder / FOLDER_DOCUMENTS)]
        files = [{"file": number, "path": str(path)} for number, path in enumerate(self._paths)]
        counted = _run(lambda: ray.data.from_items(files, override_num_blocks=len(files)).map_batches(
            count_stage, batch_size=1, num_cpus=READ_CPUS,
            fn_kwargs={"encoding": self.spec.encoding, "piece_documents": options.batch_rows}).take_all())
        counted.sort(key=lambda row: (int(row["file"]), int(row["start"])))
        documents = sum(int(row["documents"]) for row in counted)
        if documents == 0:
            raise RetrieverError(f"{self.corpus}: no documents (the file is empty or all blank lines)")
        self._items, first_rowid = [], 1
        for row in counted:
            self._items.append({key: (str(value) if key == "path" else int(value)) for key, value in row.items()}
                               | {"first_rowid": first_rowid})
            first_rowid += int(row["documents"])
        self._documents = documents
        return documents

    def load_encoder(self) -> Encoder:
        return self._encoder

    def encode(self, writer: IndexWriter, encoder: Encoder) -> tuple[VectorSource, int]:
        ray, options, plan, documents = self._ray, self.options, self._plan, self._documents
        clock = time.perf_counter()
        # The read stage runs as its own tasks: fused into the actors (Ray Data fuses consecutive maps whose
        # resources match), a one-file corpus would be read, and so encoded, by a single actor. A reader reserves a
        # quarter CPU, which no actor does, so the two never fuse; reading is light next to encoding, so one reader
        # more than there are actors keeps them fed (unbounded, dozens of readers start at once and slow the
        # actors' own start).
        with warnings.catch_warnings():
            # Ray 2.60 names no parameter for an actor's restarts and warns at the generic ones it still takes.
            warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
            encoded = ray.data.from_items(self._items, override_num_blocks=len(self._items)).map_batches(
                read_stage, batch_size=1, num_cpus=READ_CPUS, compute=ray.data.TaskPoolStrategy(size=plan.workers + 1),
                fn_kwargs={"batch_rows": options.batch_rows, "encoding": self.spec.encoding},
            ).map_batches(
                EncodeWorker, batch_size=options.batch_rows, num_cpus=plan.cpus,
                **({"num_gpus": plan.gpus} if plan.gpus else {}), compute=ray.data.ActorPoolStrategy(size=plan.workers),
                max_restarts=WORKER_RESTARTS, max_task_retries=WORKER_RESTARTS,
                fn_constructor_kwargs={"config": self.encoder_config(encoder), "shard_dir": str(self._shard_dir),
                                       "threads": plan.cpus, "device": "cuda" if plan.gpus else "cpu",
                                       "batch_size": self.spec.batch_size, "runtime": self.spec.runtime,
                                       "passages": self.passages_record(encoder)},
            )
        shards, truncated, self._vectors = [], 0, 0
        with progress_bar(f"Encoding on {plan.workers} Ray worker{'s' if plan.workers != 1 else ''}",
                          total=documents, enabled=self.progress) as advance:
            first_batch, later_rows, later_batches = None, 0, 0
            for batch in run_iter(lambda: encoded.iter_batches(batch_size=None, batch_format="numpy")):
                shards.extend(zip(batch["shard"].tolist(), batch["rows"].tolist()))
                self._vectors += int(batch["vectors"].sum())
                truncated += int(batch["truncated"].sum())
                advance(int(batch["rows"].sum()))
                if first_batch is None:  # actors started and the first batch is through
                    first_batch = time.perf_counter()
                else:
                    later_rows += int(batch["rows"].sum())
                    later_batches += 1
        # The start-up cost, and the steady rate after it where enough batches came to measure one.
        self.timings["encode_first_batch"] = first_batch - clock
        if later_batches >= 3:
            self.timings["encode_steady_rows_per_s"] = later_rows / (time.perf_counter() - first_batch)
        shards.sort()
        _check_shards(shards, documents)
        self._shards = shards
        self.timings["encode"] = time.perf_counter() - clock
        return VectorSource(self._shard_dir), truncated  # shards are named by first row id: file order is row order

    def documents_at(self, writer: IndexWriter):
        # auto's pseudo-queries: the driver reads the sampled documents' texts from the corpus files, in row order.
        return stream_texts(lambda: chain.from_iterable(iter_corpus(path, self.spec.encoding) for path in self._paths))

    def passage_rows(self, writer: IndexWriter) -> np.ndarray | None:
        if self._vectors == self._documents:
            return None
        return np.concatenate([shard_passages(self._shard_dir, first) for first, _ in self._shards])

    def write_segments(self, writer: IndexWriter, source: VectorSource, calibrator: Calibrator, spec: IndexSpec,
                       template) -> list[tuple[str, int]]:
        ray, folder = self._ray, writer.folder
        groups = segment_groups(self._shards, self._plan.workers)
        names = [segment_name(number) for number in range(1, len(groups) + 1)]
        task = ray.remote(num_cpus=1)(write_segment).options(max_retries=2)
        # Each task calibrates with what the skeleton saved in the (shared) partial folder.
        pending = {task.remote(str(folder), segment, [first for first, _ in group], str(self._shard_dir),
                               spec.to_dict(), threads=1): segment for segment, group in zip(names, groups)}
        written = {}
        with progress_bar("Writing segments", total=len(names), enabled=self.progress, unit="segments") as advance:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                written[pending.pop(done[0])] = _run(lambda: ray.get(done[0]))
                advance(1)
        check_ids_across(folder, names)
        shutil.rmtree(self._shard_dir)
        (writer.folder / FOLDER_DOCUMENTS).unlink(missing_ok=True)  # read by the workers and the checks: done
        return [(segment, *written[segment]) for segment in names]

    def encoder_config(self, encoder: Encoder) -> dict:
        return {**encoder.config(), "dtype": self.spec.dtype}  # the workers' precision, not the driver copy's

    def _folder_corpus(self, path: Path) -> Path:
        """The folder's documents (`retriever.files.folder`) written to PATH as BEIR records, a note for each file
        skipped and one for what was read."""
        with path.open("w", encoding="utf-8") as out:
            for document in noted_documents(self._folder, self.folder_options,
                                            lambda line: note(self.notes, line, self.progress)):
                out.write(json.dumps({"_id": document.doc_id, "title": document.title, "text": document.text,
                                      "metadata": document.metadata}, ensure_ascii=False) + "\n")
        return path

    def corpus_record(self) -> str | Path:
        return self.corpus

    def manifest_extras(self) -> dict:
        plan = self._plan
        return {"engine": {"name": "ray", "workers": plan.workers, "cpus_per_worker": plan.cpus,
                           "gpus_per_worker": plan.gpus, "batch_rows": self.options.batch_rows,
                           "corpus_files": len(self._paths)},
                "folder": self.folder_options.to_record() if self._folder is not None else None}


def segment_groups(shards: Sequence[tuple[int, int]], workers: int) -> list[list[tuple[int, int]]]:
    """Consecutive runs of SHARDS ((first row id, rows), in row order), one per segment: as many segments as
    workers write in parallel, but none much under MIN_SEGMENT_ROWS (small corpora make one)."""
    total = sum(rows for _, rows in shards)
    count = max(1, min(workers, total // MIN_SEGMENT_ROWS, len(shards)))
    target = math.ceil(total / count)
    groups: list[list[tuple[int, int]]] = [[]]
    filled = 0
    for shard in shards:
        if filled >= target and len(groups) < count:
            groups.append([])
            filled = 0
        groups[-1].append(shard)
        filled += shard[1]
    return groups


def check_ids_across(folder: Path, segments: Sequence[str]) -> None:
    """Refuse a doc_id that two segments both hold (each segment checked its own): the segments' sorted ids are
    merged as streams, so memory stays flat however large the corpus."""
    from retriever.versions.layout import SEGMENTS
    from retriever.store.documents import DocumentTable
    from retriever.store.layout import DOCUMENTS

    if len(segments) < 2:
        return
    tables = [DocumentTable.open(folder / SEGMENTS / segment / DOCUMENTS) for segment in segments]
    try:
        streams = [((row[0], row[1], row[2]) for row in table.db.execute(
            "SELECT d.doc_id, d.line, s.path FROM documents d LEFT JOIN sources s ON s.id = d.source "
            "ORDER BY d.doc_id")) for table in tables]
        previous = None
        repeated = []
        for doc_id, line, source in heapq.merge(*streams):
            if previous is not None and previous[0] == doc_id:
                repeated.append(f"{doc_id!r} ({previous[2]} line {previous[1]} and {source} line {line})")
                if len(repeated) > 5:
                    break
            previous = (doc_id, line, source)
        if repeated:
            shown = ", ".join(repeated[:5]) + (" and more" if len(repeated) > 5 else "")
            raise RetrieverError(f"duplicate ids: {shown}")
    finally:
        for table in tables:
            table.close()


def _check_shards(shards: Sequence[tuple[int, int]], documents: int) -> None:
    """Every row id from 1 to DOCUMENTS in exactly one shard (a lost or doubled batch would fail here)."""
    expected = 1
    for first, rows in shards:
        if first != expected:
            raise RetrieverError(f"the encode stage lost or repeated documents near row {expected}; nothing was "
                                 "written, run the build again")
        expected = first + rows
    if expected != documents + 1:
        raise RetrieverError(f"the encode stage returned {expected - 1:,} of {documents:,} documents; nothing was "
                             "written, run the build again")


def _run(step):
    """STEP's result, with a failure inside Ray (a bad corpus line, a model missing on a node, a worker lost for
    good) turned into one RetrieverError line."""
    try:
        return step()
    except Exception as error:  # Ray wraps what failed remotely in its own exception types
        _reraise(error)


def run_iter(make):
    try:
        with warnings.catch_warnings():
            # Ray Data warns when a corpus has fewer pieces than actors or readers; a small corpus is no mistake.
            warnings.filterwarnings("ignore", message="The minimum number of concurrent actors")
            warnings.filterwarnings("ignore", message="The maximum number of concurrent tasks")
            yield from make()
    except Exception as error:
        _reraise(error)


def _reraise(error: Exception):
    if _ours(error):
        raise error
    raise _ray_failure(error) from None


def _ours(error: BaseException) -> bool:
    """A RetrieverError raised here, not a Ray wrapper around one (Ray's RayTaskError subclasses the user's
    exception type, and its text is a remote traceback)."""
    return isinstance(error, RetrieverError) and type(error).__module__.startswith("retriever")


def _ray_failure(error: BaseException) -> RetrieverError:
    cause = _root_cause(error)
    if _ours(cause):
        return RetrieverError(str(cause))
    # A remote exception arrives pickled, without its chain; its text still holds the remote traceback. (An actor
    # whose constructor raised is reported as an ActorDiedError too: what it said comes first.)
    said = _REMOTE_MESSAGE.findall(str(error))
    if said:
        return RetrieverError(said[-1].strip())
    died = _worker_death(error)
    if died:
        return RetrieverError(f"{died}; nothing was written and the previous index is unchanged (why it died: "
                              "out of memory, its node lost...: see the Ray logs of that node)")
    return RetrieverError(f"the Ray build failed ({type(cause).__name__}: {_first_line(cause)}); check that every "
                          "node has the model and sees the index folder; the previous index is unchanged")


def _worker_death(error: BaseException) -> str | None:
    """What died, where ERROR (or an exception it wraps) says a Ray worker process or node was lost."""
    from ray import exceptions

    for inner in _chain(error):
        if isinstance(inner, (exceptions.ActorDiedError, exceptions.ActorUnavailableError)):
            return (f"an encode worker died {WORKER_RESTARTS + 1} times (restarted {WORKER_RESTARTS} times, each "
                    "retrying its batch)")
        if isinstance(inner, (exceptions.WorkerCrashedError, exceptions.NodeDiedError, exceptions.OutOfMemoryError)):
            return f"a Ray worker died ({type(inner).__name__}) and its task's retries ran out"
    return None


_REMOTE_MESSAGE = re.compile(r"retriever\.errors\.RetrieverError: (.+)")


def _root_cause(error: BaseException) -> BaseException:
    """The user-level exception under Ray's wrappers, else the innermost one."""
    for inner in _chain(error):
        if _ours(inner):
            return inner
    return inner


def _chain(error: BaseException) -> Iterator[BaseException]:
    """ERROR, then each exception it wraps (RayTaskError.cause, UserCodeException.__cause__, __context__...)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _nodes(ray) -> str:
    alive = [node for node in ray.nodes() if node.get("Alive")]
    return f"{len(alive)} node{'s' if len(alive) != 1 else ''}"


@contextmanager
def quiet_ray_data(ray) -> Iterator[None]:
    """Ray Data's own progress bars, per-dataset log lines and error tracebacks off for the block (the build shows
    one progress display, and a failure reaches the user as the one line `_ray_failure` makes); restored after, so
    an application that shares the process keeps its own Ray Data settings."""
    logger = logging.getLogger("ray.data")
    context = ray.data.DataContext.get_current()
    before = logger.level, context.enable_progress_bars, context.print_on_execution_start
    logger.setLevel(logging.CRITICAL)
    context.enable_progress_bars = context.print_on_execution_start = False
    try:
        yield
    finally:
        logger.setLevel(before[0])
        context.enable_progress_bars, context.print_on_execution_start = before[1], before[2]
